"""``scripts/mutation_diff.py`` (``make mutation-diff``): which functions a change touched, the tests that reach
them, mutmut's config for them and the score, on a real git repository made here (mutmut itself runs outside CI)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import ROOT


def load_script():
    spec = importlib.util.spec_from_file_location("mutation_diff_under_test", ROOT / "scripts" / "mutation_diff.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


diff = load_script()

BEFORE = textwrap.dedent('''\
    LIMIT = 3


    def kept(x):
        return x


    def changed(x):
        return x + 1


    class Store:
        @property
        def size(self):
            return 1

        def put(self, item):
            return item
    ''')


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo(tmp_path):
    """A repository with ``project/pkg/mod.py`` and two test files committed, then edited in the working tree."""
    root = tmp_path / "repo"
    (root / "project" / "pkg").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "project" / "pkg" / "mod.py").write_text(BEFORE)
    (root / "tests" / "test_mod.py").write_text("from project.pkg.mod import kept\n")
    (root / "tests" / "test_other.py").write_text("import json\n")
    (root / "tests" / "test_from.py").write_text("from project.pkg import mod\n")
    (root / "tests" / "test_outside.py").write_text("import project.pkg.mod\n")  # in no selection, not changed
    git(root, "init", "-q")
    git(root, "-c", "user.email=t@t", "-c", "user.name=t", "add", ".")
    git(root, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "base")
    after = BEFORE.replace("LIMIT = 3", "LIMIT = 4").replace("return x + 1", "return x + 2").replace(
        "        return 1", "        return 2")
    (root / "project" / "pkg" / "mod.py").write_text(after)
    (root / "project" / "pkg" / "new.py").write_text("def fresh():\n    return 0\n")  # untracked: all new
    (root / "tests" / "test_new.py").write_text("from project.pkg.new import fresh\n")
    (root / "tests" / "test_unrelated.py").write_text("import os\n")  # new, but reaches no changed module
    (root / "project" / "pkg" / "tests").mkdir()
    (root / "project" / "pkg" / "tests" / "test_inside.py").write_text("def test_y():\n    pass\n")  # a recipe's
    return root


def test_the_functions_and_methods_holding_a_changed_line_are_named_as_mutmut_names_them(repo):
    changed = {c.path: c for c in diff.changes_since("HEAD", repo)}
    assert set(changed) == {"project/pkg/mod.py", "project/pkg/new.py"}
    mod = changed["project/pkg/mod.py"]
    assert mod.functions == ("x_changed", "ǁStoreǁsize") and mod.module == "project.pkg.mod"
    assert mod.module_lines == (1,)  # LIMIT: outside any function, so mutmut leaves it
    assert changed["project/pkg/new.py"].functions == ("x_fresh",)


def test_changed_lines_are_the_new_sides_hunks_and_a_deleted_file_has_none():
    text = ("diff --git a/p/a.py b/p/a.py\n--- a/p/a.py\n+++ b/p/a.py\n@@ -3 +3 @@\n-x\n+y\n@@ -10,0 +11,2 @@\n+a\n+b\n"
            "diff --git a/p/gone.py b/p/gone.py\n--- a/p/gone.py\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-a\n-b\n"
            "diff --git a/p/c.py b/p/c.py\n--- a/p/c.py\n+++ b/p/c.py\n@@ -5,2 +4,0 @@\n-a\n-b\n")
    assert diff.changed_lines(text) == {"p/a.py": {3, 11, 12}}  # a pure deletion leaves no line to mutate


def test_a_decorated_function_counts_from_its_decorator():
    source = "import functools\n\n\n@functools.cache\ndef f():\n    return 1\n\n\ndef g():\n    return 2\n"
    assert diff.functions_touched(source, {4}) == (("x_f",), ())
    assert diff.functions_touched(source, {2, 10}) == (("x_g",), (2,))


def test_the_tests_are_the_files_that_import_a_changed_module(repo):
    changed = diff.changes_since("HEAD", repo)
    selection = ["tests/test_mod.py", "tests/test_other.py", "tests/test_from.py"]
    assert diff.test_files_for(changed, "HEAD", selection, repo) == [
        "tests/test_from.py", "tests/test_mod.py", "tests/test_new.py", "tests/test_outside.py"]


def test_mutmuts_config_mutates_the_changed_modules_alone_with_those_tests():
    import tomllib

    pyproject = ('[project]\nname = "x"\n\n[tool.mutmut]\nsource_paths = ["project/"]\nonly_mutate = ["project/*"]\n'
                 'pytest_add_cli_args_test_selection = ["tests/test_a.py", "-m", "not slow"]\n\n[tool.other]\nk = 1\n')
    changed = [diff.Changed("project/a.py", ("x_f",), ()), diff.Changed("project/b.py", (), (3,))]
    config = tomllib.loads(diff.mutmut_config(pyproject, changed, ["tests/test_b.py"]))
    assert config["tool"]["mutmut"]["only_mutate"] == ["project/a.py"]
    assert config["tool"]["mutmut"]["pytest_add_cli_args_test_selection"] == ["tests/test_b.py", "-m", "not slow"]
    assert config["tool"]["other"] == {"k": 1} and config["project"] == {"name": "x"}


def test_the_score_is_the_share_of_reached_mutants_caught():
    counts, share = diff.score({"a": "killed", "b": "survived", "c": "no tests", "d": "timeout", "e": "killed"})
    assert counts["killed"] == 2 and share == 3 / 4
    assert diff.score({"a": "no tests"})[1] is None
