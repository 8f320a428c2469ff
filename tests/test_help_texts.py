"""Each script's ``--help``, word for word, against the copy kept in ``tests/help/``: a user reads it as the
manual, so a change to it is made on purpose. After changing one, ``UPDATE_HELP=1 pytest tests/test_help_texts.py``
writes the new copies; the diff shows what the user now reads."""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KEPT = Path(__file__).resolve().parent / "help"
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
SCRIPTS = ("train", "evaluate", "predict", "runs", "sweep", "benchmark", "check_recipe", "new_recipe",
           "check_gpu", "engine_size", "plot_scalars")


def help_of(script: str, monkeypatch, capsys) -> str:
    """The script's ``--help`` as its own ``__main__`` prints it, in this process (the tests' recipe, 100 columns)."""
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setattr(sys, "argv", ["started-as", "--help"])  # the name shown is the script's own
    monkeypatch.setattr(sys, "path", list(sys.path))
    with pytest.raises(SystemExit) as ended:
        runpy.run_path(str(ROOT / "scripts" / f"{script}.py"), run_name="__main__")
    assert ended.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_scripts_help_is_the_one_kept(script, monkeypatch, capsys):
    shown = help_of(script, monkeypatch, capsys)
    kept = KEPT / f"{script}.txt"
    if os.environ.get("UPDATE_HELP"):
        kept.write_text(shown)
        (KEPT / "PYTHON").write_text(PYTHON + "\n")
        pytest.skip(f"wrote {kept.relative_to(ROOT)}")
    written_by = (KEPT / "PYTHON").read_text().strip()
    if written_by != PYTHON:
        pytest.skip(f"the copies are Python {written_by}'s argparse layout; this is {PYTHON}")
    assert kept.exists(), f"no kept copy of {script}.py --help: UPDATE_HELP=1 pytest {Path(__file__).name}"
    assert shown == kept.read_text(), (
        f"{script}.py --help changed; if on purpose: UPDATE_HELP=1 pytest tests/{Path(__file__).name}")


def test_every_script_with_a_command_line_of_the_projects_is_kept():
    with_one = {path.stem for path in (ROOT / "scripts").glob("*.py")
                if "from project.config.cli import" in path.read_text() or
                "from project.config.tool_args import" in path.read_text()}
    assert with_one == set(SCRIPTS), "name each such script in SCRIPTS, then UPDATE_HELP=1 writes its --help copy"
