"""How the processes of a DDP job end: all of them within seconds when one rank fails, each cleanly when the run
finished (SIGTERM: reliability/stops.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from lightning.pytorch.utilities.exceptions import SIGTERMException

from project.errors import Terminated, UserError
from project.reliability.processes import die_with_parent

STARTED_RANKS_WAIT_S = 60.0  # a started rank has only its teardown left once rank 0's run ends


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
        launcher = trainer.strategy.launcher
        if isinstance(launcher, _SubprocessScriptLauncher) and launcher.procs:
            self._started = launcher.procs
        if trainer.world_size > 1 and "LOCAL_RANK" in os.environ:
            die_with_parent()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if trainer.world_size > 1 and not isinstance(exception, SIGTERMException) and self._started:
            launcher = trainer.strategy.launcher
            if launcher is not None:
                launcher.kill(signal.SIGKILL)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if isinstance(trainer.strategy.launcher, _MultiProcessingLauncher):
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
