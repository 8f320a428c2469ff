"""The right run and the right checkpoint, every time: the best by its recorded score, the newest by when it started
(named runs and SLURM jobs included), one process per run folder, logs that only grow, nothing secret written."""

from __future__ import annotations

import csv
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
    TIMED,
    TINY,
    TRAIN,
    event_accumulator,
    make_tiny_data,
    one_line_error,
    run_script,
    run_script_warm,
    tiny_config,
    tiny_recipe,
    train,
)
from project.errors import NothingToDo, Terminated, UsageError, UserError
from project.reliability import run_folder

SHORT = {"max_epochs": 2, "accelerator": "cpu", "steps_per_call": 1}  # 7 steps an epoch, one per Lightning step


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_tiny_data(tmp_path_factory.mktemp("choosing") / "data", wrong_labels=0.1)


class SignalAtStep(L.Callback):
    """Sends this process ``signum`` once, after optimizer step ``step``."""

    def __init__(self, step: int, signum: int = signal.SIGTERM) -> None:
        self.step, self.signum, self.sent = step, signum, False

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step >= self.step and not self.sent:
            self.sent = True
            os.kill(os.getpid(), self.signum)


def test_best_is_the_recorded_best_score_not_the_last_name(data, tmp_path):
    result = train(tiny_config(data, tmp_path, save_top_k=-1, **SHORT))
    best = run_folder.best_checkpoint(result.run_dir)
    assert str(best) == result.best_checkpoint  # what the run recorded
    checkpoints = best.parent
    # A worse checkpoint whose name sorts last (as a later epoch's does): chosen by name, it would win.
    worse = checkpoints / "best-epoch09-acc0.0100.ckpt"
    shutil.copy(checkpoints / "last.ckpt", worse)
    assert run_folder.best_checkpoint(result.run_dir) == best
    done = run_script("evaluate.py", "--logdir", str(tmp_path), "--data-dir", str(data), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["source"] == str(best)
    assert done.stderr.startswith(f"evaluate.py: using {best}, the best checkpoint of the newest run, "
                                  f"{result.run_dir} (finished)")


def test_the_newest_run_is_the_one_that_started_last_whatever_its_name(data, tmp_path):
    first = train(tiny_config(data, tmp_path, **SHORT))
    with pytest.raises(Terminated, match="stopped by SIGTERM after step 9"):
        train(tiny_config(data, tmp_path, run_version="job_17", **SHORT), callbacks=[SignalAtStep(9)])
    newest = run_folder.runs(tmp_path, "tiny")
    assert [r.folder.name for r in newest] == ["job_17", first.run_dir.name]
    assert newest[0].state == "stopped" and newest[0].step == 9 and newest[1].state == "finished"
    resumed = train(tiny_config(data, tmp_path, resume="last", **SHORT))  # what the stop line says to do
    assert resumed.run_dir.name == "job_17" and resumed.optimizer_steps == 14
    assert run_folder.run_info(resumed.run_dir).state == "finished"


def test_a_run_folder_is_held_by_one_process(data, tmp_path):
    """A resume of a run still training, or a second job racing for the same --run-version (``--resume auto``, as
    SLURM's script runs it), meets one line and touches nothing."""
    result = train(tiny_config(data, tmp_path, **SHORT, scheduler="none"))
    lock = run_folder.RunLock(result.run_dir).acquire("test")  # as the process training it holds it
    before = sorted((p.name, p.stat().st_mtime_ns) for p in result.run_dir.rglob("*"))
    try:
        with pytest.raises(UsageError, match=r"--resume: .* is in use by a run still training \(pid"):
            train(tiny_config(data, tmp_path, resume=str(result.last_checkpoint), scheduler="none",
                              **{**SHORT, "max_epochs": 3}))
        racing = tmp_path / "tiny" / "job_3"
        racing.mkdir()
        other = run_folder.RunLock(racing).acquire("test")  # the other job, which made the folder a moment ago
        with pytest.raises(UsageError, match="--run-version: .*job_3 is in use by a run still training"):
            train(tiny_config(data, tmp_path, run_version="job_3", resume="auto", **SHORT))
        other.release()
    finally:
        lock.release()
    assert sorted((p.name, p.stat().st_mtime_ns) for p in result.run_dir.rglob("*")) == before


def test_resume_auto_leaves_a_finished_run_without_checkpoints_alone(data, tmp_path):
    config = tiny_config(data, tmp_path, run_version="job_5", trainer={"enable_checkpointing": False,
                                                                       "enable_progress_bar": False}, **SHORT)
    first = train(config)
    folder = first.run_dir
    written = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and p.name != run_folder.RUN_RECORD}
    with pytest.raises(NothingToDo) as refused:
        train(config.replace(resume="auto", seed=1))
    assert str(refused.value) == (f"{folder} is finished (test/acc {first.test_metrics['test/acc']:.4f}, weights "
                                  f"{folder / 'model.pth'}); nothing to resume, nothing written")
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.name in written} == written


def test_resume_auto_starts_a_job_killed_before_its_first_checkpoint_again_with_its_logs_cleared(data, tmp_path):
    """A requeued SLURM job whose first attempt died before any checkpoint: the same folder, one set of curves."""
    config = tiny_config(data, tmp_path, run_version="job_6", logger="tensorboard,csv", log_every_n_steps=1,
                         trainer={"enable_checkpointing": False, "enable_progress_bar": False}, **SHORT)
    folder = train(config).run_dir
    with open(folder / "metrics.csv", newline="") as stream:
        before = [{k: v for k, v in row.items() if k not in TIMED} for row in csv.DictReader(stream)]
    for name in ("results.json", "model.pth"):  # as if killed at its last step: logs written, no end
        (folder / name).unlink()
    run_folder.write_record(folder, state="running")
    again = train(config.replace(resume="auto"))
    assert again.run_dir == folder
    with open(folder / "metrics.csv", newline="") as stream:
        after = [{k: v for k, v in row.items() if k not in TIMED} for row in csv.DictReader(stream)]
    assert after == before  # each row once: the first attempt's were cleared
    losses = [event.step for event in event_accumulator(folder).Scalars("train/loss")]
    assert losses == sorted(set(losses))


def test_csv_logs_keep_their_rows_over_a_resume(data, tmp_path):
    settings = {**SHORT, "logger": "tensorboard,csv", "checkpoint_every_n_steps": 3}
    reference = train(tiny_config(data, tmp_path / "reference", **settings))
    with pytest.raises(Terminated):
        train(tiny_config(data, tmp_path / "stopped", **settings), callbacks=[SignalAtStep(9)])
    resumed = train(tiny_config(data, tmp_path / "stopped", resume="last", **settings))

    def rows(run):
        with open(run / "metrics.csv", newline="") as stream:
            return [{k: v for k, v in row.items() if k not in TIMED} for row in csv.DictReader(stream)]

    assert len(rows(resumed.run_dir)) == len(rows(reference.run_dir)) > 10
    assert rows(resumed.run_dir) == rows(reference.run_dir)  # epoch 0's val/acc included


def test_resume_last_alone_continues_the_run_with_its_own_settings(data, tmp_path, caplog):
    """As Lightning's ``ckpt_path="last"``: a resume needs no flags repeated; the settings the command leaves unset
    are the run's own, and one it gives differently is still refused."""
    from project.config.cli import parse_run_command
    from project.reliability.resume import adopt_run_settings

    settings = {**SHORT, "seed": 3, "lr": 0.05, "scheduler": "cosine", "max_epochs": 3, "checkpoint_every_n_steps": 3,
                "trainer": {"enable_progress_bar": False, "gradient_clip_val": 0.5}}
    uninterrupted = train(tiny_config(data, tmp_path / "uninterrupted", **settings))
    with pytest.raises(Terminated):
        train(tiny_config(data, tmp_path / "stopped", **settings), callbacks=[SignalAtStep(9)])
    command = ["--data-dir", str(data), "--logdir", str(tmp_path / "stopped"), "--accelerator", "cpu",
               "--steps-per-call", "1", "--trainer.enable_progress_bar", "false", "--resume", "last"]
    with caplog.at_level("INFO", logger="lightning.pytorch"):
        config = adopt_run_settings(*parse_run_command(tiny_recipe(), command), tiny_recipe())
    assert (config.seed, config.lr, config.scheduler, config.max_epochs, config.batch_size, config.val_size,
            config.trainer["gradient_clip_val"]) == (3, 0.05, "cosine", 3, 32, 40, 0.5)
    checkpoint = tmp_path / "stopped" / "tiny" / "version_0" / "checkpoints" / "last.ckpt"
    assert f"resuming {checkpoint} with its run's settings: --batch-size 32, --lr 0.05, --scheduler cosine, " \
           "--seed 3, --val-size 40, --max-epochs 3, --trainer.gradient_clip_val 0.5\n" in caplog.text
    resumed = train(config)
    weights = torch.load(resumed.run_dir / "model.pth", weights_only=True)
    reference = torch.load(uninterrupted.run_dir / "model.pth", weights_only=True)
    assert all(torch.equal(weights[key], reference[key]) for key in reference)
    without_data = [arg for arg in command if arg not in ("--data-dir", str(data))]
    adopted = adopt_run_settings(*parse_run_command(tiny_recipe(), without_data), tiny_recipe())
    assert adopted.data_dir == str(data.resolve())  # the data its run trained on, not $DATA_DIR's
    changed = adopt_run_settings(*parse_run_command(tiny_recipe(), [*command, "--seed", "4"]), tiny_recipe())
    assert changed.seed == 4 and changed.lr == 0.05  # what the command gives is kept: the resume refuses it
    with pytest.raises(UserError, match="--seed 4: the checkpoint's run trained with --seed 3"):
        train(changed)


def test_a_checkpoint_without_the_run_record_is_still_checked(data, tmp_path):
    """Written before checkpoints held the run's settings: its hyperparameters say what it trained with."""
    result = train(tiny_config(data, tmp_path, **SHORT))
    state = torch.load(result.last_checkpoint, weights_only=True)
    del state["run_record"]
    older = tmp_path / "older.ckpt"
    torch.save(state, older)
    with pytest.raises(UserError, match="--lr 0.05: the checkpoint's run trained with --lr 0.2"):
        train(tiny_config(data, tmp_path, resume=str(older), lr=0.05, **{**SHORT, "max_epochs": 2}))


def test_one_file_for_both_exports_and_bad_run_versions_are_refused_before_anything_is_written(data, tmp_path):
    same = str(tmp_path / "x.out")
    with pytest.raises(UsageError, match="--export and --export-pt2 name the same file"):
        train(tiny_config(data, tmp_path / "logs", export=same, export_pt2=same, **SHORT))
    for bad in ("/abs/path", "../x", "a/b", "..", "x" * 300):
        done = run_script_warm("train.py", "--run-version", bad, "--data-dir", str(data), "--logdir",
                               str(tmp_path / "l"))
        assert done.returncode == 2
        assert "--run-version" in one_line_error(done.stderr)
    assert not (tmp_path / "logs").exists() and not (tmp_path / "l").exists() and not (tmp_path / "abs").exists()


def test_sighup_stops_a_run_where_it_can_resume(data, tmp_path):
    """A closed terminal or a dropped ssh session: saved and said, like SIGTERM."""
    with pytest.raises(Terminated, match="stopped by SIGHUP after step 4; last.ckpt holds that step") as stopped:
        train(tiny_config(data, tmp_path, **SHORT), callbacks=[SignalAtStep(4, signal.SIGHUP)])
    assert stopped.value.exit_code == 128 + signal.SIGHUP
    assert torch.load(next(tmp_path.rglob("last.ckpt")), weights_only=True)["global_step"] == 4


def test_resume_refusals_for_a_broken_or_foreign_checkpoint(data, tmp_path):
    result = train(tiny_config(data, tmp_path, **SHORT))
    state = torch.load(result.last_checkpoint, weights_only=True)
    state["state_dict"]["model.layers.0.weight"][0, 0] = float("nan")
    broken = tmp_path / "broken.ckpt"
    torch.save(state, broken)
    with pytest.raises(UserError, match="its weights are not finite .*resume from an earlier one"):
        train(tiny_config(data, tmp_path, resume=str(broken), **SHORT))
    del state["run_record"]  # an older checkpoint whose weights were not this model's (its options say 128)
    state["state_dict"] = {k: torch.zeros(64, *v.shape[1:]) if k == "model.layers.0.weight" else v
                           for k, v in state["state_dict"].items()}
    foreign = tmp_path / "foreign.ckpt"
    torch.save(state, foreign)
    with pytest.raises(UserError, match=r"its weights do not fit this model \(model.layers.0.weight"):
        train(tiny_config(data, tmp_path, resume=str(foreign), **SHORT))


def test_a_resume_reads_its_checkpoint_once_before_the_run(data, tmp_path, monkeypatch):
    """Its settings, its data position and its weights' fit are all checked from one read of the file (Lightning's
    own load, which restores the state, is the other)."""
    from project.reliability import resume

    result = train(tiny_config(data, tmp_path, scheduler="none", **SHORT))  # no fixed-length schedule: it can go on
    reads = []
    read = resume.read_checkpoint
    monkeypatch.setattr(resume, "read_checkpoint", lambda path, *args, **kw: reads.append(path) or read(path, *args,
                                                                                                           **kw))
    train(tiny_config(data, tmp_path, scheduler="none", resume=result.last_checkpoint, **{**SHORT, "max_epochs": 3}),
          test=False)
    assert reads == [Path(result.last_checkpoint)]


def test_the_default_given_explicitly_is_no_change_of_settings(tmp_path):
    from project.config.schema import RunConfig
    from project.reliability.resume import check_same_training

    check_same_training({"val_size": None}, RunConfig(val_size=40), tmp_path, tiny_recipe())  # the recipe's own default
    with pytest.raises(UserError, match="--val-size 30: the checkpoint's run trained with --val-size 40"):
        check_same_training({"val_size": None}, RunConfig(val_size=30), tmp_path, tiny_recipe())
    # Lightning's defaults, given explicitly: all the batches (1.0), one batch a step, no step limit.
    check_same_training({"trainer": {}}, RunConfig(trainer={"limit_train_batches": 1.0, "accumulate_grad_batches": 1,
                                                            "max_steps": -1}), tmp_path, tiny_recipe())
    with pytest.raises(UserError, match=r"--trainer.limit_train_batches 1: .* trained with "
                                        r"--trainer.limit_train_batches 1.0"):
        one_batch = RunConfig(trainer={"limit_train_batches": 1})
        check_same_training({"trainer": {}}, one_batch, tmp_path, tiny_recipe())
    # ... nor a smoke test: only a limit that limits something marks the run as one.
    limits = {"limit_train_batches": 1.0, "max_steps": -1, "limit_val_batches": 2}
    run_folder.start_record(tmp_path, limits, resumed=False)
    assert run_folder.read_run_record(tmp_path)["limited"] == ["limit_val_batches"]


def test_a_test_label_the_model_cannot_predict_is_refused_before_training(tmp_path):
    data = make_tiny_data(tmp_path / "data")
    images, labels = torch.load(data / "tiny" / "test.pt", weights_only=True)
    labels[-1] = 12
    torch.save((images, labels), data / "tiny" / "test.pt")
    with pytest.raises(UserError, match="label 12 is outside the recipe's 10 classes"):
        train(tiny_config(data, tmp_path / "logs", **SHORT))
    assert not (tmp_path / "logs").exists()


def test_a_checkpoint_of_lightning_1_is_refused_for_a_resume_and_taken_for_its_weights(data, tmp_path):
    result = train(tiny_config(data, tmp_path, **SHORT))
    state = torch.load(result.last_checkpoint, weights_only=True)
    state["pytorch-lightning_version"] = "1.9.5"
    older = tmp_path / "older.ckpt"
    torch.save(state, older)
    with pytest.raises(UserError, match="written by Lightning 1.9.5, .*start a new run from its weights with "
                                        "--init-from"):
        train(tiny_config(data, tmp_path, resume=str(older), **SHORT))
    assert train(tiny_config(data, tmp_path, init_from=str(older), **SHORT)).optimizer_steps == 14


def test_a_refusal_from_lightnings_own_checks_leaves_no_run_folder(data, tmp_path):
    """As under a SLURM job step whose task count is not --devices: Lightning refuses when the Trainer is made,
    after the folder was claimed; the folder goes with the refusal."""
    env = {**os.environ, "SLURM_NTASKS": "1", "SLURM_JOB_ID": "77", "SLURM_JOB_NAME": "train",
           "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NTASKS_PER_NODE": "1"}
    done = subprocess.run([sys.executable, TRAIN, "--data-dir", str(data), "--logdir", str(tmp_path), "--devices",
                           "2", "--accelerator", "cpu", "--run-version", "job_77", *TINY], capture_output=True,
                          text=True, env=env, timeout=HANG_S)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "tiny" / "job_77").exists()


def test_runs_lists_every_run_newest_first_with_its_state(data, tmp_path):
    finished = train(tiny_config(data, tmp_path, **SHORT))
    with pytest.raises(Terminated):
        train(tiny_config(data, tmp_path, run_version="job_12", **SHORT), callbacks=[SignalAtStep(9)])
    smoke = train(tiny_config(data, tmp_path, **SHORT, trainer={"limit_train_batches": 2,
                                                                 "enable_progress_bar": False}))
    done = run_script("runs.py", "--logdir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    header, *rows = done.stdout.splitlines()
    assert header.split() == ["run", "state", "test/acc", "best", "checkpoint", "started"]
    assert [row.split()[0] for row in rows] == [str(smoke.run_dir), str(tmp_path / "tiny" / "job_12"),
                                                str(finished.run_dir)]
    assert "finished (smoke: --trainer.limit_train_batches)" in rows[0]
    assert "stopped at step 9" in rows[1] and rows[1].split()[5] == "-"  # no test/acc: it never tested
    assert rows[2].split()[1:3] == ["finished", f"{finished.test_metrics['test/acc']:.4f}"]
    assert Path(finished.best_checkpoint).name in rows[2]
    # The newest run that is not a smoke test is what the scripts take by default.
    assert run_folder.checkpoint_of("last", tmp_path, "tiny", "--resume")[1].folder.name == "job_12"


@pytest.mark.parametrize(("state", "step", "error", "limited", "shown"), [
    ("stopped", 9, None, (), "stopped at step 9"),
    ("killed", 40, None, (), "killed at step 40"),
    ("killed", None, None, (), "killed before its first checkpoint"),
    ("stopped", None, None, (), "stopped before its first checkpoint"),
    ("failed", 3, "CUDA out of memory", (), "failed: CUDA out of memory"),
    ("failed", 3, None, (), "failed"),
    ("running", 7, None, (), "running"),
    ("finished", 14, None, ("fast_dev_run", "limit_train_batches"),
     "finished (smoke: --trainer.fast_dev_run, --trainer.limit_train_batches)"),
    ("damaged", None, "run.json: started is not a time", (), "damaged (run.json: started is not a time)"),
])
def test_each_state_is_described_as_docs_results_md_shows_it(state, step, error, limited, shown):
    info = run_folder.RunInfo(folder=Path("v0"), started=0.0, state=state, step=step, limited=limited, test_acc=None,
                        best=None, error=error)
    assert info.describe() == shown


def test_a_run_without_an_end_is_running_while_a_process_holds_it_and_killed_once_none_does(tmp_path):
    """Whether the process that holds a folder lives is read from the kernel's lock, not from a pid that may since
    belong to another process; a DataLoader worker forked from it does not keep the folder locked."""
    folder = tmp_path / "tiny" / "version_0"
    folder.mkdir(parents=True)
    run_folder.write_record(folder, state="running", started=1.0, step=40, pid=4242, host="node7")
    run_folder.own(folder, "--resume")
    try:
        assert run_folder.run_info(folder).state == "running"
        with pytest.raises(UsageError, match=r"^--resume: .*version_0 is in use by a run still training "
                                             r"\(pid 4242 on node7\); runs never share a folder"):
            run_folder.RunLock(folder).acquire("--resume")
        ready, told = os.pipe()
        child = os.fork()
        if child == 0:  # a worker: lives on, holding nothing once its fork hooks have run
            os.write(told, b"1")
            signal.pause()
            os._exit(0)
        try:
            assert os.read(ready, 1) == b"1"
            run_folder.release_all()
            assert run_folder.run_info(folder).state == "killed"  # the worker still runs, the folder is free
            assert run_folder.run_info(folder).describe() == "killed at step 40"
        finally:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
    finally:
        run_folder.release_all()
    run_folder.RunLock(folder).acquire("--resume").release()


def test_logs_are_cut_back_over_an_empty_metrics_csv_and_a_row_a_kill_cut_short(tmp_path):
    from project.reliability.run_folder import roll_back_logs

    (tmp_path / "metrics.csv").write_text("")  # a run killed as it made the file
    roll_back_logs(tmp_path, 3)
    assert (tmp_path / "metrics.csv").read_text() == ""
    (tmp_path / "metrics.csv").write_bytes(b"epoch,step,train/loss\r\n0,1,0.5\r\n0,2,0.4\r\n0,3,0.3\r\n0\r\n")
    roll_back_logs(tmp_path, 3)
    assert (tmp_path / "metrics.csv").read_bytes() == b"epoch,step,train/loss\r\n0,1,0.5\r\n0,2,0.4\r\n"
