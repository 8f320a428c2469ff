"""What a hostile user tried, replayed: each attempt a real script run that must end by itself with its one line
and exit code, no traceback, and nothing written but what the case expects.

Each case names the mechanism that handles its kind of input, so the next value of the same kind is handled too:
a setting's one validation (flag, config file or ``--trainer.KEY``), a name that becomes a path, a path that must be
a regular file, a storage string, the sweep journal's cut record.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from helpers import HANG_S, ROOT, make_tiny_data, run_script_warm
from project.errors import UsageError


@dataclass(frozen=True)
class Attempt:
    script: str
    args: tuple[str, ...]
    line: str  # in the one line the script ends with
    exit_code: int = UsageError.exit_code
    prepare: tuple[str, ...] = ()  # what the folder holds first: see `lay_out`


ATTEMPTS = {
    # One validation for a setting wherever it comes from, its range included.
    "lr-beyond-float32": Attempt("train.py", ("--fast-dev-run", "--lr", "1e39", "--scheduler", "none"),
                                 "argument --lr: must fit a float32 (at most 3.4e+38), got 1e39"),
    "lr-1e308-under-onecycle": Attempt("train.py", ("--fast-dev-run", "--lr", "1e308"), "must fit a float32"),
    "limit-inf-in-a-file": Attempt("train.py", ("--config", "inf.yaml"),
                                   "--trainer.limit_train_batches: a share must be in [0, 1], got inf",
                                   prepare=("yaml",)),
    "no-training-batch": Attempt("train.py", ("--data-dir", "data", "--val-size", "40",
                                              "--trainer.limit_train_batches", "0"),
                                 "--trainer.limit_train_batches 0: no training batch, so no optimizer step",
                                 prepare=("data",)),
    "max-steps-0": Attempt("train.py", ("--trainer.max_steps", "0"),
                           "--trainer.max_steps: must be -1 (no limit) or 1 or more, got 0"),
    "max-time-negative-in-a-file": Attempt("train.py", ("--config", "max-time.yaml"),
                                           "--trainer.max_time: must be a positive length of time, got {'days': -1}",
                                           prepare=("yaml",)),
    "accumulation-beyond-the-epoch": Attempt(
        "train.py", ("--data-dir", "data", "--batch-size", "32", "--val-size", "40", "--trainer.limit_train_batches",
                     "3", "--trainer.accumulate_grad_batches", "1000000000000"),
        "--trainer.accumulate_grad_batches 1000000000000: more than the 3 batches of an epoch", prepare=("data",)),
    "logger-named-twice": Attempt("train.py", ("--logger", "csv,csv"), "argument --logger: csv is named twice"),
    "key-given-twice-in-a-file": Attempt("train.py", ("--config", "twice.yaml"),
                                         "--config twice.yaml: 'lr' is given twice (line 3); keep one",
                                         prepare=("yaml",)),
    "val-size-beyond-the-data": Attempt("train.py", ("--data-dir", "data", "--val-size", "60000"),
                                        "--val-size 60000: must leave both splits non-empty", prepare=("data",)),
    # Devices: what the accelerator has, and processes the cores can run.
    "devices-every-gpu-on-a-cpu": Attempt("train.py", ("--accelerator", "cpu", "--devices", "-1"),
                                          "--devices -1 means every GPU; on cpu give a process count"),
    "devices-far-beyond-the-cores": Attempt("train.py", ("--accelerator", "cpu", "--devices", "99"),
                                            "--devices 99: 99 training processes on"),
    # Nothing to do is not success.
    "predict-an-empty-folder": Attempt("predict.py", ("empty", "--weights", "model.pth"),
                                       "empty: no files in this folder", prepare=("empty", "weights")),
    # Every name that becomes a path: one plain folder name.
    "name-absolute": Attempt("train.py", ("--name", "/etc"), "argument --name: must be one plain folder name"),
    "name-escapes-the-logdir": Attempt("train.py", ("--name", "../escape"), "must be one plain folder name"),
    "name-in-a-file": Attempt("train.py", ("--config", "name.yaml"), "name: must be one plain folder name",
                              prepare=("yaml",)),
    "study-name-climbs-into-another": Attempt("sweep.py", ("--study-name", "other/../a"),
                                              "argument --study-name: must be one plain folder name"),
    "study-name-empty": Attempt("sweep.py", ("--study-name", ""), "must be one plain folder name, got ''"),
    "runs-name-escapes": Attempt("runs.py", ("--name", "../x"), "argument --name: must be one plain folder name"),
    # A path that must be a regular file, refused before it is opened (a pipe would block the read for good).
    "journal-is-a-pipe": Attempt("sweep.py", ("--space", "space.yaml", "--data-dir", "data", "--storage",
                                              "fifo.journal"), "not a regular file (a pipe or a device)",
                                 prepare=("fifo", "data")),
    "run-record-is-a-pipe-resume": Attempt("train.py", ("--resume", "last"), "no run with a last checkpoint",
                                           prepare=("fifo-run",)),
    "run-record-is-a-pipe-evaluate": Attempt("evaluate.py", (), "no run with a best checkpoint", prepare=("fifo-run",)),
    "run-record-nested-too-deep-evaluate": Attempt("evaluate.py", (), "no run with a best checkpoint",
                                                   prepare=("deep-run",)),
    # A storage string is a URL or a journal's path, never a file named by a password.
    "libpq-connection-string": Attempt("sweep.py", ("--space", "space.yaml", "--data-dir", "data", "--storage",
                                                    "host=127.0.0.1 port=1 password='s3cret' dbname=x"),
                                       "a libpq connection string, not a journal file's path", prepare=("data",)),
}
YAML = {"inf.yaml": "trainer:\n  limit_train_batches: .inf\n", "max-time.yaml": "trainer:\n  max_time: {days: -1}\n",
        "name.yaml": "name: /etc\n", "twice.yaml": "lr: 0.1\nbatch_size: 32\nlr: 0.3\n"}


def lay_out(folder: Path, prepare: tuple[str, ...]) -> None:
    """What the attempt finds in its working folder; the default run folder is ``lightning_logs/tiny``."""
    (folder / "space.yaml").write_text("params:\n  lr: {type: float, low: 0.01, high: 0.3}\n")
    if "yaml" in prepare:
        for name, text in YAML.items():
            (folder / name).write_text(text)
    if "data" in prepare:
        make_tiny_data(folder / "data")
    if "fifo" in prepare:
        os.mkfifo(folder / "fifo.journal")
    if "empty" in prepare:
        (folder / "empty").mkdir()
    if "weights" in prepare:
        import torch

        from tests.tiny_recipe.model import LitTiny

        torch.save(LitTiny().model.state_dict(), folder / "model.pth")
    if "fifo-run" in prepare or "deep-run" in prepare:
        run = folder / "lightning_logs" / "tiny" / "version_0"
        (run / "checkpoints").mkdir(parents=True)
        (run / "checkpoints" / "best-epoch00-acc0.5000.ckpt").write_bytes(b"never read")
        (run / "checkpoints" / "last.ckpt").write_bytes(b"never read")
        if "fifo-run" in prepare:
            os.mkfifo(run / "run.json")
        else:
            (run / "run.json").write_text("[" * 100_000 + "]" * 100_000)


def everything_in(folder: Path) -> set[str]:
    return {str(path.relative_to(folder)) for path in folder.rglob("*")}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ATTEMPTS))
def test_each_hostile_attempt_ends_in_its_one_line(name, tmp_path):
    attempt = ATTEMPTS[name]
    lay_out(tmp_path, attempt.prepare)
    before = everything_in(tmp_path)
    done = run_script_warm(attempt.script, *attempt.args, cwd=tmp_path, timeout=HANG_S)  # no hang
    output = done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert "Traceback" not in output, output
    assert done.returncode == attempt.exit_code, output
    assert lines and lines[-1].startswith(f"{attempt.script}: error: ") and attempt.line in lines[-1], output
    assert everything_in(tmp_path) == before  # nothing written, in the folder or a run folder
    assert "s3cret" not in output


TRAINER_VALUES = [
    ({"limit_train_batches": float("nan")}, "--trainer.limit_train_batches: a share must be in [0, 1], got nan"),
    ({"limit_test_batches": float("inf")}, "--trainer.limit_test_batches: a share must be in [0, 1], got inf"),
    ({"limit_val_batches": -2}, "--trainer.limit_val_batches: a count of batches must be 0 or more, got -2"),
    ({"gradient_clip_val": -1}, "--trainer.gradient_clip_val: must be a finite number, 0 or more, got -1"),
    ({"gradient_clip_val": float("inf")}, "must be a finite number, 0 or more, got inf"),
    ({"max_steps": -5}, "--trainer.max_steps: must be -1 (no limit) or 1 or more, got -5"),
    ({"max_time": "00:00:00:00"}, "--trainer.max_time: must be a positive length of time, got '00:00:00:00'"),
    ({"max_time": "1 day"}, "--trainer.max_time: must be DD:HH:MM:SS, got '1 day'"),
    ({"max_time": {"days": 1, "fortnights": 1}}, "--trainer.max_time: must map weeks, days, hours"),
    ({"accumulate_grad_batches": 0}, "--trainer.accumulate_grad_batches: must be 1 or more, got 0"),
]


@pytest.mark.parametrize(("values", "line"), TRAINER_VALUES)
def test_each_trainer_argument_out_of_its_range_is_one_line(values, line):
    """What the script replays above for one value of each kind, here for the others (no process to start)."""
    from project.config.trainer_args import check_trainer_args

    with pytest.raises(UsageError) as refused:
        check_trainer_args(values)
    assert line in str(refused.value)


def test_trainer_arguments_in_their_ranges_pass_as_given():
    from project.config.trainer_args import check_trainer_args

    given = {"limit_train_batches": 1.0, "limit_val_batches": 0, "limit_test_batches": 3, "max_steps": -1,
             "gradient_clip_val": 0.0, "max_time": {"hours": 1, "minutes": 30}, "accumulate_grad_batches": 1}
    assert check_trainer_args(given) == given
    assert check_trainer_args({"max_time": "00:01:00:00", "max_steps": 1}) == {"max_time": "00:01:00:00",
                                                                                 "max_steps": 1}


def test_a_journal_whose_last_record_was_cut_goes_on_from_its_complete_records(tmp_path, capsys):
    import optuna

    from project.sweeps.storage import open_storage

    journal = tmp_path / "study.journal"
    study = optuna.create_study(study_name="s", storage=open_storage(str(journal)), direction="maximize")
    for value in (0.25, 0.5):
        trial = study.ask()
        study.tell(trial, value)
    complete = journal.read_bytes()
    cut = b'{"op_code": 4, "worker_id": "w", "trial_id": 1, "va'  # a kill mid-append: no newline
    journal.write_bytes(complete + cut)
    study = optuna.load_study(study_name="s", storage=open_storage(str(journal)))
    notice = capsys.readouterr().err
    aside = [path for path in tmp_path.iterdir() if path.name.startswith("study.journal.cut-")]
    assert len(aside) == 1 and aside[0].read_bytes() == cut and journal.read_bytes() == complete
    assert f"{journal}: its last record was cut short" in notice and str(aside[0]) in notice
    study.tell(study.ask(), 0.75)  # the next append starts on a line of its own
    again = optuna.load_study(study_name="s", storage=open_storage(str(journal)))
    assert [t.value for t in again.trials] == [0.25, 0.5, 0.75]
    assert journal.read_bytes().endswith(b"\n") and json.loads(journal.read_bytes().splitlines()[-1])
    assert capsys.readouterr().err == ""  # a whole journal is left alone, and nothing is said


def test_what_the_scripts_print_is_terminal_safe(capsys):
    """A name or a record can hold escape sequences (retitle the terminal, clear the screen): printed, they are
    shown as text; newlines and tabs still lay a summary out."""
    from project.errors import say

    say("run a\x1b]0;pwned\x07b\r\nsecond\tline\x9b")
    assert capsys.readouterr().out == "run a\\x1b]0;pwned\\x07b\\r\nsecond\tline\\x9b\n"


def test_runs_py_shows_each_run_on_one_row_whatever_its_name_and_record_hold(tmp_path):
    evil = "evil\x1b]0;pwned\x07\nname"
    run = tmp_path / "logs" / "tiny" / evil
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"state": "failed", "started": 1.8e9, "error": "boom\x1b[2J\nline 2"}))
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "runs.py"), "--logdir", str(tmp_path / "logs"),
                           "--name", "tiny"], capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stderr
    assert not any(char in done.stdout + done.stderr for char in "\x1b\x07\r")
    header, row = done.stdout.splitlines()  # one row for the one run
    assert row.startswith(str(tmp_path / "logs" / "tiny" / "evil\\x1b]0;pwned\\x07\\nname"))
    assert "failed: boom\\x1b[2J\\nline 2" in row


@pytest.mark.slow
def test_another_recipes_checkpoint_is_refused_by_every_script_naming_both(trained, tmp_path):
    """The tiny recipe's checkpoints, given to scripts that use the second recipe: one line each, the same
    (predict.py loads its model as evaluate.py does)."""
    from helpers import make_bars

    best = Path(trained["results"]["best_checkpoint"])
    bars = make_bars(tmp_path / "bars")
    logs = ("--data-dir", str(bars), "--logdir", str(tmp_path / "logs"))
    commands = [("evaluate.py", "--ckpt", str(best), "--data-dir", str(bars)),
                ("train.py", "--resume", str(trained["run"] / "checkpoints" / "last.ckpt"), *logs),
                ("train.py", "--init-from", str(best), *logs)]
    for script, *args in commands:
        done = run_script_warm(script, *args, timeout=HANG_S, env={"PROJECT_RECIPE": "tests.second_recipe"})
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        line = done.stderr.strip().splitlines()[-1]
        assert "trained by another recipe (tests.tiny_recipe.model:LitTiny), not by this one " \
               "(tests.second_recipe.model:LitCNN); PROJECT_RECIPE names the recipe the scripts use" in line, line
    assert not list((tmp_path / "logs").rglob("*"))  # no run folder (the writable check may make --logdir)


def test_a_checkpoint_that_does_not_name_its_recipe_is_known_by_the_recipes_options():
    """Checkpoints written before they named their module: one without this recipe's options is another's."""
    from project.contract import load_recipe
    from project.errors import CheckpointError
    from project.reliability.checkpointing import check_trained_by

    second = load_recipe("tests.second_recipe")
    older = {"hyper_parameters": {"hidden": [128], "lr": 0.1}, "run_record": {"config": {}}}
    with pytest.raises(CheckpointError, match=r"^old.ckpt: trained by another recipe \(a model without --channels\), "
                                              r"not by this one \(tests.second_recipe.model:LitCNN\)"):
        check_trained_by(older, Path("old.ckpt"), second)
    # An option of two words is named as its flag; a checkpoint with no hyperparameters at all lacks them all.
    widened = replace(second, options={"kernel_size": replace(second.options["channels"], default=3),
                                       **second.options})
    with pytest.raises(CheckpointError, match=r"^old.ckpt: trained by another recipe \(a model without --kernel-size"):
        check_trained_by({"run_record": {"config": {}}}, Path("old.ckpt"), widened)
    check_trained_by({"hyper_parameters": {"channels": [8, 16]}}, Path("own.ckpt"), second)
    check_trained_by({"hyper_parameters": {}, "run_record": {"module": "tests.second_recipe.model:LitCNN"}},
                     Path("own.ckpt"), second)


def test_devices_are_what_the_accelerator_has_and_what_the_cores_can_run():
    from project.config.schema import RunConfig
    from project.hardware.devices import OVERSUBSCRIBED, cores, resolve_hardware

    with pytest.raises(UsageError, match="--devices -1 means every GPU; on cpu give a process count"):
        resolve_hardware(RunConfig(accelerator="cpu", devices=-1))
    most = OVERSUBSCRIBED * cores()
    assert resolve_hardware(RunConfig(accelerator="cpu", devices=most)).devices == most
    with pytest.raises(UsageError, match=rf"--devices {most + 1}: {most + 1} training processes on {cores()} CPU "
                                         rf"core\(s\) .* use at most {most}, or add --oversubscribe"):
        resolve_hardware(RunConfig(accelerator="cpu", devices=most + 1))
    assert resolve_hardware(RunConfig(accelerator="cpu", devices=most + 1, oversubscribe=True)).devices == most + 1


def test_a_key_given_twice_is_refused_in_every_yaml_the_project_reads(tmp_path):
    from helpers import tiny_recipe
    from project.sweeps.study import load_space

    space = tmp_path / "space.yaml"
    space.write_text("params:\n  lr: {type: float, low: 0.01, high: 0.3}\n  lr: {type: float, low: 0.1, high: 1}\n")
    with pytest.raises(UsageError, match=r"space.yaml: 'lr' is given twice \(line 3\); keep one"):
        load_space(space, tiny_recipe())
    merged = tmp_path / "merged.yaml"  # YAML's merge key is not a repeated key
    merged.write_text("base: &base {lr: 0.1}\nfixed:\n  <<: *base\nparams:\n  seed: {type: int, low: 0, high: 3}\n")
    with pytest.raises(UsageError, match="unknown top-level key 'base'"):  # read, then refused for its own reason
        load_space(merged, tiny_recipe())


def test_a_validation_share_that_leaves_no_training_split_is_a_usage_error(tmp_path):
    from helpers import tiny_config, tiny_recipe
    from project.training.build import build_datamodule

    data = build_datamodule(tiny_config(make_tiny_data(tmp_path), tmp_path, val_size=240), tiny_recipe())
    with pytest.raises(UsageError, match="--val-size 240: must leave both splits non-empty, and the training set has "
                                         "240 samples"):
        data.setup("fit")
