"""Every script command in the README and docs/ is one the scripts accept as written.

Each command is parsed by the script's own parser (flags, values, config files), in a folder
laid out like a fresh clone after a run. What the commands then do is covered by the named
tests of each script; this test keeps the pages from drifting from the parsers.
"""
from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest
import yaml

from project.config import cli
from project.config.schema import RunConfig

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND = re.compile(r"(?:\.venv/bin/)?python3? scripts/(\w+)\.py((?:[^`\n#]|#(?!\s))*)")
MAKE_TRAIN = re.compile(r'make (train) ARGS="([^"]*)"')
TOOL_PARSERS = {
    "evaluate": cli.parse_evaluate_args,
    "predict": cli.parse_predict_args,
    "sweep": cli.parse_sweep_args,
    "benchmark": cli.parse_benchmark_args,
    "runs": cli.parse_runs_args,
    "check_gpu": cli.parse_check_gpu_args,
    "plot_scalars": lambda description: cli.parse_plot_scalars_args(description, ()),
}


def documented_commands() -> list[tuple[str, str, list[str]]]:
    """(where, script, argv) for each script command the pages show, placeholders excluded."""
    found = []
    for page in PAGES:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            for match in [*COMMAND.finditer(line), *MAKE_TRAIN.finditer(line)]:
                args = match.group(2).strip().rstrip("`;,.)")
                if "..." in args or "<" in args or "|" in args or args.startswith(">"):
                    continue
                argv = shlex.split(args.split(" > ")[0])
                found.append((f"{page.name}:{number}", match.group(1), argv))
    return found


COMMANDS = documented_commands()


def test_the_pages_show_commands_of_every_script() -> None:
    shown = {script for _, script, _ in COMMANDS}
    on_disk = {p.stem for p in (ROOT / "scripts").glob("*.py")}
    assert len(COMMANDS) >= 35
    assert on_disk - shown <= {"mutation_check"}, f"scripts the pages never show: {on_disk - shown}"


@pytest.mark.parametrize(("where", "script", "argv"), COMMANDS, ids=[c[0] for c in COMMANDS])
def test_documented_command_parses(where: str, script: str, argv: list[str], tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    monkeypatch.chdir(tmp_path)
    for i, arg in enumerate(argv[:-1]):
        if arg == "--config" and not Path(argv[i + 1]).exists():
            written = Path(argv[i + 1])  # a run's or a sweep's config.yaml: write one as a run would
            written.parent.mkdir(parents=True, exist_ok=True)
            written.write_text(yaml.safe_dump(cli.parse_run_config([]).to_mapping()))
    monkeypatch.setattr(sys, "argv", [f"{script}.py", *argv])
    try:
        if script == "train":
            assert isinstance(cli.parse_run_config(argv), RunConfig)
        else:
            assert script in TOOL_PARSERS, f"{where}: no parser known for scripts/{script}.py"
            TOOL_PARSERS[script](None)
    except SystemExit as stop:  # --help exits 0; a refused command exits 2 after its one line
        assert stop.code == 0, f"{where}: scripts/{script}.py refused {shlex.join(argv)}"
