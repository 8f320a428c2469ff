"""Before training: Lightning's batch-size and LR finders, and the linear LR scaling rule."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.utilities import rank_zero_info

from project.build import global_batch, run_dir
from project.config import BASE_BATCH, RunConfig
from project.datamodule import MNISTDataModule
from project.errors import UsageError
from project.lit_module import LitMNIST

FINDER_TRIALS = 6  # doublings the batch-size finder tries
BATCH_SIZE_CAP = 8192  # Lightning's own default ceiling for the finder


def check_tuning(config: RunConfig, world_size: int) -> None:
    """Refuse tuner requests that cannot work, before anything runs."""
    if not config.wants_tuner:
        return
    if world_size > 1:
        raise UsageError("--find-batch-size and --find-lr run on one device; tune first, then train with DDP")
    if config.resume:
        raise UsageError("--find-batch-size and --find-lr tune a new run; they cannot be combined with --resume")
    if config.fast_dev_run:
        raise UsageError("--find-batch-size and --find-lr need real training steps; drop --fast-dev-run")


def tune(trainer: L.Trainer, model: LitMNIST, datamodule: MNISTDataModule, config: RunConfig) -> RunConfig:
    """Apply --find-batch-size, --find-lr and --scale-lr, in that order; return the config as trained.

    The returned config holds the batch size and LR found, with the tuner flags off, so that
    ``--config`` of the saved ``config.yaml`` repeats the run without tuning again.
    """
    check_tuning(config, trainer.world_size)
    if not config.wants_tuner and not config.scale_lr:
        return config
    from lightning.pytorch.tuner import Tuner

    tuner = Tuner(trainer)
    if config.find_batch_size:
        start = datamodule.batch_size
        found = tuner.scale_batch_size(model, datamodule=datamodule, mode="power", steps_per_trial=3,
                                       init_val=start, max_trials=FINDER_TRIALS, max_val=BATCH_SIZE_CAP)
        limits = {"the training set's size": len(datamodule.train_set), "its cap": BATCH_SIZE_CAP,
                  "its trial limit": start * 2**FINDER_TRIALS}
        hit = next((f"{name}, {value}" for name, value in limits.items() if found >= value), None)
        how = f"it stopped at {hit}, not at a memory limit" if hit else "the largest that fit in memory"
        rank_zero_info(f"batch-size finder: using --batch-size {found} ({how})")
    if config.find_lr:
        finder = tuner.lr_find(model, datamodule=datamodule, min_lr=1e-5, max_lr=1.0, num_training=100)
        suggestion = finder.suggestion() if finder else None
        if suggestion:
            model.hparams.lr = float(suggestion)
        plot = run_dir(trainer) / "lr_find.png"
        if finder:
            plot.parent.mkdir(parents=True, exist_ok=True)
            finder.plot(suggest=True).savefig(plot)
        rank_zero_info(f"LR finder: using lr {model.hparams.lr:g} (plot: {plot})")
    elif config.scale_lr:
        batch = global_batch(trainer, datamodule.batch_size)
        model.hparams.lr = config.lr * batch / BASE_BATCH
        rank_zero_info(f"--scale-lr: lr {config.lr:g} x {batch}/{BASE_BATCH} = {model.hparams.lr:g}")
    return config.replace(batch_size=datamodule.batch_size, lr=model.hparams.lr, scale_lr=False, find_lr=False,
                          find_batch_size=False)
