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

from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.utilities.rank_zero import rank_zero_only


def slurm_plugins() -> list[SLURMEnvironment]:
    """Inside a SLURM job step: SLURM's ranks and world size, without Lightning's SIGUSR1 handler."""
    return [SLURMEnvironment(auto_requeue=False)] if SLURMEnvironment.detect() else []


def requeue_this_job() -> str:
    """``scontrol requeue`` this job (from rank 0); what happened, to end the run's stop message ("" outside
    SLURM and on the other ranks)."""
    job = os.environ.get("SLURM_JOB_ID")
    if "SLURM_ARRAY_JOB_ID" in os.environ:  # an array task is requeued by its array id and index
        job = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    if not job or rank_zero_only.rank != 0:
        return ""
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return f"; scontrol is not on PATH here, so job {job} was not requeued: submit it again to continue"
    done = subprocess.run([scontrol, "requeue", job], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or ["no reason given"])[-1]
        return f"; requeueing job {job} failed ({reason}): submit it again to continue"
    return f"; job {job} requeued: it continues from last.ckpt in this folder"
