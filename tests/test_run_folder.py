"""Choosing among runs, in process, on run folders written by hand: what ``runs.py`` lists, which run ``--resume
last`` / ``--ckpt best`` take, what they pass over and how they refuse; a resumed run's logs cut back."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest

from project.errors import UsageError
from project.reliability import run_folder
from project.reliability.run_folder import RunFolder, RunInfo
from project.training.build import log_hparams_with_results, log_settings


def run(parent: Path, name: str, record: dict | None = None, results: dict | None = None, last: bool = False,
        best: str | None = None, config: str | None = None) -> Path:
    """A run folder as a run leaves it: ``run.json``, ``results.json``, ``config.yaml``, its checkpoints."""
    folder = parent / name
    folder.mkdir(parents=True)
    if record is not None:
        (folder / "run.json").write_text(json.dumps(record))
    if results is not None:
        (folder / "results.json").write_text(json.dumps(results))
    if config is not None:
        (folder / "config.yaml").write_text(config)
    if last or best:
        (folder / "checkpoints").mkdir()
    if last:
        (folder / "checkpoints" / "last.ckpt").write_bytes(b"weights")
    if best:
        (folder / "checkpoints" / best).write_bytes(b"weights")
    return folder


def finished(started: float, **fields) -> dict:
    return {"state": "finished", "started": started, "limited": [], **fields}


def test_the_runs_listed_are_the_folders_a_run_wrote_newest_started_first(tmp_path):
    parent = tmp_path / "tiny"
    run(parent, "version_1", finished(100.0))
    run(parent, "version_0", finished(200.0))  # the later start, whatever the folders' names say
    run(parent, "only_config", config="max_epochs: 1\n")
    run(parent, "only_results", results={"test/acc": 0.5})
    (parent / "only_checkpoints" / "checkpoints").mkdir(parents=True)
    (parent / "notes").mkdir()  # a folder of the user's: not a run
    (parent / "notes" / "todo.txt").write_text("x")
    (parent / "stray.txt").write_text("not a folder")
    listed = run_folder.runs(tmp_path, "tiny")
    assert {info.folder.name for info in listed} == {"version_0", "version_1", "only_config", "only_results",
                                                      "only_checkpoints"}
    names = [info.folder.name for info in listed]
    assert names.index("version_0") < names.index("version_1")
    assert run_folder.runs(tmp_path, "none") == [] and run_folder.runs(tmp_path / "missing", "tiny") == []


def test_a_runs_state_as_listed(tmp_path):
    parent = tmp_path / "tiny"
    info = {name: run_folder.run_info(folder) for name, folder in {
        "finished": run(parent, "a", finished(1.0, step=40), results={"test/acc": 0.75}),
        "failed": run(parent, "b", {"state": "failed", "started": 2.0, "error": "CUDA out of memory"}),
        "failed-silently": run(parent, "c", {"state": "failed", "started": 2.0}),
        "stopped": run(parent, "d", {"state": "stopped", "started": 3.0, "step": 25}),
        "stopped-early": run(parent, "e", {"state": "stopped", "started": 3.0}),
        "killed": run(parent, "f", {"state": "running", "started": 4.0, "step": 10, "pid": 99999999}),
        "no-record-weights": run(parent, "g", results={"test/acc": 0.5, "weights": "model.pth"}),
        "no-record": run(parent, "h", results={"test/acc": 0.5}),
        "smoke": run(parent, "i", finished(5.0, limited=["limit_train_batches", "max_steps"])),
        "smoke-by-config": run(parent, "j", results={}, config="trainer:\n  limit_val_batches: 2\n"),
        "damaged": run(parent, "k", {"state": "finished", "started": "yesterday"}),
    }.items()}
    described = {name: item.describe() for name, item in info.items()}
    assert described == {
        "finished": "finished", "failed": "failed: CUDA out of memory", "failed-silently": "failed",
        "stopped": "stopped at step 25", "stopped-early": "stopped before its first checkpoint",
        "killed": "killed at step 10", "no-record-weights": "finished", "no-record": "unfinished",
        "smoke": "finished (smoke: --trainer.limit_train_batches, --trainer.max_steps)",
        "smoke-by-config": "unfinished (smoke: --trainer.limit_val_batches)",
        "damaged": "damaged (run.json: started is not a time)",
    }
    assert info["finished"].test_acc == 0.75 and info["finished"].step == 40 and info["failed"].test_acc is None
    assert info["smoke"].smoke and not info["finished"].smoke and info["smoke-by-config"].smoke
    assert info["finished"].started == 1.0 and info["damaged"].best is None and info["damaged"].step is None
    written = os.stat(parent / "h" / "results.json").st_mtime
    assert info["no-record"].started == written and info["damaged"].started > 1e9  # a file's time, not a record's


def test_a_running_run_whose_process_holds_its_folder_is_running(tmp_path):
    folder = run(tmp_path / "tiny", "v", {"state": "running", "started": 1.0, "step": 3})
    run_folder.own(folder, "--resume")
    try:
        assert run_folder.is_locked(folder) and run_folder.run_info(folder).state == "running"
    finally:
        run_folder.release_all()
    assert not run_folder.is_locked(folder) and run_folder.run_info(folder).describe() == "killed at step 3"
    assert not run_folder.is_locked(tmp_path / "nowhere")


def test_last_and_best_are_the_newest_real_run_that_has_one(tmp_path, capsys):
    parent = tmp_path / "tiny"
    run(parent, "old", finished(1.0, best_checkpoint="best-acc0.90.ckpt"), last=True, best="best-acc0.90.ckpt")
    run(parent, "no_best", finished(2.0), last=True)
    run(parent, "no_last", finished(3.0, best_checkpoint="best-acc0.95.ckpt"), best="best-acc0.95.ckpt")
    run(parent, "smoke", finished(4.0, limited=["max_steps"]), last=True, best="best-acc0.99.ckpt")
    assert run_folder.checkpoint_of("last", tmp_path, "tiny", "--resume") == (
        parent / "no_best" / "checkpoints" / "last.ckpt", run_folder.run_info(parent / "no_best"))
    path, chosen = run_folder.checkpoint_of("best", tmp_path, "tiny", "--ckpt")
    assert path == parent / "no_last" / "checkpoints" / "best-acc0.95.ckpt" and chosen.folder.name == "no_last"
    assert run_folder.checkpoint_of("some/where.ckpt", tmp_path, "tiny", "--ckpt") == (Path("some/where.ckpt"), None)
    assert capsys.readouterr().err == ""


def test_damaged_runs_newer_than_the_choice_are_passed_over_aloud(tmp_path, capsys):
    parent = tmp_path / "tiny"
    run(parent, "older_damage", {"state": "finished", "started": "x"}, last=True)
    os.utime(parent / "older_damage" / "run.json", (0.5, 0.5))
    run(parent, "good", finished(1.0), last=True)
    run(parent, "newer_damage", {"state": "nonsense", "started": 2.0}, last=True)
    chosen = run_folder.newest_run(tmp_path, "tiny", "last", "--resume")
    assert chosen.folder.name == "good"
    err = capsys.readouterr().err
    assert err == (f"--resume last: passing over {parent / 'newer_damage'}: damaged (run.json: state is not one of "
                   "running, finished, stopped, failed)\n")


def test_no_run_to_choose_is_one_line_naming_why(tmp_path, capsys):
    parent = tmp_path / "tiny"
    with pytest.raises(UsageError) as nothing:
        run_folder.newest_run(tmp_path, "tiny", "last", "--resume")
    assert str(nothing.value) == (f"--resume last: no run with a last checkpoint under {parent}; train first or pass "
                                  "a path")
    run(parent, "damaged", {"started": "x"}, last=True)
    run(parent, "smoke_old", finished(1.0, limited=["limit_train_batches"]), last=True)
    run(parent, "smoke_new", finished(2.0, limited=["max_steps"]), last=True)
    run(parent, "finished_without", finished(3.0))
    with pytest.raises(UsageError) as smoke:
        run_folder.newest_run(tmp_path, "tiny", "last", "--resume")
    assert str(smoke.value) == (f"--resume last: the runs under {parent} are smoke tests (smoke_new: finished "
                                "(smoke: --trainer.max_steps)); pass its checkpoint's path to use one anyway")
    assert capsys.readouterr().err.startswith(f"--resume last: passing over {parent / 'damaged'}: damaged (")


def test_a_recorded_best_deleted_by_hand_is_never_returned_as_the_best(tmp_path):
    parent = tmp_path / "tiny"
    older = run(parent, "older", finished(1.0, best_checkpoint="best-acc0.80.ckpt"), best="best-acc0.80.ckpt")
    newer = run(parent, "newer", finished(2.0, best_checkpoint="best-acc0.95.ckpt"), last=True,
                results={"best_checkpoint": str(parent / "newer" / "checkpoints" / "best-acc0.95.ckpt")},
                best="best-acc0.95.ckpt")
    (newer / "checkpoints" / "best-acc0.95.ckpt").unlink()  # the user made room on the disk
    assert run_folder.best_checkpoint(newer) is None and RunFolder(newer).best_checkpoint is None
    assert run_folder.run_info(newer).best is None
    path, chosen = run_folder.checkpoint_of("best", tmp_path, "tiny", "--ckpt")  # --ckpt best; evaluate, predict
    assert path == older / "checkpoints" / "best-acc0.80.ckpt" and path.is_file() and chosen.folder == older
    (newer / "checkpoints" / "best-acc0.90.ckpt").write_bytes(b"w")  # another of its best checkpoints is left
    assert run_folder.best_checkpoint(newer) == newer / "checkpoints" / "best-acc0.90.ckpt"
    (older / "checkpoints" / "best-acc0.80.ckpt").unlink()
    (newer / "checkpoints" / "best-acc0.90.ckpt").unlink()
    with pytest.raises(UsageError, match="--ckpt best: no run with a best checkpoint under"):
        run_folder.checkpoint_of("best", tmp_path, "tiny", "--ckpt")


def test_a_run_without_a_recorded_best_is_scored_by_its_file_names(tmp_path):
    folder = run(tmp_path, "v", {"state": "finished", "started": 1.0}, best="best-acc0.91.ckpt")
    (folder / "checkpoints" / "best-acc0.97.ckpt").write_bytes(b"w")
    (folder / "checkpoints" / "best-epoch3.ckpt").write_bytes(b"w")  # no score in its name
    assert run_folder.best_checkpoint(folder) == folder / "checkpoints" / "best-acc0.97.ckpt"
    assert RunFolder(folder).best_checkpoint == folder / "checkpoints" / "best-acc0.97.ckpt"
    assert run_folder.best_checkpoint(tmp_path / "nothing") is None


def test_roll_back_cuts_each_log_to_the_steps_before_the_checkpoint(tmp_path):
    folder = tmp_path / "v"
    folder.mkdir()
    with open(folder / "metrics.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["epoch", "step", "train/loss"])
        writer.writerows([[0, 9, 1.0], [0, "", 0.7], [0, 19, 0.5], [1, 20, 0.4], [1, 29, 0.3], [1]])
    run_folder.roll_back_logs(folder, 20)
    rows = list(csv.reader((folder / "metrics.csv").open()))
    # A row without a step is the run's own (kept); one cut short by a kill goes with the rows after the checkpoint.
    assert rows == [["epoch", "step", "train/loss"], ["0", "9", "1.0"], ["0", "", "0.7"], ["0", "19", "0.5"]]
    run_folder.roll_back_logs(folder, 20)
    assert list(csv.reader((folder / "metrics.csv").open())) == rows


def test_remove_if_refused_leaves_a_folder_with_checkpoints(tmp_path):
    refused, trained = tmp_path / "refused", tmp_path / "trained"
    refused.mkdir()
    (refused / "config.yaml").write_text("x")
    (trained / "checkpoints").mkdir(parents=True)
    RunFolder(refused).remove_if_refused()
    RunFolder(trained).remove_if_refused()
    RunFolder(tmp_path / "never").remove_if_refused()
    assert not refused.exists() and trained.is_dir()


def test_describe_is_the_runs_line(tmp_path):
    info = RunInfo(folder=tmp_path, started=0.0, state="stopped", step=None, limited=("max_steps",), test_acc=None,
                   best=None, error="ignored")
    assert info.describe() == "stopped before its first checkpoint (smoke: --trainer.max_steps)"


def event_steps(path: Path) -> list[tuple[str, int]]:
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    return [("version" if event.HasField("file_version") else event.summary.value[0].tag, event.step)
            for event in EventFileLoader(str(path)).Load()]


def test_roll_back_cuts_tensorboards_events_to_the_steps_before_the_checkpoint(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    folder = tmp_path / "v"
    writer = SummaryWriter(str(folder))
    for step in (0, 9, 19, 20, 29):
        writer.add_scalar("train/loss", 1.0 / (step + 1), step)
    writer.close()
    (event_file,) = folder.glob("events.out.tfevents.*")
    (folder / "events.out.tfevents.bak").write_bytes(event_file.read_bytes())  # a user's copy: left alone
    (folder / "events.out.tfevents.1.host.0.damaged").write_bytes(b"\x00" * 7)  # unreadable: left as it is
    run_folder.roll_back_logs(folder, 20)
    assert event_steps(event_file) == [("version", 0), ("train/loss", 0), ("train/loss", 9), ("train/loss", 19)]
    assert len(event_steps(folder / "events.out.tfevents.bak")) == 6
    assert (folder / "events.out.tfevents.1.host.0.damaged").read_bytes() == b"\x00" * 7
    assert [p.name for p in folder.iterdir() if p.name.startswith(".")] == []  # the cut replaced the file whole
    before = event_file.read_bytes()
    run_folder.roll_back_logs(folder, 20)
    assert event_file.read_bytes() == before  # nothing above the step: the file untouched


def test_starting_over_clears_the_attempts_checkpoints_and_logs_but_never_a_finished_runs(tmp_path):
    from project.errors import NothingToDo

    folder = run(tmp_path, "job_7", {"state": "failed", "started": 1.0}, best="best-acc0.50.ckpt")
    (folder / "checkpoints" / ".last.ckpt.123.tmp").write_bytes(b"half")
    (folder / ".run.json.123.tmp").write_bytes(b"half")
    (folder / "checkpoints" / "notes.txt").write_text("mine")
    (folder / "metrics.csv").write_text("epoch,step,train/loss\n0,9,1.0\n")
    run_folder.start_over_in(folder)
    assert sorted(p.name for p in (folder / "checkpoints").iterdir()) == ["notes.txt"]
    assert sorted(p.name for p in folder.iterdir()) == ["checkpoints", "metrics.csv", "run.json"]
    assert (folder / "metrics.csv").read_text().splitlines() == ["epoch,step,train/loss"]
    weights = tmp_path / "job_8" / "model.pth"
    done = run(tmp_path, "job_8", finished(1.0), results={"test/acc": 0.975, "weights": str(weights)},
               best="best-acc0.97.ckpt")
    (done / "model.pth").write_bytes(b"weights")
    with pytest.raises(NothingToDo) as finished_run:
        run_folder.start_over_in(done)
    assert str(finished_run.value) == (f"{done} is finished (test/acc 0.9750, weights {weights}); nothing to "
                                       "resume, nothing written")
    assert (done / "checkpoints" / "best-acc0.97.ckpt").is_file()
    (done / "model.pth").unlink()  # results naming weights that are gone: not finished, so it starts over
    run_folder.start_over_in(done)
    assert not (done / "checkpoints" / "best-acc0.97.ckpt").exists()


def test_best_is_the_checkpoint_the_run_recorded_else_the_best_score_in_a_name(tmp_path):
    recorded = run(tmp_path, "recorded", finished(1.0, best_checkpoint="best-acc0.80.ckpt"), best="best-acc0.80.ckpt")
    (recorded / "checkpoints" / "best-acc0.90.ckpt").write_bytes(b"w")  # a higher name, not the run's choice
    assert run_folder.best_checkpoint(recorded) == recorded / "checkpoints" / "best-acc0.80.ckpt"
    by_results = run(tmp_path, "by_results", {"state": "finished", "started": 1.0},
                     results={"best_checkpoint": "/elsewhere/checkpoints/best-acc0.70.ckpt"}, best="best-acc0.70.ckpt")
    (by_results / "checkpoints" / "best-acc0.75.ckpt").write_bytes(b"w")
    assert run_folder.best_checkpoint(by_results) == by_results / "checkpoints" / "best-acc0.70.ckpt"  # moved run
    named = run(tmp_path, "named", {"state": "finished", "started": 1.0}, best="best-acc0.10.ckpt")
    for name, when in (("best-acc0.95.ckpt", 100), ("best-acc0.20.ckpt", 300), ("best-acc0.95-v1.ckpt", 200)):
        (named / "checkpoints" / name).write_bytes(b"w")
        os.utime(named / "checkpoints" / name, (when, when))
    # The best score; of two with it, the later written.
    assert run_folder.best_checkpoint(named) == named / "checkpoints" / "best-acc0.95-v1.ckpt"


def test_results_json_holds_plain_numbers_indented(tmp_path):
    import torch

    path = RunFolder(tmp_path).write_results({"test/acc": torch.tensor(0.5), "lr": 0.1, "weights": "m.pth",
                                              "storage": "postgresql://me:hunter2@db/x"})
    values = {"test/acc": 0.5, "lr": 0.1, "weights": "m.pth", "storage": "postgresql://me:***@db/x"}
    assert path == tmp_path / "results.json" and path.read_text() == json.dumps(values, indent=2)


def test_a_new_run_takes_the_version_after_the_highest(tmp_path):
    for name in ("version_0", "version_2", "version_x", "versions_9", "job_12"):
        (tmp_path / name).mkdir()
    assert run_folder._next_free_version(tmp_path) == "version_3" and (tmp_path / "version_3").is_dir()
    assert run_folder._next_free_version(tmp_path) == "version_4"
    (tmp_path / "new").mkdir()
    assert run_folder._next_free_version(tmp_path / "new") == "version_0"


def test_a_smoke_run_is_known_by_its_config_whatever_bytes_it_holds(tmp_path):
    folder = run(tmp_path, "v", results={}, config="note: caf\xe9\ntrainer:\n  max_steps: 3\n")
    (folder / "config.yaml").write_bytes(b"note: \xff\xfe\ntrainer:\n  max_steps: 3\n")
    assert run_folder.run_info(folder).limited == ("max_steps",)


@pytest.fixture
def released():
    yield
    run_folder.release_all()
    os.environ.pop(run_folder.RUN_VERSION_ENV, None)


def test_claiming_makes_the_next_folder_holds_it_and_records_the_start(tmp_path, released, monkeypatch):
    from project.config.schema import RunConfig

    config = RunConfig(logdir=str(tmp_path), name="tiny", data_dir="/data", trainer={"max_steps": 5})
    first = run_folder.claim_run_folder(config, recipe="tests.tiny_recipe")
    assert first == "version_0" and os.environ[run_folder.RUN_VERSION_ENV] == "version_0"
    record = run_folder.read_run_record(tmp_path / "tiny" / "version_0")
    assert (record["state"], record["pid"], record["limited"], record["recipe"], record["data_dir"]) == (
        "running", os.getpid(), ["max_steps"], "tests.tiny_recipe", "/data")
    assert run_folder.is_locked(tmp_path / "tiny" / "version_0")  # held: runs.py lists it running
    assert run_folder.claim_run_folder(config) == "version_1"
    with pytest.raises(UsageError) as taken:
        run_folder.claim_run_folder(config.replace(run_version="version_0"))
    assert str(taken.value) == (f"--run-version version_0: {tmp_path / 'tiny' / 'version_0'} exists; runs never "
                                "share a folder, choose another")
    assert run_folder.claim_run_folder(config.replace(fast_dev_run=True)) is None
    assert sorted(p.name for p in (tmp_path / "tiny").iterdir()) == ["version_0", "version_1"]


def test_a_later_rank_takes_rank_zeros_folder(tmp_path, released, monkeypatch):
    from project import internals
    from project.config.schema import RunConfig

    monkeypatch.setattr(internals, "is_rank_zero", lambda: False)
    config = RunConfig(logdir=str(tmp_path), name="tiny")
    assert run_folder.claim_run_folder(config) is None  # not told: its own (none), nothing made
    monkeypatch.setenv(run_folder.RUN_VERSION_ENV, "version_3")
    assert run_folder.claim_run_folder(config) == "version_3"
    assert not (tmp_path / "tiny").exists()


def test_resume_auto_in_a_folder_without_last_starts_over_there(tmp_path, released):
    from project.config.schema import RunConfig

    folder = run(tmp_path / "tiny", "job_5", {"state": "failed", "started": 1.0}, best="best-acc0.40.ckpt")
    config = RunConfig(logdir=str(tmp_path), name="tiny", run_version="job_5", resume="auto")
    assert run_folder.claim_run_folder(config) == "job_5"
    assert list((folder / "checkpoints").iterdir()) == [] and run_folder.read_run_record(folder)["started"] > 1.0


def test_the_text_and_hparams_tabs_hold_the_command_and_settings_masked(tmp_path, monkeypatch):
    import lightning as L
    import yaml
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from project.config.schema import RunConfig
    from project.training.build import build_loggers

    config = RunConfig(logdir=str(tmp_path), name="tiny", logger="tensorboard,csv")
    trainer = L.Trainer(logger=build_loggers(config, "v"), accelerator="cpu", enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    assert run_folder.run_dir(trainer) == tmp_path / "tiny" / "v" and run_folder.tensorboard_of(trainer) is not None
    monkeypatch.setattr("sys.argv", ["train.py", "--storage", "postgresql://me:hunter2@db/x", "--lr", "0.1"])
    log_settings(trainer, config)
    log_hparams_with_results(trainer, {"lr": 0.1, "storage": "postgresql://me:hunter2@db/x"},
                                       ("test/acc",))
    for logger in trainer.loggers:
        logger.finalize("success")
    events = EventAccumulator(str(tmp_path / "tiny" / "v"), size_guidance={"tensors": 0})
    events.Reload()
    text = {tag: events.Tensors(f"{tag}/text_summary")[0].tensor_proto.string_val[0].decode()
            for tag in ("run/command", "run/config")}
    assert text["run/command"].endswith("train.py --storage 'postgresql://me:***@db/x' --lr 0.1`")
    assert text["run/command"].startswith("`python")
    assert text["run/config"].startswith("| setting | value |\n|---|---|\n| ")
    assert "| world_size | `1` |" in text["run/config"].splitlines() and "| name | `tiny` |" in text["run/config"]
    saved = yaml.safe_load((tmp_path / "tiny" / "v" / "hparams.yaml").read_text())
    assert saved == {"lr": 0.1, "storage": "postgresql://me:***@db/x"}
    assert "hunter2" not in "".join(p.read_text(errors="replace") for p in (tmp_path / "tiny" / "v").rglob("*")
                                    if p.is_file())


def test_a_trainer_without_the_template_loggers_writes_into_its_root(tmp_path):
    import lightning as L

    trainer = L.Trainer(logger=False, default_root_dir=str(tmp_path), accelerator="cpu", enable_progress_bar=False,
                        enable_model_summary=False)
    assert run_folder.run_dir(trainer) == tmp_path and run_folder.tensorboard_of(trainer) is None
    log_settings(trainer, None)  # no TensorBoard: nothing to write, nothing read


def test_config_yaml_names_its_recipe_first_then_each_setting_in_order_masked(tmp_path):
    import yaml

    from project.config.schema import RunConfig

    config = RunConfig(logdir="postgresql://me:hunter2@db/x", name="tiny")
    folder = RunFolder(tmp_path / "new" / "v")
    path = folder.save_config(config, "tests.tiny_recipe")
    text = path.read_text()
    assert path == tmp_path / "new" / "v" / "config.yaml" and text.startswith("recipe: tests.tiny_recipe\n")
    assert list(yaml.safe_load(text))[1:] == list(config.to_mapping()) and "hunter2" not in text
    assert folder.saved_config == {"recipe": "tests.tiny_recipe", **config.to_mapping(),
                                   "logdir": "postgresql://me:***@db/x"}
    assert "recipe" not in yaml.safe_load(RunFolder(tmp_path / "other").save_config(config).read_text())
    assert RunFolder(tmp_path / "none").saved_config == {}


def test_how_a_run_ended_replaces_what_it_said_before(tmp_path):
    from project.errors import NothingToDo

    folder = run(tmp_path, "v", {"state": "failed", "started": 1.0, "error": "CUDA out of memory", "step": 4})
    record = RunFolder(folder)
    run_folder.start_record(folder, {}, resumed=True)  # the failed run, resumed: running, its old error gone
    assert (record.record["state"], record.record["error"], record.record["started"]) == ("running", None, 1.0)
    record.record_end(NothingToDo("finished already"))
    assert record.record["state"] == "running"  # nothing was done: nothing to record
    for error, state in ((KeyboardInterrupt(), "stopped"), (None, "finished")):
        run_folder.write_record(folder, error="before")
        record.record_end(error)
        assert (record.record["state"], record.record["error"], record.record["step"]) == (state, None, 4)
    RunFolder(tmp_path / "no_record").record_end(None)
    assert not (tmp_path / "no_record").exists()


def test_the_tensorboard_logger_alone_keeps_the_settings_in_hparams_yaml(tmp_path):
    import lightning as L
    import yaml
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from project.config.schema import RunConfig
    from project.training.build import build_loggers

    config = RunConfig(logdir=str(tmp_path), name="tiny", logger="tensorboard")
    trainer = L.Trainer(logger=build_loggers(config, "v"), accelerator="cpu", enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    log_settings(trainer, config)
    log_hparams_with_results(trainer, {"lr": 0.1}, ("test/acc",))
    trainer.loggers[0].finalize("success")
    assert yaml.safe_load((tmp_path / "tiny" / "v" / "hparams.yaml").read_text()) == {"lr": 0.1}
    events = EventAccumulator(str(tmp_path / "tiny" / "v"), size_guidance={"tensors": 0})
    events.Reload()
    assert [event.step for event in events.Tensors("run/command/text_summary")] == [0]
    assert [event.step for event in events.Tensors("run/config/text_summary")] == [0]


@pytest.mark.parametrize("recipe", ["tests.tiny_recipe", "project.recipe"])
def test_runs_py_lists_runs_without_importing_torch_or_lightning(tmp_path, recipe):
    """A light command: a fresh interpreter runs runs.py's own __main__ on a folder of runs, then says what it
    imported."""
    import subprocess
    import sys

    from helpers import HANG_S, ROOT

    for number in range(3):
        run(tmp_path / "tiny", f"version_{number}", finished(100.0 + number), results={"test/acc": 0.5}, last=True,
            best="best-acc0.50.ckpt")
    code = ("import runpy, sys\n"
            "sys.argv = ['runs.py', '--logdir', sys.argv[1], '--name', 'tiny']\n"
            "try:\n    runpy.run_path('scripts/runs.py', run_name='__main__')\n"
            "except SystemExit as end:\n    assert not end.code, end.code\n"
            "print(sorted(m for m in ('torch', 'lightning', 'torchmetrics', 'numpy') if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, cwd=ROOT,
                          timeout=HANG_S, env={**os.environ, "PROJECT_RECIPE": recipe})
    assert done.returncode == 0, done.stderr
    *rows, imported = done.stdout.splitlines()
    assert imported == "[]" and len(rows) == 4 and rows[1].startswith(str(tmp_path / "tiny" / "version_2"))
