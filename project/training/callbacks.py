"""Small callbacks the template adds to Lightning's own, and what a run shows on the terminal: Lightning's known
noise filtered out, one owner for the filters."""

from __future__ import annotations

import logging
import math
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, TQDMProgressBar
from lightning.pytorch.profilers import PassThroughProfiler, Profiler

from project.contract import DEFAULT_RECIPE
from project.errors import NonFiniteLossError
from project.hardware.devices import peak_memory_mb
from project.reliability.checkpointing import check_schedule_length, non_finite_weight

# Harmless for this template: the in-memory loader needs no workers, a small validation
# set gives fewer batches than the logging interval, Lightning's own use of a torch API that
# torch has deprecated is not ours to fix, and with several steps per call a checkpoint is
# meant to hold the state after its step. The test suite applies the same list.
QUIET_WARNINGS = (
    r".*does not have many workers.*",
    r".*is smaller than the logging interval.*",
    r".*isinstance\(treespec, LeafSpec\)` is deprecated.*",
    r".*Using ModelCheckpoint with manual optimization and every_n_train_steps.*",
    r".*torch\.distributed\.nn\.functional\.all_gather is deprecated.*",  # inside Lightning's all_gather
    # A resumed run continues in its own folder by design (its logs cut back to the checkpoint, its
    # metrics.csv appended to), and the datamodule restores the data order mid-epoch exactly.
    r".*Previous log files in this directory will be deleted.*",
    r".*Checkpoint directory .* exists and is not empty.*",
    r".*your dataloader is not resumable.*",
    # On a SLURM login node a run started without srun is meant to run there (slurm/train.sbatch uses srun).
    r".*The `srun` command is available on your system but is not used.*",
)
# Advertising, the tuner's note on reloading its own temporary checkpoint, and Lightning's note on the
# checkpoint saved when a run stops (the run's own stop message says it in one line).
QUIET_LOG_PREFIXES = ("💡 Tip:", "`weights_only` was not set", "An SIGTERMException was raised",
                      "An KeyboardInterrupt was raised")


class _DropAdverts(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(QUIET_LOG_PREFIXES)


def quiet_known_warnings() -> None:
    """Silence, by message, the console noise that says nothing about this template's run."""
    for message in QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=message)
    for name in ("lightning.pytorch", "lightning.fabric"):
        for handler in logging.getLogger(name).handlers:
            if not any(isinstance(kept, _DropAdverts) for kept in handler.filters):  # once, however many runs
                handler.addFilter(_DropAdverts())
    # --compile on a machine without CUDA: inductor says it found no CUDA runtime, which the run knows.
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)


def quiet_lightning_info() -> None:
    """Warnings only from Lightning (a sweep prints one line per trial instead of banners for each)."""
    quiet_known_warnings()
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    logging.getLogger("lightning.fabric").setLevel(logging.WARNING)


NEVER = torch.iinfo(torch.int64).max
CallbackT = TypeVar("CallbackT", bound=Callback)


def log_every(trainer: L.Trainer) -> int:
    """``--log-every-n-steps`` as the Trainer holds it (set by Lightning's logger connector, unseen by a type
    checker)."""
    return int(trainer.log_every_n_steps)  # type: ignore[attr-defined]


# Every hook Lightning calls on each callback (setup, teardown, on_*); state_dict is not one.
HOOKS = tuple(name for name, value in vars(Callback).items()
              if callable(value) and (name.startswith("on_") or name in ("setup", "teardown")))


class FetchClock:
    """Host seconds spent waiting for the next batch: the time a step cannot start because its data is not there.
    ``now`` reads the time (the host's clock; a test's own, to measure what it knows)."""

    def __init__(self, now: Callable[[], float] = time.perf_counter) -> None:
        self.seconds, self.now = 0.0, now

    def timed(self, batches: Iterable) -> Iterator:
        iterator = iter(batches)
        while True:
            began = self.now()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            finally:
                self.seconds += self.now() - began
            yield batch


class FetchProfiler(PassThroughProfiler):
    """Times each fetch of a training batch through Lightning's profiler hooks around it; everything else goes to
    the run's own profiler (``kept``), so that a run keeps its cost of profiling (and its profile)."""

    def __init__(self, clock: FetchClock, kept: Profiler) -> None:
        super().__init__()
        self.clock, self.kept = clock, kept
        self._began: float | None = None

    @classmethod
    def around(cls, trainer: L.Trainer, clock: FetchClock) -> FetchProfiler:
        """The Trainer's profiler, now timing fetches on ``clock`` too."""
        profiler = cls(clock, trainer.profiler)  # type: ignore[attr-defined]  # set by Lightning's connector
        trainer.profiler = profiler  # type: ignore[attr-defined]
        return profiler

    def remove(self, trainer: L.Trainer) -> None:
        """This profiler out of the Trainer's, wherever it is among others wrapped around it since."""
        holder: Profiler = trainer.profiler  # type: ignore[attr-defined]  # set by Lightning's connector
        if holder is self:
            trainer.profiler = self.kept  # type: ignore[attr-defined]
            return
        while isinstance(holder, FetchProfiler):
            if holder.kept is self:
                holder.kept = self.kept
                return
            holder = holder.kept

    def profile(self, action_name: str) -> Any:
        return self.kept.profile(action_name)

    def start(self, action_name: str) -> None:
        if action_name.endswith("train_dataloader_next"):
            self._began = self.clock.now()
        self.kept.start(action_name)

    def stop(self, action_name: str) -> None:
        self.kept.stop(action_name)
        if action_name.endswith("train_dataloader_next") and self._began is not None:
            self.clock.seconds += self.clock.now() - self._began
            self._began = None


class CallbackGroup(Callback):
    """Several callbacks as one, each hook called only on the members that define it.

    Lightning calls every hook of every callback it holds, six of them at each training step,
    about 2 µs a call even where the hook is ``Callback``'s own no-op: a dozen callbacks cost a
    small model a tenth of its step. The template's own callbacks ride in one group; those that
    Lightning looks for or reorders (checkpoints, early stopping, progress bars, tuners), those
    that keep state in a checkpoint (``state_dict``) and ``RunsFirst`` stay on their own.
    """

    def __init__(self, members: list[Callback]) -> None:
        refused = next((m for m in members if not groupable(m)), None)
        if refused is not None:
            raise TypeError(f"CallbackGroup: {type(refused).__name__} must stay one of the Trainer's own callbacks")
        self.members = tuple(members)
        for hook in HOOKS:
            takers = [getattr(m, hook) for m in self.members if getattr(type(m), hook) is not getattr(Callback, hook)]
            if takers:
                setattr(self, hook, _EachHook(takers))  # on this instance: shadows Callback's no-op


class _EachHook:
    """Calls each of ``hooks`` in turn; an object, not a closure, so that it pickles (``ddp_spawn`` sends the
    callbacks to its processes)."""

    def __init__(self, hooks: list[Any]) -> None:
        self.hooks = hooks

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        for hook in self.hooks:
            hook(*args, **kwargs)


def groupable(callback: Callback) -> bool:
    """A plain callback of the engine's: a direct subclass of ``Callback`` that keeps no checkpoint state. A user's
    callbacks (the recipe's included) stay where the user put them, in their order among Lightning's."""
    kind = type(callback)
    engine = kind.__module__.startswith("project.") and not kind.__module__.startswith(f"{DEFAULT_RECIPE}.")
    return engine and Callback in kind.__bases__ and kind.state_dict is Callback.state_dict


def grouped(callbacks: list[Callback]) -> list[Callback]:
    """``callbacks`` with each run of adjacent groupable ones as one ``CallbackGroup``: every hook still reaches
    every callback in the order given."""
    out: list[Callback] = []
    run: list[Callback] = []
    for callback in [*callbacks, None]:
        if callback is not None and groupable(callback):
            run.append(callback)
            continue
        out += [CallbackGroup(run)] if len(run) > 1 else run
        run = []
        if callback is not None:
            out.append(callback)
    return out


def find_callback(trainer: L.Trainer, kind: type[CallbackT]) -> CallbackT | None:
    """The Trainer's callback of type ``kind``, in a ``CallbackGroup`` or not (None: there is none)."""
    for callback in trainer.callbacks:  # type: ignore[attr-defined]  # set by Lightning's connector
        for member in callback.members if isinstance(callback, CallbackGroup) else (callback,):
            if isinstance(member, kind):
                return member
    return None


class RunsFirst(Callback):
    """A callback whose hooks run before every other callback's, for one that watches a whole step
    (a step's first hook must already see what it set). Moved from its place to the front at ``setup``:
    the callbacks after it keep their indices, so Lightning's loop over them skips none."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        callbacks: list[Callback] = trainer.callbacks  # type: ignore[attr-defined]  # set by Lightning's connector
        callbacks.remove(self)
        callbacks.insert(0, self)


class EpochStats(Callback):
    """Logs ``train/epoch_time_s``, ``train/samples_per_s`` and ``train/peak_memory_mb`` per epoch (under
    ``train/``, beside the curves they explain).

    The time covers the training batches only: validation, which Lightning runs before
    ``on_train_epoch_end``, is left out so that samples/s measures training. On a GPU it is
    timed with CUDA events: the device's own clock, read once the epoch's work is done.
    """

    def __init__(self) -> None:
        self._start: float | torch.cuda.Event | None = None
        self._samples = 0
        self.epoch_times: list[float] = []
        self.last: dict[str, float] = {}

    @staticmethod
    def _now(trainer: L.Trainer) -> float | torch.cuda.Event:
        if trainer.strategy.root_device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = self._now(trainer)
        self._samples = 0

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if self._start is None:  # resumed mid-epoch: Lightning calls no on_train_epoch_start for that epoch
            self._start = self._now(trainer)
            self._samples = 0

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self._samples += len(batch[1])

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._stop(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._stop(trainer)
        if self.last:
            # Across DDP ranks: the slowest epoch, the highest peak.
            pl_module.log_dict(self.last, reduce_fx="max", sync_dist=True)

    def _stop(self, trainer: L.Trainer) -> None:
        if self._start is None:
            return
        start, end = self._start, self._now(trainer)
        if isinstance(start, torch.cuda.Event) and isinstance(end, torch.cuda.Event):
            end.synchronize()
            elapsed = start.elapsed_time(end) / 1000
        else:
            assert isinstance(start, float) and isinstance(end, float)  # one device: both events, or both clocks
            elapsed = end - start
        self._start = None
        self.epoch_times.append(elapsed)
        self.last = {
            "train/epoch_time_s": elapsed,
            "train/samples_per_s": self._samples * trainer.world_size / elapsed,
            "train/peak_memory_mb": peak_memory_mb(trainer.strategy.root_device),
        }


class EpochLines(Callback):
    """One plain line per epoch on stderr, in place of the animated bar when nobody watches it: the epoch's mean
    step loss (summed on the device as the steps go, read once at the epoch's end), its training accuracy, and
    the validation that followed it."""

    KEYS = ("train/loss", "train/acc", "val/loss", "val/acc")

    def __init__(self) -> None:
        self._start: float | None = None
        self._loss_sum: torch.Tensor | float = 0.0
        self._steps = 0

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start, self._loss_sum, self._steps = time.perf_counter(), 0.0, 0

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if self._start is None:  # resumed mid-epoch: no on_train_epoch_start
            self._start, self._loss_sum, self._steps = time.perf_counter(), 0.0, 0

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if torch.is_tensor(loss):  # one per optimizer step of this Lightning step
            self._loss_sum = self._loss_sum + loss.detach().float().sum()
            self._steps += loss.numel()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        seconds = time.perf_counter() - (self._start or time.perf_counter())
        self._start = None
        metrics = {key: float(value) for key, value in trainer.callback_metrics.items() if key in self.KEYS}
        if self._steps:
            metrics["train/loss"] = float(self._loss_sum) / self._steps
        train_acc = getattr(pl_module, "train_acc", None)
        if train_acc is not None and train_acc.update_count:
            metrics["train/acc"] = float(train_acc.compute())  # the module logs it after this hook
        if trainer.is_global_zero:
            values = "".join(f"  {key} {metrics[key]:.4f}" for key in self.KEYS if key in metrics)
            print(f"epoch {trainer.current_epoch + 1}/{trainer.max_epochs}  step {trainer.global_step}{values}  "
                  f"{seconds:.1f} s", file=sys.stderr, flush=True)


class LoggedLossBar(TQDMProgressBar):
    """Lightning's progress bar, showing the ``train/loss`` the logger wrote at the last logging step.

    The step loss is logged without ``prog_bar=True``: Lightning converts every progress-bar value
    to a Python number after every step (on a GPU, a host sync per step, even when nothing was
    logged). Read here only at logging steps, where the logger has made the host wait anyway.
    """

    def __init__(self, refresh_rate: int = 25) -> None:
        super().__init__(refresh_rate=refresh_rate)
        self.logged_loss: float | None = None

    def remember_logged_loss(self, trainer: L.Trainer) -> None:
        if trainer.global_step % log_every(trainer) == 0:
            value = trainer.callback_metrics.get("train/loss")
            if value is not None:
                self.logged_loss = float(value)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self.remember_logged_loss(trainer)
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        if self.logged_loss is not None:
            metrics["train/loss"] = f"{self.logged_loss:.3f}"
        return metrics


class QuietWarnings(Callback):
    """The template's warning filters in every process: ``ddp_spawn`` workers start fresh interpreters."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        quiet_known_warnings()


class GpuMemoryFraction(Callback):
    """Caps this process's CUDA caching allocator; under DDP each rank caps its own device."""

    def __init__(self, fraction: float) -> None:
        self.fraction = fraction

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        device = trainer.strategy.root_device
        if device.type == "cuda":
            torch.cuda.set_per_process_memory_fraction(self.fraction, device)


class FiniteLossGuard(Callback):
    """Stops at the first non-finite training loss, and never lets a checkpoint store broken weights.

    On CPU the loss is checked every step, where it is free. On an accelerator the flag stays
    on the device (no per-step sync) and is read at logging steps, at the end of each epoch and
    before every checkpoint; the weights themselves are checked before every save too.
    """

    def __init__(self, deferred: bool = False) -> None:
        self.deferred = deferred  # True: the accelerator's way even on CPU (for tests of that path)
        self._first_bad: torch.Tensor | None = None

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if loss is None:
            return
        # One loss per optimizer step of this Lightning step (several with --steps-per-call).
        if loss.device.type == "cpu" and not self.deferred:
            values = loss.tolist()  # read as they are: a detach and a reshape cost more than the read
            values = values if isinstance(values, list) else [values]
            bad = next((i for i, value in enumerate(values) if not math.isfinite(value)), None)
            if bad is not None:
                self._raise(trainer, trainer.global_step - len(values) + 1 + bad)
            return
        losses = loss.detach().reshape(-1)
        first_step = trainer.global_step - len(losses) + 1
        steps = torch.arange(first_step, trainer.global_step + 1, device=losses.device)
        bad_step = torch.where(torch.isfinite(losses), NEVER, steps).min()
        self._first_bad = bad_step if self._first_bad is None else torch.minimum(self._first_bad, bad_step)
        step = trainer.global_step
        if step % log_every(trainer) == 0:
            self._check(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._check(trainer)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        self._check(trainer)
        broken = non_finite_weight(checkpoint.get("state_dict", {}))
        if broken is not None:
            raise NonFiniteLossError(
                f"weights became non-finite ({broken}) by epoch {trainer.current_epoch}, step "
                f"{trainer.global_step}; stopped before saving them (lower --lr, or try --precision 32); "
                "the last good checkpoint is kept"
            )

    def _check(self, trainer: L.Trainer) -> None:
        if self._first_bad is not None:
            first = int(self._first_bad)
            if first != NEVER:
                self._raise(trainer, first)

    def _raise(self, trainer: L.Trainer, step: int) -> None:
        raise NonFiniteLossError(
            f"training loss became non-finite at epoch {trainer.current_epoch}, step {step}; "
            "stopped before saving it (lower --lr, or try --precision 32); "
            "the last good checkpoint is kept"
        )


class ScheduleResumeCheck(Callback):
    """The last word on a restored schedule's length (``project.reliability.resume`` checks it before the run
    starts where it can predict the steps; this covers what it cannot, e.g. ``max_time``)."""

    def __init__(self) -> None:
        self._restored = False

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        self._restored = bool(checkpoint.get("lr_schedulers"))

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._restored:
            return
        self._restored = False
        for config in trainer.lr_scheduler_configs:
            total = getattr(config.scheduler, "total_steps", None)
            if total is not None:
                check_schedule_length(total, pl_module.optimizer_steps())  # type: ignore[operator]
