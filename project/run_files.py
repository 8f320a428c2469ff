"""What a run writes beside its checkpoints: config.yaml, results.json, TensorBoard's TEXT and HPARAMS."""

from __future__ import annotations

import json
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from project.build import run_dir
from project.config import RunConfig
from project.errors import UsageError
from project.tensorboard_figures import tensorboard_of


def check_outputs_writable(config: RunConfig) -> None:
    """Report an unwritable log folder or export path now, not after training."""
    if config.fast_dev_run:
        return
    _check_writable_dir(Path(config.logdir), "--logdir")
    named = Path(config.logdir) / config.name / (config.run_version or "")
    # Other ranks start after rank 0 has made the folder.
    if config.run_version and named.exists() and rank_zero_only.rank == 0:
        raise UsageError(f"--run-version {config.run_version}: {named} exists; runs never share a folder, "
                         "choose another")
    exports = (("--export", config.export, "model.pth"), ("--export-pt2", config.export_pt2, "model.pt2"))
    for flag, value, example in exports:
        if not value:
            continue
        export = Path(value)
        if export.is_dir():
            raise UsageError(f"{flag} {export}: is a directory; give a file path such as {export / example}")
        if export.exists() and not config.overwrite:
            raise UsageError(f"{flag} {export}: the file exists; add --overwrite to replace it")
        _check_writable_dir(export.parent, flag)


def _check_writable_dir(folder: Path, flag: str) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise UsageError(f"{flag} {folder}: cannot write there ({err.strerror or err})") from None


def save_config(trainer: L.Trainer, config: RunConfig) -> Path:
    """``config.yaml``: the settings as trained, which ``--config`` reads back to the same run."""
    import yaml

    path = run_dir(trainer) / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config.to_mapping(), sort_keys=False))
    return path


def write_results(path: Path, results: dict[str, Any]) -> None:
    """The run's numbers for machines: full precision, unlike the printed summary."""
    path.write_text(json.dumps({k: float(v) if hasattr(v, "item") else v for k, v in results.items()}, indent=2))


def log_run_text(trainer: L.Trainer, config: RunConfig) -> None:
    """The exact command and the resolved settings, in TensorBoard's TEXT tab."""
    tensorboard = tensorboard_of(trainer)
    if tensorboard is None:
        return
    command = " ".join(shlex.quote(part) for part in [Path(sys.executable).name, *sys.argv])
    settings = {**config.to_mapping(), "world_size": trainer.world_size}
    table = "| setting | value |\n|---|---|\n" + "\n".join(f"| {k} | `{v}` |" for k, v in settings.items())
    tensorboard.experiment.add_text("run/command", f"`{command}`", 0)
    tensorboard.experiment.add_text("run/config", table, 0)


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
