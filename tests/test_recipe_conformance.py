"""Recipe conformance: what any recipe installed as ``project/recipe/`` must do with the engine.

These run on the installed recipe (not the engine tests' own), or on the one ``PROJECT_RECIPE`` names
(``PROJECT_RECIPE=mine pytest tests/test_recipe_conformance.py``), on the small dataset it writes with
its ``example_data``: a swapped-in recipe gets them for free. Each is a real run of the scripts: a
few epochs of training, K = 1 and K > 1 ending bitwise equal, a run killed with SIGKILL and
resumed ending bitwise equal too, ``--fast-dev-run``, ``evaluate.py`` giving training's test
accuracy (from the checkpoint and from ``model.pth``), ``predict.py`` on the test set written as
image files agreeing with ``evaluate.py``, the exported program loading, and the recipe checks
(``scripts/check_recipe.py``: the classic bugs of a recipe's own data and model).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import HANG_S, ROOT, assert_same_training_state, run_script_fitting

INSTALLED = {"PROJECT_RECIPE": os.environ["RECIPE_UNDER_TEST"],  # set by conftest.py
             "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
# Small enough for any example dataset, long enough that a kill lands mid-run: a share for validation,
# batches of 32, a checkpoint every 3 steps.
RUN = ("--val-size", "0.2", "--batch-size", "32", "--max-epochs", "3", "--log-every-n-steps", "4",
       "--checkpoint-every-n-steps", "3", "--accelerator", "cpu")
# Run on the installed recipe: its example data; its test split as image files (PNG, as a user's would be).
WRITE_EXAMPLE = ("import sys, pathlib; from project.contract import installed_recipe; "
                 "installed_recipe().write_example_data(pathlib.Path(sys.argv[1]))")
WRITE_TEST_IMAGES = """
import json, sys
from pathlib import Path
import torch
from PIL import Image
from project.config.schema import RunConfig
from project.contract import installed_recipe
from project.training.build import build_datamodule
recipe = installed_recipe()
data = build_datamodule(RunConfig.for_recipe(recipe, data_dir=sys.argv[1]), recipe)
data.setup("test")
out = Path(sys.argv[2])
out.mkdir(parents=True)
labels = {}
for index in range(len(data.test_set)):
    inputs, target = data.test_set[index]
    pixels = inputs if data.per_sample else data.to_image(inputs.unsqueeze(0))[0]
    array = (pixels.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).squeeze(-1).numpy()
    Image.fromarray(array).save(out / f"{index:05d}.png")
    labels[f"{index:05d}.png"] = int(target)
(out.parent / "labels.json").write_text(json.dumps(labels))
"""


def on_installed(code: str, *args: str) -> None:
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=HANG_S, cwd=ROOT,
                          env={**os.environ, **INSTALLED})
    assert done.returncode == 0, done.stderr
    print(done.stdout, end="")


def script(name: str, *args: str) -> subprocess.CompletedProcess:
    done = run_script_fitting(name, *args, env=INSTALLED, timeout=HANG_S)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def last(logs: Path) -> dict:
    (run,) = [p for p in logs.iterdir() if p.is_dir()]
    (version,) = list(run.iterdir())
    return torch.load(version / "checkpoints" / "last.ckpt", weights_only=True)


@pytest.fixture(scope="session")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The installed recipe's example data, and one run of it at K = 1 (with its exports) the others compare with."""
    root = tmp_path_factory.mktemp("conformance")
    on_installed(WRITE_EXAMPLE, str(root / "data"))
    done = script("train.py", "--data-dir", str(root / "data"), "--logdir", str(root / "k1"), *RUN,
                  "--steps-per-call", "1", "--export-pt2", str(root / "model.pt2"))
    (results,) = (root / "k1").rglob("results.json")
    return {"root": root, "data": root / "data", "logs": root / "k1", "output": done.stdout,
            "results": json.loads(results.read_text()), "run": results.parent}


@pytest.mark.slow
def test_steps_per_call_change_nothing(installed):
    logs = installed["root"] / "k4"
    script("train.py", "--data-dir", str(installed["data"]), "--logdir", str(logs), *RUN, "--steps-per-call", "4")
    assert_same_training_state(last(logs), last(installed["logs"]))


@pytest.mark.slow
def test_a_killed_run_resumes_to_the_same_weights(installed, tmp_path):
    common = ("--data-dir", str(installed["data"]), "--logdir", str(tmp_path), *RUN, "--steps-per-call", "1")
    killed = subprocess.run([sys.executable, str(ROOT / "tests" / "faulty_train.py"), *common], capture_output=True,
                            text=True, timeout=HANG_S, env={**os.environ, **INSTALLED, "STOP_AT": "step-7:KILL"})
    assert killed.returncode == -9, killed.stderr
    assert 0 < last(tmp_path)["global_step"] < last(installed["logs"])["global_step"]
    script("train.py", *common, "--resume", "last")
    assert_same_training_state(last(tmp_path), last(installed["logs"]))


def test_the_recipe_passes_the_recipe_checks():
    """Labels, inputs, augmentation, statistics, leakage, evaluation and learning (scripts/check_recipe.py)."""
    done = script("check_recipe.py", "--max-epochs", "3")
    assert done.stdout.strip().splitlines()[-1] == "all 11 checks passed", done.stdout


def test_fast_dev_run(installed, tmp_path):
    done = script("train.py", "--data-dir", str(installed["data"]), "--logdir", str(tmp_path), "--fast-dev-run",
                  "--val-size", "0.2", "--accelerator", "cpu")
    assert "test/acc" in done.stdout and not list(tmp_path.rglob("*.ckpt"))


def test_evaluate_gives_trainings_test_accuracy_from_the_checkpoint_and_from_model_pth(installed):
    trained = installed["results"]["test/acc"]
    for source in (("--ckpt", "best", "--logdir", str(installed["logs"])),
                   ("--weights", str(installed["run"] / "model.pth"))):
        done = script("evaluate.py", *source, "--data-dir", str(installed["data"]), "--json")
        assert json.loads(done.stdout)["test/acc"] == pytest.approx(trained, abs=1e-6), source


def test_predict_on_the_test_set_as_image_files_agrees_with_evaluate(installed):
    images = installed["root"] / "images" / "test"
    on_installed(WRITE_TEST_IMAGES, str(installed["data"]), str(images))
    labels = json.loads((images.parent / "labels.json").read_text())
    done = script("predict.py", str(images), "--ckpt", "best", "--logdir", str(installed["logs"]))
    rows = [line.split("\t") for line in done.stdout.strip().splitlines()]
    assert len(rows) == len(labels)
    accuracy = sum(int(row[1]) == labels[Path(row[0]).name] for row in rows) / len(rows)
    # An image file holds 8-bit pixels, and a recipe's read_image may crop or centre: two images of slack.
    assert accuracy == pytest.approx(installed["results"]["test/acc"], abs=2 / len(rows) + 1e-9)


def test_the_exported_program_loads_and_classifies(installed):
    check = ("import sys, torch; from project.contract import installed_recipe; "
             "data = installed_recipe().datamodule_class(); "
             "out = torch.export.load(sys.argv[1]).module()(torch.rand(3, *data.input_shape)); "
             "assert out.shape == (3, data.num_classes) and out.isfinite().all(), out")
    on_installed(check, str(installed["root"] / "model.pt2"))
    assert f"portable program {installed['root'] / 'model.pt2'}" in installed["output"]


def test_the_recipe_under_test_is_the_one_named():
    """What the suite says it checks (`pytest -s` prints it): the recipe PROJECT_RECIPE named, else project.recipe."""
    on_installed("from project.contract import installed_recipe; "
                 "print('conformance of the recipe in', installed_recipe().folder)")


def test_the_recipes_presets_and_sweep_space_are_its_own():
    listing = ("import json; from project.contract import installed_recipe; r = installed_recipe(); "
               "print(json.dumps([sorted(r.presets()), (r.folder / 'sweep.yaml').is_file()]))")
    done = subprocess.run([sys.executable, "-c", listing], capture_output=True, text=True, timeout=HANG_S, cwd=ROOT,
                          env={**os.environ, **INSTALLED})
    assert done.returncode == 0, done.stderr
    presets, has_space = json.loads(done.stdout)
    for preset in presets:  # each names only settings and options this recipe has
        script("train.py", "--config", preset, "--print-config")
    if has_space:
        on_installed("from project.contract import installed_recipe; from project.sweeps.study import load_space; "
                     "r = installed_recipe(); load_space(str(r.folder / 'sweep.yaml'), r)")
