"""SLURM: a job that stops before its time limit requeues itself, and the requeued job continues the same run.

``slurm/train.sbatch`` runs ``train.py`` with ``--run-version job_<id> --resume auto`` under
``--signal=USR1@120 --requeue``: on SIGUSR1 the run stops at its next resume point, rank 0 asks
``scontrol requeue`` for the job, and the requeued job (same id, same folder) resumes from its
``last.ckpt``. Lightning's own auto-requeue saves inside the signal handler; it is switched off.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from lightning.fabric.plugins.environments import (
    ClusterEnvironment,
    LightningEnvironment,
    LSFEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
)

from project import internals

# Set by the MPI launchers (Open MPI, MPICH/PMI, PMIx, MVAPICH) in the processes they start.
MPI_LAUNCHERS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE")


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
