"""Promises the README and docs make, each checked against a reference computed here, independently of the code
that keeps it: the bugs that break them are one or two lines each (``tests/mutants.py``), so each test is fast."""

from __future__ import annotations

import csv
import math
import os
import signal
import subprocess
import sys
import time

import lightning as L
import optuna
import pytest
import torch
import yaml
from PIL import Image

from helpers import HANG_S, ROOT, TINY, make_tiny_data, tiny_config, tiny_recipe, train
from project.config.schema import RunConfig
from project.reliability import run_folder
from project.reliability.run_folder import roll_back_logs
from project.training.tensor_data import planned_steps


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_tiny_data(tmp_path_factory.mktemp("promises") / "data", wrong_labels=0.1)


# ---------------------------------------------------------------- choosing runs and checkpoints

def test_best_by_file_names_is_the_highest_score(tmp_path):
    """A run written before run.json (no record, no results): its best checkpoint is the best score its names hold."""
    checkpoints = tmp_path / "version_0" / "checkpoints"
    checkpoints.mkdir(parents=True)
    scores = {"best-epoch00-acc0.5000.ckpt": 0.5, "best-epoch01-acc0.9100.ckpt": 0.91,
              "best-epoch02-acc0.7000.ckpt": 0.7, "best-epoch03-acc0.0900.ckpt": 0.09}
    for name in scores:
        (checkpoints / name).write_bytes(b"")
    assert run_folder.best_checkpoint(tmp_path / "version_0").name == max(scores, key=scores.get)


def test_a_run_stopped_by_ctrl_c_is_recorded_as_stopped(data, tmp_path):
    """Ctrl-C (SIGINT) mid-run is a stop where the run can resume, never a failure."""
    from project.errors import Terminated

    class CtrlC(L.Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == 3:
                os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(Terminated, match="stopped by Ctrl-C after step 3"):
        train(tiny_config(data, tmp_path, max_epochs=3, accelerator="cpu", steps_per_call=1), callbacks=[CtrlC()])
    (run,) = run_folder.runs(tmp_path, "tiny")
    assert run.describe() == "stopped at step 3"
    assert run_folder.read_run_record(run.folder)["state"] == "stopped"


def test_a_run_killed_with_kill_9_is_listed_as_killed(data, tmp_path):
    """kill -9 leaves run.json saying running; no process holds the folder, so runs.py says killed."""
    logs = tmp_path / "logs"
    proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "train.py"), "--data-dir", str(data), "--logdir",
                             str(logs), *TINY, "--max-epochs", "200", "--accelerator", "cpu"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    record = logs / "tiny" / "version_0" / "run.json"
    deadline = time.monotonic() + HANG_S
    while not (record.is_file() and run_folder.read_run_record(record.parent).get("step")) and \
            time.monotonic() < deadline:
        time.sleep(0.1)
    assert proc.poll() is None, "the run ended before it could be killed"
    assert run_folder.run_info(record.parent).state == "running"
    proc.kill()
    proc.wait(timeout=HANG_S)
    assert run_folder.read_run_record(record.parent)["state"] == "running"  # nothing could record the kill
    listed = subprocess.run([sys.executable, str(ROOT / "scripts" / "runs.py"), "--logdir", str(logs), "--name",
                             "tiny"], capture_output=True, text=True, timeout=HANG_S)
    assert "killed at step" in listed.stdout, listed.stdout


def test_a_sweeps_best_yaml_holds_its_best_trial(tmp_path):
    from project.sweeps.report import report

    study = optuna.create_study(direction="maximize")
    lr = optuna.distributions.FloatDistribution(1e-4, 1.0, log=True)
    for value, rate in ((0.61, 0.001), (0.97, 0.2), (0.12, 0.9), (0.88, 0.05)):
        study.add_trial(optuna.trial.create_trial(params={"lr": rate}, distributions={"lr": lr}, value=value))
    text = report(study, tiny_recipe(), {"scheduler": "none"}, tmp_path)
    best = yaml.safe_load((tmp_path / "best.yaml").read_text())
    assert best["lr"] == 0.2 and best["scheduler"] == "none"
    lines = text.splitlines()
    assert lines[lines.index("|---:|---:|---|") + 1].startswith("| 1 | 0.9700 |")  # the first row: the best trial


# ---------------------------------------------------------------- resumes

def test_a_resume_cuts_the_csv_back_to_the_rows_below_its_checkpoint(tmp_path):
    """The checkpoint after step N holds what was logged below N; the resumed run logs step N again."""
    with open(tmp_path / "metrics.csv", "w", newline="") as stream:
        writer = csv.writer(stream)
        writer.writerow(["epoch", "step", "train/loss"])
        writer.writerows([0, step, 1 / (step + 1)] for step in range(10))
    roll_back_logs(tmp_path, 6)
    with open(tmp_path / "metrics.csv", newline="") as stream:
        kept = [int(row["step"]) for row in csv.DictReader(stream)]
    assert kept == [0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize(("train_size", "batch", "world", "epochs"), [(520, 32, 1, 2), (520, 32, 2, 3), (64, 32, 1, 2),
                                                                      (33, 32, 1, 1)])
def test_planned_steps_count_a_partial_last_batch(train_size, batch, world, epochs):
    """What a resume checks its schedule against: every batch, the partial last one included, on each rank."""
    config = RunConfig(batch_size=batch, max_epochs=epochs)
    assert planned_steps(config, train_size, world) == math.ceil(math.ceil(train_size / world) / batch) * epochs


def test_steps_per_epoch_count_a_partial_last_batch(data, tmp_path):
    """A real fit's optimizer steps per epoch (200 training images in batches of 32: 7, the last of 8)."""
    result = train(tiny_config(data, tmp_path, max_epochs=2, accelerator="cpu", steps_per_call=4))
    assert torch.load(result.last_checkpoint, weights_only=True)["global_step"] == 2 * math.ceil(200 / 32)
    assert planned_steps(result.config, 200, 1) == 2 * math.ceil(200 / 32)


# ---------------------------------------------------------------- data and evaluation

def test_augmentation_differs_across_epochs_and_repeats_across_a_resume():
    """Seeded by (seed, epoch, sample): another epoch draws anew, a resumed process draws the same."""
    from project.training.tensor_data import Augmented

    samples = [(torch.zeros(1, 4, 4), 0) for _ in range(6)]

    def noise(inputs, generator):
        return inputs + torch.rand(inputs.shape, generator=generator)

    first, resumed = Augmented(samples, noise, seed=3), Augmented(samples, noise, seed=3)
    for index in range(6):
        epoch0, epoch1 = first[(index, 0)][0], first[(index, 1)][0]
        assert not torch.equal(epoch0, epoch1)
        assert torch.equal(epoch1, resumed[(index, 1)][0])
    assert not torch.equal(first[(0, 0)][0], first[(1, 0)][0])  # and each sample its own draw


def test_the_test_loss_is_the_mean_over_samples_not_over_batches(data, tmp_path):
    """80 test images in batches of 32, 32 and 16: the run's test/loss against one pass over the whole set."""
    from project.results.evaluation import evaluate_test_set, load_classifier

    result = train(tiny_config(data, tmp_path, max_epochs=1, accelerator="cpu", eval_batch_size=32, lr=0.05))
    whole = evaluate_test_set(tiny_recipe(), load_classifier(tiny_recipe(), ckpt=result.best_checkpoint), str(data))
    assert whole["samples"] == 80
    assert result.test_metrics["test/loss"] == pytest.approx(whole["test/loss"], rel=1e-5)
    assert result.test_metrics["test/acc"] == pytest.approx(whole["test/acc"], abs=1e-7)


class EvaluationBatches(L.Callback):
    """The size of each batch validated (the sanity check aside) and tested."""

    def __init__(self) -> None:
        self.val: list[int] = []
        self.test: list[int] = []

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if not trainer.sanity_checking:
            self.val.append(len(batch[1]))

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self.test.append(len(batch[1]))


@pytest.mark.parametrize("eval_batch_size", [16, 24])
def test_validation_and_test_run_in_batches_of_eval_batch_size(data, tmp_path, eval_batch_size):
    """--eval-batch-size: 40 validation and 80 test images, read in batches of that size whatever --batch-size is."""
    seen = EvaluationBatches()
    train(tiny_config(data, tmp_path, max_epochs=1, accelerator="cpu", batch_size=32, eval_batch_size=eval_batch_size),
          callbacks=[seen])
    split = [*[eval_batch_size] * (40 // eval_batch_size), *([40 % eval_batch_size] if 40 % eval_batch_size else [])]
    assert seen.val == split
    assert seen.test == [*[eval_batch_size] * (80 // eval_batch_size),
                         *([80 % eval_batch_size] if 80 % eval_batch_size else [])]


def test_a_float_image_whose_brightest_pixel_is_1_is_read_as_0_to_1(tmp_path):
    from project.results.image_files import read_resized

    values = torch.linspace(0, 1, 28 * 28).reshape(28, 28)
    path = tmp_path / "float.tiff"
    Image.frombytes("F", (28, 28), values.numpy().tobytes()).save(path)
    read = read_resized(path, (1, 28, 28))[0]
    assert read.max().item() == 1.0
    assert torch.allclose(read, values, atol=1 / 255)


@pytest.mark.parametrize("size", [(56, 14), (14, 56), (20, 20), (30, 27)])
def test_an_image_is_shrunk_by_area_only_where_it_is_larger_on_both_sides(tmp_path, size):
    from project.results.image_files import read_resized

    generator = torch.Generator().manual_seed(0)
    pixels = torch.randint(0, 256, (size[1], size[0]), dtype=torch.uint8, generator=generator)
    image = Image.frombytes("L", size, pixels.numpy().tobytes())
    path = tmp_path / "image.png"
    image.save(path)
    larger = size[0] >= 28 and size[1] >= 28
    expected = image.resize((28, 28), Image.Resampling.BOX if larger else Image.Resampling.BILINEAR)
    reference = torch.frombuffer(bytearray(expected.tobytes()), dtype=torch.uint8).float().div(255).reshape(28, 28)
    assert torch.equal(read_resized(path, (1, 28, 28))[0], reference)


def test_the_conformance_tests_check_the_recipe_a_user_names():
    """(Without PROJECT_RECIPE, every conformance test of the suite runs on project.recipe.)"""
    env = {k: v for k, v in os.environ.items() if k not in ("PROJECT_RECIPE", "RECIPE_UNDER_TEST")}
    env["PROJECT_RECIPE"] = "tests.second_recipe"
    done = subprocess.run([sys.executable, "-m", "pytest", "-s", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "tests/test_recipe_conformance.py::test_the_recipe_under_test_is_the_one_named"],
                          capture_output=True, text=True, timeout=HANG_S, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"conformance of the recipe in {ROOT / 'tests' / 'second_recipe'}\n" in done.stdout
