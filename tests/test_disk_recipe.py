"""Data on disk, first class: a recipe that reads a folder of PNG files sample by sample (``tests/disk_recipe``).

Its datamodule has only ``load_samples`` (torchvision's ``ImageFolder``), reads with two DataLoader
workers and flips training images at random: no flag says so. Every test is a real run of the
scripts on files the recipe's ``example_data`` writes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import HANG_S, ROOT, assert_same_training_state, newest_last_checkpoint, run_script_fitting

DISK = {"PROJECT_RECIPE": "tests.disk_recipe"}
RUN = ("--max-epochs", "3", "--log-every-n-steps", "2", "--checkpoint-every-n-steps", "3", "--accelerator", "cpu")


def script(name: str, *args: str, expect: int = 0) -> subprocess.CompletedProcess:
    done = run_script_fitting(name, *args, env=DISK, timeout=HANG_S)
    assert done.returncode == expect, done.stdout + done.stderr
    return done


@pytest.fixture(scope="session")
def disk_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The shapes as PNG files, and one run on them that the other runs compare with."""
    root = tmp_path_factory.mktemp("disk")
    done = subprocess.run([sys.executable, "-c", "import sys, pathlib; from project.contract import "
                           "installed_recipe; installed_recipe().write_example_data(pathlib.Path(sys.argv[1]))",
                           str(root / "data")],
                          capture_output=True, text=True, cwd=ROOT, env={**os.environ, **DISK, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    trained = script("train.py", "--data-dir", str(root / "data"), "--logdir", str(root / "logs"), *RUN)
    run = root / "logs" / "shapes" / "version_0"
    return {"root": root, "data": root / "data", "logs": root / "logs", "output": trained.stdout,
            "results": json.loads((run / "results.json").read_text())}


def test_files_are_read_per_sample_by_workers_without_a_flag(disk_run):
    assert len(list((disk_run["data"] / "shapes").rglob("*.png"))) == 320 + 80
    assert ("steps per call 1 (auto: the recipe reads its samples one by one from load_samples: a batch per "
            "Lightning step)") in disk_run["output"]
    assert disk_run["results"]["test/acc"] > 0.6  # three shapes: chance is a third
    config = (disk_run["logs"] / "shapes" / "version_0" / "config.yaml").read_text()
    assert "num_workers: 2" in config and "batch_size: 32" in config  # the recipe's own defaults, recorded


@pytest.mark.slow
def test_kill_9_and_resume_end_bitwise_equal_with_workers_and_random_flips(disk_run, tmp_path):
    common = ("--data-dir", str(disk_run["data"]), "--logdir", str(tmp_path), *RUN)
    killed = subprocess.run([sys.executable, str(ROOT / "tests" / "faulty_train.py"), *common], capture_output=True,
                            text=True, timeout=HANG_S, env={**os.environ, **DISK, "STOP_AT": "step-11:KILL"})
    assert killed.returncode == -9, killed.stderr
    assert 0 < newest_last_checkpoint(tmp_path, "shapes")["global_step"] < 24  # mid-run, mid-epoch
    script("train.py", *common, "--resume", "last")
    assert_same_training_state(newest_last_checkpoint(tmp_path, "shapes"),
                               newest_last_checkpoint(disk_run["logs"], "shapes"))


@pytest.mark.slow
def test_two_ddp_ranks_share_the_files_between_them(disk_run, tmp_path):
    done = script("train.py", "--data-dir", str(disk_run["data"]), "--logdir", str(tmp_path), *RUN, "--devices", "2",
                  "--accelerator", "cpu")
    assert "world size 2" in done.stdout
    state = newest_last_checkpoint(tmp_path, "shapes")
    assert state["global_step"] == 3 * 4  # 256 training files, 32 a batch, two ranks: 4 steps an epoch
    assert json.loads((tmp_path / "shapes" / "version_0" / "results.json").read_text())["test/acc"] > 0.5


def test_evaluate_and_predict_read_the_files_as_training_did(disk_run):
    common = ("--logdir", str(disk_run["logs"]))
    evaluated = json.loads(script("evaluate.py", *common, "--data-dir", str(disk_run["data"]), "--json").stdout)
    assert evaluated["test/acc"] == pytest.approx(disk_run["results"]["test/acc"], abs=1e-7)
    test = disk_run["data"] / "shapes" / "test"
    predicted = script("predict.py", *(str(test / shape) for shape in ("bar", "column", "square")), *common)
    rows = [line.split("\t") for line in predicted.stdout.strip().splitlines()]
    # Each row names its class as the recipe does: here, as its class folder is named.
    correct = sum(row[1] == Path(row[0]).parent.name for row in rows)
    assert len(rows) == 80 and correct / 80 == pytest.approx(evaluated["test/acc"], abs=1e-6)


@pytest.mark.slow
def test_the_benchmark_runs_on_the_files(disk_run, tmp_path):
    """The disk path against a hand-written DataLoader over the same files, at the same worker count."""
    script("benchmark.py", "--epochs", "1", "--limit", "64", "--batch-size", "32", "--accelerator", "cpu",
           "--num-workers", "1", "--data-dir", str(disk_run["data"]), "--out", str(tmp_path))
    result = json.loads((tmp_path / "benchmark.json").read_text())
    rows = {row["key"]: row for row in result["rows"]}
    assert list(rows) == ["hand", "hand-samples", "article", "bare", "template-k1", "template-auto"]
    assert result["train_samples"] == 64 and result["num_workers"] == 1
    assert all(row["epoch_s"] > 0 and row["samples_per_s"] == pytest.approx(64 / row["epoch_s"])
               for row in rows.values())
    assert torch.tensor([row["test_acc"] for row in rows.values()]).isfinite().all()
    # Rows that decode PNG files wait for them; each share is of its own epoch.
    assert all(0 < rows[key]["data_wait"] < 1 for key in ("hand-samples", "article", "template-k1"))
    assert rows["hand-samples"]["vs_hand_samples"] == 1.0
    assert rows["template-k1"]["vs_hand_samples"] == pytest.approx(rows["template-k1"]["epoch_s"]
                                                                   / rows["hand-samples"]["epoch_s"])
    table = (tmp_path / "benchmark.md").read_text()
    assert "DataLoader workers 1;" in table and "| vs hand per-sample | vs bare Lightning | waits for data |" in table
    assert rows["template-k1"]["vs_bare"] == pytest.approx(rows["template-k1"]["step_us"] / rows["bare"]["step_us"])
