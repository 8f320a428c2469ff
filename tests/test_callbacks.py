"""The template's own callbacks in a real Trainer, in this process, on a module whose losses are known: what each
one measures, logs, prints or refuses. Times are injected: no assertion reads how fast this machine is."""

from __future__ import annotations

import logging
import re

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from project.errors import NonFiniteLossError
from project.training import callbacks as cb


class KnownLosses(L.LightningModule):
    """Learns nothing (its one weight has LR 0): optimizer step ``k``'s loss is ``losses[k]``, logged as
    ``train/loss``; with ``per_call`` > 1, that many optimizer steps a Lightning step, their losses returned together
    (as the engine's steps per call do)."""

    def __init__(self, losses: list[float], per_call: int = 1) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.losses, self.per_call = losses, per_call
        self.automatic_optimization = per_call == 1

    def training_step(self, batch, batch_idx):
        first = self.global_step
        if not self.automatic_optimization:
            for _ in range(self.per_call):
                self.optimizers().step()
            return torch.tensor(self.losses[first:first + self.per_call])
        loss = self.weight.sum() * 0 + self.losses[first]
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", torch.tensor(0.5))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.zeros(12, 1), torch.zeros(12)), batch_size=4)  # 3 steps an epoch

    def val_dataloader(self):
        return DataLoader(TensorDataset(torch.zeros(4, 1), torch.zeros(4)), batch_size=4)


def fit(module: L.LightningModule, callbacks: list, **trainer: object) -> L.Trainer:
    settings = dict(accelerator="cpu", max_epochs=2, logger=False, enable_checkpointing=False,
                    enable_model_summary=False, enable_progress_bar=False, num_sanity_val_steps=0)
    runner = L.Trainer(callbacks=callbacks, **{**settings, **trainer})
    runner.fit(module)
    return runner


def test_epoch_stats_time_the_training_batches_and_count_their_samples(monkeypatch):
    """Each epoch from its start to its validation's start: the clock read twice an epoch, validation left out."""
    clock = iter([100.0, 102.5, 200.0, 204.0])
    monkeypatch.setattr(cb.EpochStats, "_now", staticmethod(lambda trainer: next(clock)))
    stats = cb.EpochStats()
    runner = fit(KnownLosses([1.0] * 6), [stats])
    assert stats.epoch_times == [2.5, 4.0]
    assert (stats.last["train/epoch_time_s"], stats.last["train/samples_per_s"]) == (4.0, 3.0)
    assert stats.last["train/peak_memory_mb"] > 0  # this process's peak, on the CPU
    assert float(runner.callback_metrics["train/samples_per_s"]) == 3.0  # 12 samples in 4 s, logged
    assert float(runner.callback_metrics["train/epoch_time_s"]) == 4.0


def test_epoch_stats_start_an_epoch_resumed_mid_way_at_its_first_batch(monkeypatch):
    """Lightning calls no ``on_train_epoch_start`` for an epoch resumed mid-way: the first batch starts the clock."""
    clock = iter([10.0, 13.0])
    monkeypatch.setattr(cb.EpochStats, "_now", staticmethod(lambda trainer: next(clock)))
    stats, runner = cb.EpochStats(), L.Trainer(accelerator="cpu", logger=False)
    batch = (torch.zeros(5, 1), torch.zeros(5))
    stats.on_train_batch_start(runner, None, batch, 0)
    stats.on_train_batch_end(runner, None, None, batch, 0)
    stats.on_train_batch_start(runner, None, batch, 1)  # the clock is not read again
    stats.on_train_batch_end(runner, None, None, batch, 1)
    stats.on_validation_start(runner, None)
    assert stats.epoch_times == [3.0] and stats.last["train/samples_per_s"] == 10 / 3.0
    stats.on_validation_start(runner, None)  # a second validation in the epoch times nothing more
    assert stats.epoch_times == [3.0]


def test_epoch_lines_say_each_epochs_mean_step_loss_and_its_validation(capsys):
    losses = [1.0, 2.0, 6.0, 0.5, 0.25, 0.25]
    fit(KnownLosses(losses), [cb.EpochLines()])
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2, lines
    assert re.fullmatch(r"epoch 1/2  step 3  train/loss 3\.0000  val/loss 0\.5000  \d+\.\d s", lines[0]), lines
    assert re.fullmatch(r"epoch 2/2  step 6  train/loss 0\.3333  val/loss 0\.5000  \d+\.\d s", lines[1]), lines


def test_epoch_lines_count_each_optimizer_step_of_a_call(capsys):
    """With several steps per call a Lightning step returns one loss per optimizer step: each is a step."""
    fit(KnownLosses([1.0, 2.0, 3.0, 6.0, 0.0, 0.0, 3.0, 3.0, 3.0], per_call=3), [cb.EpochLines()], max_epochs=1)
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert re.fullmatch(r"epoch 1/1  step 9  train/loss 2\.3333  val/loss 0\.5000  \d+\.\d s", line), line


def test_the_bar_shows_the_loss_the_logger_wrote_at_its_last_logging_step():
    class Watch(L.Callback):
        def __init__(self, bar):
            self.bar, self.seen = bar, []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.seen.append(self.bar.logged_loss)

    bar = cb.LoggedLossBar()
    watch = Watch(bar)
    runner = fit(KnownLosses([0.0, 1.0, 2.0, 3.0, 4.0, 5.0]), [bar, watch], enable_progress_bar=True,
                 log_every_n_steps=2, max_epochs=2)
    assert watch.seen == [None, 1.0, 1.0, 3.0, 3.0, 5.0]  # read at steps 2, 4 and 6 only
    assert bar.get_metrics(runner, runner.lightning_module)["train/loss"] == "5.000"
    assert "train/loss" not in cb.LoggedLossBar().get_metrics(runner, runner.lightning_module)


@pytest.mark.parametrize("deferred", [False, True], ids=["every-step", "at-logging-steps"])
def test_a_non_finite_loss_stops_the_run_naming_its_first_step(deferred):
    losses = [1.0, 1.0, float("nan"), float("inf"), 1.0, 1.0]
    guard = cb.FiniteLossGuard(deferred=deferred)
    with pytest.raises(NonFiniteLossError) as stopped:
        fit(KnownLosses(losses), [guard], log_every_n_steps=4)
    assert str(stopped.value) == ("training loss became non-finite at epoch 0, step 3; stopped before saving it "
                                  "(lower --lr, or try --precision 32); the last good checkpoint is kept")


@pytest.mark.parametrize("deferred", [False, True], ids=["every-step", "at-the-epochs-end"])
def test_a_guard_names_the_first_bad_step_of_several_in_one_call(deferred):
    """Three optimizer steps a call: steps 4-6 in the second call, 5 the first bad one; deferred and never at a
    logging step, the flag is read at the epoch's end."""
    losses = [1.0, 1.0, 1.0, 1.0, float("nan"), float("nan"), 1.0, 1.0, 1.0]
    with pytest.raises(NonFiniteLossError, match=r"at epoch 0, step 5;"):
        fit(KnownLosses(losses, per_call=3), [cb.FiniteLossGuard(deferred=deferred)], log_every_n_steps=1000,
            max_epochs=1)
    fit(KnownLosses([1.0] * 9, per_call=3), [cb.FiniteLossGuard(deferred=deferred)], max_epochs=1)


def test_weights_made_non_finite_are_never_saved():
    guard, runner = cb.FiniteLossGuard(), L.Trainer(accelerator="cpu", logger=False)
    checkpoint = {"state_dict": {"a.weight": torch.ones(2), "a.steps": torch.tensor([3]),
                                 "b.bias": torch.tensor([0.0, float("inf")])}}
    with pytest.raises(NonFiniteLossError) as refused:
        guard.on_save_checkpoint(runner, None, checkpoint)
    assert str(refused.value) == ("weights became non-finite (b.bias) by epoch 0, step 0; stopped before saving them "
                                  "(lower --lr, or try --precision 32); the last good checkpoint is kept")
    guard.on_save_checkpoint(runner, None, {"state_dict": {"a.weight": torch.ones(2)}})
    guard.on_save_checkpoint(runner, None, {})


def test_runs_first_moves_itself_before_every_other_callback():
    class First(cb.RunsFirst):
        pass

    before, first, after = L.Callback(), First(), L.Callback()
    runner = fit(KnownLosses([1.0] * 3), [before, first, after], max_epochs=1)
    assert runner.callbacks.index(first) == 0
    assert runner.callbacks.index(before) < runner.callbacks.index(after)


def test_lightnings_adverts_are_dropped_and_its_other_lines_kept():
    keep = cb._DropAdverts()
    record = logging.LogRecord("lightning.pytorch", logging.INFO, __file__, 1, "💡 Tip: try LitServe", None, None)
    assert not keep.filter(record)
    for message in ("`weights_only` was not set, defaulting", "An SIGTERMException was raised with", "GPU available"):
        record.msg = message
        assert keep.filter(record) is message.startswith("GPU")
