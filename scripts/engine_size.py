#!/usr/bin/env python
"""How much a reader must read: the engine's lines (``project/`` less the recipe), and the project's files one
default training run loads (``train.py --fast-dev-run`` on the recipe's example data, read from ``sys.modules``).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from project.config.tool_args import parse_engine_size_args  # noqa: E402  (light: no torch)
from project.errors import UserError, run_cli  # noqa: E402


@dataclass(frozen=True)
class EngineLines:
    """The engine's lines, and what they are: docstrings, comments and blank lines are part of what a reader reads
    but not of what runs."""

    files: int
    total: int
    docstrings: int
    comments: int
    blank: int

    @property
    def code(self) -> int:
        return self.total - self.docstrings - self.comments - self.blank


def engine_lines(project: Path = ROOT / "project") -> EngineLines:
    """Lines of ``project/**/*.py``, the recipe left out."""
    files = [p for p in project.rglob("*.py") if "recipe" not in p.relative_to(project).parts[:1]]
    total = docstrings = comments = blank = 0
    for path in files:
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines()
        in_docstrings: set[int] = set()  # line numbers, from 1
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    ast.get_docstring(node, clean=False) is not None:
                first = node.body[0]
                in_docstrings.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
        outside = [line for number, line in enumerate(lines, start=1) if number not in in_docstrings]
        total += len(lines)
        docstrings += len(in_docstrings)
        blank += sum(1 for line in outside if not line.strip())
        comments += sum(1 for line in outside if line.lstrip().startswith("#"))
    return EngineLines(len(files), total, docstrings, comments, blank)


# Run in a fresh interpreter: the default run, then the project's modules it left in ``sys.modules``
# (``-X importtime`` misses those loaded with ``importlib.import_module``, as the recipe's are).
LOADED_BY_A_RUN = """
import json, runpy, sys
from pathlib import Path
script, out, root = sys.argv[1:4]
sys.argv = [script, *sys.argv[4:]]
try:
    runpy.run_path(script, run_name="__main__")
except SystemExit as stop:
    if stop.code not in (0, None):
        raise
from project.contract import RECIPE_VARIABLE, DEFAULT_RECIPE
import os
recipe = Path(sys.modules[os.environ.get(RECIPE_VARIABLE, DEFAULT_RECIPE)].__file__).resolve().parent
files = {Path(module.__file__).resolve() for module in list(sys.modules.values()) if getattr(module, "__file__", None)}
Path(out).write_text(json.dumps(sorted((str(path), path.is_relative_to(recipe)) for path in files
                                       if path.is_relative_to(Path(root, "project")) or path.is_relative_to(recipe))))
"""


@dataclass(frozen=True)
class LoadedFile:
    path: str  # relative to the template's root where it lies inside it
    lines: int
    in_recipe: bool


def files_a_run_loads() -> list[LoadedFile]:
    """The project's files and the installed recipe's in ``sys.modules`` after a default ``train.py --fast-dev-run``
    on the recipe's example data."""
    with tempfile.TemporaryDirectory(prefix="engine-size-") as scratch:
        write = ("import sys, pathlib; from project.contract import installed_recipe; "
                 "installed_recipe().write_example_data(pathlib.Path(sys.argv[1]))")
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        written = subprocess.run([sys.executable, "-c", write, scratch], capture_output=True, text=True, env=env,
                                 cwd=ROOT, check=False)
        if written.returncode != 0:
            said = written.stderr.strip().splitlines() or ["?"]
            raise UserError(f"the recipe's example data could not be written: {said[-1]}")
        listing = Path(scratch) / "loaded.json"
        done = subprocess.run([sys.executable, "-c", LOADED_BY_A_RUN, str(ROOT / "scripts" / "train.py"),
                               str(listing), str(ROOT), "--fast-dev-run", "--data-dir", scratch, "--val-size", "0.2",
                               "--logdir", str(Path(scratch) / "logs")],
                              capture_output=True, text=True, env=env, cwd=ROOT, check=False)
        if done.returncode != 0 or not listing.is_file():
            said = done.stderr.strip().splitlines() or ["?"]
            raise UserError(f"the run failed: {said[-1]}")
        found = [(Path(path), in_recipe) for path, in_recipe in json.loads(listing.read_text())]
    return [LoadedFile(str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path),
                       len(path.read_text(encoding="utf-8").splitlines()), in_recipe) for path, in_recipe in found]


def main() -> int:
    lines = engine_lines()
    print(f"engine: {lines.total} lines in {lines.files} files (project/ less project/recipe/): {lines.code} of code, "
          f"{lines.docstrings} of docstrings, {lines.comments} of comments, {lines.blank} blank")
    loaded = files_a_run_loads()
    recipe = [file for file in loaded if file.in_recipe]
    print(f"a default run loads {len(loaded)} of the project's files, {sum(f.lines for f in loaded):,} lines "
          f"(the recipe's {len(recipe)} files and {sum(f.lines for f in recipe):,} lines among them):")
    for file in loaded:
        print(f"{file.lines:7,}  {file.path}")
    return 0


if __name__ == "__main__":
    arguments = parse_engine_size_args(__doc__)
    run_cli(main, "engine_size.py", debug=arguments.debug)
