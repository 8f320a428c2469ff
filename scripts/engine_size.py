#!/usr/bin/env python
"""How much a reader must read: the engine's lines (``project/`` less the recipe), and the project's files one
default training run imports (``python -X importtime scripts/train.py --fast-dev-run`` on the recipe's example data).
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from project.config.cli import parse_engine_size_args  # noqa: E402  (light: no torch)
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


def files_a_run_imports() -> list[str]:
    """The project's modules a default ``train.py --fast-dev-run`` imports, in import order."""
    with tempfile.TemporaryDirectory(prefix="engine-size-") as scratch:
        write = ("import sys, pathlib; from project.contract import installed_recipe; "
                 "installed_recipe().write_example_data(pathlib.Path(sys.argv[1]))")
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        written = subprocess.run([sys.executable, "-c", write, scratch], capture_output=True, text=True, env=env,
                                 cwd=ROOT, check=False)
        if written.returncode != 0:
            said = written.stderr.strip().splitlines() or ["?"]
            raise UserError(f"the recipe's example data could not be written: {said[-1]}")
        done = subprocess.run([sys.executable, "-X", "importtime", str(ROOT / "scripts" / "train.py"), "--fast-dev-run",
                               "--data-dir", scratch, "--val-size", "0.2", "--logdir",
                               str(Path(scratch) / "logs")],
                              capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    if done.returncode != 0:
        said = [line for line in done.stderr.splitlines() if not line.startswith("import time:")] or ["?"]
        raise UserError(f"the run failed: {said[-1]}")
    names = re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*(project(?:\.\w+)*)\s*$", done.stderr, re.MULTILINE)
    return list(dict.fromkeys(name for name in names if not name.startswith("project.recipe")))


def main() -> int:
    lines = engine_lines()
    print(f"engine: {lines.total} lines in {lines.files} files (project/ less project/recipe/): {lines.code} of code, "
          f"{lines.docstrings} of docstrings, {lines.comments} of comments, {lines.blank} blank")
    imported = files_a_run_imports()
    print(f"a default run imports {len(imported)} of the engine's files: {' '.join(imported)}")
    return 0


if __name__ == "__main__":
    arguments = parse_engine_size_args(__doc__)
    run_cli(main, "engine_size.py", debug=arguments.debug)
