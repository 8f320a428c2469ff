"""A job's processes, in this process: which cluster environment a run gets under each launcher, how the ranks a
run started are waited for and reported, and when a process group is ended. (The real launchers are
``tests/test_ddp.py`` and ``tests/test_slurm.py``.)"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch.distributed as dist
from lightning.fabric.plugins.environments import LightningEnvironment, SLURMEnvironment

from helpers import HANG_S, free_port
from project.errors import Terminated, UserError
from project.reliability import processes as cluster

LAUNCHER_PREFIXES = ("SLURM_", "OMPI_", "PMI", "MV2_", "TORCHELASTIC", "LSB_", "JSM_")
LAUNCHER_KEYS = ("RANK", "GROUP_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def no_launcher(monkeypatch):
    for key in list(os.environ):
        if key.startswith(LAUNCHER_PREFIXES) or key in LAUNCHER_KEYS:
            monkeypatch.delenv(key)
    return monkeypatch


def test_a_plain_run_gets_the_plain_environment_said_outright(no_launcher):
    (environment,) = cluster.cluster_plugins()
    assert type(environment) is LightningEnvironment


def test_a_slurm_job_step_gets_slurms_ranks_without_lightnings_requeue(no_launcher):
    no_launcher.setenv("SLURM_NTASKS", "2")
    no_launcher.setenv("SLURM_NTASKS_PER_NODE", "2")
    no_launcher.setenv("SLURM_JOB_NAME", "train")
    (environment,) = cluster.cluster_plugins()
    assert type(environment) is SLURMEnvironment and environment.auto_requeue is False


@pytest.mark.parametrize("key", [*cluster.MPI_LAUNCHERS, "torchelastic"])
def test_under_another_launcher_lightning_detects_it_itself(no_launcher, key):
    if key == "torchelastic":
        no_launcher.setenv("TORCHELASTIC_RUN_ID", "job")  # what torchrun sets
    else:
        no_launcher.setenv(key, "2")
    assert cluster.cluster_plugins() == []


@pytest.mark.parametrize(("code", "said"), [
    (None, "no exit within 60 s"), (-9, "signal SIGKILL"), (-15, "signal SIGTERM"), (3, "exit code 3"),
    (0, "exit code 0"),
])
def test_a_ranks_end_is_said_in_words(code, said):
    assert cluster.exit_status(code) == said


def shell(command: str) -> subprocess.Popen:
    return subprocess.Popen(["/bin/sh", "-c", command])


def test_the_ranks_a_run_started_are_waited_for_each_its_exit_code_or_none():
    assert cluster.wait_for([shell("exit 0"), shell("sleep 0.5; exit 3")], timeout=HANG_S) == [0, 3]
    sleepers = [shell("exec sleep 600"), shell("exec sleep 600")]
    try:
        assert cluster.wait_for(sleepers, timeout=0.1) == [None, None]  # one deadline for all, not one each
    finally:
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()


@pytest.fixture
def process_group():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def test_a_finished_run_ends_its_group_and_reports_the_first_rank_that_failed(process_group):
    end = cluster.DdpJobEnd()
    end._started = [shell("exit 0"), shell("exit 3"), shell("kill -9 $$")]
    with pytest.raises(UserError) as failed:
        end.end(None)
    assert str(failed.value) == ("rank 2 of this DDP job ended with exit code 3 after the run finished (its output "
                                 "is above); the run's files are complete")
    assert not dist.is_initialized()


def test_a_rank_still_running_after_the_wait_is_reported_not_passed_over(process_group, monkeypatch):
    """A rank that neither exits nor fails (a hung teardown) is the job's failure too: said, never exit 0."""
    waited = cluster.wait_for
    monkeypatch.setattr(cluster, "wait_for", lambda processes: waited(processes, timeout=0.2))  # not 60 s
    end = cluster.DdpJobEnd()
    end._started = [shell("exit 0"), shell("exec sleep 600")]
    try:
        with pytest.raises(UserError) as failed:
            end.end(None)
    finally:
        end._started[1].kill()
        end._started[1].wait()
    assert str(failed.value) == ("rank 2 of this DDP job ended with no exit within 60 s after the run finished (its "
                                 "output is above); the run's files are complete")
    assert not dist.is_initialized()


def test_a_finished_run_whose_ranks_all_ended_well_says_nothing(process_group):
    end = cluster.DdpJobEnd()
    end._started = [shell("exit 0")]
    end.end(None)
    assert not dist.is_initialized()


def test_an_agreed_stop_ends_the_group_without_waiting_and_a_failure_leaves_it(process_group, monkeypatch):
    waited = []
    monkeypatch.setattr(cluster, "wait_for", lambda processes: waited.append(processes) or [])
    end = cluster.DdpJobEnd()
    end.end(RuntimeError("this rank's own failure: the others may be in a collective"))
    assert dist.is_initialized() and waited == []
    end.end(Terminated("stopped by SIGTERM"))
    assert not dist.is_initialized() and waited == []


def test_a_requeue_refused_without_a_reason_says_so(tmp_path, monkeypatch):
    scontrol = tmp_path / "scontrol"
    scontrol.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path / 'asked'}\nexit 1\n")
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert cluster.requeue("77") == "no reason given"
    assert (tmp_path / "asked").read_text() == "requeue 77\n"


def test_a_process_started_for_a_run_dies_with_its_parent(tmp_path):
    """The parent starts a child that asks to die with it, then exits at once: the child must not outlive it."""
    child = ("import sys, time; sys.path.insert(0, sys.argv[1]); from project.reliability.processes import "
             "die_with_parent; die_with_parent(); open(sys.argv[2], 'w').write('armed'); time.sleep(600)")
    parent = ("import subprocess, sys, time, pathlib; p = subprocess.Popen([sys.executable, '-c', sys.argv[1], "
              "sys.argv[2], sys.argv[3]]); print(p.pid, flush=True)\n"
              "while not pathlib.Path(sys.argv[3]).exists(): time.sleep(0.05)")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", parent, child, root, str(tmp_path / "armed")], capture_output=True,
                          text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stderr
    pid = int(done.stdout)
    for _ in range(600):  # the kernel's SIGKILL is sent as the parent exits; reaping is init's
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        if open(f"/proc/{pid}/stat").read().split()[2] == "Z":
            break
        time.sleep(0.1)
    else:
        os.kill(pid, 9)
        pytest.fail("the child outlived its parent by a minute")


def test_a_run_in_one_process_ends_with_nothing_to_end_or_wait_for():
    assert not dist.is_initialized()
    cluster.DdpJobEnd().end(None)  # no process group, no ranks started
    cluster.end_process_group()
