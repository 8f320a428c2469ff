"""The template's own callbacks in a real Trainer, in this process, on a module whose losses are known: what each
one measures, logs, prints or refuses. Times are injected: no assertion reads how fast this machine is."""

from __future__ import annotations

import itertools
import logging
import types
import warnings

import lightning as L
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics.classification import MulticlassAccuracy

from project.errors import NonFiniteLossError, UserError
from project.training import callbacks as cb


class KnownLosses(L.LightningModule):
    """Learns nothing (its one weight has LR 0): optimizer step ``k``'s loss is ``losses[k]``, logged as
    ``train/loss``; with ``per_call`` > 1, that many optimizer steps a Lightning step, their losses returned together
    (as the engine's steps per call do)."""

    def __init__(self, losses: list[float], per_call: int = 1, samples: int = 12, schedule_steps: int = 0,
                 half_right: bool = False) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.losses, self.per_call, self.samples, self.schedule_steps = losses, per_call, samples, schedule_steps
        self.automatic_optimization = per_call == 1
        self.train_acc = MulticlassAccuracy(num_classes=2, average="micro")
        self.half_right = half_right  # each step: one of two predictions right, counted in train_acc
        self.calls = 0

    def optimizer_steps(self) -> int:
        return int(self.trainer.estimated_stepping_batches)

    def training_step(self, batch, batch_idx):
        self.calls += 1
        first = self.global_step
        if self.half_right:
            self.train_acc.update(torch.tensor([0, 1]), torch.tensor([0, 0]))
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
        optimizer = torch.optim.SGD(self.parameters(), lr=0.0)
        if not self.schedule_steps:
            return optimizer
        schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2) if self.schedule_steps < 0 else \
            torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=self.schedule_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def train_dataloader(self):  # batches of 4: 3 steps an epoch for the 12 samples
        return DataLoader(TensorDataset(torch.zeros(self.samples, 1), torch.zeros(self.samples)), batch_size=4)

    def val_dataloader(self):
        return DataLoader(TensorDataset(torch.zeros(4, 1), torch.zeros(4)), batch_size=4)


def fit(module: L.LightningModule, callbacks: list, ckpt_path: str | None = None, **trainer: object) -> L.Trainer:
    settings = dict(accelerator="cpu", max_epochs=2, logger=False, enable_checkpointing=False,
                    enable_model_summary=False, enable_progress_bar=False, num_sanity_val_steps=0)
    runner = L.Trainer(callbacks=callbacks, **{**settings, **trainer})
    runner.fit(module, ckpt_path=ckpt_path)
    return runner


@pytest.fixture
def clock(monkeypatch):
    """The callbacks' clock, set by the test: ``clock.times`` are the readings it gives, in order."""
    readings = types.SimpleNamespace(times=[])
    monkeypatch.setattr(cb, "time", types.SimpleNamespace(perf_counter=lambda: readings.times.pop(0)))
    return readings


def test_epoch_stats_time_the_training_batches_and_count_their_samples(clock):
    """Each epoch from its start to its validation's start: the clock read twice an epoch, validation left out."""
    clock.times = [100.0, 102.5, 200.0, 204.0]
    stats = cb.EpochStats()
    runner = fit(KnownLosses([1.0] * 6), [stats])
    assert stats.epoch_times == [2.5, 4.0]
    assert (stats.last["train/epoch_time_s"], stats.last["train/samples_per_s"]) == (4.0, 3.0)
    assert stats.last["train/peak_memory_mb"] > 0  # this process's peak, on the CPU
    assert float(runner.callback_metrics["train/samples_per_s"]) == 3.0  # 12 samples in 4 s, logged
    assert float(runner.callback_metrics["train/epoch_time_s"]) == 4.0
    assert clock.times == []


def test_epoch_stats_of_a_run_without_validation_end_with_the_epoch(clock):
    clock.times = [1.0, 2.0, 3.0, 5.0]
    stats = cb.EpochStats()
    fit(KnownLosses([1.0] * 6), [stats], limit_val_batches=0)
    assert stats.epoch_times == [1.0, 2.0] and stats.last["train/samples_per_s"] == 6.0


def test_epoch_stats_start_an_epoch_resumed_mid_way_at_its_first_batch(clock):
    """Lightning calls no ``on_train_epoch_start`` for an epoch resumed mid-way: the first batch starts the clock."""
    clock.times = [10.0, 13.0]
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


def test_epoch_lines_say_each_epochs_mean_step_loss_and_its_validation(capsys, clock):
    clock.times = [1.0, 3.5, 10.0, 11.5]
    fit(KnownLosses([1.0, 2.0, 6.0, 0.5, 0.25, 0.25], half_right=True), [cb.EpochLines()])
    assert capsys.readouterr().err.strip().splitlines() == [
        "epoch 1/2  step 3  train/loss 3.0000  train/acc 0.5000  val/loss 0.5000  2.5 s",
        "epoch 2/2  step 6  train/loss 0.3333  train/acc 0.5000  val/loss 0.5000  1.5 s"]


def test_epoch_lines_count_each_optimizer_step_of_a_call(capsys, clock):
    """With several steps per call a Lightning step returns one loss per optimizer step: each is a step."""
    clock.times = [5.0, 5.25]
    fit(KnownLosses([1.0, 2.0, 3.0, 6.0, 0.0, 0.0, 3.0, 3.0, 3.0], per_call=3), [cb.EpochLines()], max_epochs=1)
    assert capsys.readouterr().err.strip() == "epoch 1/1  step 9  train/loss 2.3333  val/loss 0.5000  0.2 s"


def test_epoch_lines_start_an_epoch_resumed_mid_way_at_its_first_batch(capsys, clock):
    clock.times = [7.0, 9.0]
    lines, runner = cb.EpochLines(), L.Trainer(accelerator="cpu", logger=False, max_epochs=3)
    lines.on_train_batch_start(runner, None, None, 5)  # no on_train_epoch_start came
    lines.on_train_batch_end(runner, None, {"loss": torch.tensor([1.0, 2.0])}, None, 5)
    lines.on_train_batch_end(runner, None, torch.tensor(6.0), None, 6)
    lines.on_train_batch_start(runner, None, None, 7)  # the epoch is under way: nothing starts again
    lines.on_train_batch_end(runner, None, None, None, 7)  # a step that returned nothing
    lines.on_train_epoch_end(runner, None)
    assert capsys.readouterr().err.strip() == "epoch 1/3  step 0  train/loss 3.0000  2.0 s"


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


@pytest.mark.parametrize(("deferred", "log_every", "stopped_after"), [
    (None, 4, 3), (False, 4, 3), (True, 4, 4), (True, 5, 5), (True, 1000, 6),
], ids=["by-default", "every-step", "at-a-logging-step", "at-another-logging-step", "at-the-epochs-end"])
def test_a_non_finite_loss_stops_the_run_naming_its_first_step(deferred, log_every, stopped_after):
    """On the CPU every step is checked; deferred (an accelerator's way) the flag is read at logging steps and at the
    epoch's end, and names the first bad step whenever it is read."""
    losses = [1.0, 1.0, float("nan"), float("inf"), 1.0, 1.0, 1.0, 1.0]
    module = KnownLosses(losses, samples=24)  # 6 steps an epoch
    with pytest.raises(NonFiniteLossError) as stopped:
        guard = cb.FiniteLossGuard() if deferred is None else cb.FiniteLossGuard(deferred=deferred)
        fit(module, [guard], log_every_n_steps=log_every)
    assert str(stopped.value) == ("training loss became non-finite at epoch 0, step 3; stopped before saving it "
                                  "(lower --lr, or try --precision 32); the last good checkpoint is kept")
    assert module.calls == stopped_after


def test_a_guard_reads_the_losses_a_step_returns_bare():
    runner = L.Trainer(accelerator="cpu", logger=False)
    cb.FiniteLossGuard().on_train_batch_end(runner, None, torch.tensor([1.0, 2.0]), None, 0)
    with pytest.raises(NonFiniteLossError, match=r"at epoch 0, step 0;"):  # the second of two losses ending at step 0
        cb.FiniteLossGuard().on_train_batch_end(runner, None, torch.tensor([1.0, float("nan")]), None, 0)


def test_a_deferred_guard_reads_its_flag_before_a_checkpoint_is_saved(tmp_path):
    module = KnownLosses([1.0, float("nan"), 1.0, 1.0, 1.0, 1.0], samples=24)
    saving = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=3, save_top_k=-1)
    with pytest.raises(NonFiniteLossError, match=r"at epoch 0, step 2;"):
        fit(module, [cb.FiniteLossGuard(deferred=True), saving], log_every_n_steps=1000, enable_checkpointing=True)
    assert module.calls == 3 and list(tmp_path.iterdir()) == []


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


def test_a_restored_schedule_must_span_the_steps_this_run_takes(tmp_path):
    first = fit(KnownLosses([1.0] * 9, schedule_steps=6), [cb.ScheduleResumeCheck()], max_epochs=1)
    first.save_checkpoint(tmp_path / "one-epoch.ckpt")
    with pytest.raises(UserError) as refused:
        fit(KnownLosses([1.0] * 9, schedule_steps=9), [cb.ScheduleResumeCheck()], str(tmp_path / "one-epoch.ckpt"),
            max_epochs=3)
    assert str(refused.value) == ("the checkpoint's LR schedule spans 6 steps but these settings give 9; resume with "
                                  "the settings it was trained with, or start a new run from its weights with "
                                  "--init-from")
    check, resumed = cb.ScheduleResumeCheck(), KnownLosses([1.0] * 9, schedule_steps=6)
    fit(resumed, [check], str(tmp_path / "one-epoch.ckpt"), max_epochs=2)
    assert resumed.calls == 3
    fit(KnownLosses([1.0] * 9, schedule_steps=9), [check], max_epochs=1)  # the same callback, a fresh fit: no check
    stepped = fit(KnownLosses([1.0] * 9, schedule_steps=-1), [], max_epochs=1)  # a schedule of no fixed length
    stepped.save_checkpoint(tmp_path / "stepped.ckpt")
    fit(KnownLosses([1.0] * 9, schedule_steps=-1), [cb.ScheduleResumeCheck()], str(tmp_path / "stepped.ckpt"),
        max_epochs=3)
    unscheduled = cb.ScheduleResumeCheck()
    unscheduled.on_load_checkpoint(None, None, {"lr_schedulers": []})
    unscheduled.on_train_start(None, None)  # a checkpoint without a schedule: nothing to compare


@pytest.fixture
def lightning_loggers():
    """The loggers' levels as they were, put back after the test."""
    names = ("lightning.pytorch", "lightning.fabric", "torch.utils.cpp_extension")
    levels = {name: logging.getLogger(name).level for name in names}
    yield
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


KNOWN_NOISE = [
    "The 'train_dataloader' does not have many workers which may be a bottleneck.",
    "The number of training batches (3) is smaller than the logging interval Trainer(log_every_n_steps=50).",
    "`isinstance(treespec, LeafSpec)` is deprecated, use `isinstance(treespec, TreeSpec) and treespec.is_leaf()`",
    "Using ModelCheckpoint with manual optimization and every_n_train_steps, the checkpoint is saved after the step",
    "torch.distributed.nn.functional.all_gather is deprecated",
    "Previous log files in this directory will be deleted when the new ones are saved",
    "Checkpoint directory /runs/x/checkpoints exists and is not empty.",
    "Restarting mid-epoch: your dataloader is not resumable",
    "The `srun` command is available on your system but is not used.",
]


def test_the_known_noise_is_silenced_and_nothing_else(lightning_loggers):
    fresh = {name: logging.StreamHandler() for name in ("lightning.pytorch", "lightning.fabric")}
    for name, handler in fresh.items():
        logging.getLogger(name).addHandler(handler)
    try:
        for _ in range(3):  # a sweep's trials, each a run
            cb.quiet_known_warnings()
    finally:
        for name, handler in fresh.items():
            logging.getLogger(name).removeHandler(handler)
    assert [sum(isinstance(f, cb._DropAdverts) for f in handler.filters) for handler in fresh.values()] == [1, 1]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cb.quiet_known_warnings()
        for message in KNOWN_NOISE:
            warnings.warn(message, UserWarning, stacklevel=1)
        warnings.warn("a warning of the run's own", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["a warning of the run's own"]
    assert logging.getLogger("torch.utils.cpp_extension").level == logging.ERROR


def test_a_sweep_hears_only_lightnings_warnings(lightning_loggers):
    with warnings.catch_warnings():
        cb.quiet_lightning_info()
    assert logging.getLogger("lightning.pytorch").level == logging.WARNING
    assert logging.getLogger("lightning.fabric").level == logging.WARNING


def _recorder(engine: bool, hooks: tuple[str, ...], calls: list, base: type = L.Callback) -> L.Callback:
    """A callback that records each of ``hooks`` it receives; ``engine``: defined in the engine's packages."""
    def hook(name):
        return lambda self, *args, **kwargs: calls.append((self.name, name))

    kind = type("Recorder", (base,), {name: hook(name) for name in hooks})
    kind.__module__ = "project.training.recorded" if engine else "tests.recorded"
    callback = kind()
    callback.name = f"{'engine' if engine else 'user'}-{len(calls)}-{id(callback)}"
    return callback


# Each step hook with the arguments Lightning passes it besides the trainer and the module.
STEP_HOOKS = {"on_train_batch_start": (None, 0), "on_before_backward": (None,), "on_after_backward": (),
              "on_train_batch_end": (None, None, 0)}


def _dispatch(callbacks: list, hook: str) -> None:
    """Lightning's own dispatch: the hook of every callback, in order."""
    for callback in callbacks:
        getattr(callback, hook)(None, None, *STEP_HOOKS[hook])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.sets(st.sampled_from(sorted(STEP_HOOKS)))), max_size=8))
def test_grouped_callbacks_receive_every_hook_in_the_order_given(shapes):
    calls: list = []
    callbacks = [_recorder(engine, tuple(sorted(hooks)), calls) for engine, hooks in shapes]
    for index, callback in enumerate(callbacks):
        callback.name = f"c{index}"
    together = cb.grouped(callbacks)
    for hook in STEP_HOOKS:
        _dispatch(callbacks, hook)
    expected, calls[:] = list(calls), []
    for hook in STEP_HOOKS:
        _dispatch(together, hook)
    assert calls == expected
    # Each run of adjacent engine callbacks is one group; a user's callback is never in one.
    flat = [m for c in together for m in (c.members if isinstance(c, cb.CallbackGroup) else (c,))]
    assert flat == callbacks
    assert not any(isinstance(a, cb.CallbackGroup) and isinstance(b, cb.CallbackGroup)
                   for a, b in itertools.pairwise(together))
    assert all(type(m).__module__.startswith("project.") for g in together if isinstance(g, cb.CallbackGroup)
               for m in g.members)


def test_a_group_calls_only_the_members_that_define_a_hook():
    calls: list = []
    quiet, loud = _recorder(True, (), calls), _recorder(True, ("on_train_batch_end",), calls)
    group = cb.CallbackGroup([quiet, loud])
    assert "on_before_backward" not in vars(group)  # Callback's own no-op: nothing to call
    group.on_train_batch_end(None, None, None, None, 0)
    assert calls == [(loud.name, "on_train_batch_end")]


def test_what_lightning_looks_for_or_restores_stays_out_of_a_group():
    class Stateful(L.Callback):
        __module__ = "project.training.stateful"

        def state_dict(self):
            return {"n": 1}

    class First(cb.RunsFirst):
        __module__ = "project.training.first"

    calls: list = []
    for callback in (ModelCheckpoint(), Stateful(), First(), _recorder(False, STEP_HOOKS, calls),
                     _recorder(True, STEP_HOOKS, calls, base=cb.EpochStats)):
        assert not cb.groupable(callback)
        with pytest.raises(TypeError, match=f"CallbackGroup: {type(callback).__name__} must stay one of the "):
            cb.CallbackGroup([callback])
    assert cb.groupable(cb.EpochStats()) and cb.groupable(cb.FiniteLossGuard())


def test_the_templates_callbacks_run_grouped_and_are_found_in_their_group(tmp_path):
    from helpers import tiny_config
    from project.training.build import NoProfiler, build_trainer

    config = tiny_config(tmp_path / "data", tmp_path)
    user = _recorder(False, ("on_train_batch_end",), [])
    trainer = build_trainer(config, [user])
    groups = [c for c in trainer.callbacks if isinstance(c, cb.CallbackGroup)]
    assert groups and user in trainer.callbacks and all(user not in g.members for g in groups)
    assert cb.find_callback(trainer, cb.EpochStats) in groups[0].members + groups[-1].members
    assert cb.find_callback(trainer, type(user)) is user and cb.find_callback(trainer, cb.GpuMemoryFraction) is None
    assert isinstance(trainer.profiler, NoProfiler)
    with trainer.profiler.profile("run_training_batch") as nothing:
        assert nothing is None
    profiled = build_trainer(config.replace(trainer={"profiler": "simple"}))
    assert type(profiled.profiler).__name__ == "SimpleProfiler"  # --trainer.profiler still profiles


def test_a_group_pickles_with_its_members_as_ddp_spawn_sends_it():
    import pickle

    group = cb.CallbackGroup([cb.EpochStats(), cb.FiniteLossGuard()])
    copy = pickle.loads(pickle.dumps(group))
    copy.on_train_batch_end(types.SimpleNamespace(global_step=1), None, torch.tensor(0.5), (None, [1, 2, 3]), 0)
    assert copy.members[0]._samples == 3 and group.members[0]._samples == 0  # the copy's own members
    with pytest.raises(NonFiniteLossError):
        copy.on_train_batch_end(types.SimpleNamespace(global_step=2, current_epoch=0), None,
                                torch.tensor(float("nan")), (None, [1]), 1)
