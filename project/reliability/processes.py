"""The processes of a run: how they stop on a signal, how they end together, how a cluster takes them back.

SIGTERM, Ctrl-C, SIGHUP and SLURM's SIGUSR1 are only noted by the handler; the run stops at the next point it
can resume from exactly (after a step with no validation due, after the epoch's validation, between phases),
the same step on every rank: under DDP the ranks agree by an all-reduce (every ``AGREE_EVERY`` steps) first.
A second Ctrl-C stops at once. A DDP job's ranks all end within seconds when one fails, and each ends cleanly
when the run finished; a process started for a run (a rank, a sweep worker) dies with its parent. Under SLURM
(``slurm/train.sbatch``: ``--resume auto``, ``--signal=USR1@120 --requeue``) SIGUSR1 stops the run, rank 0
asks ``scontrol requeue`` for the job, and the requeued job resumes from its ``last.ckpt``; Lightning's own
auto-requeue, which saves inside the signal handler, is switched off.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins.environments import (
    ClusterEnvironment,
    LightningEnvironment,
    LSFEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
)
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import SIGTERMException

from project import internals
from project.errors import Terminated, UserError

# Set by the MPI launchers (Open MPI, MPICH/PMI, PMIx, MVAPICH) in the processes they start.
MPI_LAUNCHERS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE")
STARTED_RANKS_WAIT_S = 60.0  # a started rank has only its teardown left once rank 0's run ends


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux; elsewhere a no-op)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() == 1:  # the parent died before that took effect
        os.kill(os.getpid(), signal.SIGKILL)


def cluster_plugins() -> list[ClusterEnvironment]:
    """The cluster environment of this run, for the Trainer: SLURM's ranks and world size without Lightning's
    SIGUSR1 handler inside a SLURM job step; Lightning's own detection under another launcher; else the plain
    environment, said outright: Lightning's detection would import mpi4py where it is installed, and starting
    MPI costs a GPU run a large share of its own time."""
    if SLURMEnvironment.detect():
        return [SLURMEnvironment(auto_requeue=False)]
    if any(key in os.environ for key in MPI_LAUNCHERS) or TorchElasticEnvironment.detect() or LSFEnvironment.detect():
        return []
    return [LightningEnvironment()]


def job_to_requeue() -> str | None:
    """This SLURM job as ``scontrol requeue`` names it, on rank 0 (None outside SLURM and on the other ranks)."""
    job = os.environ.get("SLURM_JOB_ID")
    if "SLURM_ARRAY_JOB_ID" in os.environ:  # an array task is requeued by its array id and index
        job = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return job if job and internals.is_rank_zero() else None


def requeue(job: str) -> str | None:
    """``scontrol requeue`` the job: None when SLURM took it, else why not."""
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return "scontrol is not on PATH here"
    done = subprocess.run([scontrol, "requeue", job], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return (done.stderr.strip().splitlines() or ["no reason given"])[-1]
    return None


def end_process_group() -> None:
    """Destroy this process's process group while the interpreter is whole.

    A group left to the interpreter's exit can abort a finished run: gloo's threads outlive the objects
    they use ("terminate called without an active exception", exit 134, or SIGABRT in a spawned rank).
    """
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


class DdpJobEnd(Callback):
    """The end of every process of a DDP job.

    A failure on one rank ends every process within seconds, not at the process group's 30-minute timeout
    (the others would wait forever in their next all-reduce): rank 0 (Lightning's launcher) kills the ranks
    it started when it fails; when another rank fails, Lightning's child watcher in rank 0 ends the job;
    each started rank asks the kernel to kill it if rank 0 dies.

    A run that ended on every rank together (finished, or stopped by a signal the ranks agreed on) ends each
    process's process group before the process exits: a spawned rank at the end of its fit or test, any other
    at the end of ``train()`` (``end``), where rank 0 then waits for the ranks it started and reports one that
    failed. A rank that failed alone leaves its group as it is: its one line comes first, and the job's end
    is the failure handling's above.
    """

    def __init__(self) -> None:
        self._started: list[subprocess.Popen] = []

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._started = internals.started_ranks(trainer.strategy.launcher) or self._started
        if trainer.world_size > 1 and "LOCAL_RANK" in os.environ:
            die_with_parent()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if trainer.world_size > 1 and not isinstance(exception, SIGTERMException) and self._started:
            launcher = trainer.strategy.launcher
            if launcher is not None:
                launcher.kill(signal.SIGKILL)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if internals.spawns_ranks(trainer.strategy.launcher):
            end_process_group()  # a spawned rank's process ends with this fit or test

    def end(self, error: BaseException | None) -> None:
        """After the run is recorded and its folder released. ``error``: what ends the run, if anything; any but
        an agreed stop may be this rank's alone, with the others still in a collective."""
        if error is not None and not isinstance(error, Terminated):
            return
        end_process_group()
        if error is not None:
            return
        failed = [(rank, code) for rank, code in enumerate(wait_for(self._started), start=1) if code != 0]
        if failed:
            rank, code = failed[0]
            raise UserError(f"rank {rank} of this DDP job ended with {exit_status(code)} after the run finished "
                            "(its output is above); the run's files are complete")


def wait_for(processes: list[subprocess.Popen], timeout: float = STARTED_RANKS_WAIT_S) -> list[int | None]:
    """Each process's exit code, None for one still running ``timeout`` seconds from now."""
    deadline = time.monotonic() + timeout
    codes: list[int | None] = []
    for process in processes:
        try:
            codes.append(process.wait(timeout=max(0.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            codes.append(None)
    return codes


def exit_status(code: int | None) -> str:
    if code is None:
        return f"no exit within {STARTED_RANKS_WAIT_S:.0f} s"
    if code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"exit code {code}"


# SIGUSR1: SLURM's warning before a time limit (sbatch --signal=USR1@SECONDS); the job requeues itself.
# SIGHUP: the terminal went away (a closed window, a dropped ssh session).
NAMES = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "Ctrl-C", signal.SIGUSR1: "SIGUSR1", signal.SIGHUP: "SIGHUP"}
# Under DDP the ranks compare what they saw every so many steps, not every step: the all-reduce costs a gloo rank on
# a small CPU about a millisecond, as long as a small model's whole step. A stop waits at most this many steps.
AGREE_EVERY = 8


class StopSignals:
    """Notes SIGTERM, SIGINT, SIGUSR1 and SIGHUP for the whole run; ``received`` is the first that came, if any."""

    def __init__(self) -> None:
        self.received: int | None = None

    def note(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT and self.received == signal.SIGINT:
            print("\ninterrupted again: stopping now", file=sys.stderr, flush=True)
            internals.exit_now(128 + signal.SIGINT)
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
        due = trainer.world_size == 1 or trainer.global_step % AGREE_EVERY == 0
        if due and self._agreed(trainer) and not internals.validation_due(trainer):
            self.stopped_at = trainer.global_step
            # Lightning's own stop: it raises SIGTERMException once this step's metrics are logged.
            internals.stop_as_on_sigterm(trainer)

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
        agreed = bool(flag.item())
        if agreed and not seen:
            self.signals.received = signal.SIGTERM  # another rank got it
        return agreed
