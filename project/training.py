"""Builds the Trainer for ``scripts/train.py`` and reports what a run produced."""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import re
import shlex
import sys
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import DeviceStatsMonitor, LearningRateMonitor, ModelCheckpoint, TQDMProgressBar
from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger

from project.callbacks import EpochStats, FiniteLossGuard, GpuMemoryFraction
from project.checkpointing import AtomicCheckpointIO, LastCheckpoint, atomic_save
from project.cli import to_config
from project.datamodule import MNISTDataModule
from project.errors import Terminated, UsageError, UserError
from project.lit_module import LitMNIST
from project.model import MLP, export_state_dict

# Harmless for this template: the in-memory loader needs no workers, a 5,000-image validation
# set gives fewer batches than the logging interval, and Lightning's own use of a torch API
# that torch has deprecated is not ours to fix.
_QUIET_WARNINGS = (
    r".*does not have many workers.*",
    r".*is smaller than the logging interval.*",
    r".*isinstance\(treespec, LeafSpec\)` is deprecated.*",
)
# Advertising, and the tuner's note on reloading its own temporary checkpoint.
_QUIET_LOG_PREFIXES = ("💡 Tip:", "`weights_only` was not set")


class _DropAdverts(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_QUIET_LOG_PREFIXES)


def quiet_known_warnings() -> None:
    """Silence, by message, the console noise that says nothing about this template's run."""
    for message in _QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=message)
    for name in ("lightning.pytorch", "lightning.fabric"):
        for handler in logging.getLogger(name).handlers:
            handler.addFilter(_DropAdverts())


def find_last_checkpoint(logdir: str | os.PathLike, name: str) -> Path:
    """The ``last.ckpt`` of the newest run (highest version) under ``logdir/name``."""
    runs = []
    for folder in Path(logdir, name).glob("version_*"):
        match = re.fullmatch(r"version_(\d+)", folder.name)
        if match and (folder / "checkpoints" / "last.ckpt").is_file():
            runs.append((int(match.group(1)), folder / "checkpoints" / "last.ckpt"))
    if not runs:
        raise UsageError(f"--resume last: no run with checkpoints/last.ckpt under {Path(logdir, name)}")
    return max(runs)[1]


LOGGERS = ("tensorboard", "csv", "wandb", "mlflow")


def build_datamodule(args: argparse.Namespace) -> MNISTDataModule:
    return MNISTDataModule(
        data_dir=args.data_dir, batch_size=args.batch_size, num_workers=args.num_workers,
        pin_memory=args.pin_memory, val_size=args.val_size, seed=args.seed, loader=args.loader,
    )


def build_model(args: argparse.Namespace) -> LitMNIST:
    model = LitMNIST(
        hidden=args.hidden, optimizer=args.optimizer, lr=args.lr, momentum=args.momentum,
        weight_decay=args.weight_decay, scheduler=args.scheduler,
    )
    if args.compile:
        model.model.compile(mode=None if args.compile == "default" else args.compile)
    return model


def build_loggers(args: argparse.Namespace) -> list[Logger]:
    """``--logger tensorboard,csv,...``: all write into the same ``LOGDIR/NAME/version_N`` run."""
    names = [n.strip() for n in args.logger.split(",") if n.strip()]
    unknown = [n for n in names if n not in LOGGERS]
    if unknown or not names:
        raise UsageError(f"--logger {args.logger}: choose from {', '.join(LOGGERS)} (comma-separated)")
    for name, package in (("wandb", "wandb"), ("mlflow", "mlflow")):
        if name in names and importlib.util.find_spec(package) is None:
            raise UsageError(f"--logger {name} needs the {package} package: pip install -e '.[{name}]'")
    loggers: list[Logger] = []
    version = None
    for name in names:
        if name == "tensorboard":
            logger: Logger = TensorBoardLogger(args.logdir, name=args.name, version=version, default_hp_metric=False)
        elif name == "csv":
            logger = CSVLogger(args.logdir, name=args.name, version=version)
        elif name == "wandb":
            from lightning.pytorch.loggers import WandbLogger

            logger = WandbLogger(project=args.name, save_dir=args.logdir)
        else:
            from lightning.pytorch.loggers import MLFlowLogger

            logger = MLFlowLogger(experiment_name=args.name, save_dir=str(Path(args.logdir) / "mlruns"))
        if version is None and name in ("tensorboard", "csv"):
            version = logger.version  # the next loggers join this run's folder
        loggers.append(logger)
    return loggers


def build_trainer(args: argparse.Namespace, precision: str, **overrides: Any) -> L.Trainer:
    """A Trainer whose per-step bookkeeping stays a small fraction of the MLP's step.

    ``overrides`` are extra ``Trainer`` arguments (the benchmark turns the progress bar off).
    """
    loggers: list[Logger] | bool = False
    callbacks: list[Any] = [FiniteLossGuard()]
    if args.gpu_memory_fraction is not None:
        callbacks.append(GpuMemoryFraction(args.gpu_memory_fraction))
    if not args.fast_dev_run:
        loggers = build_loggers(args)
        callbacks += [
            ModelCheckpoint(
                monitor="val/acc", mode="max", save_top_k=1,
                filename="best-epoch{epoch:02d}-acc{val/acc:.4f}", auto_insert_metric_name=False,
            ),
            # Not save_last=True: Lightning writes that only when the best improves, and a
            # resume needs the newest state whether or not it was the best.
            LastCheckpoint(every_n_train_steps=args.checkpoint_every_n_steps),
            LearningRateMonitor(logging_interval="step"),
            EpochStats(),
        ]
        if args.device_stats:
            callbacks.append(DeviceStatsMonitor(cpu_stats=True))
    if overrides.get("enable_progress_bar", True):
        callbacks.append(TQDMProgressBar(refresh_rate=25))
    settings: dict[str, Any] = dict(
        accelerator=args.accelerator,
        devices=args.devices,
        num_nodes=args.num_nodes,
        strategy=args.strategy,
        precision=precision,
        max_epochs=args.max_epochs,
        deterministic=args.deterministic,
        detect_anomaly=args.detect_anomaly,
        fast_dev_run=args.fast_dev_run,
        logger=loggers,
        callbacks=callbacks,
        log_every_n_steps=args.log_every_n_steps,
        enable_model_summary=False,
        default_root_dir=args.logdir,  # where the tuner's temporary checkpoints go
        plugins=[AtomicCheckpointIO()],
    )
    return L.Trainer(**{**settings, **overrides})


def tensorboard_of(loggers: list[Logger]) -> TensorBoardLogger | None:
    return next((lg for lg in loggers if isinstance(lg, TensorBoardLogger)), None)


def run_dir(trainer: L.Trainer) -> Path:
    """The run's folder: where checkpoints, model.pth, config.yaml and results.json go."""
    local = next((lg for lg in trainer.loggers if isinstance(lg, (TensorBoardLogger, CSVLogger))), None)
    return Path(local.log_dir) if local else Path(trainer.default_root_dir)


def save_config(trainer: L.Trainer, args: argparse.Namespace, model: LitMNIST,
                datamodule: MNISTDataModule) -> Path | None:
    """``config.yaml``: the flags as resolved (tuned batch size and LR included) for ``--config``."""
    if args.fast_dev_run or not trainer.is_global_zero:
        return None
    import yaml

    resolved = argparse.Namespace(**{**vars(args), "batch_size": datamodule.batch_size, "lr": model.hparams.lr,
                                     "scale_lr": False, "find_lr": False, "find_batch_size": False})
    path = run_dir(trainer) / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(to_config(resolved), sort_keys=False))
    return path


def checkpoint_paths(trainer: L.Trainer) -> tuple[str | None, str | None, float]:
    """Best and last checkpoint paths, and the best ``val/acc`` (None when nothing was saved)."""
    callbacks = trainer.checkpoint_callbacks
    if len(callbacks) < 2 or not callbacks[0].best_model_path:
        return None, None, float("nan")
    best, last = callbacks[0], callbacks[1]
    return best.best_model_path, last.best_model_path, float(best.best_model_score)


def save_weights(model: MLP, path: str | os.PathLike) -> Path:
    """Write the article-compatible ``model.pth`` (input normalisation folded in), atomically."""
    return atomic_save(export_state_dict(model), path)


def save_program(model: MLP, path: str | os.PathLike) -> Path:
    """A ``torch.export`` program of the article's network: runs with torch alone, no project code."""
    import torch
    from torch import nn

    from project.model import build_sequential

    network = build_sequential(model.hidden)
    network.load_state_dict(export_state_dict(model))
    portable = nn.Sequential(nn.Flatten(1), *network).eval()
    example = torch.rand(2, 1, 28, 28)
    program = torch.export.export(portable, (example,), dynamic_shapes=({0: torch.export.Dim("batch")},))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.stem}.tmp.pt2")  # torch.export wants the .pt2 suffix
    torch.export.save(program, temporary)
    os.replace(temporary, path)
    return path


def check_outputs_writable(args: argparse.Namespace) -> None:
    """Report an unwritable log folder or export path now, not after training."""
    if args.fast_dev_run:
        return
    _check_writable_dir(Path(args.logdir), "--logdir")
    exports = (("--export", args.export, "model.pth"), ("--export-pt2", args.export_pt2, "model.pt2"))
    for flag, value, example in exports:
        if not value:
            continue
        export = Path(value)
        if export.is_dir():
            raise UsageError(f"{flag} {export}: is a directory; give a file path such as {export / example}")
        if export.exists() and not args.overwrite:
            raise UsageError(f"{flag} {export}: the file exists; add --overwrite to replace it")
        _check_writable_dir(export.parent, flag)


def _check_writable_dir(folder: Path, flag: str) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise UsageError(f"{flag} {folder}: cannot write there ({err.strerror or err})") from None


@contextmanager
def reported_failures() -> Iterator[None]:
    """Turn the failures a user causes or expects into one-line errors with a non-zero exit.

    Lightning exits with status 0 on SIGTERM, which schedulers and scripts would read as success.
    """
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    try:
        yield
    except SIGTERMException:
        raise Terminated("stopped by SIGTERM after saving last.ckpt; continue with --resume last") from None
    except torch.OutOfMemoryError as err:
        first = str(err).splitlines()[0][:160] if str(err) else "CUDA out of memory"
        raise UserError(
            f"{first}; lower --batch-size, try --precision 16-mixed, or raise --gpu-memory-fraction"
        ) from None


def log_run_text(trainer: L.Trainer, args: argparse.Namespace, precision: str) -> None:
    """The exact command and the resolved settings, in TensorBoard's TEXT tab."""
    tensorboard = tensorboard_of(trainer.loggers)
    if tensorboard is None:
        return
    command = " ".join(shlex.quote(part) for part in [Path(sys.executable).name, *sys.argv])
    settings = {**vars(args), "precision (resolved)": precision, "world_size": trainer.world_size}
    table = "| setting | value |\n|---|---|\n" + "\n".join(f"| {k} | `{v}` |" for k, v in settings.items())
    tensorboard.experiment.add_text("run/command", f"`{command}`", 0)
    tensorboard.experiment.add_text("run/config", table, 0)


def write_results(path: Path, results: dict[str, Any]) -> None:
    """The run's numbers for machines: full precision, unlike the printed summary."""
    path.write_text(json.dumps({k: float(v) if hasattr(v, "item") else v for k, v in results.items()}, indent=2))


def log_hparams_with_results(trainer: L.Trainer, hparams: dict[str, Any], results: dict[str, float]) -> None:
    """Fill TensorBoard's HPARAMS tab (and the other loggers) with the run's real best/test accuracy."""
    from lightning.pytorch.core.saving import save_hparams_to_yaml

    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger):
            logger.log_hyperparams(hparams, results)
        else:
            logger.log_hyperparams(hparams)
            logger.log_metrics(results, step=trainer.global_step)
        logger.save()
    # The loggers wrote hparams.yaml when the run started, before these were known.
    if trainer.loggers:
        save_hparams_to_yaml(run_dir(trainer) / "hparams.yaml", hparams)


def tune(trainer: L.Trainer, model: L.LightningModule, datamodule: L.LightningDataModule,
         args: argparse.Namespace) -> None:
    """Apply --find-batch-size, --find-lr and --scale-lr, in that order, before training."""
    wants_tuner = args.find_batch_size or args.find_lr
    if wants_tuner and trainer.world_size > 1:
        raise UsageError("--find-batch-size and --find-lr run on one device; tune first, then train with DDP")
    if wants_tuner and args.resume:
        raise UsageError("--find-batch-size and --find-lr tune a new run; they cannot be combined with --resume")
    if wants_tuner and args.fast_dev_run:
        raise UsageError("--find-batch-size and --find-lr need real training steps; drop --fast-dev-run")
    if not wants_tuner and not args.scale_lr:
        return
    from lightning.pytorch.tuner import Tuner
    from lightning.pytorch.utilities import rank_zero_info

    from project.cli import BASE_BATCH

    tuner = Tuner(trainer)
    if args.find_batch_size:
        found = tuner.scale_batch_size(model, datamodule=datamodule, mode="power", steps_per_trial=3,
                                       init_val=datamodule.batch_size, max_trials=6)
        note = " (CPU memory never runs out here: the finder stopped at its trial limit)" \
            if trainer.strategy.root_device.type == "cpu" else ""
        rank_zero_info(f"batch-size finder: using --batch-size {found}{note}")
    if args.find_lr:
        finder = tuner.lr_find(model, datamodule=datamodule, min_lr=1e-5, max_lr=1.0, num_training=100)
        suggestion = finder.suggestion() if finder else None
        if suggestion:
            model.hparams.lr = float(suggestion)
        plot = run_dir(trainer) / "lr_find.png"
        if finder:
            plot.parent.mkdir(parents=True, exist_ok=True)
            finder.plot(suggest=True).savefig(plot)
        rank_zero_info(f"LR finder: using lr {model.hparams.lr:g} (plot: {plot})")
    elif args.scale_lr:
        global_batch = datamodule.batch_size * trainer.num_devices * trainer.num_nodes
        model.hparams.lr = args.lr * global_batch / BASE_BATCH
        rank_zero_info(f"--scale-lr: lr {args.lr:g} x {global_batch}/{BASE_BATCH} = {model.hparams.lr:g}")
