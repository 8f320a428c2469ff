"""Faults under DDP and fault drills: nothing trained is lost, no rank hangs, every resume is exact.

Kill points are random; each test prints them (``pytest -s``) so a failure can be replayed.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from helpers import ROOT, TRAIN, assert_same_training_state, make_tiny_mnist, newest_last_checkpoint, tiny_config
from project.checkpointing import read_checkpoint
from project.errors import UserError
from project.resume import checkpoint_to_resume
from project.run import train

FAULTY = str(ROOT / "tests" / "faulty_train.py")
# 640 training images, batches of 32: 20 steps per epoch on one process, 10 per rank on two.
RUN = ("--batch-size", "32", "--val-size", "40", "--log-every-n-steps", "2", "--checkpoint-every-n-steps", "3",
       "--accelerator", "cpu")
DDP = ("--devices", "2", "--max-epochs", "4")
SINGLE = ("--max-epochs", "40")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_mnist(tmp_path_factory.mktemp("faults") / "data", n_train=680, n_test=40)


@pytest.fixture(scope="module")
def uninterrupted_ddp(data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    logdir = tmp_path_factory.mktemp("reference")
    done = start(data, logdir, *DDP)
    assert done.wait(timeout=300) == 0, stderr_of(done)
    return newest_last_checkpoint(logdir)


def start(data: Path, logdir: Path, *extra: str, script: str = TRAIN, env: dict | None = None) -> subprocess.Popen:
    """``train.py`` in a session of its own, so that the whole job (every rank) can be signalled."""
    stderr = tempfile.TemporaryFile("w+")  # a file, not a pipe: a stalled reader cannot block a rank
    proc = subprocess.Popen([sys.executable, script, "--data-dir", str(data), "--logdir", str(logdir), *RUN, *extra],
                            stdout=subprocess.DEVNULL, stderr=stderr, text=True, start_new_session=True,
                            env={**os.environ, **(env or {})})
    proc.stderr_file = stderr
    return proc


def stderr_of(proc: subprocess.Popen) -> str:
    proc.stderr_file.seek(0)
    return proc.stderr_file.read()


def saved_steps(logdir: Path) -> int:
    """The newest ``last.ckpt``'s step, or -1 before the first one."""
    try:
        return max(read_checkpoint(p)["global_step"] for p in logdir.rglob("last.ckpt"))
    except Exception:  # noqa: BLE001 - not written yet, or being replaced this instant
        return -1


def job_ended(proc: subprocess.Popen, within: float) -> float:
    """Seconds until every process of ``proc``'s session is gone; fails after ``within``."""
    started = time.monotonic()
    while time.monotonic() - started < within:
        proc.poll()  # reaps it once it exits, so that pgrep sees only live processes
        if subprocess.run(["pgrep", "-s", str(proc.pid)], capture_output=True).returncode != 0:
            proc.wait(timeout=5)
            return time.monotonic() - started
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    pytest.fail(f"the job was still running {within} s later")


def wait_for_checkpoint(proc: subprocess.Popen, logdir: Path, after_step: int) -> None:
    """Until a checkpoint past ``after_step`` is saved (or the run ends)."""
    deadline = time.monotonic() + 180
    while saved_steps(logdir) <= after_step and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)


def kill_after(proc: subprocess.Popen, logdir: Path, after_step: int, delay: float, sig: int,
               group: bool | None = None) -> None:
    """Send ``sig`` once a checkpoint past ``after_step`` exists: to every process of the job (SIGKILL's
    default), or to rank 0 only."""
    wait_for_checkpoint(proc, logdir, after_step)
    time.sleep(delay)
    os.killpg(proc.pid, sig) if (sig == signal.SIGKILL if group is None else group) else os.kill(proc.pid, sig)


def drill(data: Path, logdir: Path, kills: int, extra: tuple[str, ...], total_steps: int, seed: int) -> None:
    """``kills`` SIGKILLs of the whole job at random steps, each run resumed with ``--resume last``."""
    rng = random.Random(seed)
    points = sorted(rng.sample(range(1, total_steps - 10), kills))
    print(f"drill seed {seed}: SIGKILL once a checkpoint past each of steps {points} is saved", flush=True)
    proc = start(data, logdir, *extra)
    for point in points:
        kill_after(proc, logdir, point, rng.uniform(0.0, 0.05), signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL, "the run ended before its kill point"
        proc = start(data, logdir, *extra, "--resume", "last")
    assert proc.wait(timeout=300) == 0, stderr_of(proc)


@pytest.mark.slow
def test_fault_drill_on_two_ranks_ends_bitwise_equal(data, tmp_path, uninterrupted_ddp):
    drill(data, tmp_path / "logs", 3, DDP, 40, random.randrange(10**6))
    runs = len(list((tmp_path / "logs" / "mnist").iterdir()))
    assert runs >= 2
    assert_same_training_state(uninterrupted_ddp, newest_last_checkpoint(tmp_path / "logs"))


@pytest.mark.slow
def test_fault_drill_on_one_process_ends_bitwise_equal(data, tmp_path):
    reference = train(tiny_config(data, tmp_path / "reference", max_epochs=40, checkpoint_every_n_steps=3,
                                  accelerator="cpu"), test=False)
    drill(data, tmp_path / "logs", 5, SINGLE, 800, random.randrange(10**6))
    assert_same_training_state(torch.load(reference.last_checkpoint, weights_only=True),
                               newest_last_checkpoint(tmp_path / "logs"))


@pytest.mark.slow
@pytest.mark.parametrize("every_process", [True, False], ids=["to-every-process", "to-rank-0"])
def test_sigterm_under_ddp_stops_every_rank_at_one_step_and_resumes_exactly(data, tmp_path, uninterrupted_ddp,
                                                                            every_process):
    """SLURM's scancel signals every process; ``kill PID`` only rank 0, which passes it on."""
    logdir = tmp_path / "logs"
    proc = start(data, logdir, *DDP)
    delay = random.uniform(0.0, 0.5)
    print(f"SIGTERM {delay:.2f} s after the first checkpoint past step 4")
    kill_after(proc, logdir, 4, delay, signal.SIGTERM, group=every_process)
    seconds = job_ended(proc, within=60)
    stderr = stderr_of(proc)
    print(f"SIGTERM: every process ended {seconds:.1f} s after it")
    assert proc.returncode == 143, stderr
    assert stderr.count("stopped by SIGTERM after saving last.ckpt; continue with --resume last") == 1
    assert len(list(logdir.rglob("last.ckpt"))) == 1
    stopped = newest_last_checkpoint(logdir)
    assert 4 < stopped["global_step"] < 40
    resumed = start(data, logdir, *DDP, "--resume", "last")
    assert resumed.wait(timeout=300) == 0, stderr_of(resumed)
    assert_same_training_state(uninterrupted_ddp, newest_last_checkpoint(logdir))


@pytest.mark.slow
@pytest.mark.parametrize("rank", [0, 1])
def test_one_failing_rank_ends_the_whole_job_fast_with_one_line(data, tmp_path, rank):
    logdir = tmp_path / "logs"
    proc = start(data, logdir, *DDP, script=FAULTY, env={"FAIL_RANK": str(rank), "FAIL_STEP": "7"})
    wait_for_checkpoint(proc, logdir, 5)  # the step-6 one
    seconds = job_ended(proc, within=60)
    stderr = stderr_of(proc)
    print(f"rank {rank} failed at step 7: the job ended {seconds:.1f} s after the step-6 checkpoint")
    assert proc.returncode != 0
    assert f"train.py: error: CUDA out of memory (injected on rank {rank} at step 7); lower --batch-size" in stderr
    assert "Traceback" not in stderr, stderr
    assert newest_last_checkpoint(logdir)["global_step"] == 6  # the newest good checkpoint, intact


@pytest.mark.slow
def test_sigkill_of_rank_zero_ends_the_other_ranks(data, tmp_path):
    logdir = tmp_path / "logs"
    proc = start(data, logdir, *DDP, "--max-epochs", "400")
    kill_after(proc, logdir, 3, 0.2, signal.SIGKILL, group=False)  # rank 0 only: rank 1 is left in its collective
    seconds = job_ended(proc, within=60)
    print(f"rank 0 killed: the other rank ended {seconds:.1f} s later")


def test_resuming_with_another_world_size_is_refused(uninterrupted_ddp, data, tmp_path):
    path = tmp_path / "ddp.ckpt"
    torch.save(uninterrupted_ddp, path)
    config = tiny_config(data, tmp_path / "logs", max_epochs=4, resume=str(path))
    with pytest.raises(UserError, match="the checkpoint was written by 2 process\\(es\\), this run has 1"):
        checkpoint_to_resume(config, 640, 1)
