"""The stop handler's decisions in this process, without sending a signal (the real signals, DDP and the SLURM requeue
are in test_restarts.py, test_faults.py and test_slurm.py): which signal counts, how the stop is named and with
which exit status, a second Ctrl-C, and what a SLURM time-limit warning asks of ``scontrol``."""

from __future__ import annotations

import os
import signal
import stat

import pytest

from project.errors import Terminated
from project.reliability.processes import StopSignals


@pytest.fixture(autouse=True)
def exit_raises(monkeypatch):
    """``os._exit`` raises instead, so a handler that exits when it should not fails its test, not the session."""
    def exit_now(status):
        raise SystemExit(status)

    monkeypatch.setattr(os, "_exit", exit_now)


@pytest.fixture
def outside_slurm(monkeypatch):
    for name in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        monkeypatch.delenv(name, raising=False)


def noted(*signums: int) -> StopSignals:
    signals = StopSignals()
    for signum in signums:
        signals.note(signum, None)
    return signals


@pytest.mark.parametrize(("signums", "name", "status"), [
    ((signal.SIGTERM,), "SIGTERM", 143), ((signal.SIGINT,), "Ctrl-C", 130), ((signal.SIGHUP,), "SIGHUP", 129),
    ((signal.SIGUSR1,), "SIGUSR1", 138), ((signal.SIGTERM, signal.SIGINT), "SIGTERM", 143),
    ((signal.SIGHUP, signal.SIGTERM), "SIGHUP", 129)])
def test_the_first_signal_names_the_stop_and_its_exit_status(outside_slurm, signums, name, status):
    signals = noted(*signums)
    assert signals.received == signums[0] and signals.name() == name
    stop = signals.terminated("after step 7: continue with --resume last")
    assert isinstance(stop, Terminated) and stop.exit_code == status
    assert str(stop) == f"stopped by {name} after step 7: continue with --resume last"
    with pytest.raises(Terminated, match=f"^stopped by {name} during the test$"):
        signals.check("during the test")


def test_no_signal_no_stop_and_an_unnamed_one_reads_as_a_signal():
    signals = StopSignals()
    signals.check("between phases")  # nothing came: nothing raised
    assert signals.name() == "SIGTERM"  # Lightning's own stop, when no signal of ours came
    signals.received = signal.SIGUSR2
    assert signals.name() == "a signal"


def test_a_second_ctrl_c_stops_at_once_with_ctrl_cs_status(capsys):
    assert noted(signal.SIGTERM, signal.SIGINT).received == signal.SIGTERM  # after another signal: waits for it
    signals = noted(signal.SIGINT)
    with pytest.raises(SystemExit) as stopped:
        signals.note(signal.SIGINT, None)
    assert stopped.value.code == 130 and capsys.readouterr().err == "\ninterrupted again: stopping now\n"


def fake_scontrol(folder, status: int, said: str = ""):
    script = folder / "scontrol"
    script.write_text(f"#!/bin/sh\necho \"$@\" > {folder / 'asked'}\necho '{said}' >&2\nexit {status}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


@pytest.mark.parametrize(("array", "job"), [(False, "77"), (True, "5_3")])
def test_a_time_limit_warning_requeues_the_job_and_says_so_before(tmp_path, monkeypatch, capsys, outside_slurm,
                                                                  array, job):
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    if array:
        monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "5")
        monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    fake_scontrol(tmp_path, 0)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    stop = noted(signal.SIGUSR1).terminated("after step 7: continue with --resume last")
    line = f"stopped by SIGUSR1 after step 7; requeueing job {job}: it continues from last.ckpt in this folder"
    assert (tmp_path / "asked").read_text() == f"requeue {job}\n"
    assert capsys.readouterr().err == f"train.py: {line}\n"
    assert str(stop) == line and stop.prefix == "" and stop.said and stop.exit_code == 138


def test_a_requeue_slurm_refuses_is_an_error_naming_why(tmp_path, monkeypatch, outside_slurm):
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    fake_scontrol(tmp_path, 1, "scontrol: error: Requeue of job 77 denied")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    stop = noted(signal.SIGUSR1).terminated("after step 7")
    assert str(stop) == ("requeueing job 77 failed (scontrol: error: Requeue of job 77 denied): submit it again to "
                         "continue") and not stop.said and stop.prefix == "error: "
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    assert "(scontrol is not on PATH here)" in str(noted(signal.SIGUSR1).terminated("after step 7"))


@pytest.mark.parametrize(("signum", "name"), [(signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "Ctrl-C"),
                                            (signal.SIGHUP, "SIGHUP")])
def test_in_a_slurm_job_only_the_time_limit_warning_requeues(tmp_path, monkeypatch, capsys, outside_slurm, signum,
                                                             name):
    """A SIGTERM (scancel, preemption), a Ctrl-C or a lost terminal stops the job; only SIGUSR1 asks for more time."""
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    fake_scontrol(tmp_path, 0)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    stop = noted(signum).terminated("after step 7: continue with --resume last")
    assert str(stop) == f"stopped by {name} after step 7: continue with --resume last"
    assert not (tmp_path / "asked").exists() and capsys.readouterr().err == ""


def test_only_rank_zero_requeues(monkeypatch, outside_slurm):
    from project import internals

    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setattr(internals, "is_rank_zero", lambda: False)
    assert str(noted(signal.SIGUSR1).terminated("after step 7")) == "stopped by SIGUSR1 after step 7"


def test_the_stop_line_says_where_the_run_stopped_and_how_to_go_on():
    from project.reliability.processes import StopAtSafePoints

    stopper = StopAtSafePoints(StopSignals())
    assert stopper.where(resumed=False) == "before its first training step; nothing new to save: start it again"
    assert stopper.where(resumed=True) == ("before its first training step; nothing new to save: continue with "
                                           "--resume last")
    stopper.stopped_at = 0  # a step count, not "none yet"
    assert stopper.where(resumed=False) == "after step 0; last.ckpt holds that step: continue with --resume last"


@pytest.mark.parametrize(("here", "elsewhere", "stops"), [(False, 0, False), (True, 0, True), (False, 1, True),
                                                          (True, 1, True)])
def test_ranks_stop_together_when_any_of_them_saw_a_signal(monkeypatch, here, elsewhere, stops):
    """The ranks' flags meet in an all-reduce (MAX); a rank that saw nothing stops as on SIGTERM. The other ranks
    stand in as the value they bring (two real ranks: test_faults.py)."""
    from types import SimpleNamespace

    import torch

    from project.reliability.processes import StopAtSafePoints

    def all_reduce(flag, op):
        assert op == torch.distributed.ReduceOp.MAX and flag.device == torch.device("cpu")
        assert flag.tolist() == [int(here)]
        flag.copy_(torch.maximum(flag, torch.tensor([elsewhere])))

    monkeypatch.setattr(torch.distributed, "all_reduce", all_reduce)
    signals = noted(signal.SIGHUP) if here else StopSignals()
    trainer = SimpleNamespace(world_size=2, strategy=SimpleNamespace(root_device=torch.device("cpu")))
    assert StopAtSafePoints(signals)._agreed(trainer) is stops
    assert signals.received == ({True: signal.SIGHUP, False: signal.SIGTERM if stops else None}[here])


def test_under_ddp_the_ranks_compare_every_few_steps_and_stop_at_the_first_comparison(monkeypatch):
    """An all-reduce costs a gloo rank about a small model's step: the ranks compare what they saw every AGREE_EVERY
    steps (all at the same steps), and at every epoch's end; one process alone checks every step, for nothing."""
    from types import SimpleNamespace

    import torch

    from project import internals
    from project.reliability import processes

    compared, stopped = [], []
    other_rank_saw = {"from": 3}  # the other rank got SIGTERM during step 3

    def all_reduce(flag, op):
        compared.append(trainer.global_step)
        flag.copy_(torch.maximum(flag, torch.tensor([int(trainer.global_step >= other_rank_saw["from"])])))

    monkeypatch.setattr(torch.distributed, "all_reduce", all_reduce)
    monkeypatch.setattr(internals, "validation_due", lambda trainer: False)
    monkeypatch.setattr(internals, "stop_as_on_sigterm", lambda trainer: stopped.append(trainer.global_step))
    trainer = SimpleNamespace(world_size=2, global_step=0, strategy=SimpleNamespace(root_device=torch.device("cpu")))
    stopper = processes.StopAtSafePoints(StopSignals())
    for step in range(1, 2 * processes.AGREE_EVERY + 1):
        trainer.global_step = step
        stopper.on_train_batch_end(trainer, None, None, None, step - 1)
        if stopped:
            break
    assert compared == stopped == [processes.AGREE_EVERY] and stopper.stopped_at == processes.AGREE_EVERY
    assert stopper.signals.received == signal.SIGTERM  # as the other rank saw
    compared.clear()
    trainer.global_step = processes.AGREE_EVERY + 3
    stopper.on_train_epoch_end(trainer, None)  # an epoch's end is always a comparison
    assert compared == [processes.AGREE_EVERY + 3] and stopper.stopped_at == processes.AGREE_EVERY + 3

    alone = processes.StopAtSafePoints(noted(signal.SIGTERM))
    stopped.clear()
    trainer.world_size, trainer.global_step = 1, 3
    alone.on_train_batch_end(trainer, None, None, None, 2)
    assert stopped == [3] and alone.stopped_at == 3  # no comparison to wait for
