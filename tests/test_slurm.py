"""SLURM for real: jobs submitted with sbatch to a one-node cluster the tests start (munged, slurmctld, slurmd).

A job signalled before its time limit stops at a resume point, requeues itself and continues the same run
in the same folder, ending bitwise-equal to a run never stopped; srun with 2 tasks is 2-rank DDP.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers import CHECKPOINTED, HANG_S, ROOT, assert_same_training_state, make_tiny_data, tiny_config, train
from project.reliability.checkpointing import read_checkpoint

pytestmark = pytest.mark.slow
SBATCH = str(ROOT / "slurm" / "train.sbatch")
# 640 training images in batches of 32, one batch per step: 20 steps an epoch, 600 in all.
LONG = {"batch_size": 32, "val_size": 40, "checkpoint_every_n_steps": 3, "log_every_n_steps": 2,
        "accelerator": "cpu", "steps_per_call": 1, "max_epochs": 30}


def submit(slurm, logdir: Path, *flags: str, tasks: int = 1) -> int:
    return slurm.sbatch("--chdir", str(ROOT), "--output", str(logdir.parent / "slurm-%j.out"),
                        f"--ntasks-per-node={tasks}", f"--export=ALL,PYTHON={sys.executable}", SBATCH,
                        "--logdir", str(logdir), *flags)


def wait_for(condition, what: str, timeout: float = HANG_S, fail: bool = True):
    """Polls ``condition``; ``timeout`` guards against a hang, long enough for a machine kept busy by others."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    if fail:
        pytest.fail(f"timed out waiting for {what}")
    return None


def saved_step(run: Path) -> int:
    try:
        return read_checkpoint(run / "checkpoints" / "last.ckpt")["global_step"]
    except Exception:  # noqa: BLE001 - not there yet, or being replaced this instant
        return -1


def flags(settings: dict, data: Path) -> list[str]:
    return ["--data-dir", str(data), *(part for key, value in settings.items()
                                        for part in (f"--{key.replace('_', '-')}", str(value)))]


def test_a_job_signalled_before_its_time_limit_requeues_itself_and_ends_as_if_never_stopped(slurm, tmp_path):
    data = make_tiny_data(tmp_path / "data", n_train=680, n_test=40)
    reference = train(tiny_config(data, tmp_path / "reference", **LONG))
    logdir = tmp_path / "logs"
    job = submit(slurm, logdir, *flags(LONG, data))
    run = logdir / "tiny" / f"job_{job}"
    stops = []
    for restart in (1, 2):
        past = (stops[-1] if stops else 0) + 150
        wait_for(lambda past=past: saved_step(run) > past, f"a checkpoint past step {past}")
        assert slurm.run("scancel", "--signal=USR1", str(job)).returncode == 0  # what --signal=USR1@120 sends
        wait_for(lambda restart=restart: slurm.job(job).get("Restarts") == str(restart) and
                 slurm.job(job).get("JobState") == "PENDING", f"requeue {restart}")
        stops.append(saved_step(run))
        print(f"job {job}: SIGUSR1, stopped after step {stops[-1]}, requeued (restart {restart})")
        # A requeued job waits two minutes (BeginTime); it may start once its old credential has expired
        # (cred_expire=10 in the test cluster), or slurmd refuses it as revoked.
        time.sleep(11)
        assert slurm.run("scontrol", "update", f"jobid={job}", "StartTime=now").returncode == 0
        wait_for(lambda: slurm.job(job).get("JobState") == "RUNNING", "the requeued job to start")
    wait_for(lambda: slurm.job(job).get("JobState") == "COMPLETED", "the job to complete")
    assert slurm.job(job)["Restarts"] == "2"  # finished: not requeued again

    output = (logdir.parent / f"slurm-{job}.out").read_text()
    for step in stops:
        assert 0 < step < 600
        assert (f"train.py: stopped by SIGUSR1 after step {step}; last.ckpt holds that step; requeueing job {job}: "
                "it continues from last.ckpt in this folder") in output
    assert output.count(f"job {job}: start") == 3 and "Traceback" not in output
    assert [p.name for p in (logdir / "tiny").iterdir()] == [f"job_{job}"]  # one run, one folder
    assert_same_training_state(torch.load(run / "checkpoints" / "last.ckpt", weights_only=True),
                               torch.load(reference.last_checkpoint, weights_only=True))
    ours, theirs = torch.load(run / "model.pth"), torch.load(reference.run_dir / "model.pth")
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)

    again = submit(slurm, logdir, *flags(LONG, data))  # a finished run's job does nothing, and says so
    wait_for(lambda: slurm.job(again).get("JobState") == "COMPLETED", "the second job")


def test_srun_with_two_tasks_is_two_rank_ddp(slurm, uninterrupted_ddp, tmp_path):
    """The same run as train.py --devices 2 (Lightning starting the second rank), with SLURM's ranks."""
    logdir = tmp_path / "logs"
    job = submit(slurm, logdir, "--data-dir", str(uninterrupted_ddp["data"]), *CHECKPOINTED, "--max-epochs", "4",
                 tasks=2)
    wait_for(lambda: slurm.job(job).get("JobState") in ("COMPLETED", "FAILED"), "the 2-task job")
    output = (logdir.parent / f"slurm-{job}.out").read_text()
    assert slurm.job(job)["JobState"] == "COMPLETED", output
    run = logdir / "tiny" / f"job_{job}"
    results = json.loads((run / "results.json").read_text())
    assert results["world_size"] == 2 and "world size 2" in output
    assert_same_training_state(torch.load(run / "checkpoints" / "last.ckpt", weights_only=True),
                               uninterrupted_ddp["last"])
    reference = json.loads(next((uninterrupted_ddp["logs"] / "tiny").glob("*/results.json")).read_text())
    assert results["test/acc"] == reference["test/acc"]
