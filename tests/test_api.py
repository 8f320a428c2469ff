"""``project.api``: the recipe is a value, so one process trains two recipes, each exactly as ``train.py`` does."""

import pytest
import torch

from helpers import run_script, tiny_recipe
from project import api

# Small runs of each recipe on its own example data: one epoch, one optimizer step per Lightning step.
SETTINGS = {"max_epochs": 1, "batch_size": 32, "val_size": 0.2, "steps_per_call": 1, "accelerator": "cpu",
            "log_every_n_steps": 2}


def weights(checkpoint: str) -> dict[str, torch.Tensor]:
    return torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"]


@pytest.mark.slow
def test_two_recipes_train_in_one_process_each_bitwise_as_train_py(tmp_path):
    for package in ("project.recipe", "tests.second_recipe"):
        recipe = api.load_recipe(package)
        data = recipe.write_example_data(tmp_path / package / "data")
        config = api.RunConfig.for_recipe(recipe, data_dir=str(data), logdir=str(tmp_path / package / "api"),
                                          trainer={"enable_progress_bar": False}, **SETTINGS)
        in_process = api.train(config, recipe)
        flags = [f"--{key.replace('_', '-')}={value}" for key, value in SETTINGS.items()]
        done = run_script("train.py", "--data-dir", str(data), "--logdir", str(tmp_path / package / "script"),
                          *flags, env={"PROJECT_RECIPE": package})
        assert done.returncode == 0, done.stderr
        script = sorted((tmp_path / package / "script").rglob("last.ckpt"))
        assert in_process.config.name == recipe.name and len(script) == 1
        mine, theirs = weights(in_process.last_checkpoint), weights(str(script[0]))
        assert mine.keys() == theirs.keys()
        assert all(torch.equal(mine[key], theirs[key]) for key in mine), package
        assert f"test/acc {in_process.test_metrics['test/acc']:.4f}" in done.stdout


def test_a_config_of_another_recipe_is_refused_in_one_line(tmp_path):
    second = api.load_recipe("tests.second_recipe")
    config = api.RunConfig.for_recipe(second, logdir=str(tmp_path))
    with pytest.raises(api.UsageError, match=r"this config holds the options channels, recipe 'tiny' takes hidden"):
        api.train(config, tiny_recipe())
    with pytest.raises(api.UsageError, match="holds the options none"):
        api.train(api.RunConfig(logdir=str(tmp_path)), tiny_recipe())  # the engine's defaults: no recipe at all
    assert not any(tmp_path.iterdir())  # refused before anything is written


def test_the_recipe_contract_is_importable_without_torch():
    import subprocess
    import sys

    code = ("import sys; from project.api import Option, Recipe, RunConfig, load_recipe, sizes; "
            "load_recipe('tests.second_recipe'); print(sorted(m for m in ('torch', 'lightning') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stderr
