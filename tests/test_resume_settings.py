"""What a resume takes from the run it continues, and what it compares with it, on checkpoint records written by hand
(no training): the K that ``auto`` chose, the folder as its run spelled it, precisions by Lightning's full names, the
settings that must match and how a refusal names them."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import tiny_recipe
from project.config.schema import RunConfig, full_precision
from project.contract import load_recipe
from project.errors import UserError
from project.reliability.resume import Resume, check_same_training, continue_in_its_folder


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

    from lightning.pytorch.callbacks import ModelCheckpoint

    from project.reliability.checkpointing import RunRecord

    before, here = "/old/disk/logs/tiny/version_0/checkpoints", str(tmp_path / "checkpoints")
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "best-acc0.90.ckpt").write_bytes(b"")
    state = {"dirpath": before, "best_model_path": f"{before}/best-acc0.90.ckpt", "best_model_score": 0.9,
             "best_k_models": {f"{before}/best-acc0.90.ckpt": 0.9, "/elsewhere/kept.ckpt": 0.5},
             "kth_best_model_path": f"{before}/best-acc0.90.ckpt", "monitor": "val/acc", "last_model_path": ""}
    foreign = {**state, "best_model_path": f"{before}/best-acc0.80.ckpt"}  # its best is not in the new folder
    # The states passed over come first: each is passed over alone, the one after it still moved.
    checkpoint = {"callbacks": {"Counter": 3, "EarlyStopping": {"wait_count": 2}, "Other": dict(foreign),
                                "ModelCheckpoint": dict(state)}}
    trainer = SimpleNamespace(checkpoint_callbacks=[ModelCheckpoint(), ModelCheckpoint(dirpath=here)])
    RunRecord(None, SimpleNamespace(k=1)).on_load_checkpoint(trainer, None, checkpoint)
    moved = checkpoint["callbacks"]["ModelCheckpoint"]
    assert moved["dirpath"] == here and moved["best_model_path"] == f"{here}/best-acc0.90.ckpt"
    assert moved["kth_best_model_path"] == f"{here}/best-acc0.90.ckpt" and moved["best_model_score"] == 0.9
    assert moved["best_k_models"] == {f"{here}/best-acc0.90.ckpt": 0.9, "/elsewhere/kept.ckpt": 0.5}
    assert moved["monitor"] == "val/acc" and moved["last_model_path"] == ""
    assert checkpoint["callbacks"]["Other"] == foreign and checkpoint["callbacks"]["Counter"] == 3
    assert checkpoint["callbacks"]["EarlyStopping"] == {"wait_count": 2}
    unmoved = {"callbacks": {"ModelCheckpoint": dict(state)}}
    RunRecord(None, SimpleNamespace(k=1)).on_load_checkpoint(SimpleNamespace(checkpoint_callbacks=[]), None,
                                                 unmoved)
    assert unmoved["callbacks"]["ModelCheckpoint"] == state  # nowhere to move them to: Lightning's own paths


def a_checkpoint(path: Path, **fields) -> Path:
    """A checkpoint file as read before any model is built: weights, hyperparameters and what else ``fields`` say."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": {"model.0.weight": torch.zeros(2, 2)}, "hyper_parameters": {}, **fields}, path)
    return path


def test_a_schedule_of_another_length_is_refused_with_both_lengths_and_the_way_on():
    from project.reliability.checkpointing import check_schedule_length

    check_schedule_length(120, 120)
    with pytest.raises(UserError) as refused:
        check_schedule_length(100, 120)
    assert str(refused.value) == ("the checkpoint's LR schedule spans 100 steps but these settings give 120; resume "
                                  "with the settings it was trained with, or start a new run from its weights with "
                                  "--init-from")


def test_a_checkpoint_from_before_run_records_is_read_by_its_hyperparameters(tmp_path):
    """Written before checkpoints recorded their run: its settings are the hyperparameters that name a setting
    or an option; the resume adopts them as it would a record's, and one without hyperparameters gives none."""
    from project.reliability.resume import _trained_with, adopt_run_settings

    recipe = tiny_recipe()
    config = RunConfig.for_recipe(recipe, logdir=str(tmp_path))
    older = {"hyper_parameters": {"lr": 0.3, "hidden": [4], "module_note": "x"}, "run_record": {}}
    assert _trained_with(older, config) == {"lr": 0.3, "hidden": [4]}
    assert _trained_with({"run_record": {}}, config) == {}
    path = a_checkpoint(tmp_path / "old" / "last.ckpt", hyper_parameters={"lr": 0.3, "hidden": [4]})
    adopted = adopt_run_settings(config.replace(resume=str(path)), (), recipe)
    assert (adopted.lr, adopted.options["hidden"]) == (0.3, [4])


@pytest.mark.parametrize("flag", ["resume", "init_from"])
def test_another_recipes_checkpoint_is_refused_by_its_path_before_its_settings_are_read(tmp_path, flag):
    from project.errors import CheckpointError
    from project.reliability.resume import adopt_run_settings, initial_weights

    recipe = tiny_recipe()
    path = a_checkpoint(tmp_path / "other.ckpt", run_record={"module": "elsewhere.model:Other", "config": {}})
    config = RunConfig.for_recipe(recipe, logdir=str(tmp_path), **{flag: str(path)})
    with pytest.raises(CheckpointError, match=f"^{path}: trained by another recipe \\(elsewhere.model:Other\\)"):
        (adopt_run_settings(config, (), recipe) if flag == "resume" else initial_weights(config, recipe))


def test_init_from_last_looks_for_the_newest_run_of_this_name_and_says_so_with_its_flag(tmp_path):
    from project.errors import UsageError
    from project.reliability.resume import initial_weights

    recipe = tiny_recipe()
    a_checkpoint(tmp_path / "logs" / "other" / "version_0" / "checkpoints" / "last.ckpt")
    config = RunConfig.for_recipe(recipe, logdir=str(tmp_path / "logs"), name="tiny", init_from="last")
    with pytest.raises(UsageError, match=f"^--init-from last: .*{tmp_path / 'logs' / 'tiny'}"):
        initial_weights(config, recipe)


def test_a_run_that_recorded_no_settings_continues_in_its_folder_by_its_path(tmp_path):
    from project.reliability.resume import _folder_settings

    folder = tmp_path / "logs" / "tiny" / "version_3"
    resume = resume_of({}, path=folder / "checkpoints" / "last.ckpt")
    assert _folder_settings(folder, resume) == {"logdir": str(tmp_path / "logs"), "name": "tiny",
                                                "run_version": "version_3"}


class Unfitting:
    def __init__(self, said: str) -> None:
        self.said = said

    def load_state_dict(self, weights):
        raise RuntimeError(self.said)


@pytest.mark.parametrize(("said", "detail"), [
    ("Error(s) in loading state_dict for LitTiny:\n\tsize mismatch for model.0.weight: copying a param with shape "
     "[4, 16]", "size mismatch for model.0.weight: copying a param with shape [4, 16]"),
    ("Error(s) in loading state_dict for LitTiny:\n\tMissing key(s) in state_dict: \"model.3.weight\"",
     "Missing key(s) in state_dict: \"model.3.weight\""),
    ("Error(s) in loading state_dict for LitTiny:\n\tUnexpected key(s) in state_dict: \"model.9.bias\"",
     "Unexpected key(s) in state_dict: \"model.9.bias\""),
    ("weights on another device\nsecond line", "weights on another device"),
    ("Error(s) in loading state_dict:\n\tsize mismatch for " + "model.0.weight" * 20, ("size mismatch for " +
                                                                                   "model.0.weight" * 20)[:140]),
])
@pytest.mark.parametrize(("options", "hint"), [({"hidden_size": 8, "widths": [4]}, " (--hidden-size, --widths)"),
                                               ({}, "")])
def test_weights_that_do_not_fit_are_refused_naming_why_and_the_model_flags(monkeypatch, said, detail, options, hint):
    from project.reliability import resume

    monkeypatch.setattr(resume, "initial_weights", lambda config, recipe: {"model.0.weight": None})
    config = RunConfig(init_from="old.ckpt", options=options)
    with pytest.raises(UserError) as refused:
        resume.load_initial_weights(Unfitting(said), config, tiny_recipe())
    assert str(refused.value) == (f"--init-from old.ckpt: its weights do not fit this model ({detail}); use the "
                                  f"model settings it was trained with{hint}")


def test_the_best_checkpoints_state_keeps_lightnings_key_so_older_runs_resume_with_their_best_scores():
    """Lightning restores a callback's state by its key: the best checkpoints' is ModelCheckpoint's, as runs saved
    it before their names counted epochs from 1."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from project.reliability.checkpointing import BestCheckpoints

    settings = {"monitor": "val/acc", "mode": "max", "save_top_k": 2, "every_n_epochs": 1}
    assert BestCheckpoints(**settings).state_key == ModelCheckpoint(**settings).state_key


def test_the_checkpoint_callbacks_make_their_key_once_and_it_is_the_key_lightning_would_make():
    """Lightning names each of a training step's six hook calls by the callback's key, which ModelCheckpoint builds
    from the repr of its settings every time: the engine's two make it once, the same key."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from project.reliability.checkpointing import BestCheckpoints, LastCheckpoint

    best, last = BestCheckpoints(monitor="val/acc", mode="max"), LastCheckpoint(every_n_train_steps=5)
    for callback in (best, last):
        assert callback.state_key is callback.state_key
    assert last.state_key == ModelCheckpoint.state_key.fget(last)  # type: ignore[attr-defined]
    assert "'every_n_train_steps': 5" in last.state_key
