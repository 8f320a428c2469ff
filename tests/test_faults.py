"""Faults under DDP and fault drills: nothing trained is lost, no rank hangs, every resume is exact.

Kill points are drawn from a seed each test prints (``pytest -s``); ``DRILL_SEED=N`` replays a failure.
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

import psutil
import pytest
import torch

from helpers import (
    CHECKPOINTED,
    HANG_S,
    ROOT,
    TRAIN,
    TWO_RANKS,
    assert_same_training_state,
    make_tiny_data,
    newest_last_checkpoint,
    tiny_config,
    tiny_recipe,
    train,
)
from project.errors import UserError
from project.hardware.devices import expected_world_size
from project.reliability.checkpointing import read_checkpoint
from project.reliability.resume import checkpoint_to_resume
from project.training.tensor_data import planned_steps

FAULTY = str(ROOT / "tests" / "faulty_train.py")
SINGLE_EPOCHS = 10  # 200 steps
ENDS_WITHIN = 20  # seconds for every process of a job to be gone after a fault: the README's bound


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_data(tmp_path_factory.mktemp("faults") / "data", n_train=680, n_test=40)


def start(data: Path, logdir: Path, *extra: str, script: str = TRAIN, env: dict | None = None) -> subprocess.Popen:
    """``train.py`` in a session of its own, so that the whole job (every rank) can be signalled."""
    stderr = tempfile.TemporaryFile("w+")  # a file, not a pipe: a stalled reader cannot block a rank
    command = [sys.executable, script, "--data-dir", str(data), "--logdir", str(logdir), *CHECKPOINTED, *extra]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, text=True, start_new_session=True,
                            env={**os.environ, **(env or {})})
    proc.stderr_file = stderr
    return proc


def stderr_of(proc: subprocess.Popen) -> str:
    proc.stderr_file.seek(0)
    return proc.stderr_file.read()


_STEPS: dict[tuple[Path, int], int] = {}


def saved_steps(logdir: Path) -> int:
    """The newest ``last.ckpt``'s step, or -1 before the first one. Each version of a file is read once:
    the polling loops below must not take the CPU the run needs."""
    steps = [-1]
    for path in logdir.rglob("last.ckpt"):
        try:
            key = (path, path.stat().st_mtime_ns)
            if key not in _STEPS:
                _STEPS[key] = read_checkpoint(path)["global_step"]
            steps.append(_STEPS[key])
        except Exception:  # noqa: BLE001 - not written yet, or being replaced this instant
            pass
    return max(steps)


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
    deadline = time.monotonic() + HANG_S
    while saved_steps(logdir) <= after_step and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)


def rank_pid(proc: subprocess.Popen, rank: int) -> int:
    """The process of ``rank`` in ``proc``'s job, by the LOCAL_RANK Lightning gives each rank it starts."""
    if rank == 0:
        return proc.pid
    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline:
        for child in psutil.Process(proc.pid).children(recursive=True):
            try:
                if child.environ().get("LOCAL_RANK") == str(rank):
                    return child.pid
            except psutil.Error:
                continue
        time.sleep(0.1)
    pytest.fail(f"no rank {rank} process")


def kill_after(proc: subprocess.Popen, logdir: Path, after_step: int, delay: float, sig: int,
               target: str = "job") -> None:
    """Send ``sig`` once a checkpoint past ``after_step`` exists: to every process of the job, or to one rank
    (``"rank0"``, ``"rank1"``)."""
    wait_for_checkpoint(proc, logdir, after_step)
    time.sleep(delay)
    os.killpg(proc.pid, sig) if target == "job" else os.kill(rank_pid(proc, int(target[-1])), sig)


def drill_seed() -> int:
    return int(os.environ.get("DRILL_SEED") or random.randrange(10**6))


def drill(data: Path, logdir: Path, kills: int, extra: tuple[str, ...], total_steps: int, seed: int) -> list[int]:
    """``kills`` SIGKILLs of the whole job at random steps (none in the last quarter, so that a run cannot end
    before its kill), each followed by ``--resume last``; the caller runs the last resume to the end.

    Every kill lands mid-run: a kill point at or below the step the run resumes from moves just past it,
    and each killed run must have saved a newer checkpoint than the one it started from. Returns the steps
    the kills' runs had saved.
    """
    rng = random.Random(seed)
    points = sorted(rng.sample(range(1, total_steps - total_steps // 4), kills))
    print(f"drill seed {seed}: SIGKILL once a checkpoint past each of steps {points} is saved", flush=True)
    saved, landed = -1, []
    for number, point in enumerate(points):
        proc = start(data, logdir, *extra, *(("--resume", "last") if number else ()))
        kill_after(proc, logdir, max(point, saved + 1), 0.0, signal.SIGKILL)
        assert proc.wait(timeout=HANG_S) == -signal.SIGKILL, "the run ended before its kill point"
        now = saved_steps(logdir)
        assert saved < now < total_steps, f"kill {number + 1} did not land mid-run (saved {saved}, then {now})"
        saved = now
        landed.append(now)
    print(f"drill seed {seed}: {len(landed)} kills, each after new training; checkpoints at {landed}", flush=True)
    return landed


@pytest.mark.slow
def test_fault_drill_on_two_ranks_ends_bitwise_equal(tmp_path, uninterrupted_ddp):
    data = uninterrupted_ddp["data"]
    assert len(drill(data, tmp_path / "logs", 3, TWO_RANKS, 40, drill_seed())) == 3
    resumed = start(data, tmp_path / "logs", *TWO_RANKS, "--resume", "last")
    assert resumed.wait(timeout=HANG_S) == 0, stderr_of(resumed)
    assert [p.name for p in (tmp_path / "logs" / "tiny").iterdir()] == ["version_0"]  # one run, one folder
    assert_same_training_state(uninterrupted_ddp["last"], newest_last_checkpoint(tmp_path / "logs"))


@pytest.mark.slow
def test_fault_drill_on_one_process_ends_bitwise_equal(data, tmp_path):
    settings = {"max_epochs": SINGLE_EPOCHS, "checkpoint_every_n_steps": 3, "accelerator": "cpu"}  # CHECKPOINTED
    reference = train(tiny_config(data, tmp_path / "reference", **settings), test=False)
    assert len(drill(data, tmp_path / "logs", 5, ("--max-epochs", str(SINGLE_EPOCHS)), 20 * SINGLE_EPOCHS,
                     drill_seed())) == 5
    train(tiny_config(data, tmp_path / "logs", **settings, resume="last"), test=False)  # the last resume, in here
    assert_same_training_state(torch.load(reference.last_checkpoint, weights_only=True),
                               newest_last_checkpoint(tmp_path / "logs"))


@pytest.mark.slow
def test_sigterm_under_ddp_stops_every_rank_at_one_step_and_resumes_exactly(tmp_path, uninterrupted_ddp):
    """A signal to any one rank stops the job (``kill PID`` of a worker), as does one to every process (SLURM's
    scancel). One run is stopped each way, and the run resumed after both ends as if never stopped."""
    data = uninterrupted_ddp["data"]
    logdir = tmp_path / "logs"
    stopped_at = 4
    for run, target in enumerate(("rank1", "job"), start=1):
        proc = start(data, logdir, *TWO_RANKS, *(("--resume", "last") if run > 1 else ()))
        # At once: a step takes about 10 ms here, so any delay would be a random number of steps.
        after = stopped_at + 2
        print(f"SIGTERM to {target} once a checkpoint past step {after} is saved")
        kill_after(proc, logdir, after, 0.0, signal.SIGTERM, target=target)
        seconds = job_ended(proc, within=ENDS_WITHIN)
        stderr = stderr_of(proc)
        print(f"SIGTERM: every process ended {seconds:.1f} s after it")
        assert proc.returncode == 143, stderr
        stopped_at = newest_last_checkpoint(logdir)["global_step"]
        assert after < stopped_at < 40, f"stopped at {stopped_at}: not mid-run"
        assert stderr.count(f"train.py: stopped by SIGTERM after step {stopped_at}; last.ckpt holds that "
                            "step: continue with --resume last") == 1, stderr
        assert len(list(logdir.rglob("last.ckpt"))) == 1  # one run folder, one last.ckpt
    resumed = start(data, logdir, *TWO_RANKS, "--resume", "last")
    assert resumed.wait(timeout=HANG_S) == 0, stderr_of(resumed)
    assert_same_training_state(uninterrupted_ddp["last"], newest_last_checkpoint(logdir))


@pytest.mark.slow
@pytest.mark.parametrize("rank", [0, 1])
def test_one_failing_rank_ends_the_whole_job_fast_with_one_line(data, tmp_path, rank):
    logdir = tmp_path / "logs"
    proc = start(data, logdir, *TWO_RANKS, script=FAULTY, env={"FAIL_RANK": str(rank), "FAIL_STEP": "7"})
    wait_for_checkpoint(proc, logdir, 5)  # the step-6 one
    seconds = job_ended(proc, within=ENDS_WITHIN)
    stderr = stderr_of(proc)
    print(f"rank {rank} failed at step 7: the job ended {seconds:.1f} s after the step-6 checkpoint")
    assert proc.returncode != 0
    assert f"train.py: error: CUDA out of memory (injected on rank {rank} at step 7); lower --batch-size" in stderr
    assert "Traceback" not in stderr, stderr
    assert newest_last_checkpoint(logdir)["global_step"] == 6  # the newest good checkpoint, intact


@pytest.mark.slow
def test_sigkill_of_rank_zero_ends_the_other_ranks(data, tmp_path):
    logdir = tmp_path / "logs"
    proc = start(data, logdir, *TWO_RANKS, "--max-epochs", "400")
    kill_after(proc, logdir, 3, 0.2, signal.SIGKILL, target="rank0")  # rank 1 is left in its collective
    saved = saved_steps(logdir)
    seconds = job_ended(proc, within=ENDS_WITHIN)
    print(f"rank 0 killed: the other rank ended {seconds:.1f} s later")
    assert proc.returncode == -signal.SIGKILL
    assert 3 < saved == newest_last_checkpoint(logdir)["global_step"] < 400 * 10  # mid-run; nothing saved after
    assert "Traceback" not in stderr_of(proc)


def test_resuming_with_another_world_size_is_refused(uninterrupted_ddp, tmp_path):
    path = tmp_path / "ddp.ckpt"
    torch.save(uninterrupted_ddp["last"], path)
    trained_lr = uninterrupted_ddp["last"]["run_record"]["config"]["lr"]  # scaled for its 2 processes, as adopted
    config = tiny_config(uninterrupted_ddp["data"], tmp_path / "logs", max_epochs=4, resume=str(path), lr=trained_lr,
                         scale_lr=False)
    with pytest.raises(UserError, match="the checkpoint was written by 2 process\\(es\\), this run has 1; .* resume "
                                        "with the same --devices and --num-nodes"):
        checkpoint_to_resume(config, tiny_recipe(), planned_steps(config, 640, 1), 1)
    # Two machines of one process each are the same two ranks: the world size counts nodes too.
    two_nodes = config.replace(devices=1, num_nodes=2, accelerator="cpu")
    assert expected_world_size(two_nodes) == 2
    resumed = checkpoint_to_resume(two_nodes, tiny_recipe(), planned_steps(two_nodes, 640, 2),
                                   expected_world_size(two_nodes))
    assert resumed.global_step == uninterrupted_ddp["last"]["global_step"]
