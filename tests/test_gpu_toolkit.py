"""The article's FAQ as features: inspect devices, refuse impossible requests, tune, compile, guard."""

import json

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from test_train_script import summary_value, tiny_run

from conftest import run_script

NO_CUDA = not torch.cuda.is_available()
CPU_ONLY = pytest.mark.skipif(not NO_CUDA, reason="needs a machine without CUDA")
CUDA_ONLY = pytest.mark.skipif(NO_CUDA, reason="needs CUDA")


@pytest.mark.skipif(not NO_CUDA, reason="describes a machine without CUDA")
def test_check_gpu_on_a_cpu_machine_says_so_and_reports_the_cpu():
    done = run_script("check_gpu.py", "--bench")
    assert done.returncode == 0, done.stderr
    assert "torch.cuda.is_available(): False" in done.stdout
    assert "No CUDA GPU is visible" in done.stdout
    assert "Lightning accelerator='auto' picks: cpu" in done.stdout
    cpu_row = next(line for line in done.stdout.splitlines() if line.startswith("cpu ") and "float32" in line)
    assert float(cpu_row.split()[-1]) > 0


def test_check_gpu_json_matches_torch():
    done = run_script("check_gpu.py", "--json")
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert info["cuda_available"] == torch.cuda.is_available()
    assert info["device_count"] == len(info["devices"]) == (torch.cuda.device_count() if not NO_CUDA else 0)
    assert info["torch"] == torch.__version__
    assert info["cpu_cores"] >= 1


INVALID = [
    (["--batch-size", "0"], "--batch-size: must be a positive integer"),
    (["--max-epochs", "-1"], "--max-epochs: must be a positive integer"),
    (["--lr", "0"], "--lr: must be a positive number"),
    (["--hidden", "128,0"], "--hidden: must be a positive integer"),
    (["--optimizer", "rmsprop"], "invalid choice: 'rmsprop'"),
    (["--precision", "17"], "argument --precision: invalid choice: '17'"),
    (["--devices", "0"], "device count must be >= 1"),
    (["--gpu-memory-fraction", "1.5"], "must be in (0, 1]"),
    (["--fast-dev-run", "--resume", "last"], "--fast-dev-run cannot be combined with --resume"),
    (["--strategy", "dp"], "Lightning 2 removed DataParallel"),
    (["--strategy", "warp"], "'warp' is not a Lightning strategy"),
    pytest.param(["--accelerator", "gpu"], "no CUDA GPU is visible", marks=CPU_ONLY),
    pytest.param(["--devices", "0,1"], "device indices select GPUs", marks=CPU_ONLY),
    pytest.param(["--gpu-memory-fraction", "0.5"], "this run uses cpu",
                 marks=CPU_ONLY),
    pytest.param(["--devices", "64"], "only", marks=CUDA_ONLY),
    pytest.param(["--devices", "63,"], "GPU index 63 does not exist", marks=CUDA_ONLY),
]


@pytest.mark.parametrize(("flags", "message"), INVALID)
def test_impossible_requests_get_one_line_and_exit_2(tmp_path, flags, message):
    done = run_script("train.py", "--data-dir", str(tmp_path), "--logdir", str(tmp_path / "logs"), *flags)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("train.py: error:")


def test_16_mixed_on_cpu_is_explained_and_scale_lr_uses_the_global_batch(tiny_mnist, tmp_path):
    done = tiny_run(tiny_mnist, tmp_path / "logs", "--fast-dev-run", "--accelerator", "cpu",
                    "--precision", "16-mixed", "--batch-size", "512", "--scale-lr")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "fp16 mixed precision is not available on CPU; using bf16-mixed" in output
    assert "--scale-lr: lr 0.2 x 512/256 = 0.4" in output
    assert "precision bf16-mixed; lr 0.4" in output


@pytest.mark.slow
def test_tuner_flags_find_and_use_a_batch_size_and_an_lr(tiny_mnist, tmp_path):
    done = tiny_run(tiny_mnist, tmp_path / "logs", "--batch-size", "8", "--max-epochs", "1",
                    "--find-batch-size", "--find-lr")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    found = int(output.split("batch-size finder: using --batch-size ")[1].split()[0])
    assert found > 8
    assert f"global batch {found} = {found} per device" in output
    lr = float(output.split("LR finder: using lr ")[1].split()[0])
    assert lr > 0 and f"; lr {lr:g}" in output  # the summary shows the LR the run trained with
    assert (tmp_path / "logs" / "mnist" / "version_0" / "lr_find.png").stat().st_size > 1000
    assert not list((tmp_path / "logs").glob(".scale_batch_size_*"))  # the tuner cleaned up


@pytest.mark.slow
def test_compile_on_cpu_trains_and_logs(tiny_mnist, tmp_path):
    done = tiny_run(tiny_mnist, tmp_path / "logs", "--max-epochs", "1", "--compile", timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert float(summary_value(output, "test/acc")) > 0.5  # tiny data is learnable
    events = EventAccumulator(str(tmp_path / "logs" / "mnist" / "version_0"))
    events.Reload()
    assert {"train/loss", "val/acc", "test/acc"} <= set(events.Tags()["scalars"])
    state = torch.load(tmp_path / "logs" / "mnist" / "version_0" / "checkpoints" / "last.ckpt", weights_only=True)
    assert "model.layers.0.weight" in state["state_dict"]  # same keys as an uncompiled model


def test_device_stats_and_peak_memory_are_logged(tiny_mnist, tmp_path):
    done = tiny_run(tiny_mnist, tmp_path / "logs", "--max-epochs", "1", "--device-stats")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert float(summary_value(output, "peak memory")) > 50  # MiB of this Python process at least
    events = EventAccumulator(str(tmp_path / "logs" / "mnist" / "version_0"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert any("DeviceStatsMonitor" in t and "cpu_percent" in t for t in tags), tags
    assert events.Scalars("perf/peak_memory_mb")[-1].value > 50


def test_diverging_training_stops_at_the_first_non_finite_loss(tiny_mnist, tmp_path):
    done = tiny_run(tiny_mnist, tmp_path / "logs", "--max-epochs", "3", "--lr", "1e6", "--scheduler", "none")
    assert done.returncode == 1
    assert "training loss became non-finite at epoch 0, step" in done.stderr
    assert "Traceback" not in done.stderr
    for checkpoint in (tmp_path / "logs").rglob("*.ckpt"):
        weights = torch.load(checkpoint, weights_only=True)["state_dict"]
        assert all(torch.isfinite(w).all() for w in weights.values() if w.is_floating_point())
