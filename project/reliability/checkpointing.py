"""Checkpoint files: written atomically, resumed exactly, and checked before they are trusted."""

from __future__ import annotations

import errno
import functools
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Protocol

import lightning as L
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException

from project import internals
from project.config.schema import RunConfig
from project.contract import RECIPE_VARIABLE, Recipe
from project.errors import CheckpointError, NonFiniteLossError, UserError, first_line, not_a_regular_file
from project.reliability.run_folder import LAST


def write_error(err: RuntimeError, path: Path, written: int) -> OSError:
    """torch's own word for a failed write (after ``written`` bytes), as the ``OSError`` it stands for: a file size
    limit (``ulimit -f``) that the file reached, a full disk, or another failure."""
    import resource

    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit != resource.RLIM_INFINITY and written + (1 << 16) >= limit:
        return OSError(errno.EFBIG, f"File too large: this process may write files of at most {limit:,} bytes",
                       str(path))
    if shutil.disk_usage(path.parent).free < (1 << 20):
        return OSError(errno.ENOSPC, "No space left on device", str(path))
    return OSError(errno.EIO, f"write failed ({first_line(err)})", str(path))


def atomic_save(obj: Any, path: str | os.PathLike) -> Path:
    """``torch.save`` to a temporary file beside ``path``, then rename it over ``path``.

    The rename is atomic on one file system, so a crash leaves either the old file or the new
    one, never a half-written one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as stream:
            torch.save(obj, stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except RuntimeError as err:  # torch's zip writer says a failed write its own way ("unexpected pos ...")
        written = Path(temporary).stat().st_size if Path(temporary).exists() else 0
        Path(temporary).unlink(missing_ok=True)
        if "write" not in str(err) and "unexpected pos" not in str(err):
            raise
        raise write_error(err, path, written) from None
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer, made crash-safe with :func:`atomic_save`."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        atomic_save(checkpoint, path)


class BestCheckpoints(ModelCheckpoint):
    """Lightning's best-k checkpoints, their names counting epochs from 1, as the progress lines and the summary
    count them (``best-epoch06-...`` is the sixth epoch's)."""

    def format_checkpoint_name(self, metrics: dict[str, torch.Tensor], filename: str | None = None,
                               ver: int | None = None, prefix: str | None = None) -> str:
        counted = {**metrics, "epoch": metrics["epoch"] + 1} if "epoch" in metrics else metrics
        return super().format_checkpoint_name(counted, filename, ver, prefix)

    @functools.cached_property
    def state_key(self) -> str:
        """``ModelCheckpoint``'s own key: a run checkpointed before these names counted from 1 resumes with its
        best scores, which Lightning finds by this key. Made once (see ``LastCheckpoint.state_key``)."""
        return super().state_key.replace(type(self).__qualname__, ModelCheckpoint.__qualname__, 1)


class LastCheckpoint(ModelCheckpoint):
    """``last.ckpt``: the newest training state, every epoch and optionally every N steps.

    On SIGTERM, Ctrl-C or a crash it is written once more so that nothing trained is lost;
    not when training diverged, so the last good state survives. Under DDP only SIGTERM (which
    every rank acts on at the same step) writes it; otherwise the newest periodic one stands.
    """

    def __init__(self, every_n_train_steps: int | None = None) -> None:
        super().__init__(filename=LAST, save_top_k=1, enable_version_counter=False, save_on_exception=True,
                         every_n_train_steps=every_n_train_steps)
        self.refresh_every_n_steps = every_n_train_steps
        self._started_at: int | None = None

    @functools.cached_property
    def state_key(self) -> str:
        """Made once: Lightning names every hook call by it (six a training step), and ``ModelCheckpoint`` builds it
        from the repr of its settings each time, which never change."""
        return super().state_key

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._started_at = trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        # Not where a validation follows: resumed from there, Lightning would skip that validation.
        # The save after it (at the epoch's end) holds the same step, validated.
        if self.refresh_every_n_steps and not internals.validation_due(trainer):
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        # With every_n_train_steps, Lightning saves only at those steps; the end of every epoch
        # (and so of training) belongs in last.ckpt too.
        if internals.saves_every_n_steps(self):
            internals.save_now(self, trainer)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if isinstance(exception, (NonFiniteLossError, OSError)) or trainer.global_step == self._started_at \
                or self._started_at is None:
            return  # broken weights; a write that failed (it would fail again); nothing new since the start
        if trainer.world_size > 1 and not isinstance(exception, SIGTERMException):
            # Only SIGTERM stops every rank at the same step. Anything else failed on this rank
            # alone, and a save ends at a barrier the other ranks would never reach.
            return
        super().on_exception(trainer, pl_module, exception)


class Stepping(Protocol):
    """What the run record reads of the run's stepper (``project.training.steps_per_call.Stepper``)."""

    k: int  # optimizer steps per Lightning step, now


class RunRecord(Callback):
    """Writes into every checkpoint what a resume must know of its run (the settings it trained with, its
    steps per call), and keeps the logs on disk up to each checkpoint: a killed run loses no logged step
    before its newest checkpoint (a resume cuts the logs back to that checkpoint)."""

    def __init__(self, config: RunConfig, stepper: Stepping) -> None:
        self.config, self.stepper = config, stepper  # K as it is at each save: auto follows the run

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        checkpoint["run_record"] = {"config": self.config.to_mapping(), "steps_per_call": self.stepper.k,
                                    "module": module_name(type(pl_module))}
        self._flush(trainer)
        if trainer.is_global_zero:
            self._note_in_run_record(trainer)

    @staticmethod
    def _note_in_run_record(trainer: L.Trainer) -> None:
        """``run.json``: the newest checkpoint's step, and the best checkpoint with the score it recorded."""
        from project.reliability.run_folder import RUN_RECORD, run_dir, write_record

        folder = run_dir(trainer)
        if not (folder / RUN_RECORD).is_file():
            return
        best = next((cb for cb in trainer.checkpoint_callbacks
                     if isinstance(cb, ModelCheckpoint) and not isinstance(cb, LastCheckpoint)), None)
        noted: dict[str, Any] = {"step": trainer.global_step}
        if best is not None and best.best_model_path and best.best_model_score is not None:
            noted.update(best_checkpoint=Path(best.best_model_path).name, best_score=float(best.best_model_score))
        write_record(folder, **noted)

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        """A run folder that was moved or copied (to another disk, another machine) resumes as well: the
        checkpoint callbacks' paths are moved with it, or Lightning would drop their best scores."""
        here = next((str(cb.dirpath) for cb in trainer.checkpoint_callbacks
                     if isinstance(cb, ModelCheckpoint) and cb.dirpath), None)
        for state in checkpoint.get("callbacks", {}).values():
            before = state.get("dirpath") if isinstance(state, dict) else None
            if here is None or before is None or before == here:
                continue
            best = state.get("best_model_path") or ""
            if not (best.startswith(before) and Path(here + best[len(before):]).is_file()):
                continue  # not this folder's files: Lightning keeps the checkpoint's own paths
            for key, value in state.items():
                if isinstance(value, str) and value.startswith(before):
                    state[key] = here + value[len(before):]
                elif isinstance(value, dict):
                    state[key] = {(here + k[len(before):] if k.startswith(before) else k): v for k, v in value.items()}

    def _flush(self, trainer: L.Trainer) -> None:
        for logger in trainer.loggers:
            logger.save()


def read_checkpoint(path: str | os.PathLike, mmap: bool = False) -> dict[str, Any]:
    """Load a ``.ckpt`` of this project safely, or say in one line why it cannot be used (``mmap``: tensors are read
    only when touched, for a caller that wants the settings, not the weights)."""
    path = Path(path)
    state = _load(path, mmap)
    if not isinstance(state, dict) or "state_dict" not in state or "hyper_parameters" not in state:
        raise CheckpointError(f"{path}: not a Lightning checkpoint of this project (no state_dict/hyper_parameters)")
    if not any(key.startswith("model.") for key in state["state_dict"]):
        raise CheckpointError(f"{path}: a Lightning checkpoint, but not of a ClassifierModule (no model.* weights)")
    return state


def module_name(module_class: type) -> str:
    """The recipe module a checkpoint records as the one that trained it."""
    return f"{module_class.__module__}:{module_class.__qualname__}"


def check_trained_by(checkpoint: dict[str, Any], path: Path, recipe: Recipe) -> None:
    """Another recipe's checkpoint is refused in one line naming both recipes' models, before anything builds a
    model from its settings. A checkpoint that does not record its module (written before it did) is another
    recipe's where it lacks one of this recipe's options."""
    mine = module_name(recipe.module_class())
    recorded = checkpoint.get("run_record", {}).get("module")
    lacking = [name for name in recipe.options if name not in checkpoint.get("hyper_parameters", {})]
    if recorded is None and lacking:
        recorded = f"a model without --{lacking[0].replace('_', '-')}"
    if recorded is not None and recorded != mine:
        raise CheckpointError(f"{path}: trained by another recipe ({recorded}), not by this one ({mine}); "
                              f"{RECIPE_VARIABLE} names the recipe the scripts use")


def non_finite_weight(state: dict[str, Any]) -> str | None:
    """The first weight of a ``state_dict`` holding a NaN or an infinity: a checkpoint not to save, or to resume."""
    return next((key for key, value in state.items() if value.is_floating_point() and
                 not bool(torch.isfinite(value).all())), None)


def check_schedule_length(saved_total: int, planned: int) -> None:
    """A one-cycle or cosine schedule restored from a checkpoint must span the steps this run takes."""
    if saved_total != planned:
        raise UserError(
            f"the checkpoint's LR schedule spans {saved_total} steps but these settings give {planned}; "
            "resume with the settings it was trained with, or start a new run from its weights with --init-from"
        )


def read_weights(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Load a ``model.pth`` state dict safely, or say in one line why it cannot be used."""
    path = Path(path)
    state = _load(path)
    if not isinstance(state, dict) or not state or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path}: not an exported model.pth (expected a state_dict: names to tensors)")
    return state


def _load(path: Path, mmap: bool = False) -> Any:
    problem = not_a_regular_file(path) or (None if path.exists() else "no such file")
    if problem:
        raise CheckpointError(f"{path}: {problem}")
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path}: empty file")
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except PermissionError:
        raise CheckpointError(f"{path}: no permission to read it") from None
    except Exception as err:  # noqa: BLE001 - torch.load fails in many ways; each means the same to the user
        text = str(err).strip()
        if "Unsupported global" in text:
            raise CheckpointError(
                f"{path}: holds Python objects, not just tensors; refused for safety (weights_only loading)"
            ) from None
        raise CheckpointError(f"{path}: corrupt or not a PyTorch file ({_reason(text, err)})") from None


def _reason(text: str, err: Exception) -> str:
    """torch.load's messages run to paragraphs; keep what the user can act on."""
    if isinstance(err, EOFError):
        return "it ends too early"
    if "Weights only load failed" in text or isinstance(err, (KeyError, IndexError)):  # the unpickler met garbage
        return "unreadable pickle data"
    if "PytorchStreamReader" in text or "zip archive" in text:
        return "damaged or truncated archive"
    return first_line(err)


def data_position(checkpoint: dict[str, Any]) -> dict[str, Any] | None:
    """Where in the epoch's data order a checkpoint was taken (the datamodule's ``state_dict``), if it says."""
    return next((v for v in checkpoint.values() if isinstance(v, dict) and "samples_done" in v), None)
