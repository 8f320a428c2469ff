"""Before training: Lightning's batch-size and LR finders, and the linear LR scaling rule."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_info

from project.config.schema import BASE_BATCH, RunConfig
from project.errors import UsageError
from project.training.build import global_batch, run_dir
from project.training.classifier import ClassifierModule
from project.training.tensor_data import TensorDataModule

FINDER_TRIALS = 6  # doublings the batch-size finder tries
BATCH_SIZE_CAP = 8192  # Lightning's own default ceiling for the finder
# A batch that leaves fewer optimizer steps per epoch trains worse in the recipe's epochs
# however well it fits in memory.
MIN_STEPS_PER_EPOCH = 100
# The LR finder's pick, as a share of the edge: the largest LR whose smoothed loss is still within
# EDGE_TOLERANCE of the lowest (past it the loss only climbs). A schedule that warms up and
# anneals peaks near a quarter of it; a constant LR stays lower. The lowest point itself moves
# between the curve's shallow valleys from seed to seed; the edge does not.
PEAK_SHARE = {"onecycle": 1 / 4, "cosine": 1 / 4, "none": 1 / 10}
EDGE_TOLERANCE = 1.15


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


def tune(trainer: L.Trainer, model: ClassifierModule, datamodule: TensorDataModule, config: RunConfig) -> RunConfig:
    """Apply --find-batch-size, --find-lr and --scale-lr, in that order; return the config as trained.

    The returned config holds the batch size and LR found, with the tuner flags off, so that
    ``--config`` of the saved ``config.yaml`` repeats the run without tuning again.
    """
    check_tuning(config, trainer.world_size)
    if not config.wants_tuner and not config.scale_lr:
        return config
    from lightning.pytorch.tuner import Tuner

    tuner = Tuner(trainer)
    with bars_only_on_a_terminal(trainer):
        if config.find_batch_size:
            find_batch_size(tuner, model, datamodule)
        if config.find_lr:
            find_lr(tuner, model, datamodule, trainer)
    if not config.find_lr and config.scale_lr:
        batch = global_batch(trainer, datamodule.batch_size)
        model.hparams.lr = config.lr * batch / BASE_BATCH
        rank_zero_info(f"--scale-lr: lr {config.lr:g} x {batch}/{BASE_BATCH} = {model.hparams.lr:g}")
    return config.replace(batch_size=datamodule.batch_size, lr=model.hparams.lr, scale_lr=False, find_lr=False,
                          find_batch_size=False)


@contextmanager
def bars_only_on_a_terminal(trainer: L.Trainer) -> Iterator[None]:
    """The LR finder draws its own tqdm bar, whatever the Trainer's: in a log (not a terminal) that is one line of
    carriage returns many kilobytes long. tqdm reads ``TQDM_DISABLE`` for every bar it makes."""
    if trainer.progress_bar_callback is not None:
        yield
        return
    before = os.environ.get("TQDM_DISABLE")
    os.environ["TQDM_DISABLE"] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TQDM_DISABLE", None)
        else:
            os.environ["TQDM_DISABLE"] = before


def find_batch_size(tuner: Any, model: ClassifierModule, datamodule: TensorDataModule) -> None:
    """The largest batch that fits in memory, up to the one that keeps ``MIN_STEPS_PER_EPOCH``; the
    LR follows by the square-root rule (linear scaling overshoots on a fixed epoch budget)."""
    start, start_lr = datamodule.batch_size, model.hparams.lr
    by_steps = 2 ** int(math.log2(max(1, len(datamodule.train_set) // MIN_STEPS_PER_EPOCH)))
    cap = max(start, min(BATCH_SIZE_CAP, by_steps))
    found = tuner.scale_batch_size(model, datamodule=datamodule, mode="power", steps_per_trial=3,
                                   init_val=start, max_trials=FINDER_TRIALS, max_val=cap)
    limits = {f"{cap}, the largest that keeps {MIN_STEPS_PER_EPOCH} optimizer steps per epoch": by_steps,
              f"its cap, {BATCH_SIZE_CAP}": BATCH_SIZE_CAP, f"its trial limit, {start * 2**FINDER_TRIALS}":
              start * 2**FINDER_TRIALS}
    hit = next((name for name, value in limits.items() if found >= value), None)
    how = f"stopped at {hit}; not a memory limit" if hit else "the largest that fit in memory"
    model.hparams.lr = start_lr * math.sqrt(found / start)
    rank_zero_info(f"batch-size finder: --batch-size {found} ({how}); "
                   f"lr {start_lr:g} x sqrt({found}/{start}) = {model.hparams.lr:.4g}")


def find_lr(tuner: Any, model: ClassifierModule, datamodule: TensorDataModule, trainer: L.Trainer) -> None:
    """Lightning's LR range test, read for the run's schedule: a share of the edge where the loss
    turns up, not the steepest-slope point (which sits far below a good one-cycle peak)."""
    finder = tuner.lr_find(model, datamodule=datamodule, min_lr=1e-4, max_lr=10.0, num_training=200,
                           update_attr=False)
    if finder is None:
        return
    picked = pick_lr(finder.results["lr"], finder.results["loss"], model.hparams.scheduler)
    if picked is None:
        rank_zero_info(f"LR finder: every loss was non-finite; keeping lr {model.hparams.lr:g}")
        return
    edge, model.hparams.lr = picked
    plot = run_dir(trainer) / "lr_find.png"
    plot.parent.mkdir(parents=True, exist_ok=True)
    figure = finder.plot(suggest=False)
    figure.axes[0].axvline(model.hparams.lr, color="tab:red", linestyle="--", label=f"chosen {model.hparams.lr:.3g}")
    figure.axes[0].legend()
    figure.savefig(plot)
    rank_zero_info(f"LR finder: loss within {EDGE_TOLERANCE - 1:.0%} of its lowest up to lr {edge:.3g}; using "
                   f"{model.hparams.lr:.4g} for "
                   f"--scheduler {model.hparams.scheduler} (plot: {plot})")


def pick_lr(lrs: list[float], losses: list[float], scheduler: str) -> tuple[float, float] | None:
    """``(edge, lr)`` from an LR range test's curve (None when no loss was finite)."""
    finite = [(loss, lr) for lr, loss in zip(lrs, losses, strict=True) if math.isfinite(loss)]
    if not finite:
        return None
    lowest = min(finite)[0]
    edge = max(lr for loss, lr in finite if loss <= EDGE_TOLERANCE * lowest)
    return edge, edge * PEAK_SHARE[scheduler]
