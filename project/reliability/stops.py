"""How a run stops on SIGTERM, Ctrl-C or SLURM's SIGUSR1: at a point it can resume from exactly, the same step
on every rank.

The signal handler only notes the signal. The run acts on it at safe points: after a training
step (when no validation is due), after the epoch's validation (the epoch-end ``last.ckpt`` is
then the resume point), or between the run's phases (fit, test, export). A validation is never
cut in half, so a resumed run validates exactly when the uninterrupted one did. Under DDP the
ranks agree (an all-reduce of what each saw) before any of them stops, so a signal to any one
rank stops them all after the same step. A second Ctrl-C stops at once.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import SIGTERMException

from project.errors import Terminated
from project.internals import exit_now, stop_as_on_sigterm
from project.reliability.checkpointing import validation_due
from project.reliability.cluster import job_to_requeue, requeue

# SIGUSR1: SLURM's warning before a time limit (sbatch --signal=USR1@SECONDS); the job requeues itself.
# SIGHUP: the terminal went away (a closed window, a dropped ssh session).
NAMES = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "Ctrl-C", signal.SIGUSR1: "SIGUSR1", signal.SIGHUP: "SIGHUP"}


class StopSignals:
    """Notes SIGTERM, SIGINT, SIGUSR1 and SIGHUP for the whole run; ``received`` is the first that came, if any."""

    def __init__(self) -> None:
        self.received: int | None = None

    def note(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT and self.received == signal.SIGINT:
            print("\ninterrupted again: stopping now", file=sys.stderr, flush=True)
            exit_now(128 + signal.SIGINT)
        self.received = self.received or signum

    def install(self) -> None:
        for signum in NAMES:
            signal.signal(signum, self.note)

    def name(self) -> str:
        return NAMES.get(signal.Signals(self.received or signal.SIGTERM), "a signal")

    def terminated(self, what: str) -> Terminated:
        """The exception that ends the run, its message saying what really happened. On SLURM, SIGUSR1
        (the time-limit warning) requeues the job, which continues the run where it stopped."""
        job = job_to_requeue() if self.received == signal.SIGUSR1 else None
        if job is None:
            error = Terminated(f"stopped by {self.name()} {what}")
        else:
            error = self._requeued(job, what.replace(": continue with --resume last", ""))
        error.exit_code = 128 + int(self.received or signal.SIGTERM)
        return error

    def _requeued(self, job: str, what: str) -> Terminated:
        """The stop's line is said before the requeue: srun relays this process's output only until the requeue
        ends its job step, and a line printed after it is lost."""
        line = f"stopped by {self.name()} {what}; requeueing job {job}: it continues from last.ckpt in this folder"
        print(f"train.py: {line}", file=sys.stderr, flush=True)
        failure = requeue(job)
        if failure is not None:
            failed = Terminated(f"requeueing job {job} failed ({failure}): submit it again to continue")
            failed.prefix = "error: "  # the stop was asked for; the requeue that should follow it failed
            return failed
        error = Terminated(line)
        error.said = True  # the requeue SLURM was asked for: said already
        return error

    def check(self, what: str) -> None:
        """Between phases: stop here if a signal came."""
        if self.received is not None:
            raise self.terminated(what)


@contextmanager
def stop_signals() -> Iterator[StopSignals]:
    """The run's handler for its whole length (in the main thread); the previous handlers after."""
    signals = StopSignals()
    try:
        previous = {signum: signal.getsignal(signum) for signum in NAMES}
        signals.install()
    except ValueError:  # not the main thread: leave signals to whoever owns them
        yield signals
        return
    try:
        yield signals
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class StopAtSafePoints(Callback):
    """Acts on a noted signal where the run can resume exactly (see the module's docstring)."""

    def __init__(self, signals: StopSignals) -> None:
        self.signals = signals
        self.stopped_at: int | None = None

    def where(self, resumed: bool) -> str:
        """Where the run stopped, and what to do next, for the one line it ends with."""
        if self.stopped_at is None:
            return "before its first training step; nothing new to save: " + \
                ("continue with --resume last" if resumed else "start it again")
        return f"after step {self.stopped_at}; last.ckpt holds that step: continue with --resume last"

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Lightning registered its own handler, which stops mid-validation; the run's comes back.
        self.signals.install()
        if self._agreed(trainer):
            raise SIGTERMException()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._agreed(trainer) and not validation_due(trainer):
            self.stopped_at = trainer.global_step
            # Lightning's own stop: it raises SIGTERMException once this step's metrics are logged.
            stop_as_on_sigterm(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._agreed(trainer):
            self.stopped_at = trainer.global_step
            trainer.should_stop = True  # fit() ends after this epoch's hooks, its last.ckpt written

    def _agreed(self, trainer: L.Trainer) -> bool:
        seen = self.signals.received is not None
        if trainer.world_size == 1:
            return seen
        flag = torch.tensor([int(seen)], device=trainer.strategy.root_device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        if flag.item() and not seen:
            self.signals.received = signal.SIGTERM  # another rank got it
        return bool(flag.item())
