"""Checks that need a CUDA GPU; they skip cleanly elsewhere (run them with scripts/gpu_smoke.sh)."""

import json
import subprocess
import sys

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from helpers import (
    HANG_S,
    assert_same_training_state,
    make_tiny_data,
    run_script,
    summary_value,
    tiny_config,
    tiny_run,
    train,
)
from project.hardware.devices import StepMode
from project.training.callbacks import RunsFirst
from tests.tiny_recipe.data import TinyDataModule
from tests.tiny_recipe.model import LitTiny

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
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_S)
    assert "LIMITED" in done.stdout, done.stderr


def test_memory_fraction_counts_the_data_the_run_keeps_on_the_gpu(tmp_path):
    # A 160 MiB cap holds the model, cuBLAS's workspace (32 MiB on Hopper) and a small data set, but not
    # 60,000 images as float32 (188 MB).
    fraction = f"{160 * 2**20 / torch.cuda.get_device_properties(0).total_memory:.8f}"
    small = make_tiny_data(tmp_path / "small")
    fine = tiny_run(small, tmp_path / "logs", "--accelerator", "gpu", "--fast-dev-run",
                    "--gpu-memory-fraction", fraction)
    assert fine.returncode == 0, fine.stderr
    large = make_tiny_data(tmp_path / "large", n_train=60000, n_test=80)
    done = tiny_run(large, tmp_path / "logs", "--accelerator", "gpu", "--fast-dev-run",
                    "--gpu-memory-fraction", fraction)
    assert done.returncode == 1
    assert "out of memory" in done.stderr and "raise --gpu-memory-fraction" in done.stderr
    assert "Traceback" not in done.stderr


def test_16_mixed_uses_a_grad_scaler_and_data_lives_on_the_gpu(tiny_data):
    dm = TinyDataModule(tiny_data, batch_size=32, val_size=40)
    trainer = L.Trainer(accelerator="gpu", devices=1, precision="16-mixed", fast_dev_run=True)
    assert isinstance(trainer.precision_plugin.scaler, torch.amp.GradScaler)
    trainer.fit(LitTiny(), datamodule=dm)
    assert dm.train_set.inputs.is_cuda and dm.train_set.targets.is_cuda
    x, _ = next(iter(dm.train_dataloader()))
    assert x.is_cuda  # batches are gathered on the device: no host-to-device copy per step


class SyncsAreErrorsBetweenLogs(RunsFirst):  # first: LearningRateMonitor syncs at a logging step's start
    """CUDA's sync debug mode set to "error" for every Lightning step that does not end at a logging step or the
    epoch's end, from its start to the next step's start: the step, every callback's hooks, the logger
    connector and progress bar bookkeeping and the next batch's fetch. Off for validation, and restored
    whatever happens (``on_exception``, ``teardown``)."""

    def __init__(self, warm_up_steps: int = 16) -> None:
        self.warm_up_steps = warm_up_steps
        self.previous = torch.cuda.get_sync_debug_mode()
        self.checked_steps = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        step, every = trainer.global_step, trainer.log_every_n_steps
        ends_at = min(step + getattr(pl_module, "steps_per_call", 1), step + every - step % every)  # groups end at logs
        epoch_end = (trainer.current_epoch + 1) * trainer.datamodule.steps_per_epoch()
        free = step >= self.warm_up_steps and ends_at % every != 0 and ends_at < epoch_end
        self.checked_steps += free
        torch.cuda.set_sync_debug_mode("error" if free else self.previous)

    def on_validation_start(self, trainer, pl_module):
        torch.cuda.set_sync_debug_mode(self.previous)

    def on_exception(self, trainer, pl_module, exception):
        torch.cuda.set_sync_debug_mode(self.previous)

    def teardown(self, trainer, pl_module, stage):
        torch.cuda.set_sync_debug_mode(self.previous)


@pytest.mark.parametrize("cuda_graphs", [False, True])
@pytest.mark.parametrize("precision", ["32-true", "16-mixed"])  # 16-mixed: the loss scaler's path too
@pytest.mark.parametrize("steps_per_call", [1, 8])
def test_training_steps_never_wait_for_the_host_between_logging_steps(tiny_data, tmp_path, steps_per_call,
                                                                      precision, cuda_graphs):
    """At default settings (progress bar and logger on), logging every 10 steps; captured steps too."""
    if cuda_graphs and steps_per_call == 1:
        pytest.skip("a graph replays the steps of a group")
    syncs = SyncsAreErrorsBetweenLogs()
    try:
        result = train(tiny_config(tiny_data, tmp_path / "logs", accelerator="gpu", max_epochs=8, batch_size=8,
                                   log_every_n_steps=10, steps_per_call=steps_per_call, precision=precision,
                                   cuda_graphs=cuda_graphs, trainer={"enable_progress_bar": True}), callbacks=[syncs])
    finally:
        torch.cuda.set_sync_debug_mode(syncs.previous)
    assert torch.cuda.get_sync_debug_mode() == syncs.previous
    assert result.optimizer_steps == 8 * 25  # 200 images / 8
    assert result.steps.mode is (StepMode.GRAPHS if cuda_graphs else StepMode.OFF), result.steps.mode_reason
    assert syncs.checked_steps > 0  # some Lightning steps ran under "error": none of them synced


GRAPHED = {"accelerator": "gpu", "max_epochs": 3, "steps_per_call": 8, "log_every_n_steps": 1000}


def checkpoints(tiny_data, folder, **settings):
    every_5 = ModelCheckpoint(dirpath=folder / "every5", filename="{step}", every_n_train_steps=5, save_top_k=-1)
    result = train(tiny_config(tiny_data, folder, **{**GRAPHED, "checkpoint_every_n_steps": 5, **settings}),
                   callbacks=[every_5])
    return result, torch.load(result.last_checkpoint, weights_only=True)


@pytest.mark.parametrize(("optimizer", "scheduler", "precision"), [("sgd", "onecycle", "32-true"),
                                                                   ("sgd", "cosine", "bf16-mixed"),
                                                                   ("adamw", "cosine", "32-true")])
def test_cuda_graphs_train_like_eager_execution(tiny_data, tmp_path, optimizer, scheduler, precision):
    """The default (captured) against --no-cuda-graphs: the same steps, the same weights to float32 roundings."""
    settings = {"optimizer": optimizer, "scheduler": scheduler, "precision": precision,
                "lr": 0.2 if optimizer == "sgd" else 0.01}
    graphed, b = checkpoints(tiny_data, tmp_path / "graphed", **settings)
    eager, a = checkpoints(tiny_data, tmp_path / "eager", cuda_graphs=False, **settings)
    assert graphed.steps.mode is StepMode.GRAPHS and eager.steps.mode is StepMode.OFF
    assert "CUDA graphs on (each optimizer step replayed from one capture)" in graphed.summary()
    assert a["global_step"] == b["global_step"] == 3 * 7
    tolerance = 1e-2 if precision == "bf16-mixed" else 1e-4
    for key in a["state_dict"]:
        torch.testing.assert_close(a["state_dict"][key], b["state_dict"][key], rtol=tolerance, atol=tolerance / 10)
    assert graphed.test_metrics["test/acc"] == pytest.approx(eager.test_metrics["test/acc"], abs=0.03)
    assert graphed.test_metrics["test/loss"] == pytest.approx(eager.test_metrics["test/loss"], rel=0.05)


def test_a_captured_run_resumes_mid_epoch_bitwise(tiny_data, tmp_path):
    _, uninterrupted = checkpoints(tiny_data, tmp_path / "full")
    middle = tmp_path / "full" / "every5" / "step=10.ckpt"  # epoch 1, 3 steps into it (7 steps per epoch)
    resumed_run, resumed = checkpoints(tiny_data, tmp_path / "resumed", resume=str(middle))
    assert resumed_run.steps.mode is StepMode.GRAPHS
    assert_same_training_state(uninterrupted, resumed)


class HugeLossScale(L.Callback):
    """A loss scale so large that fp16's backward overflows: the first steps are skipped until it backs off."""

    def setup(self, trainer, pl_module, stage):
        trainer.precision_plugin.scaler = torch.amp.GradScaler("cuda", init_scale=2.0**24)


def test_16_mixed_captured_skips_the_steps_that_overflow_as_eager_does(tiny_data, tmp_path):
    settings = {**GRAPHED, "precision": "16-mixed"}
    scales, weights = [], []
    for name, graphs in (("graphed", True), ("eager", False)):
        result = train(tiny_config(tiny_data, tmp_path / name, cuda_graphs=graphs, **settings),
                       callbacks=[HugeLossScale()])
        state = torch.load(result.last_checkpoint, weights_only=True)
        scales.append(state["MixedPrecision"]["scale"])
        weights.append(state["state_dict"])
        assert result.steps.mode is (StepMode.GRAPHS if graphs else StepMode.OFF)
    assert scales[0] == scales[1] < 2.0**24  # the same steps skipped, the same backoffs
    for key in weights[0]:
        assert bool(torch.isfinite(weights[0][key]).all())
        torch.testing.assert_close(weights[0][key], weights[1][key], rtol=1e-2, atol=1e-3)


def test_a_network_that_cannot_be_captured_trains_eagerly_with_one_line(tiny_data, tmp_path, monkeypatch, capfd):
    from project.recipe.model import MLP

    forward = MLP.forward

    def syncing(self, x):  # a host sync in the step: .item() cannot be captured
        return forward(self, x) * (1.0 if x.abs().sum().item() >= 0 else 0.0)

    monkeypatch.setattr(MLP, "forward", syncing)
    result = train(tiny_config(tiny_data, tmp_path / "logs", **GRAPHED))
    assert result.steps.mode is StepMode.OFF and result.steps.mode_reason
    assert f"CUDA graphs off ({result.steps.mode_reason})" in result.summary()
    lines = [line for line in capfd.readouterr().err.splitlines() if "CUDA graphs off" in line]
    assert lines == [f"train.py: CUDA graphs off ({result.steps.mode_reason}); the same steps run eagerly"]
    assert result.optimizer_steps == 3 * 7 and result.test_metrics["test/acc"] > 0.3


def test_compile_reduce_overhead_runs_on_cuda_graphs(tiny_data, tmp_path):
    from torch._dynamo.utils import counters

    counters.clear()
    result = train(tiny_config(tiny_data, tmp_path / "logs", accelerator="gpu", max_epochs=1,
                               compile="reduce-overhead", steps_per_call=1))
    assert result.test_metrics["test/acc"] > 0.5
    assert not counters["inductor"].get("cudagraph_skips"), dict(counters["inductor"])
    from torch._inductor import cudagraph_trees

    assert cudagraph_trees.get_container(0).tree_manager is not None  # inductor recorded CUDA graph trees


def test_compile_reduce_overhead_from_the_command_line(tiny_data, tmp_path):
    done = tiny_run(tiny_data, tmp_path / "logs", "--accelerator", "gpu", "--max-epochs", "1",
                    "--compile", "reduce-overhead", timeout=HANG_S)
    assert done.returncode == 0, done.stderr
    assert float(summary_value(done.stdout, "test/acc")) > 0.5


def test_fsdp_on_one_gpu_trains_tests_and_exports(tiny_data, tmp_path):
    """The strategy refused on CPU works where it belongs: one GPU, K = 1 with its reason, a test, the export."""
    done = tiny_run(tiny_data, tmp_path / "logs", "--accelerator", "gpu", "--devices", "1", "--strategy", "fsdp",
                    "--max-epochs", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "steps per call 1 (auto: --strategy fsdp wraps the model's forward" in done.stdout
    results = json.loads((tmp_path / "logs" / "tiny" / "version_0" / "results.json").read_text())
    assert results["best_checkpoint"] and results["last_checkpoint"] and 0 < results["test/acc"] <= 1
    assert float(summary_value(done.stdout, "test/acc")) == pytest.approx(results["test/acc"], abs=1e-4)
