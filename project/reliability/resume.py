"""``--resume`` and ``--init-from``: the checkpoint to continue from, checked against this run before anything
is written. A resume continues the same run: same settings, same folder, same steps per call."""

from __future__ import annotations

import math
import os
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from project import internals
from project.config.schema import TRAINER_ARGUMENTS, TRAINING_SETTINGS, RunConfig, full_precision
from project.config.validators import flag_value, same_trainer_value, trainer_default
from project.contract import Recipe
from project.errors import NothingToDo, UsageError, UserError
from project.reliability import run_folder
from project.reliability.checkpointing import (
    check_schedule_length,
    check_trained_by,
    data_position,
    non_finite_weight,
    read_checkpoint,
)
from project.reliability.run_folder import RunFolder, finished_results, remove_partial_files, roll_back_logs

# What a resume must keep, as each setting says of itself (``setting(..., trains=True)``, ``TRAINER_ARGUMENTS``);
# --init-from starts a new run instead.
TRAINED_TRAINER_ARGS = tuple(key for key, argument in TRAINER_ARGUMENTS.items() if argument.trains)


@dataclass(frozen=True)
class Resume:
    """The checkpoint a run continues from, and what it recorded of the run that wrote it."""

    path: Path
    record: dict[str, Any]  # checkpoint["run_record"]: the settings its run trained with, and its K
    steps_per_call: int | None
    global_step: int
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # of its weights, as read once
    not_finite: str | None = None  # its first weight holding a NaN or an infinity

    def auto_steps_per_call(self) -> int | None:
        """The K that ``auto`` chose for the run this one resumes (None: it was asked for, or not recorded)."""
        return self.steps_per_call if self.record.get("config", {}).get("steps_per_call") == "auto" else None

    def check_fits(self, model: L.LightningModule) -> None:
        """Its weights fit this run's model and are finite (a run that diverged into its checkpoint cannot
        continue): one line each, before the run starts, from what was read of the file at once."""
        mine = {key: tuple(value.shape) for key, value in model.state_dict().items()}
        unfit = next((key for key, shape in self.shapes.items() if key in mine and shape != mine[key]), None)
        if unfit is not None or not set(mine) >= {key for key in self.shapes if key.startswith("model.")}:
            where = f" ({unfit}: {self.shapes[unfit]} in it, {mine[unfit]} here)" if unfit else ""
            raise UserError(f"{self.path}: its weights do not fit this model{where}; resume with the settings it was "
                            "trained with")
        if self.not_finite is not None:
            raise UserError(f"{self.path}: its weights are not finite ({self.not_finite}): the run diverged before "
                            "this checkpoint; resume from an earlier one, or start again with a lower --lr")

    @property
    def run_folder(self) -> Path | None:
        """``LOGDIR/NAME/VERSION`` when the checkpoint lies in a run's ``checkpoints/`` folder."""
        return self.path.parent.parent if self.path.parent.name == run_folder.CHECKPOINTS else None


def checkpoint_to_resume(config: RunConfig, recipe: Recipe, planned_steps: int | None = None,
                         world_size: int = 1) -> Resume | None:
    """The checkpoint ``--resume`` names, read now: a corrupt file, another model, other settings or a
    schedule of another length is one line before any run folder exists (``planned_steps``: the optimizer steps
    this run's settings take, ``project.training.tensor_data.planned_steps``)."""
    path = _checkpoint_named(config)
    if path is None:
        return None
    if config.wants_tuner:
        raise UsageError("--find-lr/--find-batch-size with --resume: the checkpoint fixes the batch size and LR; "
                         "drop the tuner flag")
    checkpoint = read_checkpoint(path)
    check_trained_by(checkpoint, path, recipe)
    written_by = str(checkpoint.get("pytorch-lightning_version", "2"))
    if not written_by.split(".")[0].isdigit() or int(written_by.split(".")[0]) < 2:
        raise UserError(f"{path}: written by Lightning {written_by}, whose training loops kept another state; a "
                        "resume needs a checkpoint of Lightning 2: start a new run from its weights with --init-from")
    record = checkpoint.get("run_record", {})
    check_same_training(_trained_with(checkpoint, config), config, path, recipe)
    saved_world = (data_position(checkpoint) or {}).get("world_size")
    if saved_world is not None and saved_world != world_size:
        raise UserError(f"the checkpoint was written by {saved_world} process(es), this run has {world_size}; "
                        "each rank's place in the epoch's data order depends on it: resume with the same "
                        "--devices and --num-nodes")
    schedules = checkpoint.get("lr_schedulers") or [{}]
    total = schedules[0].get("total_steps")
    if total is not None and planned_steps is not None:
        check_schedule_length(total, planned_steps)
    state = checkpoint["state_dict"]
    return Resume(Path(path), record, record.get("steps_per_call"), int(checkpoint.get("global_step", 0)),
                  {key: tuple(value.shape) for key, value in state.items()}, non_finite_weight(state))


def _checkpoint_named(config: RunConfig) -> Path | None:
    """The checkpoint ``--resume`` names (None: nothing to resume, or ``auto`` before the job's first checkpoint)."""
    if not config.resume:
        return None
    if config.resume == "auto":  # slurm/train.sbatch: the job's own folder, once it has a checkpoint
        if not config.run_version:
            raise UsageError("--resume auto continues the run --run-version names (as slurm/train.sbatch does); "
                             "add --run-version NAME")
        path = run_folder.last_checkpoint(Path(config.logdir) / config.name / config.run_version)
        return path if path.is_file() else None
    return Path(run_folder.checkpoint_of(config.resume, config.logdir, config.name, "--resume")[0])


def _trained_with(checkpoint: dict[str, Any], config: RunConfig) -> dict[str, Any]:
    """The settings the checkpoint's run trained with; for a checkpoint written before runs recorded them, what its
    hyperparameters say of them."""
    record = checkpoint.get("run_record", {})
    return record.get("config") or {key: value for key, value in checkpoint.get("hyper_parameters", {}).items()
                                    if key in (*TRAINING_SETTINGS, *config.options)}


def adopt_run_settings(config: RunConfig, given: Collection[str], recipe: Recipe) -> RunConfig:
    """A resume continues its run: each setting that defines the training and that the command (flags, config file)
    leaves unset is the run's own, so ``--resume last`` alone continues it; one given differently is refused later.
    ``last`` and ``best`` come back as the path they name."""
    path = _checkpoint_named(config)
    if path is None:
        return config
    checkpoint = read_checkpoint(path, mmap=True)  # its settings: the weights are read by the resume
    check_trained_by(checkpoint, path, recipe)
    saved = _trained_with(checkpoint, config)
    changes = {key: saved[key] for key in (*TRAINING_SETTINGS, *config.options, "max_epochs", "data_dir")
               if key in saved and key not in given}
    saved_trainer = saved.get("trainer") or {}
    trainer = {**{key: saved_trainer[key] for key in TRAINED_TRAINER_ARGS
                  if key in saved_trainer and f"trainer.{key}" not in given}, **config.trainer}
    # ``last``/``best`` resolved here, once: the run resumes this very file, and says what it passed over once
    named = {"resume": str(path)} if config.resume in ("best", "last") else {}
    adopted = config.replace(**changes, **named, trainer=trainer)
    differing = [f"--{key.replace('_', '-')} {_shown(value)}" for key, value in changes.items()
                 if value != config.value(key) and not (key == "precision" and full_precision(value) ==
                                                           full_precision(config.precision))]
    differing += [f"--trainer.{key} {_shown(value)}" for key, value in trainer.items() if key not in config.trainer]
    if differing:
        rank_zero_info(f"resuming {path} with its run's settings: {', '.join(differing)}")
    return adopted


def check_same_training(saved: dict[str, Any], config: RunConfig, path: Path, recipe: Recipe) -> None:
    """Refuse, naming the flag, any setting that would change what the checkpoint's run trains (a setting left to
    its default compares as the default it stands for)."""
    now = {**config.to_mapping(), "precision": full_precision(config.precision)}
    saved = {**saved, **({"precision": full_precision(saved["precision"])} if "precision" in saved else {})}
    default_val = recipe.datamodule_class().default_val_size if "val_size" in saved else None
    for values in (now, saved):
        if values.get("val_size") is None and "val_size" in saved:
            values["val_size"] = default_val
    keys = [*TRAINING_SETTINGS, *config.options, *(("max_epochs",) if saved.get("scheduler", "none") != "none" else ())]
    differing = [(f"--{key.replace('_', '-')}", saved[key], now.get(key)) for key in keys
                 if key in saved and saved[key] != now.get(key)]
    saved_trainer, trainer = saved.get("trainer", {}), config.trainer
    for key in TRAINED_TRAINER_ARGS:
        default = trainer_default(key)
        before, after = saved_trainer.get(key, default), trainer.get(key, default)
        if saved and not same_trainer_value(key, before, after):
            differing.append((f"--trainer.{key}", before, after))
    if differing:
        flag, before, after = differing[0]
        raise UserError(f"{flag} {_shown(after)}: the checkpoint's run trained with {flag} {_shown(before)}, and a "
                        f"resume continues that run; resume with {flag} {_shown(before)}, or start a new run from "
                        f"its weights with --init-from {path}")


def _shown(value: Any) -> str:
    return "(not set)" if value is None else flag_value(value)


def initial_weights(config: RunConfig, recipe: Recipe) -> dict[str, Any] | None:
    """``--init-from``: the model weights of a checkpoint, for a new run with its own settings."""
    if not config.init_from:
        return None
    path, _ = run_folder.checkpoint_of(config.init_from, config.logdir, config.name, "--init-from")
    checkpoint = read_checkpoint(path)
    check_trained_by(checkpoint, path, recipe)
    return checkpoint["state_dict"]


def continue_in_its_folder(config: RunConfig, resume: Resume | None) -> dict[str, Any]:
    """The settings a resume takes from the run it resumes: its folder, and the steps per call that run took.

    Its logs are cut back to the checkpoint (a resumed run logs the rest again) and the temporary files
    of a killed save removed. A finished run is left alone, in one line, unless this one asks for more
    epochs (possible without a fixed-length schedule): then the run goes on in its folder.
    """
    if resume is None:
        return {}
    taken = {"steps_per_call": resume.steps_per_call} if config.steps_per_call == "auto" and resume.steps_per_call \
        else {}
    folder = resume.run_folder
    if folder is None or not internals.is_rank_zero():
        return {**taken, **(_folder_settings(folder, resume) if folder else {})}
    run_folder.own(folder, "--resume")  # before anything in it changes: a run still training there is refused
    RunFolder(folder).refuse_if_damaged()  # and one whose records are damaged
    if not os.access(folder, os.W_OK) or not os.access(folder / run_folder.CHECKPOINTS, os.W_OK):
        raise UsageError(f"--resume: cannot write in {folder} (no permission): a resumed run continues in its own "
                         "folder; make it writable, or start a new run from its weights with --init-from")
    done = finished_results(folder)
    if done is not None and config.max_epochs == resume.record.get("config", {}).get("max_epochs"):
        raise NothingToDo(f"{folder} is finished (test/acc {done.get('test/acc', math.nan):.4f}, weights "
                          f"{done['weights']}); nothing to resume, nothing written")
    remove_partial_files(folder)
    roll_back_logs(folder, resume.global_step)
    return {**taken, **_folder_settings(folder, resume)}


def _folder_settings(folder: Path, resume: Resume) -> dict[str, str]:
    """``logdir``, ``name`` and ``run_version`` of ``folder``, spelled as its run spelled them where they match
    (the checkpoint callbacks restore their state only into the same folder name)."""
    saved = resume.record.get("config", {})
    logdir, name = str(folder.parent.parent), folder.parent.name
    if saved.get("logdir") and saved.get("name") == name and \
            Path(saved["logdir"], name).resolve() == folder.parent.resolve():
        logdir = saved["logdir"]
    return {"logdir": logdir, "name": name, "run_version": folder.name}


def load_initial_weights(model: L.LightningModule, config: RunConfig, recipe: Recipe) -> None:
    """``--init-from``: a new run starts from a checkpoint's weights (its optimizer and schedule are new)."""
    weights = initial_weights(config, recipe)
    if weights is None:
        return
    try:
        model.load_state_dict(weights)
    except RuntimeError as err:
        detail = next((line.strip() for line in str(err).splitlines() if "size mismatch" in line or "Missing" in
                       line or "Unexpected" in line), str(err).splitlines()[0])
        raise UserError(f"--init-from {config.init_from}: its weights do not fit this model ({detail[:140]}); "
                        f"use the model settings it was trained with{_options_hint(config)}") from None


def _options_hint(config: RunConfig) -> str:
    flags = ", ".join(f"--{name.replace('_', '-')}" for name in config.options)
    return f" ({flags})" if flags else ""
