"""The article's FAQ as features: inspect devices, refuse impossible requests, tune, compile, guard."""

import json

import lightning as L
import pytest
import torch

from helpers import RUN_STARTED, event_accumulator, one_line_error, run_script, tiny_config, tiny_run, train
from project.config.schema import RunConfig
from project.errors import NonFiniteLossError, UsageError
from project.hardware.devices import resolve_hardware
from project.hardware.gpu_info import collect
from project.training.tuning import pick_lr

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


def test_check_gpu_facts_match_torch():
    info = collect()
    assert info["cuda_available"] == torch.cuda.is_available()
    assert info["device_count"] == len(info["devices"]) == (torch.cuda.device_count() if not NO_CUDA else 0)
    assert info["torch"] == torch.__version__
    assert info["cpu_cores"] >= 1
    assert json.loads(json.dumps(info)) == info  # what --json prints


IMPOSSIBLE = [
    ({"strategy": "dp"}, "Lightning 2 removed DataParallel"),
    ({"strategy": "warp"}, "'warp' is not a Lightning strategy"),
    pytest.param({"accelerator": "gpu"}, "no CUDA GPU is visible", marks=CPU_ONLY),
    pytest.param({"devices": [0, 1]}, "device indices select GPUs", marks=CPU_ONLY),
    pytest.param({"gpu_memory_fraction": 0.5}, "this run uses cpu", marks=CPU_ONLY),
    pytest.param({"devices": 64}, "only", marks=CUDA_ONLY),
    pytest.param({"devices": [63]}, "GPU index 63 does not exist", marks=CUDA_ONLY),
]


@pytest.mark.parametrize(("settings", "message"), IMPOSSIBLE)
def test_impossible_hardware_requests_are_refused(settings, message):
    with pytest.raises(UsageError, match=message):
        resolve_hardware(RunConfig(**settings))


def test_16_mixed_on_cpu_is_explained_and_scale_lr_uses_the_global_batch(shared_tiny_data, tmp_path, caplog):
    result = train(tiny_config(shared_tiny_data, tmp_path / "logs", fast_dev_run=True, accelerator="cpu",
                               precision="16-mixed", batch_size=512, scale_lr=True))
    assert "fp16 mixed precision is not available on CPU; using bf16-mixed" in caplog.text
    assert "--scale-lr: lr 0.2 x 512/256 = 0.4" in caplog.text
    assert "precision bf16-mixed; lr 0.4" in result.summary()


def test_a_scaled_lr_is_recorded_as_trained_so_its_config_and_its_resume_do_not_scale_it_again(shared_tiny_data,
                                                                                                 tmp_path):
    """``--scale-lr`` sets the LR once: ``config.yaml`` (what ``--config`` repeats) and the checkpoint's record (what
    a resume adopts) hold the LR trained with and the rule off, and the run's result says the same."""
    import yaml

    result = train(tiny_config(shared_tiny_data, tmp_path / "logs", accelerator="cpu", batch_size=512,
                               scale_lr=True, max_epochs=1, steps_per_call=1))
    assert (result.config.lr, result.config.scale_lr) == (0.4, False) and result.lr_scaling.lr == 0.4
    saved = yaml.safe_load(result.config_file.read_text())
    assert (saved["lr"], saved["scale_lr"], saved["batch_size"]) == (0.4, False, 512)
    recorded = torch.load(result.last_checkpoint, weights_only=False)["run_record"]["config"]
    assert (recorded["lr"], recorded["scale_lr"]) == (0.4, False)


@pytest.mark.parametrize("asked, world_size, scales", [("auto", 1, False), ("auto", 2, True), (False, 2, False),
                                                      (True, 1, True), (True, 2, True)])
def test_the_lr_follows_the_global_batch_of_several_processes_unless_told_not_to(asked, world_size, scales):
    assert RunConfig(scale_lr=asked).scales_lr(world_size) is scales


@pytest.mark.slow
@pytest.mark.parametrize("given", [1, 256])
def test_tuner_flags_find_and_use_a_batch_size_and_an_lr(shared_tiny_data, tmp_path, caplog, given):
    result = train(tiny_config(shared_tiny_data, tmp_path / "logs", batch_size=given, max_epochs=1,
                               find_batch_size=True, find_lr=True))
    found = result.config.batch_size
    assert f"global batch {found} = {found} per device" in result.summary()
    # 200 training images: CPU memory never runs out; 100 steps per epoch allow a batch of 2, from below or above
    assert found == 2
    assert ("batch-size finder: --batch-size 2 (stopped at 2, the largest power of two that leaves 100 optimizer "
            f"steps per epoch of 200 training samples; not a memory limit); lr 0.2 x sqrt(2/{given}) = "
            f"{0.2 * (2 / given) ** 0.5:.4g}") in caplog.text
    lr = result.config.lr
    # Data this easy keeps the loss falling to the range test's end: no edge, so the finder keeps the LR it had
    # (the second recipe's test is a pick that trains).
    assert f"LR finder: the loss never turned up before the range test's end (lr 10); keeping lr {lr:.4g} (plot" in \
        caplog.text, caplog.text
    assert lr > 0 and f"; lr {lr:g}" in result.summary()  # the summary shows the LR the run trained with
    assert (result.run_dir / "lr_find.png").stat().st_size > 1000
    assert not list((tmp_path / "logs").glob(".scale_batch_size_*"))  # the tuner cleaned up
    saved = result.config_file.read_text()
    assert f"batch_size: {found}" in saved and "find_lr: false" in saved  # --config repeats it without tuning


def test_the_lr_finder_picks_a_share_of_where_the_loss_turns_up():
    lrs = [10 ** (i / 10 - 4) for i in range(50)]  # 1e-4 .. ~8
    # a descent, two shallow valleys (1.25 then 1.3, within 15%), then a climb
    losses = [2.0 - 0.3 * i / 25 if i < 25 else 1.25 if i < 30 else 1.3 if i < 40 else 1.3 + (i - 39) for i in
              range(50)]
    losses[45] = float("nan")  # diverged: a running average stays NaN from there
    losses[0] = 0.9  # the first point, debiased by Lightning to about half the real loss: no lowest
    edge, lr = pick_lr(lrs, losses, "onecycle")
    assert edge == pytest.approx(lrs[39]) and lr == pytest.approx(lrs[39] / 4)
    assert pick_lr(lrs, losses, "none")[1] == pytest.approx(lrs[39] / 10)
    assert pick_lr(lrs, [float("inf")] * 50, "cosine") is None
    # A loss that jumps straight from its valley to NaN: the edge is the last finite point, not the sweep's end.
    cliff = [2.0 - 0.3 * i / 25 if i < 25 else 1.25 for i in range(40)] + [float("nan")] * 10
    assert pick_lr(lrs, cliff, "onecycle")[0] == pytest.approx(lrs[39])
    # A spike the loss recovers from is no edge: the last LR in the band is.
    spike = [1.25 if i < 30 else 3.0 if i < 33 else 1.3 if i < 45 else 5.0 for i in range(50)]
    assert pick_lr(lrs, spike, "onecycle")[0] == pytest.approx(lrs[44])


@pytest.mark.slow
def test_compile_on_cpu_trains_and_logs(shared_tiny_data, tmp_path):
    result = train(tiny_config(shared_tiny_data, tmp_path / "logs", max_epochs=1, compile="default"))
    assert result.test_metrics["test/acc"] > 0.5  # tiny data is learnable
    tags = set(event_accumulator(result.run_dir).Tags()["scalars"])
    assert {"train/loss", "val/acc", "test/acc"} <= tags
    state = torch.load(result.last_checkpoint, weights_only=True)
    assert "model.layers.0.weight" in state["state_dict"]  # same keys as an uncompiled model


def test_device_stats_and_peak_memory_are_logged(shared_tiny_data, tmp_path):
    result = train(tiny_config(shared_tiny_data, tmp_path / "logs", max_epochs=1, device_stats=True))
    # On CPU: this Python process's resident set (50 MiB at least); on a GPU: what the run allocated there.
    floor = 50 if result.device == "cpu" else 0.1
    ceiling = torch.cuda.get_device_properties(0).total_memory / 2**20 if result.device != "cpu" else 1e6
    assert floor < result.peak_memory_mb < ceiling
    assert f"peak memory {result.peak_memory_mb:.0f} MiB" in result.summary()
    events = event_accumulator(result.run_dir)
    tags = set(events.Tags()["scalars"])
    assert any("DeviceStatsMonitor" in t and "cpu_percent" in t for t in tags), tags
    assert floor < events.Scalars("train/peak_memory_mb")[-1].value < ceiling


FIRST_NON_FINITE = 4  # lr 1e6 on the tiny data: the first non-finite loss (measured with the per-step check)


@pytest.mark.parametrize("deferred", [False, True], ids=["cpu-check", "accelerator-check"])
def test_diverging_training_stops_before_any_checkpoint_holds_broken_weights(shared_tiny_data, tmp_path, deferred,
                                                                              monkeypatch):
    from project.training import build
    from project.training.callbacks import FiniteLossGuard

    # The accelerator's path (flag kept on the device, read at log steps and before saves) forced on CPU.
    monkeypatch.setattr(build, "FiniteLossGuard", lambda: FiniteLossGuard(deferred=deferred))
    config = tiny_config(shared_tiny_data, tmp_path / "logs", max_epochs=3, lr=1e6, scheduler="none",
                         log_every_n_steps=50, checkpoint_every_n_steps=4)
    with pytest.raises(NonFiniteLossError, match="non-finite") as err:
        train(config)
    # Both ways, the first non-finite loss, named by its step: at once on CPU, at the next check (a checkpoint
    # every 4 steps) on the device's path, before any save could hold what came of it.
    assert str(err.value) == (f"training loss became non-finite at epoch 0, step {FIRST_NON_FINITE}; stopped before "
                              "saving it (lower --lr, or try --precision 32); the last good checkpoint is kept")
    for checkpoint in (tmp_path / "logs").rglob("*.ckpt"):
        weights = torch.load(checkpoint, weights_only=True)["state_dict"]
        assert all(torch.isfinite(w).all() for w in weights.values() if w.is_floating_point())


def test_divergence_from_the_command_line_is_one_line_exit_1(shared_tiny_data, tmp_path):
    done = tiny_run(shared_tiny_data, tmp_path / "logs", "--max-epochs", "3", "--lr", "1e6", "--scheduler", "none")
    assert done.returncode == 1
    assert "training loss became non-finite at epoch 0, step" in one_line_error(done.stderr, after=RUN_STARTED)


class CorruptWeightsAt(L.Callback):
    """Puts a NaN into the weights just before optimizer step ``step``: that step's loss was still finite."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if trainer.global_step == self.step:
            with torch.no_grad():
                next(pl_module.parameters()).view(-1)[0] = float("nan")


def test_non_finite_weights_are_never_saved_even_when_the_loss_was_finite(shared_tiny_data, tmp_path):
    config = tiny_config(shared_tiny_data, tmp_path / "logs", max_epochs=2, steps_per_call=1,
                         checkpoint_every_n_steps=1)
    with pytest.raises(NonFiniteLossError, match=r"weights became non-finite \(model\.layers\.0\.weight\) by epoch "
                                                 r"0, step 6; stopped before saving them"):
        train(config, callbacks=[CorruptWeightsAt(5)])
    saved = torch.load(next((tmp_path / "logs").rglob("last.ckpt")), weights_only=True)
    assert saved["global_step"] == 5  # the newest good checkpoint, and nothing after it
    assert all(torch.isfinite(w).all() for w in saved["state_dict"].values() if w.is_floating_point())
