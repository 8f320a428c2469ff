#!/usr/bin/env python
"""mutmut over the functions changed since a commit, with the test files that reach them: the new code's score.

Finds the engine's functions and methods whose lines differ from BASE (committed or not), runs mutmut on them alone
in a copy of the template, with the test files of tests/ that import a changed module (their fast tests), and
prints the score and each survivor's diff. Lines changed outside any function (module constants) are
listed: mutmut does not mutate them. Needs mutmut (`make mutation-diff` installs it); see docs/tests.md.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
SEPARATOR = "ǁ"  # mutmut's: a method's mutants are named module.xǁClassǁmethod__mutmut_N
HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@", re.MULTILINE)
# mutmut's exit codes of a mutant's test run, as its results command names them.
KILLED, SURVIVED, NO_TESTS, TIMEOUT = "killed", "survived", "no tests", "timeout"


@dataclass(frozen=True)
class Changed:
    """What differs from BASE in one module: its functions (mutmut's names) and its lines outside any function."""

    path: str  # relative to the template's root
    functions: tuple[str, ...]
    module_lines: tuple[int, ...]

    @property
    def module(self) -> str:
        return self.path.removesuffix(".py").replace("/", ".")


def changed_lines(diff: str) -> dict[str, set[int]]:
    """The new file's changed or added lines per file, from a ``git diff --unified=0``."""
    lines: dict[str, set[int]] = {}
    for section in re.split(r"^diff --git ", diff, flags=re.MULTILINE)[1:]:
        target = re.search(r"^\+\+\+ b/(.+)$", section, re.MULTILINE)
        if target is None:  # a file deleted
            continue
        found = lines.setdefault(target.group(1), set())
        for match in HUNK.finditer(section):
            start, count = int(match.group(1)), int(match.group(2) or "1")
            found.update(range(start, start + count))
        if not found:
            del lines[target.group(1)]
    return lines


def functions_touched(source: str, lines: set[int]) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """mutmut's names of the top-level functions and methods that hold a changed line, and the changed lines
    that none holds."""
    names, held = [], set()
    for node in ast.parse(source).body:
        inside = [(node.name, node)] if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else []
        if isinstance(node, ast.ClassDef):
            inside = [(f"{SEPARATOR}{node.name}{SEPARATOR}{item.name}", item) for item in node.body
                      if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for name, function in inside:
            start = min([function.lineno, *(decorator.lineno for decorator in function.decorator_list)])
            span = set(range(start, (function.end_lineno or function.lineno) + 1))
            if span & lines:
                names.append(name if name.startswith(SEPARATOR) else f"x_{name}")
                held |= span
    return tuple(names), tuple(sorted(lines - held))


def changes_since(base: str, root: Path = ROOT) -> list[Changed]:
    """The engine's modules that differ from ``base`` (the working tree against it, so uncommitted work counts)."""
    diff = subprocess.run(["git", "diff", "--unified=0", "--no-color", "--no-ext-diff", base, "--", "project/"],
                          cwd=root, capture_output=True, text=True, check=True).stdout
    new = subprocess.run(["git", "ls-files", "--others", "--exclude-standard", "project/"], cwd=root,
                         capture_output=True, text=True, check=True).stdout.split()
    lines = changed_lines(diff)
    for path in new:  # untracked: every line is new
        lines[path] = set(range(1, len((root / path).read_text(encoding="utf-8").splitlines()) + 1))
    changed = []
    for path in sorted(p for p in lines if p.endswith(".py") and "/tests/" not in p):  # a recipe's tests: not code
        functions, module_lines = functions_touched((root / path).read_text(encoding="utf-8"), lines[path])
        changed.append(Changed(path, functions, module_lines))
    return changed


def test_files_for(changed: list[Changed], base: str, selection: list[str], root: Path = ROOT) -> list[str]:
    """The test files that import a changed module: those changed since ``base``, those of mutmut's selection and
    any other of ``tests/`` (a function's success path may be tested only outside the selection)."""
    diff = subprocess.run(["git", "diff", "--name-only", base, "--", "tests/"], cwd=root, capture_output=True,
                          text=True, check=True).stdout.split()
    new = subprocess.run(["git", "ls-files", "--others", "--exclude-standard", "tests/"], cwd=root,
                         capture_output=True, text=True, check=True).stdout.split()
    every = [str(path.relative_to(root)) for path in sorted((root / "tests").glob("test_*.py"))]
    candidates = {path for path in (*diff, *new, *selection, *every)
                  if re.fullmatch(r"tests/test_\w+\.py", path) and (root / path).is_file()}
    modules = [c.module for c in changed if c.functions]
    return sorted(path for path in candidates
                  if any(_imports((root / path).read_text(encoding="utf-8"), module) for module in modules))


def _imports(text: str, module: str) -> bool:
    package, _, name = module.rpartition(".")
    return bool(re.search(rf"\b{re.escape(module)}\b", text) or
                re.search(rf"^\s*from {re.escape(package)} import [^\n]*\b{re.escape(name)}\b", text, re.MULTILINE))


def score(statuses: dict[str, str]) -> tuple[Counter[str], float | None]:
    """The count of each status, and the share of the mutants some test reached that a test caught (a timeout
    counts as caught, as mutmut counts it)."""
    counts = Counter(statuses.values())
    reached = sum(counts.values()) - counts[NO_TESTS]
    return counts, ((counts[KILLED] + counts[TIMEOUT]) / reached if reached else None)


def mutmut_config(pyproject: str, changed: list[Changed], tests: list[str]) -> str:
    """``pyproject.toml`` with its ``[tool.mutmut]`` mutating only the changed modules, with ``tests``."""
    options = [arg for arg in tomllib.loads(pyproject)["tool"]["mutmut"]["pytest_add_cli_args_test_selection"]
               if not arg.startswith("tests/")]
    section = (
        "[tool.mutmut]\n"
        'source_paths = ["project/"]\n'
        'also_copy = ["scripts/", "tests/", ".gitignore", "constraints.txt"]\n'
        f"only_mutate = {json.dumps([c.path for c in changed if c.functions])}\n"
        f"pytest_add_cli_args_test_selection = {json.dumps([*tests, *options])}\n"
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "-x", "-q"]\n'
    )
    start = pyproject.index("[tool.mutmut]")
    end = pyproject.find("\n[", start + 1)
    return pyproject[:start] + section + (pyproject[end + 1:] if end != -1 else "")


def statuses_in(template: Path, changed: list[Changed]) -> dict[str, str]:
    """Each mutant of the changed functions and its status, from the ``.meta`` files mutmut wrote."""
    from mutmut.stats import status_by_exit_code

    wanted = {f"{c.module}.{name}" for c in changed for name in c.functions}
    found = {}
    for change in changed:
        meta = template / "mutants" / f"{change.path}.meta"
        if not meta.is_file():
            continue
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        for key, code in codes.items():
            if key.rsplit("__mutmut_", 1)[0] in wanted:
                found[key] = status_by_exit_code[code]
    return found


def main() -> int:
    parser = argparse.ArgumentParser(prog="mutation_diff.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="HEAD", help="the commit to compare with (default: HEAD, so the changes "
                        "not yet committed)")
    parser.add_argument("--max-children", type=int, default=2, help="mutants tested at once")
    args = parser.parse_args()
    from mutants import copy_template

    try:
        changed = changes_since(args.base)
    except subprocess.CalledProcessError as err:
        parser.error(f"--base {args.base}: {err.stderr.strip().splitlines()[0] if err.stderr else 'git failed'}")
    for change in changed:
        if change.module_lines:
            shown = ", ".join(map(str, change.module_lines[:8])) + (", ..." if len(change.module_lines) > 8 else "")
            print(f"not mutated (outside any function): {change.path} lines {shown}")
    names = [f"{c.module}.{name}__mutmut_*" for c in changed for name in c.functions]
    if not names:
        print(f"no function of project/ changed since {args.base}")
        return 0
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    selection = [a for a in tomllib.loads(pyproject)["tool"]["mutmut"]["pytest_add_cli_args_test_selection"]
                 if a.startswith("tests/")]
    tests = test_files_for(changed, args.base, selection)
    print(f"{len(names)} function(s) changed since {args.base}; tests: {' '.join(tests) or 'none'}", flush=True)
    with tempfile.TemporaryDirectory(prefix="mutation-diff-") as scratch:
        template = copy_template(Path(scratch) / "template")
        (template / "pyproject.toml").write_text(mutmut_config(pyproject, changed, tests), encoding="utf-8")
        mutmut = str(Path(sys.executable).with_name("mutmut"))
        ran = subprocess.run([mutmut, "run", "--max-children", str(args.max_children), *names], cwd=template,
                             capture_output=True, text=True, check=False)
        if ran.returncode != 0:  # e.g. a test that fails without any mutant: mutmut checks none
            output = ran.stdout + ran.stderr
            failure = output.find("= FAILURES =")  # the failing test's own report, before pytest's warnings
            print(output[failure:failure + 6000] if failure != -1 else output.rstrip()[-3000:])
            print(f"mutmut failed (exit code {ran.returncode}): no score")
            return 2
        statuses = statuses_in(template, changed)
        counts, share = score(statuses)
        survivors = sorted(key for key, status in statuses.items() if status == SURVIVED)
        for name in survivors:
            shown = subprocess.run([mutmut, "show", name], cwd=template, capture_output=True, text=True).stdout
            print(shown.rstrip())
    summary = ", ".join(f"{count} {status}" for status, count in sorted(counts.items()))
    print(f"{len(statuses)} mutants: {summary}")
    print(f"score {share:.0%} of the mutants reached" if share is not None else "score: no mutant was reached")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
