"""How a DDP job ends when one rank fails: all of its processes, within seconds (SIGTERM: reliability/stops.py)."""

from __future__ import annotations

import os
import signal
from types import FrameType

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from lightning.pytorch.utilities.exceptions import SIGTERMException

from project.reliability.processes import die_with_parent


class OneFailureEndsTheJob(Callback):
    """Under DDP, an exception on any one rank ends every process within seconds, not at the
    process group's 30-minute timeout.

    The others would wait forever in their next all-reduce. Rank 0 (Lightning's launcher) kills
    the ranks it started when it fails; when another rank fails, Lightning's child watcher in
    rank 0 ends the job; and each started rank asks the kernel to kill it if rank 0 dies.
    """

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if trainer.world_size > 1 and "LOCAL_RANK" in os.environ:
            die_with_parent()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        launcher = trainer.strategy.launcher
        if trainer.world_size > 1 and not isinstance(exception, SIGTERMException) and \
                isinstance(launcher, _SubprocessScriptLauncher) and launcher.procs:
            launcher.kill(signal.SIGKILL)


class SigtermOnEveryRank(Callback):
    """Under DDP, SIGTERM stops every rank after the same optimizer step.

    Lightning's own handler runs a collective inside the signal handler, and each rank also
    checks its own flag at validation batches and epoch ends: when the signal reaches every
    process (``scancel``, ``kill`` of the process group) the ranks meet in different collectives
    and wait forever. Here the handler only notes the signal; after each step rank 0 shares
    what it saw, and all ranks raise Lightning's ``SIGTERMException`` together.
    """

    def __init__(self) -> None:
        self._seen = False

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.world_size > 1:  # after Lightning registered its handler, which this replaces
            signal.signal(signal.SIGTERM, self._note)
            self._launcher = trainer.strategy.launcher

    def _note(self, signum: int, frame: FrameType | None) -> None:
        if not self._seen and isinstance(self._launcher, _SubprocessScriptLauncher):
            self._launcher.kill(signum)  # rank 0 passes it on to the ranks it started
        self._seen = True

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: object, batch: object,
                           batch_idx: int) -> None:
        self._stop_if_signalled(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._stop_if_signalled(trainer)  # a signal during the last validation: no step comes after it

    def _stop_if_signalled(self, trainer: L.Trainer) -> None:
        if trainer.world_size == 1:
            return
        seen = torch.tensor([int(self._seen)], device=trainer.strategy.root_device)
        torch.distributed.broadcast(seen, src=0)
        if seen.item():
            trainer._signal_connector.received_sigterm = True  # noqa: SLF001 - Lightning's own stop flag
            raise SIGTERMException()
