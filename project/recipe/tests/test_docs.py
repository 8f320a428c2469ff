"""Every script command in the README and docs/ is one the scripts accept as written, for this recipe.

The pages document the shipped recipe (its presets, its ``--hidden``), so this test goes with it. Each
command is parsed by the script's own parser (flags, values, config files) in a fresh interpreter on
this recipe, in a folder laid out like a fresh clone after a run. What the commands then do is
covered by the named tests of each script; this test keeps the pages from drifting from the parsers.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from project.recipe.tests.conftest import THIS_RECIPE
from tests.helpers import HANG_S

ROOT = Path(__file__).resolve().parents[3]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND = re.compile(r"(?:\.venv/bin/)?python3? scripts/(\w+)\.py((?:[^`\n#]|#(?!\s))*)")
MAKE_TRAIN = re.compile(r'make (train) ARGS="([^"]*)"')
TOOL_PARSERS = ("evaluate", "predict", "sweep", "benchmark", "runs", "check_gpu", "plot_scalars", "check_recipe",
                "engine_size", "install_torch", "new_recipe")
# Run in a fresh interpreter, from a folder like a clone after a run: each command's parser on its argv.
PARSE_EACH = """
import json, sys
from pathlib import Path
import yaml
from project.config import cli, tool_args
from project.contract import installed_recipe
recipe = installed_recipe()
refused = {}
for where, script, argv in json.loads(sys.argv[1]):
    for i, arg in enumerate(argv[:-1]):
        if arg == "--config" and "/" in argv[i + 1] and not Path(argv[i + 1]).exists():
            written = Path(argv[i + 1])  # a run's or a sweep's config.yaml: write one as a run would
            written.parent.mkdir(parents=True, exist_ok=True)
            written.write_text(yaml.safe_dump(cli.parse_run_command(recipe, [])[0].to_mapping()))
    sys.argv = [script + ".py", *argv]
    try:
        if script == "train":
            cli.parse_run_command(recipe, argv)
        elif script == "plot_scalars":
            tool_args.parse_plot_scalars_args(None, ())
        elif script == "install_torch":  # runs before torch is installed: its parser is its own
            import importlib.util, project
            where_ = Path(project.__file__).parents[1] / "scripts" / "install_torch.py"
            spec = importlib.util.spec_from_file_location("install_torch", where_)
            module = importlib.util.module_from_spec(spec)
            sys.modules["install_torch"] = module
            spec.loader.exec_module(module)
            module.parser().parse_args(argv)
        elif script in ("check_gpu", "check_recipe", "engine_size", "new_recipe"):
            getattr(tool_args, f"parse_{script}_args")(None)
        else:
            getattr(tool_args, f"parse_{script}_args")(recipe, None)
    except SystemExit as stop:  # --help exits 0; a refused command exits 2 after its one line
        if stop.code != 0:
            refused[where] = f"scripts/{script}.py {' '.join(argv)}"
print(json.dumps(refused))
"""


def documented_commands() -> list[tuple[str, str, list[str]]]:
    """(where, script, argv) for each script command the pages show, placeholders excluded."""
    found = []
    for page in PAGES:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            for match in [*COMMAND.finditer(line), *MAKE_TRAIN.finditer(line)]:
                args = match.group(2).split("&&")[0].strip().rstrip("`;,.)")
                if "..." in args or "<" in args or "|" in args or args.startswith(">"):
                    continue
                found.append((f"{page.name}:{number}", match.group(1), shlex.split(args.split(" > ")[0])))
    return found


def test_the_pages_show_commands_of_every_script() -> None:
    commands = documented_commands()
    shown = {script for _, script, _ in commands}
    on_disk = {p.stem for p in (ROOT / "scripts").glob("*.py")}
    assert len(commands) >= 35
    assert on_disk - shown <= {"mutation_check", "mutation_diff"}, f"scripts the pages never show: {on_disk - shown}"
    assert shown <= {"train", *TOOL_PARSERS}, f"no parser known for {shown - {'train', *TOOL_PARSERS}}"


def test_every_documented_command_parses(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", PARSE_EACH, json.dumps(documented_commands())], cwd=tmp_path,
                          capture_output=True, text=True, timeout=HANG_S,
                          env={**os.environ, **THIS_RECIPE, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    refused = json.loads(done.stdout.strip().splitlines()[-1])
    assert not refused, f"commands the scripts refuse: {refused}\n{done.stderr}"


def shown_block(page: Path, heading: str) -> str:
    """The first fenced block after ``heading`` on ``page``."""
    text = page.read_text()
    after = text[text.index(heading):]
    return after.split("```\n", 2)[1]


def test_the_readme_shows_the_run_output_make_figures_wrote() -> None:
    written = shown_block(ROOT / "docs" / "figures.md", "## The default run")
    assert written.startswith("epoch ") and "\ntest/acc " in written  # the last epoch line, then the summary
    assert shown_block(ROOT / "README.md", "## What a run prints") == written
