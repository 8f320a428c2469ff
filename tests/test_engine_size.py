"""``scripts/engine_size.py``: its count of the engine's lines, on a tree written by hand, and of the files a real
default run loads."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from helpers import ROOT

spec = importlib.util.spec_from_file_location("engine_size", ROOT / "scripts" / "engine_size.py")
assert spec is not None and spec.loader is not None
engine_size = importlib.util.module_from_spec(spec)
sys.modules["engine_size"] = engine_size  # its dataclass looks its module up
spec.loader.exec_module(engine_size)

MODULE = '''"""A module.

Its second paragraph, after a blank line.
"""

import os  # a comment after code is code

# a comment


def walk(path):
    """Why it walks.

    # not a comment: docstring text
    """
    return os.walk(path)


class Tree:
    """One line."""

    size = 3
'''


def test_the_engines_lines_are_counted_by_kind_and_the_recipe_left_out(tmp_path):
    (tmp_path / "training").mkdir(parents=True)
    (tmp_path / "training" / "walk.py").write_text(MODULE)
    (tmp_path / "empty.py").write_text("")
    (tmp_path / "recipe").mkdir()
    (tmp_path / "recipe" / "model.py").write_text("x = 1\n" * 50)
    lines = engine_size.engine_lines(tmp_path)
    assert (lines.files, lines.total, lines.docstrings, lines.comments, lines.blank, lines.code) == (
        2, 22, 9, 1, 7, 5)


@pytest.mark.slow
@pytest.mark.parametrize(("recipe", "folder"), [("project.recipe", "project/recipe/"), ("tests.tiny_recipe", "tests/")])
def test_a_default_run_is_counted_from_what_it_loaded_the_recipes_files_included(monkeypatch, recipe, folder):
    monkeypatch.setenv("PROJECT_RECIPE", recipe)
    loaded = engine_size.files_a_run_loads()
    paths = [file.path for file in loaded]
    assert "project/training/run.py" in paths
    assert "project/results/evaluation.py" not in paths  # what a run does not load is not counted
    # the tuners, the .pt2 export, the resume, the device-side steps, the --trainer.* checks and YAML files are loaded
    # by a run that uses them, and the other scripts' command lines and figures by those scripts (the MNIST recipe's
    # photo reader by predict.py), not by every run
    for elsewhere in ("training/tuning.py", "results/export.py", "reliability/resume.py", "hardware/device_step.py",
                      "config/trainer_args.py", "config/yaml_files.py", "config/tool_args.py", "results/plots.py",
                      "recipe/digits.py"):
        assert f"project/{elsewhere}" not in paths
    assert paths == sorted(set(paths))
    # The recipe's modules come through importlib.import_module, which -X importtime does not log.
    recipe_files = [file.path for file in loaded if file.in_recipe]
    assert len(recipe_files) >= 2 and all(path.startswith(folder) for path in recipe_files)
    assert all(path.startswith(("project/", folder)) for path in paths)
    for file in loaded:
        assert file.lines == len((ROOT / file.path).read_text().splitlines())
