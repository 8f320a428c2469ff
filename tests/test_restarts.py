"""Every restart is right: a run stopped at any phase, by SIGTERM, Ctrl-C or kill -9, and resumed with the same
flags ends as the run that was never stopped (weights, validations, best checkpoint, test metrics, model.pth,
TensorBoard curves), in its one folder; what would change the run is refused; runs never share a folder."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch

from helpers import (
    HANG_S,
    ROOT,
    TIMED,
    TRAIN,
    assert_same_training_state,
    event_accumulator,
    fill_file_system,
    make_tiny_data,
    tiny_config,
    train,
)
from project.errors import NothingToDo, UserError

FAULTY = str(ROOT / "tests" / "faulty_train.py")
# 640 training images in batches of 32: 20 steps an epoch; 40 validation images in batches of 8 (5 batches),
# 80 test images (10 batches), so that a signal can land mid-way through either.
FLAGS = ("--batch-size", "32", "--val-size", "40", "--eval-batch-size", "8", "--checkpoint-every-n-steps", "3",
         "--log-every-n-steps", "2", "--accelerator", "cpu", "--max-epochs", "3")
SETTINGS = {"batch_size": 32, "val_size": 40, "eval_batch_size": 8, "checkpoint_every_n_steps": 3,
            "log_every_n_steps": 2, "accelerator": "cpu", "max_epochs": 3}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # A tenth of the labels wrong: accuracies below 1, so that a partial epoch's train/acc differs from the whole's.
    return make_tiny_data(tmp_path_factory.mktemp("restarts") / "data", n_train=680, n_test=80, wrong_labels=0.1)


@pytest.fixture(scope="module")
def reference(data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The run never stopped, with what every stopped and resumed run must end equal to."""
    result = train(tiny_config(data, tmp_path_factory.mktemp("reference") / "logs", **SETTINGS))
    return outcome(result.run_dir)


def outcome(run: Path) -> dict:
    results = json.loads((run / "results.json").read_text())
    events = event_accumulator(run)
    return {"model": torch.load(run / "model.pth", weights_only=True),
            "last": torch.load(run / "checkpoints" / "last.ckpt", weights_only=True),
            "best": (Path(results["best_checkpoint"]).name, results["val/acc_best"]),
            "test": (results["test/acc"], results["test/loss"]),
            "curves": {tag: [(e.step, None if tag.startswith(TIMED) else e.value) for e in events.Scalars(tag)]
                       for tag in events.Tags()["scalars"]}}


def assert_same_run(resumed: dict, reference: dict) -> None:
    assert resumed["model"].keys() == reference["model"].keys()
    assert all(torch.equal(resumed["model"][k], reference["model"][k]) for k in reference["model"])
    assert_same_training_state(resumed["last"], reference["last"])
    assert resumed["best"] == reference["best"] and resumed["test"] == reference["test"]
    # Every logged tag: every validation, no step missing or logged twice, the resumed epoch's figures whole.
    assert resumed["curves"] == reference["curves"]


def stop(data: Path, logdir: Path, phase: str, signal_name: str, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "STOP_AT": f"{phase}:{signal_name}"}
    return subprocess.run([sys.executable, FAULTY, "--data-dir", str(data), "--logdir", str(logdir), *FLAGS, *extra],
                          capture_output=True, text=True, timeout=HANG_S, env=env)


# What the stopped run says: one line, true to where it stopped.
SAID = {
    "step-25": "stopped by {name} after step {step}; last.ckpt holds that step: continue with --resume last",
    "validation-0": "stopped by {name} after step 20; last.ckpt holds that step: continue with --resume last",
    "validation-2": "stopped by {name} after step 60; last.ckpt holds that step: continue with --resume last",
    "test": "stopped by {name} during the test; training is complete: continue with --resume last (it tests "
            "and exports)",
}


PHASES = ["step-25", "validation-0", "validation-2", "test", "export"]
# Every phase by SIGTERM, every phase but the first validation (the last one is the harder) by kill -9;
# Ctrl-C takes SIGTERM's path, shown mid-epoch.
STOPS = ([(phase, "TERM") for phase in PHASES] + [(phase, "KILL") for phase in PHASES if phase != "validation-0"]
         + [("step-25", "INT")])


@pytest.mark.slow
@pytest.mark.parametrize(("phase", "signal_name"), STOPS)
def test_a_run_stopped_at_any_phase_resumes_to_the_uninterrupted_run(data, reference, tmp_path, phase, signal_name):
    logdir = tmp_path / "logs"
    stopped = stop(data, logdir, phase, signal_name)
    run = logdir / "tiny" / "version_0"
    lines = stopped.stderr.strip().splitlines()
    if signal_name == "KILL":
        assert stopped.returncode == -signal.SIGKILL
    elif phase == "export":  # the outputs were being written: they are finished first
        assert stopped.returncode == 0, stopped.stderr
        assert lines[-1].endswith("came while the outputs were written; they are complete and the run is finished")
    else:
        name = {"TERM": "SIGTERM", "INT": "Ctrl-C"}[signal_name]
        assert stopped.returncode == 128 + getattr(signal, f"SIG{signal_name}"), stopped.stderr
        step = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
        assert lines[-1] == "train.py: " + SAID[phase].format(name=name, step=step)  # a stop asked for: no error
        assert not [line for line in lines if "error" in line or "Traceback" in line], stopped.stderr
    if phase == "test":
        assert "test/acc" not in stopped.stdout

    config = tiny_config(data, logdir, **SETTINGS, resume="last")
    if phase == "export" and signal_name != "KILL":
        with pytest.raises(NothingToDo, match="is finished .*nothing to resume, nothing written"):
            train(config)
    else:
        train(config)
    assert [p.name for p in (logdir / "tiny").iterdir()] == ["version_0"]  # one run, one folder
    assert not list(run.rglob(".*.tmp"))
    assert_same_run(outcome(run), reference)


@pytest.mark.slow
def test_a_run_stopped_before_its_first_step_says_so_and_saves_nothing(data, tmp_path):
    stopped = stop(data, tmp_path / "logs", "start", "TERM")
    assert stopped.returncode == 143
    assert stopped.stderr.strip().splitlines()[-1] == ("train.py: stopped by SIGTERM before its first training "
                                                       "step; nothing new to save: start it again")
    assert not list((tmp_path / "logs").rglob("*.ckpt"))


@pytest.mark.slow
def test_resuming_with_another_steps_per_call_changes_nothing(data, reference, tmp_path):
    """Killed mid-epoch with 4 optimizer steps per Lightning step, resumed with 1 (a sized loader, which counts
    its batches): the epoch still ends with its validation, and the run ends as if never stopped."""
    logdir = tmp_path / "logs"
    assert stop(data, logdir, "step-25", "KILL", "--steps-per-call", "4").returncode == -signal.SIGKILL
    assert torch.load(logdir / "tiny" / "version_0" / "checkpoints" / "last.ckpt")["global_step"] < 40
    train(tiny_config(data, logdir, **SETTINGS, resume="last", steps_per_call=1))
    assert_same_run(outcome(logdir / "tiny" / "version_0"), reference)


@pytest.fixture(scope="module")
def one_epoch(data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("one_epoch")
    train(tiny_config(data, root / "logs", **{**SETTINGS, "max_epochs": 1}), test=False)
    return root / "logs" / "tiny" / "version_0" / "checkpoints" / "last.ckpt"


CHANGES = [
    ({"lr": 0.05}, "--lr 0.05: the checkpoint's run trained with --lr 0.2"),
    ({"momentum": 0.0}, "--momentum 0.0: the checkpoint's run trained with --momentum 0.9"),
    ({"weight_decay": 0.0}, "--weight-decay 0.0: the checkpoint's run trained with --weight-decay 0.0005"),
    ({"optimizer": "adam"}, "--optimizer adam: the checkpoint's run trained with --optimizer sgd"),
    ({"seed": 1}, "--seed 1: the checkpoint's run trained with --seed 0"),
    ({"val_size": 80}, "--val-size 80: the checkpoint's run trained with --val-size 40"),
    ({"batch_size": 16}, "--batch-size 16: the checkpoint's run trained with --batch-size 32"),
    ({"hidden": [64]}, "--hidden 64: the checkpoint's run trained with --hidden 128"),
    ({"max_epochs": 3, "scheduler": "none"},
     "--scheduler none: the checkpoint's run trained with --scheduler onecycle"),
    ({"max_epochs": 3}, "--max-epochs 3: the checkpoint's run trained with --max-epochs 1"),
    ({"trainer": {"accumulate_grad_batches": 2}},
     "--trainer.accumulate_grad_batches 2: the checkpoint's run trained with --trainer.accumulate_grad_batches 1,"),
]


@pytest.mark.parametrize(("change", "message"), CHANGES)
def test_a_resume_refuses_what_would_change_the_run_naming_the_flag(data, one_epoch, tmp_path, change, message):
    settings = {**SETTINGS, "max_epochs": 1, **change}
    before = sorted(p.relative_to(one_epoch.parents[3]) for p in one_epoch.parents[3].rglob("*"))
    with pytest.raises(UserError) as err:
        train(tiny_config(data, tmp_path / "elsewhere", **settings, resume=str(one_epoch)))
    assert str(err.value).startswith(message)
    assert str(err.value).endswith(f"or start a new run from its weights with --init-from {one_epoch}")
    assert sorted(p.relative_to(one_epoch.parents[3]) for p in one_epoch.parents[3].rglob("*")) == before
    assert not (tmp_path / "elsewhere").exists()


def test_init_from_starts_a_new_run_from_the_weights(data, one_epoch, tmp_path):
    start = torch.load(one_epoch, weights_only=True)["state_dict"]
    result = train(tiny_config(data, tmp_path / "logs", max_epochs=1, lr=1e-30, scheduler="none", momentum=0.0,
                               weight_decay=0.0, init_from=str(one_epoch)), test=False)
    assert result.run_dir == tmp_path / "logs" / "tiny" / "version_0"  # a new run, in a folder of its own
    after = torch.load(result.last_checkpoint, weights_only=True)
    assert after["global_step"] == 20  # its own schedule, from step 0
    assert all(torch.allclose(after["state_dict"][k], start[k]) for k in start)  # an LR of 1e-30 moved nothing
    with pytest.raises(UserError, match=r"--init-from .*: its weights do not fit this model \(size mismatch.*\); "
                                        r"use the model settings it was trained with \(--hidden\)$"):
        train(tiny_config(data, tmp_path / "logs", max_epochs=1, hidden=[16], init_from=str(one_epoch)))


@pytest.mark.slow
def test_runs_started_together_never_share_a_folder(data, tmp_path):
    procs = [subprocess.Popen([sys.executable, TRAIN, "--data-dir", str(data), "--logdir", str(tmp_path / "logs"),
                               *FLAGS, "--max-epochs", "1", "--seed", str(seed)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for seed in (1, 2)]
    outputs = [p.communicate(timeout=HANG_S) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    runs = sorted((tmp_path / "logs" / "tiny").iterdir())
    assert [r.name for r in runs] == ["version_0", "version_1"]
    folders = {line.split()[1].rsplit("/", 1)[0] for out, _ in outputs for line in out.splitlines()
               if line.startswith("results ")}
    assert folders == {str(r) for r in runs}  # each summary names its own folder
    assert sorted(json.loads((r / "results.json").read_text())["weights"] for r in runs) == \
        sorted(str(r / "model.pth") for r in runs)
    assert {yaml_seed(r) for r in runs} == {1, 2}


def yaml_seed(run: Path) -> int:
    import yaml

    return yaml.safe_load((run / "config.yaml").read_text())["seed"]


def test_resuming_a_finished_run_says_so_and_writes_nothing(data, tmp_path):
    logs = tmp_path / "logs"
    train(tiny_config(data, logs, **{**SETTINGS, "max_epochs": 1}))
    before = {p: p.stat().st_mtime_ns for p in logs.rglob("*")}
    done = subprocess.run([sys.executable, TRAIN, "--data-dir", str(data), "--logdir", str(logs), *FLAGS,
                           "--max-epochs", "1", "--resume", "last"], capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0 and done.stdout == ""
    assert done.stderr.strip().splitlines()[-1].startswith(f"train.py: {logs / 'tiny' / 'version_0'} is finished")
    assert {p: p.stat().st_mtime_ns for p in logs.rglob("*")} == before


def test_a_killed_save_leaves_no_temporary_file_after_the_resume(data, one_epoch, tmp_path):
    run = tmp_path / "logs" / "tiny" / "version_0"
    shutil.copytree(one_epoch.parents[1], run)
    (run / "results.json").unlink()  # not finished: stopped before it wrote its results
    stray = run / "checkpoints" / ".last.ckpt.k3j4.tmp"
    stray.write_bytes(b"half a checkpoint")
    train(tiny_config(data, tmp_path / "logs", **{**SETTINGS, "max_epochs": 1},
                      resume=str(run / "checkpoints" / "last.ckpt")), test=False)
    assert not stray.exists()


# ---------------------------------------------------------------- a full disk: one line, nothing lost


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 16 MiB tmpfs: a real file system that fills up (mounting needs root)."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("needs root to mount a small tmpfs")
    folder = tmp_path / "disk"
    folder.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(folder)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    yield folder
    subprocess.run(["umount", "-l", str(folder)], check=False)


def fill_at(data: Path, disk: Path, phase: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "FILL_DISK": f"{phase}:{disk / 'filler'}"}
    return subprocess.run([sys.executable, FAULTY, "--data-dir", str(data), "--logdir", str(disk / "logs"), *FLAGS],
                          capture_output=True, text=True, timeout=HANG_S, env=env)


def only_line(stderr: str) -> str:
    """The one line a failed run says of its failure (around Lightning's usual notes and the epoch lines)."""
    lines = [line for line in stderr.splitlines()
             if line.startswith("train.py:") or any(word in line for word in ("Error", "Traceback", "Exception"))]
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.mark.slow
def test_a_full_disk_at_the_start_is_one_line_and_writes_nothing(data, small_disk):
    fill_file_system(small_disk / "filler")
    done = subprocess.run([sys.executable, TRAIN, "--data-dir", str(data), "--logdir", str(small_disk / "logs"),
                           *FLAGS], capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 2
    assert only_line(done.stderr) == (f"train.py: error: --logdir {small_disk / 'logs'}: cannot write there "
                                      "(No space left on device)")
    assert not list((small_disk / "logs").rglob("*"))


@pytest.mark.slow
def test_a_full_disk_during_a_checkpoint_keeps_the_last_good_one(data, small_disk, reference):
    done = fill_at(data, small_disk, "step-25")
    assert done.returncode == 1
    run = small_disk / "logs" / "tiny" / "version_0"
    assert only_line(done.stderr) == (f"train.py: error: cannot write the run's files (No space left on device); "
                                      f"{run / 'checkpoints' / 'last.ckpt'} is kept: free space and continue with "
                                      "--resume last")
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 24
    assert not list(run.rglob(".*.tmp"))
    (small_disk / "filler").unlink()
    train(tiny_config(data, small_disk / "logs", **SETTINGS, resume="last"))
    assert_same_run(outcome(run), reference)


@pytest.mark.slow
def test_a_full_disk_before_the_first_checkpoint_says_there_is_none(data, small_disk):
    done = fill_at(data, small_disk, "step-1")
    assert done.returncode == 1
    assert only_line(done.stderr).endswith("(No space left on device); no checkpoint was written yet, nothing to "
                                           "resume: free space and start the run again")
    assert not list((small_disk / "logs").rglob("last.ckpt"))


def test_a_failed_write_says_what_is_on_disk_and_its_cause(tmp_path):
    import errno

    from project.training.run import failed_write

    full, too_large = OSError(errno.ENOSPC, "No space left on device"), OSError(errno.EFBIG, "File too large")
    assert failed_write(full, tmp_path) == ("cannot write the run's files (No space left on device); no checkpoint was "
                                           "written yet, nothing to resume: free space and start the run again")
    assert failed_write(too_large, None).endswith("raise the file size limit (ulimit -f) and start the run again")
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"kept")
    assert failed_write(full, tmp_path).endswith(f"{tmp_path / 'checkpoints' / 'last.ckpt'} is kept: free space and "
                                                 "continue with --resume last")
    assert failed_write(too_large, tmp_path, kept="the test metrics are above").endswith(
        "the test metrics are above: raise the file size limit (ulimit -f) and continue with --resume last")


def test_a_checkpoint_past_the_file_size_limit_is_said_as_such(tmp_path):
    code = ("import resource, sys, torch; from project.reliability.checkpointing import atomic_save; "
            "resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, resource.RLIM_INFINITY)); "
            "atomic_save({'w': torch.zeros(100_000)}, sys.argv[1])")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "x.ckpt")], capture_output=True, text=True,
                          timeout=HANG_S, cwd=ROOT)
    assert "OSError: [Errno 27] File too large: this process may write files of at most 65,536 bytes" in done.stderr
    assert not list(tmp_path.iterdir())  # no partial file left


def test_resume_auto_starting_again_leaves_no_checkpoint_of_the_attempt_before(tmp_path):
    from project.config.schema import RunConfig
    from project.reliability import run_folder
    from project.reliability.run_folder import claim_run_folder

    folder = tmp_path / "tiny" / "job_7"
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "best-epoch00-acc0.5000.ckpt").write_bytes(b"the attempt's, never resumed")
    (folder / "checkpoints" / ".last.ckpt.x1.tmp").write_bytes(b"cut")
    claim_run_folder(RunConfig(logdir=str(tmp_path), name="tiny", run_version="job_7", resume="auto"))
    run_folder.release_all()
    assert list((folder / "checkpoints").iterdir()) == []


@pytest.mark.slow
def test_a_full_disk_during_the_export_loses_no_test_metric(data, small_disk, reference):
    done = fill_at(data, small_disk, "export")
    assert done.returncode == 1
    assert done.stdout.splitlines()[0] == "test/acc {:.4f}   test/loss {:.4f}".format(*reference["test"])
    assert only_line(done.stderr) == ("train.py: error: cannot write the run's files (No space left on device); the "
                                      "test metrics are above and in results.json: free space and continue with "
                                      "--resume last")
    run = small_disk / "logs" / "tiny" / "version_0"
    saved = json.loads((run / "results.json").read_text())
    assert (saved["test/acc"], saved["test/loss"]) == reference["test"] and saved["weights"] is None
    (small_disk / "filler").unlink()
    train(tiny_config(data, small_disk / "logs", **SETTINGS, resume="last"))
    assert_same_run(outcome(run), reference)


# ---------------------------------------------------------------- bad input: one line


def test_bad_config_files_and_seeds_are_one_line(tmp_path, capsys):
    from helpers import parse_run_config
    from project.errors import UsageError

    utf16 = tmp_path / "utf16.yaml"
    utf16.write_text("max_epochs: 2\n", encoding="utf-16")
    deep = tmp_path / "deep.yaml"
    deep.write_text("[" * 10000 + "]" * 10000)
    for argv, message in ((["--config", str(utf16)], f"--config {utf16}: not UTF-8 text (save it as UTF-8)"),
                          (["--config", str(deep)], f"--config {deep}: nested too deeply to be a config file"),
                          (["--seed", "-1"], "must be between 0 and 4294967295, got -1"),
                          (["--seed", str(2**32)], "must be between 0 and 4294967295, got 4294967296")):
        with pytest.raises((UsageError, SystemExit)) as err:
            parse_run_config(argv)
        said = str(err.value) if err.type is UsageError else capsys.readouterr().err  # argparse prints and exits 2
        assert message in said and said.strip().count("\n") == 0, said
    done = subprocess.run([sys.executable, TRAIN, "--config", str(utf16)], capture_output=True, text=True,
                          timeout=HANG_S)
    assert done.returncode == 2 and done.stderr == f"train.py: error: --config {utf16}: not UTF-8 text (save it " \
                                                   "as UTF-8)\n"


def test_runs_that_choose_the_same_folder_at_the_same_moment_claim_two(tmp_path, monkeypatch):
    """The race made certain: both runs have picked the next version_N before either makes it. The exclusive mkdir
    sends the second to version_N+1; a mkdir that tolerated an existing folder would give both the same one."""
    import threading

    from project.reliability import run_folder

    (tmp_path / "version_0").mkdir()
    barrier, waited, make = threading.Barrier(2, timeout=20), set(), Path.mkdir

    def held(self: Path, *args, **kwargs) -> None:
        if self.name.startswith("version_") and threading.get_ident() not in waited:
            waited.add(threading.get_ident())
            barrier.wait()  # each thread's first attempt: both chose their number already
        return make(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", held)
    chosen: list[str] = []
    threads = [threading.Thread(target=lambda: chosen.append(run_folder._next_free_version(tmp_path)))
               for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(chosen) == ["version_1", "version_2"]


class TermAtStep(L.Callback):
    """Sends this process SIGTERM once, after optimizer step ``step``."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def test_a_stop_at_an_epochs_last_step_waits_for_its_validation(data, tmp_path):
    """SIGTERM after the epoch's last step, where a validation is due: the run validates first, so the checkpoint it
    stops with holds the validated epoch (stopped there, a resume would skip that validation for good)."""
    from project.errors import Terminated

    with pytest.raises(Terminated, match="stopped by SIGTERM after step 20; last.ckpt holds that step"):
        train(tiny_config(data, tmp_path / "logs", **{**SETTINGS, "checkpoint_every_n_steps": None},
                          steps_per_call=1), callbacks=[TermAtStep(20)])
    run = tmp_path / "logs" / "tiny" / "version_0"
    assert [e.step for e in event_accumulator(run).Scalars("val/acc")] == [19]  # epoch 0's validation ran
    assert [p.name for p in (run / "checkpoints").glob("best-*.ckpt")] == [
        next(p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("best-epoch01"))]
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 20
