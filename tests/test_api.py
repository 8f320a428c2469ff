"""``project.api``: the recipe is a value, so one process trains two recipes, each exactly as ``train.py`` does."""

import pytest
import torch

from helpers import HANG_S, run_script, tiny_recipe
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
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_S)
    assert done.stdout.strip() == "[]", done.stderr


def test_api_predict_returns_the_top_k_classes_the_checkpoints_network_gives(trained, tmp_path):
    """``api.predict(..., topk=3)``: each file's three likeliest classes, against the network's own softmax."""
    from PIL import Image

    from tests.tiny_recipe.data import TinyDataModule
    from tests.tiny_recipe.model import LitTiny

    torch.manual_seed(1)
    pixels = (torch.rand(2, 28, 28) * 200).to(torch.uint8)
    for index, image in enumerate(pixels):
        Image.fromarray(image.numpy(), "L").save(tmp_path / f"{index}.png")
    ckpt = trained["results"]["best_checkpoint"]
    rows = api.predict(tiny_recipe(), [str(tmp_path)], ckpt=ckpt, topk=3)
    module = LitTiny.load_from_checkpoint(ckpt, map_location="cpu").eval()  # Lightning's loader, not the engine's
    mean, std = TinyDataModule.mean[0], TinyDataModule.std[0]
    assert [row["path"] for row in rows] == [str(tmp_path / "0.png"), str(tmp_path / "1.png")]
    for row, image in zip(rows, pixels, strict=True):
        with torch.no_grad():
            expected = torch.softmax(module(((image.float() / 255 - mean) / std)[None, None]).float(), dim=1)[0]
        top = expected.topk(3)
        assert [c for c, _ in row["topk"]] == top.indices.tolist() and row["class"] == int(top.indices[0])
        assert [p for _, p in row["topk"]] == pytest.approx(top.values.tolist(), abs=1e-5)
        # Each class by its name beside its index: the tests' recipe names none, so its digits.
        assert row["name"] == str(row["class"]) and row["topk_names"] == [str(c) for c, _ in row["topk"]]
    assert [len(row["topk"]) for row in api.predict(tiny_recipe(), [str(tmp_path)], ckpt=ckpt)] == [1, 1]


@pytest.mark.slow
def test_the_readmes_python_example_runs_as_written_where_train_py_does(tmp_path):
    """Run from another folder, with the data where ``train.py`` would find it (``DATA_DIR``)."""
    import os
    import re
    import subprocess
    import sys

    from helpers import ROOT

    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## From Python"):]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    # Enough images for the recipe's default split (5,000 held out for validation).
    data = api.load_recipe("project.recipe").write_example_data(tmp_path / "data", train=5400, test=200)
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=HANG_S,
                          env={**os.environ, "DATA_DIR": str(data), "PYTHONPATH": str(ROOT),
                               "PROJECT_RECIPE": "project.recipe"})
    assert done.returncode == 0, done.stderr
    trained, evaluated = (float(value) for value in done.stdout.split())
    assert 0 <= trained <= 1 and trained == evaluated  # the same checkpoint on the same test set


def test_load_recipe_names_its_argument_and_why_the_package_is_not_importable(tmp_path):
    """A script elsewhere, run from the folder that holds the package: its sys.path has the script's folder."""
    import os
    import subprocess
    import sys

    from helpers import ROOT

    (tmp_path / "work" / "letters").mkdir(parents=True)
    (tmp_path / "work" / "letters" / "__init__.py").write_text("")
    (tmp_path / "scripts").mkdir()
    script = tmp_path / "scripts" / "go.py"
    script.write_text("from project.api import load_recipe\nload_recipe('letters')\n")

    def run(pythonpath: str) -> str:
        done = subprocess.run([sys.executable, str(script)], cwd=tmp_path / "work", capture_output=True, text=True,
                              timeout=HANG_S, env={**os.environ, "PYTHONPATH": pythonpath})
        return done.stderr.strip().splitlines()[-1]

    assert run(str(ROOT)) == (
        f"project.contract.RecipeError: load_recipe('letters'): no such module 'letters': the current folder "
        f"{tmp_path / 'work'} holds letters/, but this process's sys.path does not (a script's starts at its own "
        "folder): run with PYTHONPATH=. or add the folder to sys.path")
    assert run(f".{os.pathsep}{ROOT}").endswith("load_recipe('letters'): the package has no RECIPE; its __init__.py "
                                               "names its classes in RECIPE = Recipe(...) (project.contract)")
    (tmp_path / "work" / "letters" / "__init__.py").unlink()
    (tmp_path / "work" / "letters").rmdir()
    assert run(str(ROOT)).endswith("load_recipe('letters'): no such module 'letters': no folder on this process's "
                                   "sys.path (PYTHONPATH, the script's folder) holds it, nor is it installed")
