"""``scripts/train.py`` run as a user runs it: a fresh process, real Trainer, real files."""

import re
import subprocess
import sys
import time

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn
from torchvision import datasets, transforms

from conftest import ROOT, run_script

TINY = ("--batch-size", "32", "--log-every-n-steps", "2", "--val-size", "40")
SCALARS = {"train/loss", "train/acc", "val/loss", "val/acc", "test/loss", "test/acc"}


def tiny_run(data_dir, logdir, *extra, timeout=300):
    return run_script("train.py", "--data-dir", str(data_dir), "--logdir", str(logdir), *TINY, *extra,
                      timeout=timeout)


def summary_value(output: str, key: str) -> str:
    match = re.search(rf"^{re.escape(key)}\s+(\S+)", output, re.MULTILINE)
    assert match, f"{key!r} missing from:\n{output}"
    return match.group(1)


def event_tags(run_dir):
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return events


def test_help_is_instant_and_imports_no_torch():
    code = (
        "import runpy, sys\n"
        f"sys.argv = ['train.py', '--help']\n"
        "try:\n"
        f"    runpy.run_path({str(ROOT / 'scripts' / 'train.py')!r}, run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('HEAVY', sorted(m for m in ('torch', 'lightning', 'torchvision') if m in sys.modules))\n"
    )
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    elapsed = time.perf_counter() - started
    assert "--accelerator" in done.stdout and "--precision" in done.stdout
    assert "HEAVY []" in done.stdout
    assert elapsed < 5  # generous for a loaded CI box; measured ~0.1 s


def test_fast_dev_run_exits_zero(tiny_mnist, tmp_path):
    done = tiny_run(tiny_mnist, tmp_path / "logs", "--fast-dev-run")
    assert done.returncode == 0, done.stderr
    assert 0.0 <= float(summary_value(done.stdout + done.stderr, "test/acc")) <= 1.0
    assert not (tmp_path / "logs").exists()  # fast_dev_run writes no logs or checkpoints


@pytest.mark.slow
def test_short_run_writes_scalars_checkpoints_weights_and_resumes(tiny_mnist, tmp_path):
    logdir = tmp_path / "logs"
    done = tiny_run(tiny_mnist, logdir, "--max-epochs", "2", "--scheduler", "none")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    run_dir = logdir / "mnist" / "version_0"
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert "last.ckpt" in checkpoints and any(n.startswith("best-") for n in checkpoints)
    assert (run_dir / "model.pth").is_file()
    assert f"tensorboard --logdir {run_dir}" in output

    events = event_tags(run_dir)
    tags = set(events.Tags()["scalars"])
    assert SCALARS <= tags, tags
    assert {"perf/epoch_time_s", "perf/samples_per_s", "perf/peak_memory_mb", "val/acc_best"} <= tags
    assert any(t.startswith("lr-") for t in tags)
    assert len(events.Scalars("val/acc")) == 2
    # HPARAMS tab: real metric values, not the hp_metric=-1 placeholder
    assert "hp_metric" not in tags
    test_acc = events.Scalars("hp/test_acc")[-1].value
    assert test_acc == pytest.approx(float(summary_value(output, "test/acc")), abs=1e-4)
    hparams_tags = events.PluginTagToContent("hparams")
    assert "_hparams_/session_start_info" in hparams_tags
    experiment = hparams_tags["_hparams_/experiment"]
    assert b"hp/test_acc" in experiment and b"hp/val_acc_best" in experiment and b"batch_size" in experiment

    # checkpoints hold plain hyperparameters only: they load under weights_only=True
    state = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert state["epoch"] == 1 and state["hyper_parameters"]["hidden"] == [128]

    resumed = tiny_run(tiny_mnist, logdir, "--max-epochs", "3", "--scheduler", "none", "--resume", "last")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    new_run = logdir / "mnist" / "version_1"
    assert torch.load(new_run / "checkpoints" / "last.ckpt", weights_only=True)["epoch"] == 2
    assert len(event_tags(new_run).Scalars("val/acc")) == 1  # only the one new epoch was trained

    other_model = tiny_run(tiny_mnist, logdir, "--max-epochs", "4", "--scheduler", "none",
                           "--hidden", "64", "--resume", "last")
    assert other_model.returncode == 1
    assert "the checkpoint has hidden sizes [128], this run asks for [64]" in other_model.stderr
    assert "Traceback" not in other_model.stderr


@pytest.mark.slow
def test_two_process_ddp_with_16_mixed_on_cpu(tiny_mnist, tmp_path):
    done = tiny_run(tiny_mnist, tmp_path / "logs", "--accelerator", "cpu", "--devices", "2",
                    "--precision", "16-mixed", "--max-epochs", "1", timeout=400)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "fp16 mixed precision is not available on CPU; using bf16-mixed" in output
    assert "world size 2" in output
    assert output.count("test/acc ") == 1  # only rank 0 prints the summary
    assert len(list((tmp_path / "logs" / "mnist").iterdir())) == 1


@pytest.mark.slow
def test_default_recipe_reaches_98_percent_and_model_pth_matches(real_data_dir, tmp_path):
    started = time.perf_counter()
    done = run_script("train.py", "--data-dir", str(real_data_dir), "--logdir", str(tmp_path / "logs"),
                      timeout=600)
    wall = time.perf_counter() - started
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    reported = float(summary_value(output, "test/acc"))
    assert reported >= 0.980, output
    print(f"default recipe: test/acc {reported:.4f} in {wall:.1f} s wall")

    # The article's own code: its nn.Sequential, its ToTensor()-only preprocessing.
    article = nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10), nn.LogSoftmax(dim=1))
    article.load_state_dict(torch.load(summary_value(output, "weights"), weights_only=True), strict=True)
    test = datasets.MNIST(real_data_dir, train=False, transform=transforms.ToTensor())
    images = torch.stack([test[i][0] for i in range(len(test))]).reshape(len(test), -1)
    with torch.no_grad():
        accuracy = (article(images).argmax(1) == test.targets).float().mean().item()
    assert accuracy == pytest.approx(reported, abs=2e-4)
