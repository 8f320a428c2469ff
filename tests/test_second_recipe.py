"""A second recipe through the real scripts, with no engine file edited: the engine works for any recipe.

``tests/second_recipe`` is a small CNN that returns logits (cross-entropy), on 3 x 12 x 16 images of
4 classes that the tests make as tensors (no IDX files). ``swapped_template`` copies the template
and puts it in place of ``project/recipe/``, as a user would.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys

import pytest
import torch
from conftest import BARS
from PIL import Image

from helpers import (
    HANG_S,
    ROOT,
    assert_same_training_state,
    event_accumulator,
    newest_last_checkpoint,
    one_line_error,
    run_in,
)
from project.training.steps_per_call import steps_for

RECIPE_FILES = ROOT / "tests" / "second_recipe"
ENGINE_FILES = [p for p in (ROOT / "project").rglob("*.py") if p.relative_to(ROOT / "project").parts[0] != "recipe"]


def test_the_engine_knows_no_mnist_and_finds_the_recipe_in_one_place():
    mnist = re.compile(r"mnist|\b28\b|784|\bidx\b|\bmlp\b", re.IGNORECASE)
    mentions = [f"{p.relative_to(ROOT)}:{number}: {line.strip()}" for p in ENGINE_FILES
                for number, line in enumerate(p.read_text().splitlines(), 1) if mnist.search(line)]
    assert not mentions
    assert [p.name for p in ENGINE_FILES if "project.recipe" in p.read_text()] == ["contract.py"]
    # The whole swap: three files of the user's, about 110 lines with the example data it writes.
    files = sorted(p.name for p in RECIPE_FILES.glob("*.py"))
    assert files == ["__init__.py", "data.py", "model.py"]
    assert sum(len(p.read_text().splitlines()) for p in RECIPE_FILES.glob("*.py")) < 120


def test_the_recipes_option_is_a_flag_and_a_missing_feature_is_one_line_before_training(second_recipe):
    template, data, logs = second_recipe["template"], second_recipe["data"], second_recipe["root"] / "refused"
    shown = run_in(template, "train.py", "--help").stdout
    assert "--channels" in shown and "--hidden" not in shown and "coloured bars" in shown
    assert "(default: 8, the recipe's)" in shown and "(default: adamw, the recipe's)" in shown  # its own defaults
    refused = run_in(template, "train.py", "--data-dir", str(data), "--logdir", str(logs), "--channels", "16")
    assert refused.returncode == 2  # the CNN unpacks two channel counts: its option check says so
    assert one_line_error(refused.stderr).endswith("--channels: needs exactly 2 sizes, e.g. 8,16; got 1")
    refused = run_in(template, "train.py", "--config", "fast")
    assert one_line_error(refused.stderr).endswith("--config fast: no such file, and not one of the recipe's "
                                                   "presets (it has none)")
    assert not logs.exists()  # refused before anything was written


def _weights(checkpoint: dict) -> dict:
    return checkpoint["state_dict"]


@pytest.mark.parametrize("steps_per_call", ["8", "auto"])
def test_steps_per_call_trains_bitwise_the_same(second_recipe, tmp_path, steps_per_call):
    """auto's K follows the step's time: it is given (2 ms a step, so K = 2 where the run logs every 2 steps), and
    the run groups steps however busy the machine is."""
    template = second_recipe["template"]
    done = subprocess.run([sys.executable, str(template / "tests" / "faulty_train.py"), "--data-dir",
                           str(second_recipe["data"]), "--logdir", str(tmp_path), *BARS, "--steps-per-call",
                           steps_per_call], capture_output=True, text=True, timeout=HANG_S, cwd=template,
                          env={**os.environ, "PROJECT_RECIPE": "project.recipe", "STEP_SECONDS": "0.002"})
    assert done.returncode == 0, done.stderr
    chosen = int(re.search(r"^steps per call (\d+)", done.stdout, re.MULTILINE).group(1))
    log_every = int(BARS[BARS.index("--log-every-n-steps") + 1])
    assert chosen == (8 if steps_per_call == "8" else steps_for(0.002, log_every)) and chosen > 1
    assert_same_training_state(newest_last_checkpoint(tmp_path, "bars"),
                               newest_last_checkpoint(second_recipe["run"].parent.parent, "bars"))
    results = json.loads((tmp_path / "bars" / "version_0" / "results.json").read_text())
    assert results["test/acc"] == second_recipe["results"]["test/acc"]


@pytest.mark.slow
def test_kill_9_mid_run_then_resume_last_is_bitwise_the_same(second_recipe, tmp_path):
    template, data = second_recipe["template"], second_recipe["data"]
    args = ("--data-dir", str(data), "--logdir", str(tmp_path), *BARS)
    killed = subprocess.run([sys.executable, str(template / "tests" / "faulty_train.py"), *args, "--steps-per-call",
                             "8"], capture_output=True, text=True, timeout=HANG_S, cwd=template,
                            env={**os.environ, "PROJECT_RECIPE": "project.recipe", "STOP_AT": "step-17:KILL"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    saved = newest_last_checkpoint(tmp_path, "bars")
    assert 0 < saved["global_step"] < 40  # killed mid-run, from a checkpoint of an earlier step
    resumed = run_in(template, "train.py", *args, "--resume", "last")
    assert resumed.returncode == 0, resumed.stderr
    assert_same_training_state(newest_last_checkpoint(tmp_path, "bars"),
                               newest_last_checkpoint(second_recipe["run"].parent.parent, "bars"))


@pytest.mark.slow
def test_ddp_on_two_cpu_ranks(second_recipe, tmp_path):
    done = run_in(second_recipe["template"], "train.py", "--data-dir", str(second_recipe["data"]), "--logdir",
                  str(tmp_path), *BARS, "--devices", "2", timeout=HANG_S)
    assert done.returncode == 0, done.stderr
    assert "world size 2" in done.stdout
    results = json.loads((tmp_path / "bars" / "version_0" / "results.json").read_text())
    assert results["world_size"] == 2 and results["test/acc"] > 0.5  # 4 classes: chance is 0.25


@pytest.mark.parametrize("extra", [("--fast-dev-run",), ("--precision", "bf16-mixed")])
def test_fast_dev_run_and_bf16_mixed(second_recipe, tmp_path, extra):
    done = run_in(second_recipe["template"], "train.py", "--data-dir", str(second_recipe["data"]), "--logdir",
                  str(tmp_path), *BARS, *extra)
    assert done.returncode == 0, done.stderr
    accuracy = float(re.search(r"^test/acc (\S+)", done.stdout, re.MULTILINE).group(1))
    if extra[0] == "--fast-dev-run":
        assert not tmp_path.exists() or not any(tmp_path.iterdir())  # no logs or files
    else:
        assert "precision bf16-mixed" in done.stdout and accuracy > 0.5
        evaluated = run_in(second_recipe["template"], "evaluate.py", "--logdir", str(tmp_path), "--data-dir",
                           str(second_recipe["data"]), "--json")  # in the run's precision, as its test was
        assert evaluated.returncode == 0, evaluated.stderr
        assert "computed in bf16-mixed, as the run tested" in evaluated.stderr
        assert json.loads(evaluated.stdout)["test/acc"] == pytest.approx(accuracy, abs=1e-4)


def _recipe_model(second_recipe: dict) -> object:
    """The swapped-in recipe's model.py (it imports the same engine as this process)."""
    spec = importlib.util.spec_from_file_location("bars_model", second_recipe["template"] / "project" / "recipe" /
                                                  "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _test_set(second_recipe: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The test images as uint8, as the network sees them (normalised), and their labels."""
    from tests.second_recipe.data import BarsDataModule

    images, labels = torch.load(second_recipe["data"] / "bars" / "test.pt", weights_only=True)
    return images, BarsDataModule(second_recipe["data"]).normalize(images.float() / 255), labels


def test_evaluate_and_the_exports_agree_with_training(second_recipe):
    run, results = second_recipe["run"], second_recipe["results"]
    for source in (("--ckpt", "best"), ("--weights", str(run / "model.pth"))):
        done = run_in(second_recipe["template"], "evaluate.py", *source, "--logdir", str(run.parent.parent),
                      "--data-dir", str(second_recipe["data"]), "--json")
        assert done.returncode == 0, done.stderr
        evaluated = json.loads(done.stdout)
        assert evaluated["test/acc"] == pytest.approx(results["test/acc"], abs=1e-7)
        # The loss of logits is cross-entropy, as in training: log_softmax first, then NLL.
        assert evaluated["test/loss"] == pytest.approx(results["test/loss"], rel=1e-5)
        assert evaluated["samples"] == 100 and len(evaluated["per_class_acc"]) == 4
    network = _recipe_model(second_recipe).CNN()
    network.load_state_dict(torch.load(run / "model.pth", weights_only=True))  # the recipe's own nn.Module
    _, inputs, labels = _test_set(second_recipe)
    with torch.no_grad():
        logits = network.eval()(inputs)
        program = torch.export.load(second_recipe["pt2"]).module()(inputs)
    torch.testing.assert_close(program, logits)
    assert float((logits.argmax(1) == labels).float().mean()) == pytest.approx(results["test/acc"], abs=1e-7)
    assert "portable program" in second_recipe["output"] and "the state_dict of CNN" in second_recipe["output"]


@pytest.mark.parametrize("form", ["as-is", "dark-on-light", "upscaled-3x"])
def test_predict_reads_image_files_the_recipes_way(second_recipe, tmp_path, form):
    """The test set as PNG files, as trained (light bars on dark noise), inverted, or upscaled three times: the
    default read_image turns each back into the training images' form, so predict.py equals the network."""
    images, inputs, labels = _test_set(second_recipe)
    for index in range(40):
        image = Image.fromarray(images[index].permute(1, 2, 0).numpy(), mode="RGB")
        if form == "dark-on-light":
            image = Image.eval(image, lambda v: 255 - v)
        elif form == "upscaled-3x":
            image = image.resize((16 * 3, 12 * 3), Image.Resampling.NEAREST)
        image.save(tmp_path / f"{index:02d}.png")
    done = run_in(second_recipe["template"], "predict.py", str(tmp_path), "--ckpt", "best", "--logdir",
                  str(second_recipe["run"].parent.parent), "--json", "--topk", "4")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["results"]
    predicted = [r["class"] for r in rows]
    for row in rows:  # a logits network's outputs, turned into probabilities: all four sum to one
        assert all(0 <= p <= 1 for _, p in row["topk"]) and sum(p for _, p in row["topk"]) == pytest.approx(1)
    network = _recipe_model(second_recipe).CNN()
    network.load_state_dict(torch.load(second_recipe["run"] / "model.pth", weights_only=True))
    with torch.no_grad():
        expected = network.eval()(inputs[:40]).argmax(1).tolist()
    assert predicted == expected  # the file, read and normalised as training saw it
    assert sum(p == y for p, y in zip(predicted, labels[:40].tolist(), strict=True)) >= 30  # 8 % labels random


def test_tensorboard_figures_show_the_recipes_images(second_recipe):
    events = event_accumulator(second_recipe["run"])
    tags = set(events.Tags()["images"])
    assert {"train/first_batch", "val/confusion_matrix", "test/confusion_matrix", "test/worst_misclassified"} <= tags
    grid = events.Images("train/first_batch")[0]
    assert (grid.width, grid.height) == (8 * (16 + 2) + 2, 4 * (12 + 2) + 2)  # 32 images of 16 x 12, 8 a row
    confusion = events.Images("val/confusion_matrix")[-1]
    assert 4 * 22 < confusion.width < 300 and 4 * 22 < confusion.height < 300  # 4 classes, labelled


@pytest.mark.slow
def test_the_lr_finder_picks_an_lr_the_run_trains_with(second_recipe, tmp_path):
    done = run_in(second_recipe["template"], "train.py", "--data-dir", str(second_recipe["data"]), "--logdir",
                  str(tmp_path), *BARS, "--find-lr")
    assert done.returncode == 0, done.stderr
    assert re.search(r"LR finder: loss within 15% of its lowest up to lr \S+; using \S+ for --scheduler cosine",
                     done.stderr), done.stderr
    results = json.loads((tmp_path / "bars" / "version_0" / "results.json").read_text())
    assert results["test/acc"] > 0.5  # it trains (4 classes: chance is 0.25)


def test_a_sweep_over_the_recipes_option(second_recipe, tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("fixed: {max_epochs: 2, batch_size: 32, lr: 0.05}\n"
                     "params:\n  channels: {type: categorical, choices: ['4,8']}\n"
                     "  steps_per_call: {type: categorical, choices: [4, 1]}\n")
    done = run_in(second_recipe["template"], "sweep.py", "--space", str(space), "--n-trials", "2", "--sampler",
                  "grid", "--workers", "1", "--storage", str(tmp_path / "sweeps.journal"), "--logdir",
                  str(tmp_path / "logs"), "--data-dir", str(second_recipe["data"]), "--accelerator", "cpu")
    assert done.returncode == 0, done.stderr
    assert len(re.findall(r"^trial \d: val/acc", done.stdout, re.MULTILINE)) == 2
    trials = sorted((tmp_path / "logs" / "sweeps" / "bars-sweep" / "trials").iterdir())
    assert len(trials) == 2 and all("channels:\n- 4\n- 8" in (t / "config.yaml").read_text() for t in trials)


@pytest.mark.slow
def test_the_benchmark_trains_every_row_on_the_recipes_samples(second_recipe, tmp_path):
    args = ("--epochs", "1", "--limit", "128", "--batch-size", "32", "--accelerator", "cpu", "--data-dir",
            str(second_recipe["data"]), "--out", str(tmp_path))
    done = run_in(second_recipe["template"], "benchmark.py", *args)
    assert done.returncode == 0, done.stderr
    results = json.loads((tmp_path / "benchmark.json").read_text())
    assert results["recipe"] == "bars" and results["train_samples"] == 128
    # No per-sample dataset in this recipe: the rows that need one are left out, not run on other data.
    assert [row["key"] for row in results["rows"]] == ["hand", "bare", "template-k1", "template-auto"]
    for row in results["rows"]:
        assert row["samples_per_s"] == pytest.approx(128 / row["epoch_s"])
    assert [row["optimizer_steps"] for row in results["rows"] if "optimizer_steps" in row] == [2 * 128 // 32] * 2
    refused = run_in(second_recipe["template"], "benchmark.py", *args, "--only", "article")
    assert refused.returncode == 2 and "needs the recipe's per-sample dataset" in one_line_error(refused.stderr,
                                                                                                 "benchmark.py")
