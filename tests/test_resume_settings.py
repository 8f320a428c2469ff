"""What a resume takes from the run it continues, and what it compares with it, on checkpoint records written by hand
(no training): the K that ``auto`` chose, the folder as its run spelled it, precisions by Lightning's full names, the
settings that must match and how a refusal names them."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import tiny_recipe
from project.config.schema import RunConfig
from project.contract import load_recipe
from project.errors import UserError
from project.reliability.resume import Resume, check_same_training, continue_in_its_folder, full_precision


def resume_of(record: dict, steps_per_call: int | None = 4, path: Path = Path("elsewhere/last.ckpt")) -> Resume:
    return Resume(path, record, steps_per_call, global_step=10)


@pytest.mark.parametrize(("recorded", "k", "kept"),
                         [("auto", 4, 4), (4, 4, None), (None, 4, None), ("auto", None, None)])
def test_a_resume_asking_auto_takes_its_runs_k_which_counts_as_autos_only_where_auto_chose_it(recorded, k, kept):
    record = {"config": {"steps_per_call": recorded}} if recorded is not None else {}
    resume = resume_of(record, k)
    assert resume.auto_steps_per_call() == kept
    taken = continue_in_its_folder(RunConfig(steps_per_call="auto"), resume)  # not in a run folder: K only
    assert taken == ({"steps_per_call": k} if k else {})
    assert continue_in_its_folder(RunConfig(steps_per_call=2), resume) == {}  # a K asked for is this run's own


def test_a_resume_continues_in_its_folder_spelled_as_its_run_spelled_it(tmp_path, monkeypatch):
    """The checkpoint callbacks restore their state only into the same folder name: a relative ``--logdir`` stays
    relative where it still names the folder; otherwise the folder's own path."""
    from project import internals

    monkeypatch.setattr(internals, "is_rank_zero", lambda: False)  # a later rank: the folder is left as it is
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "logs" / "tiny" / "version_2"
    checkpoint = folder / "checkpoints" / "last.ckpt"
    absolute = {"logdir": str(tmp_path / "logs"), "name": "tiny", "run_version": "version_2"}
    for saved, expected in [({"logdir": "logs", "name": "tiny"}, {**absolute, "logdir": "logs"}),
                            ({"logdir": "other", "name": "tiny"}, absolute),
                            ({"logdir": "logs", "name": "small"}, absolute),
                            ({"name": "tiny"}, absolute), ({}, absolute)]:
        resume = resume_of({"config": {**saved, "steps_per_call": 1}}, 1, checkpoint)
        assert continue_in_its_folder(RunConfig(steps_per_call=1), resume) == expected, saved


@pytest.mark.parametrize(("short", "full"), [("32", "32-true"), ("64", "64-true"), ("16", "16-mixed"),
                                             ("bf16", "bf16-mixed"), ("16-true", "16-true"), (32, "32-true")])
def test_short_precisions_are_lightnings_full_names(short, full):
    assert full_precision(short) == full


def test_a_resume_compares_precisions_by_their_full_names(tmp_path):
    recipe = tiny_recipe()
    check_same_training({"precision": "16"}, RunConfig(precision="16-mixed"), tmp_path, recipe)
    check_same_training({"precision": "bf16-mixed"}, RunConfig(precision="bf16"), tmp_path, recipe)
    with pytest.raises(UserError, match=r"^--precision 16-mixed: the checkpoint's run trained with --precision "
                                        r"bf16-mixed, and a resume continues that run; resume with --precision "
                                        r"bf16-mixed, or start a new run from its weights with --init-from "):
        check_same_training({"precision": "bf16"}, RunConfig(precision="16-mixed"), tmp_path, recipe)


def test_the_epochs_must_match_only_where_a_schedule_spans_them(tmp_path):
    recipe = tiny_recipe()
    check_same_training({"scheduler": "none", "max_epochs": 5}, RunConfig(scheduler="none", max_epochs=10), tmp_path,
                        recipe)
    check_same_training({"max_epochs": 5}, RunConfig(scheduler="none", max_epochs=10), tmp_path, recipe)  # no record
    with pytest.raises(UserError, match="^--max-epochs 10: the checkpoint's run trained with --max-epochs 5"):
        check_same_training({"scheduler": "cosine", "max_epochs": 5}, RunConfig(max_epochs=10), tmp_path, recipe)


def test_a_refusal_shows_lists_and_unset_values_as_they_are_typed(tmp_path):
    second = load_recipe("tests.second_recipe")
    config = RunConfig.for_recipe(second, channels=[8, 32])
    with pytest.raises(UserError, match=r"^--channels 8,32: the checkpoint's run trained with --channels 8,16, .*"
                                        r"resume with --channels 8,16, or"):
        check_same_training({"channels": [8, 16]}, config, tmp_path, second)
    with pytest.raises(UserError, match=r"^--warmup-steps \(not set\): the checkpoint's run trained with "
                                        r"--warmup-steps 10, .*resume with --warmup-steps 10, or"):
        check_same_training({"warmup_steps": 10}, RunConfig(), tmp_path, tiny_recipe())


def test_a_moved_run_folder_resumes_with_its_checkpoint_callbacks_paths_moved_along(tmp_path):
    """Lightning drops a checkpoint callback's best scores when its saved paths are not where it now writes: the
    record moves every path under the old folder to the new one, where the new folder holds those files."""
    from types import SimpleNamespace

    from project.reliability.checkpointing import RunRecord

    before, here = "/old/disk/logs/tiny/version_0/checkpoints", str(tmp_path / "checkpoints")
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "best-acc0.90.ckpt").write_bytes(b"")
    state = {"dirpath": before, "best_model_path": f"{before}/best-acc0.90.ckpt", "best_model_score": 0.9,
             "best_k_models": {f"{before}/best-acc0.90.ckpt": 0.9, "/elsewhere/kept.ckpt": 0.5},
             "kth_best_model_path": f"{before}/best-acc0.90.ckpt", "monitor": "val/acc", "last_model_path": ""}
    foreign = {**state, "best_model_path": f"{before}/best-acc0.80.ckpt"}  # its best is not in the new folder
    checkpoint = {"callbacks": {"ModelCheckpoint": dict(state), "Other": dict(foreign), "Counter": 3}}
    trainer = SimpleNamespace(checkpoint_callbacks=[SimpleNamespace(), SimpleNamespace(dirpath=here)])
    RunRecord(None, 1).on_load_checkpoint(trainer, None, checkpoint)
    moved = checkpoint["callbacks"]["ModelCheckpoint"]
    assert moved["dirpath"] == here and moved["best_model_path"] == f"{here}/best-acc0.90.ckpt"
    assert moved["kth_best_model_path"] == f"{here}/best-acc0.90.ckpt" and moved["best_model_score"] == 0.9
    assert moved["best_k_models"] == {f"{here}/best-acc0.90.ckpt": 0.9, "/elsewhere/kept.ckpt": 0.5}
    assert moved["monitor"] == "val/acc" and moved["last_model_path"] == ""
    assert checkpoint["callbacks"]["Other"] == foreign and checkpoint["callbacks"]["Counter"] == 3
    unmoved = {"callbacks": {"ModelCheckpoint": dict(state)}}
    RunRecord(None, 1).on_load_checkpoint(SimpleNamespace(checkpoint_callbacks=[]), None, unmoved)
    assert unmoved["callbacks"]["ModelCheckpoint"] == state  # nowhere to move them to: Lightning's own paths
