"""A run's record, at both places that keep it: when it started (a resume keeps it), how it ended (a stop, a crash
or a refusal, each as itself), and what stays on disk (only a refused run's empty folder goes)."""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException

from helpers import make_tiny_data, tiny_config, train
from project.config.schema import RunConfig
from project.errors import NonFiniteLossError, Terminated, UsageError
from project.reliability import run_folder
from project.reliability.run_folder import RunFolder, runs


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return make_tiny_data(tmp_path / "data")


def record(folder: Path) -> dict:
    return json.loads((folder / "run.json").read_text())


def test_a_resume_keeps_when_its_run_started_so_the_newest_run_stays_the_newest(tmp_path):
    older, newer = tmp_path / "tiny" / "version_0", tmp_path / "tiny" / "version_1"
    for folder, started in ((older, 1000.0), (newer, 2000.0)):
        folder.mkdir(parents=True)
        (folder / "run.json").write_text(json.dumps({"state": "stopped", "started": started}))
    run_folder.start_record(older, {}, resumed=True)  # the older run resumed: it is still the older one
    assert record(older)["started"] == 1000.0 and record(older)["state"] == "running"
    assert [run.folder.name for run in runs(str(tmp_path), "tiny")] == ["version_1", "version_0"]
    run_folder.start_record(newer, {}, resumed=False)  # a new run in a folder starts its own clock
    assert record(newer)["started"] > 2000.0


@pytest.mark.parametrize(("raised", "state", "kept"), [
    (KeyboardInterrupt(), "stopped", True),
    (Terminated("stopped by SIGTERM"), "stopped", True),
    (RuntimeError("the recipe's forward failed"), "failed", True),
    (UsageError("Lightning refused a setting"), None, False),
], ids=["ctrl-c", "sigterm", "crash", "refused"])
def test_how_a_run_ended_is_recorded_and_only_a_refused_run_leaves_no_folder(tmp_path, raised, state, kept):
    config = RunConfig(logdir=str(tmp_path), name="tiny")
    with pytest.raises(type(raised)):
        with RunFolder.opened(config, resuming=False) as (folder, _):
            folder.save_config(config)  # what a run has written before its first checkpoint
            raise raised
    run = tmp_path / "tiny" / "version_0"
    assert run.exists() == kept
    if kept:
        assert record(run)["state"] == state and (run / "config.yaml").is_file()
        assert record(run)["error"] == ("the recipe's forward failed" if state == "failed" else None)


def test_a_run_that_crashes_before_its_first_checkpoint_keeps_its_folder_record_and_logs(data, tmp_path):
    class Crash(L.Callback):
        def on_train_batch_end(self, trainer, *args):
            raise RuntimeError("boom at the first step")

    with pytest.raises(RuntimeError, match="boom"):
        train(tiny_config(data, tmp_path / "logs", max_epochs=1), callbacks=[Crash()])
    run = tmp_path / "logs" / "tiny" / "version_0"
    assert record(run)["state"] == "failed" and record(run)["error"] == "boom at the first step"
    assert (run / "config.yaml").is_file() and list(run.glob("events.out.tfevents.*"))
    assert [r.describe() for r in runs(str(tmp_path / "logs"), "tiny")][0].startswith("failed")


def test_each_checkpoint_records_its_run_and_run_json_its_step_and_best(data, tmp_path):
    """Every save: the checkpoint holds the run's settings, its K and its module (what a resume and the scripts read
    back), and ``run.json`` the newest step with the best checkpoint and its score (what ``runs.py`` and
    ``--ckpt best`` read); ``last.ckpt`` every N steps and at each epoch's end."""

    class Saves(L.Callback):
        def __init__(self) -> None:
            self.steps: list[int] = []

        def on_save_checkpoint(self, trainer, pl_module, checkpoint):
            self.steps.append(trainer.global_step)

    saves = Saves()
    result = train(tiny_config(data, tmp_path, max_epochs=2, steps_per_call=1, checkpoint_every_n_steps=3,
                               accelerator="cpu"), callbacks=[saves], test=False)
    # 200 samples in batches of 32: 7 steps an epoch; last.ckpt at 3 and 6, then at each epoch's end (the first
    # epoch's best beside it)
    assert [step for step in saves.steps if step % 7] == [3, 6, 9, 12] and saves.steps.count(7) == 2
    assert saves.steps[-1] == 14
    last = torch.load(result.last_checkpoint, weights_only=False)
    assert last["global_step"] == 14
    assert last["run_record"] == {"config": result.config.to_mapping(), "steps_per_call": 1,
                                  "module": "tests.tiny_recipe.model:LitTiny"}
    noted = record(result.run_dir)
    best = Path(result.best_checkpoint)
    assert (noted["step"], noted["best_checkpoint"]) == (14, best.name) and best.is_file()
    assert noted["best_score"] == pytest.approx(result.best_val) and 0 < noted["best_score"] <= 1


@pytest.mark.parametrize("world_size", [1, 2])
@pytest.mark.parametrize("started_at", [None, 5, 8])
@pytest.mark.parametrize("exception", [RuntimeError("a bug"), KeyboardInterrupt(), OSError(28, "disk full"),
                                       NonFiniteLossError("diverged"), SIGTERMException()],
                         ids=["crash", "ctrl-c", "failed-write", "diverged", "sigterm"])
def test_last_ckpt_is_written_once_more_on_an_exception_only_where_it_adds_something_safe(monkeypatch, world_size,
                                                                                         started_at, exception):
    """The rule in ``LastCheckpoint``'s docstring, against every case: not for broken weights or a write that failed,
    not when nothing was trained since the start, and under DDP only on SIGTERM (every rank at the same step)."""
    from types import SimpleNamespace

    from lightning.pytorch.callbacks import ModelCheckpoint

    from project.reliability.checkpointing import LastCheckpoint

    saved = []
    monkeypatch.setattr(ModelCheckpoint, "on_exception", lambda self, *args: saved.append(args))
    LastCheckpoint().on_exception(SimpleNamespace(global_step=8, world_size=1), object(), exception)
    assert saved == []  # training never started: nothing trained to save
    last = LastCheckpoint()
    last._started_at = started_at
    trainer, module = SimpleNamespace(global_step=8, world_size=world_size), object()
    last.on_exception(trainer, module, exception)
    expected = (not isinstance(exception, (NonFiniteLossError, OSError)) and started_at == 5
                and (world_size == 1 or isinstance(exception, SIGTERMException)))
    assert saved == ([(trainer, module, exception)] if expected else [])
