"""The recipe's presets and sweep space: each read by train.py and sweep.py as a user would name them."""

import os
import subprocess
import sys

import pytest
import yaml

from project.recipe.tests.conftest import THIS_RECIPE, run_script
from tests.helpers import HANG_S, ROOT


def printed_config(*args: str) -> dict:
    done = run_script("train.py", *args, "--print-config")
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)


@pytest.mark.parametrize("preset", ["article", "fast", "gpu-ddp"])
def test_presets_parse(preset):
    settings = printed_config("--config", preset)
    if preset == "article":  # the article's own recipe
        assert [settings[k] for k in ("optimizer", "lr", "batch_size", "max_epochs", "scheduler", "hidden")] == \
            ["sgd", 0.01, 64, 10, "none", [128]]
    if preset == "fast":  # the preset is the default recipe, setting for setting
        assert settings == printed_config()
    if preset == "gpu-ddp":
        assert (settings["devices"], settings["precision"], settings["strategy"]) == (2, "16-mixed", "ddp")


def test_the_recipes_defaults_are_the_default_run():
    settings = printed_config()
    assert [settings[k] for k in ("optimizer", "lr", "momentum", "weight_decay", "scheduler", "batch_size",
                                  "max_epochs")] == ["sgd", 0.2, 0.9, 5e-4, "onecycle", 256, 6]


def test_the_sweep_space_is_checked_against_this_installed_recipe():
    read = ("from project.contract import installed_recipe; from project.sweeps.study import load_space; "
            "r = installed_recipe(); fixed, params = load_space(str(r.folder / 'sweep.yaml'), r); "
            "print(sorted(fixed), sorted(params))")
    done = subprocess.run([sys.executable, "-c", read], capture_output=True, text=True, timeout=HANG_S, cwd=ROOT,
                          env={**os.environ, **THIS_RECIPE})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["['scheduler']", "['batch_size',", "'hidden',", "'lr',", "'max_epochs',",
                                   "'momentum',", "'optimizer',", "'weight_decay']"]


@pytest.mark.slow
def test_the_benchmark_runs_on_a_small_example_of_this_recipe(tmp_path):
    """The recipe holds 5,000 images out for validation; its example data of a few hundred takes a share instead."""
    done = run_script("benchmark.py", "--example-data", "400", "--epochs", "1", "--only", "hand", "--out",
                      str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "| hand-written tensor loop |" in done.stdout
