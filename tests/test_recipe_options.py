"""Early stopping, top-k checkpoints, cosine with warm-up, and resume refusals that write nothing."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import lightning as L
import pytest
import torch

from helpers import tiny_config, tiny_run, train
from project import OPTIMIZERS
from project.config.schema import RunConfig
from project.errors import UsageError, UserError
from project.training import classifier
from project.training.classifier import WarmupCosine, default_warmup
from project.training.tensor_data import planned_steps, train_batches

STEPS_PER_EPOCH = 7  # 200 tiny training images in batches of 32


def schedule(total: int, warmup: int) -> list[float]:
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    scheduler = WarmupCosine(optimizer, total, warmup)
    lrs = []
    for _ in range(total):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs


def test_cosine_warms_up_linearly_then_decays_to_zero() -> None:
    lrs = schedule(total=100, warmup=10)
    assert lrs[:10] == pytest.approx([(i + 1) / 11 for i in range(10)])
    assert lrs[10] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:], strict=False))
    assert lrs[55] == pytest.approx(0.5 * (1 + math.cos(math.pi * 45 / 90)))
    assert lrs[-1] < 1e-3
    assert default_warmup(1000) == 50 and default_warmup(3) == 1
    assert type(default_warmup(1000)) is int  # a count of steps


def test_cosine_ends_at_zero_however_short_its_decay_and_stays_there() -> None:
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    one_step_of_decay = WarmupCosine(optimizer, total_steps=4, warmup_steps=3)
    assert [one_step_of_decay.factor(step) for step in range(5)] == pytest.approx([0.25, 0.5, 0.75, 1.0, 0.0])
    assert WarmupCosine(optimizer, total_steps=10, warmup_steps=2).factor(15) == pytest.approx(0.0)  # past its end


def test_warmup_steps_only_with_cosine() -> None:
    with pytest.raises(UsageError, match="--warmup-steps applies to --scheduler cosine, not onecycle"):
        RunConfig(warmup_steps=5, scheduler="onecycle")


def test_cosine_run_spans_its_steps_and_ends_at_zero(tiny_data: Path, tmp_path: Path) -> None:
    config = tiny_config(tiny_data, tmp_path / "logs", max_epochs=2, scheduler="cosine", warmup_steps=3,
                         steps_per_call=1)
    result = train(config, test=False)
    state = torch.load(result.last_checkpoint, weights_only=True)["lr_schedulers"][0]
    assert (state["total_steps"], state["warmup_steps"], state["last_epoch"]) == (14, 3, 14)
    assert state["_last_lr"][0] == pytest.approx(0.0, abs=1e-12)


def test_save_top_k_keeps_that_many_best_checkpoints(tiny_data: Path, tmp_path: Path) -> None:
    result = train(tiny_config(tiny_data, tmp_path / "logs", max_epochs=3, save_top_k=-1), test=False)
    kept = sorted(p.name for p in Path(result.best_checkpoint).parent.glob("best-*.ckpt"))
    # Named as the progress lines count the epochs: 1 to 3.
    assert len(kept) == 3 and [name[:12] for name in kept] == ["best-epoch01", "best-epoch02", "best-epoch03"]


def test_early_stopping_ends_a_run_that_stopped_improving(tiny_data: Path, tmp_path: Path) -> None:
    # An LR this small leaves val/acc where the first epoch put it: no improvement after it.
    config = tiny_config(tiny_data, tmp_path / "logs", max_epochs=20, lr=1e-12, scheduler="none",
                         early_stopping=2)
    result = train(config, test=False)
    assert result.optimizer_steps == 3 * STEPS_PER_EPOCH


def test_resume_with_another_schedule_length_is_refused_before_anything_is_written(
        tiny_data: Path, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    train(tiny_config(tiny_data, logs, max_epochs=1), test=False)
    before = sorted(p.relative_to(logs) for p in logs.rglob("*"))
    refusal = ("--max-epochs 2: the checkpoint's run trained with --max-epochs 1, and a resume continues that run; "
               "resume with --max-epochs 1, or start a new run from its weights with --init-from ")
    with pytest.raises(UserError) as err:
        train(tiny_config(tiny_data, logs, max_epochs=2, resume="last"))
    assert str(err.value).startswith(refusal)
    assert sorted(p.relative_to(logs) for p in logs.rglob("*")) == before

    done = tiny_run(tiny_data, logs, "--max-epochs", "2", "--resume", "last")
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"train.py: error: {refusal}") and lines[0].endswith("last.ckpt")
    assert sorted(p.relative_to(logs) for p in logs.rglob("*")) == before


def test_planned_steps_follow_lightnings_rules_and_an_empty_limit_is_refused() -> None:
    assert planned_steps(RunConfig(batch_size=32, max_epochs=3), 200, 1) == 21
    limited = RunConfig(batch_size=32, max_epochs=3, trainer={"limit_train_batches": 0.5, "accumulate_grad_batches": 2})
    assert planned_steps(limited, 200, 2) == 3  # 100 per rank: 4 batches, 2 kept, 1 step
    assert planned_steps(RunConfig(batch_size=32, trainer={"max_steps": 5}), 200, 1) == 5
    with pytest.raises(UsageError, match="0.01 of 7 batches per epoch is none; use at least 0.143"):
        train_batches(RunConfig(batch_size=32, trainer={"limit_train_batches": 0.01}), 200, 1)


class MomentumSeen(L.Callback):
    def __init__(self) -> None:
        self.values: list[float] = []

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: object) -> None:
        self.values.append(float(trainer.optimizers[0].param_groups[0]["momentum"]))


@pytest.mark.parametrize(("momentum", "expected"), [(0.9, (0.85, 0.95)), (0.0, (0.0, 0.0))])
def test_one_cycle_cycles_the_momentum_unless_it_is_zero(tiny_data: Path, tmp_path: Path, momentum: float,
                                                         expected: tuple[float, float]) -> None:
    """What the README says trains by default: under one-cycle SGD's momentum runs 0.95 -> 0.85 -> 0.95."""
    seen = MomentumSeen()
    train(tiny_config(tiny_data, tmp_path, max_epochs=2, momentum=momentum, steps_per_call=1), callbacks=[seen],
          test=False)
    assert min(seen.values) == pytest.approx(expected[0], abs=1e-3)
    assert max(seen.values) == pytest.approx(expected[1], abs=1e-3)
    if momentum:
        assert seen.values[0] == pytest.approx(0.95, abs=1e-3) and seen.values[-1] > seen.values[len(seen.values) // 2]


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_the_optimizers_take_torchs_fused_kernels_on_a_cpu_too(name: str) -> None:
    """One pass over each weight per step, where torch has the kernels; SGD's momentum starts as zeros, so a first
    step that a loss scaler skips leaves nothing uninitialised behind."""
    network = torch.nn.Linear(3, 2)
    optimizer, _ = classifier.optimizer_and_schedule(network.parameters(), name, 0.1, 0.9, 0.0, "none", None, 10,
                                                     torch.device("cpu"))
    assert optimizer.defaults["fused"] is True
    if name == "sgd":
        assert all(torch.equal(optimizer.state[p]["momentum_buffer"], torch.zeros_like(p))
                   for p in network.parameters())
    assert classifier.OptimizerSettings(0.1, 0.9, 0.0, torch.device("meta"), False).fused is None  # torch's choice


def test_a_first_step_the_loss_scaler_skips_leaves_fused_sgd_as_if_it_never_came() -> None:
    """What a 16-mixed run's scaler does when the first steps overflow: skipped, they leave no trace."""
    inputs = torch.linspace(-1, 1, 16).reshape(2, 8)
    finals, scales = [], []
    for skipped_first in (True, False):
        torch.manual_seed(0)
        network = torch.nn.Linear(8, 4)
        optimizer, _ = classifier.optimizer_and_schedule(network.parameters(), "sgd", 0.1, 0.9, 5e-4, "none", None,
                                                         10, torch.device("cpu"))
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
        for overflow in (True, False) if skipped_first else (False,):
            loss = network(inputs).square().mean() * (math.inf if overflow else 1.0)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
        scales.append(scaler.get_scale())
        finals.append([*network.parameters(), *(optimizer.state[p]["momentum_buffer"] for p in network.parameters())])
    assert scales == [2.0**15, 2.0**16]  # the overflow was seen, and its step skipped
    assert all(torch.isfinite(t).all() and torch.equal(a, t) for a, t in zip(*finals, strict=True))


def test_cosines_state_is_plain_values_and_its_rates_lambdalrs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Saved as numbers (a checkpoint reads it back with weights_only), stepping as LambdaLR with its factor would."""
    def optimizer() -> torch.optim.Optimizer:
        return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.3)

    cosine, ours = WarmupCosine(first := optimizer(), total_steps=40, warmup_steps=7), []
    reference = torch.optim.lr_scheduler.LambdaLR(second := optimizer(), WarmupCosine(optimizer(), 40, 7).factor)
    for _ in range(45):
        for opt, schedule in ((first, cosine), (second, reference)):
            opt.step()
            schedule.step()
        ours.append((first.param_groups[0]["lr"], second.param_groups[0]["lr"]))
    assert all(a == b for a, b in ours)
    torch.save(cosine.state_dict(), tmp_path / "schedule.pt")
    again = WarmupCosine(optimizer(), total_steps=1, warmup_steps=0)
    again.load_state_dict(torch.load(tmp_path / "schedule.pt", weights_only=True))
    assert (again.total_steps, again.warmup_steps, again.last_epoch) == (40, 7, 45)
    assert not any(callable(value) for value in cosine.state_dict().values())
    # A wrapped factor (as mutmut's trampolines wrap it) does not reach the state: a LambdaLR's would hold it.
    factor = WarmupCosine.factor
    monkeypatch.setattr(WarmupCosine, "factor", functools.wraps(factor)(lambda self, step: factor(self, step)))
    torch.save(WarmupCosine(optimizer(), 40, 7).state_dict(), tmp_path / "wrapped.pt")
