"""The processes of a job: how they are launched, how they end, and how a cluster takes them back.

A DDP job's ranks all end within seconds when one fails, and each ends cleanly when the run finished
(SIGTERM: reliability/stops.py); a process started for a run (a rank, a sweep worker) dies with its parent.
Under SLURM, ``slurm/train.sbatch`` runs ``train.py`` with ``--run-version job_<id> --resume auto`` under
``--signal=USR1@120 --requeue``: on SIGUSR1 the run stops at its next resume point, rank 0 asks
``scontrol requeue`` for the job, and the requeued job (same id, same folder) resumes from its
``last.ckpt``. Lightning's own auto-requeue saves inside the signal handler; it is switched off.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

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
