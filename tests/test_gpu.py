"""Checks that need a CUDA GPU; they skip cleanly elsewhere (run them with scripts/gpu_smoke.sh)."""

import json
import subprocess
import sys

import lightning as L
import pytest
import torch

from helpers import run_script, summary_value, tiny_run
from project.datamodule import MNISTDataModule
from project.lit_module import LitMNIST

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_check_gpu_lists_the_device_and_benches_it():
    done = run_script("check_gpu.py", "--json", "--bench")
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert info["cuda_available"] and info["device_count"] == torch.cuda.device_count()
    assert info["devices"][0]["name"] == torch.cuda.get_device_name(0)
    assert info["lightning_auto_accelerator"] == "cuda"
    assert any(r["device"] == "cuda:0" and r["tflops"] > 1 for r in info["bench"])


def test_memory_fraction_really_limits_allocation():
    code = (
        "import torch\n"
        "torch.cuda.set_per_process_memory_fraction(0.05, 0)\n"
        "total = torch.cuda.get_device_properties(0).total_memory\n"
        "torch.empty(int(total * 0.03), dtype=torch.uint8, device='cuda')\n"
        "try:\n"
        "    torch.empty(int(total * 0.06), dtype=torch.uint8, device='cuda')\n"
        "except torch.OutOfMemoryError:\n"
        "    print('LIMITED')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "LIMITED" in done.stdout, done.stderr


def test_memory_fraction_flag_applies_to_the_training_process(tiny_mnist, tmp_path):
    # 1e-6 of the GPU is a few hundred KB: too little for even the tiny data set on the device.
    done = tiny_run(tiny_mnist, tmp_path / "logs", "--accelerator", "gpu", "--fast-dev-run",
                    "--gpu-memory-fraction", "0.000001")
    assert done.returncode == 1
    assert "out of memory" in done.stderr and "raise --gpu-memory-fraction" in done.stderr
    assert "Traceback" not in done.stderr
    fine = tiny_run(tiny_mnist, tmp_path / "logs", "--accelerator", "gpu", "--fast-dev-run",
                    "--gpu-memory-fraction", "0.5")
    assert fine.returncode == 0, fine.stderr


def test_16_mixed_uses_a_grad_scaler_and_data_lives_on_the_gpu(tiny_mnist):
    dm = MNISTDataModule(tiny_mnist, batch_size=32, val_size=40)
    trainer = L.Trainer(accelerator="gpu", devices=1, precision="16-mixed", fast_dev_run=True)
    assert isinstance(trainer.precision_plugin.scaler, torch.amp.GradScaler)
    trainer.fit(LitMNIST(), datamodule=dm)
    assert dm.train_set.images.is_cuda and dm.train_set.targets.is_cuda
    x, _ = next(iter(dm.train_dataloader()))
    assert x.is_cuda  # batches are gathered on the device: no host-to-device copy per step


def test_compile_reduce_overhead_runs(tiny_mnist, tmp_path):
    done = tiny_run(tiny_mnist, tmp_path / "logs", "--accelerator", "gpu", "--max-epochs", "1",
                    "--compile", "reduce-overhead", timeout=600)
    assert done.returncode == 0, done.stderr
    assert float(summary_value(done.stdout + done.stderr, "test/acc")) > 0.5
