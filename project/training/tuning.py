"""Before training: Lightning's batch-size and LR finders, and the linear LR scaling rule."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_info

from project import internals
from project.config.schema import RunConfig
from project.config.validators import learning_rate
from project.errors import UsageError
from project.reliability.run_folder import run_dir
from project.training.build import global_batch
from project.training.classifier import ClassifierModule
from project.training.tensor_data import TensorDataModule, batches_of, sample_count

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
# Lightning's range test reads its first points low: its running average of the loss (beta 0.98) is
# debiased by one step too many, so its n-th point is (1 - 0.98^n) / (1 - 0.98^(n+1)) of the loss, half
# at the first and within 3 % from the 25th. A false "lowest" there would pick an LR far too small.
SKIP_FIRST = 25
RANGE_TEST_STEPS = 200


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


@dataclass(frozen=True)
class LrScaling:
    """The linear scaling rule as applied: ``given`` x ``batch`` / ``base_batch``; ``auto`` when the run's
    several processes asked for it (their global batch grows with them), not the user."""

    given: float
    batch: int
    base_batch: int
    auto: bool

    @property
    def lr(self) -> float:
        return self.given * self.batch / self.base_batch


def checked_scaled_lr(scaling: LrScaling) -> float:
    """The LR as trained passes the check ``--lr`` passes: a scaled one must fit a float32 too."""
    try:
        return learning_rate(scaling.lr)
    except ValueError as err:
        raise UsageError(f"--lr {scaling.given:g} x {scaling.batch}/{scaling.base_batch} (the linear scaling rule) = "
                         f"{scaling.lr:g}: {err}; give a smaller --lr, or --no-scale-lr") from None


@dataclass(frozen=True)
class Tuning:
    """What the tuners and the scaling rule set: the batch size and LR the run trains with."""

    batch_size: int
    lr: float
    scaling: LrScaling | None

    def trained(self, config: RunConfig) -> RunConfig:
        """``config`` as trained: the batch size and LR found, the tuner flags off, so that ``--config`` of the saved
        ``config.yaml`` repeats the run without tuning again."""
        return config.replace(batch_size=self.batch_size, lr=self.lr, scale_lr=False, find_lr=False,
                              find_batch_size=False)


def tune(trainer: L.Trainer, model: ClassifierModule, datamodule: TensorDataModule, config: RunConfig,
         base_batch: int) -> Tuning | None:
    """Apply --find-batch-size, --find-lr and --scale-lr (from ``base_batch``, the batch the default LR is for), in
    that order, to the model and datamodule; what they set (None: nothing to tune)."""
    check_tuning(config, trainer.world_size)
    if not config.tunes(trainer.world_size):
        return None
    from lightning.pytorch.tuner import Tuner

    tuner = Tuner(trainer)
    with bars_only_on_a_terminal(trainer):
        if config.find_batch_size:
            find_batch_size(tuner, model, datamodule)
        if config.find_lr:
            find_lr(tuner, model, datamodule, trainer)
    scaling = None
    if not config.find_lr and config.scales_lr(trainer.world_size):
        scaling = LrScaling(config.lr, global_batch(trainer, datamodule.batch_size), base_batch,
                            auto=config.scale_lr == "auto")
        checked_scaled_lr(scaling)
        model.hparams["lr"] = scaling.lr
        rank_zero_info(f"--scale-lr: lr {config.lr:g} x {scaling.batch}/{base_batch} = {model.hparams['lr']:g}")
    return Tuning(datamodule.batch_size, model.hparams["lr"], scaling)


@contextmanager
def bars_only_on_a_terminal(trainer: L.Trainer) -> Iterator[None]:
    """The LR finder draws its own progress bar, whatever the Trainer's: in a log (not a terminal) that is one line
    of carriage returns many kilobytes long, so without the Trainer's bar the tuners run with it disabled."""
    if trainer.progress_bar_callback is not None:
        yield
        return
    with internals.lr_finder_bars_disabled():
        yield


def find_batch_size(tuner: Any, model: ClassifierModule, datamodule: TensorDataModule) -> None:
    """The largest batch that fits in memory, up to the one that keeps ``MIN_STEPS_PER_EPOCH``; the
    LR follows by the square-root rule (linear scaling overshoots on a fixed epoch budget)."""
    given, start_lr = datamodule.batch_size, model.hparams["lr"]
    samples = sample_count(datamodule.train_set)
    by_steps = 2 ** int(math.log2(max(1, samples // MIN_STEPS_PER_EPOCH)))
    cap = min(BATCH_SIZE_CAP, by_steps)
    first = datamodule.batch_size = min(given, cap)  # a --batch-size already past the limit starts at the limit
    found = tuner.scale_batch_size(model, datamodule=datamodule, mode="power", steps_per_trial=3,
                                   init_val=first, max_trials=FINDER_TRIALS, max_val=cap)
    limits = {f"{by_steps}, the largest power of two that leaves {MIN_STEPS_PER_EPOCH} optimizer steps per epoch "
              f"of {samples:,} training samples": by_steps,
              f"its cap, {BATCH_SIZE_CAP}": BATCH_SIZE_CAP,
              f"its trial limit, {first} x 2^{FINDER_TRIALS}": first * 2**FINDER_TRIALS}
    hit = next((name for name, value in limits.items() if found >= value), None)
    how = f"stopped at {hit}; not a memory limit" if hit else "the largest that fit in memory"
    model.hparams["lr"] = start_lr * math.sqrt(found / given)
    rank_zero_info(f"batch-size finder: --batch-size {found} ({how}); "
                   f"lr {start_lr:g} x sqrt({found}/{given}) = {model.hparams['lr']:.4g}")


def find_lr(tuner: Any, model: ClassifierModule, datamodule: TensorDataModule, trainer: L.Trainer) -> None:
    """Lightning's LR range test, read for the run's schedule: a share of the edge where the loss
    turns up, not the steepest-slope point (which sits far below a good one-cycle peak)."""
    # The test sweeps min_lr to max_lr over its steps; a small dataset must not end it at the run's epochs.
    epochs = trainer.fit_loop.max_epochs
    steps_per_epoch = batches_of(datamodule.train_size(), datamodule.batch_size)
    trainer.fit_loop.max_epochs = max(epochs or 1, RANGE_TEST_STEPS // steps_per_epoch + 1)
    try:
        finder = tuner.lr_find(model, datamodule=datamodule, min_lr=1e-4, max_lr=10.0, num_training=RANGE_TEST_STEPS,
                               update_attr=False)
    finally:
        trainer.fit_loop.max_epochs = epochs
    if finder is None:
        return
    lrs = finder.results["lr"]
    picked = pick_lr(lrs, finder.results["loss"], model.hparams["scheduler"])
    plot = run_dir(trainer) / "lr_find.png"
    plot.parent.mkdir(parents=True, exist_ok=True)
    figure = finder.plot(suggest=False)
    if picked is None:
        outcome = "every loss was non-finite"
    elif picked[0] >= lrs[-1]:  # the test ended before the loss turned up: no edge seen
        outcome = f"the loss never turned up before the range test's end (lr {lrs[-1]:.3g})"
    else:
        edge, model.hparams["lr"] = picked
        figure.axes[0].axvline(model.hparams["lr"], color="tab:red", linestyle="--",
                               label=f"chosen {model.hparams['lr']:.3g}")
        figure.axes[0].legend()
        figure.savefig(plot)
        rank_zero_info(f"LR finder: loss within {EDGE_TOLERANCE - 1:.0%} of its lowest up to lr {edge:.3g}; using "
                       f"{model.hparams['lr']:.4g} for --scheduler {model.hparams['scheduler']} (plot: {plot})")
        return
    figure.savefig(plot)
    rank_zero_info(f"LR finder: {outcome}; keeping lr {model.hparams['lr']:.4g} (plot: {plot})")


def pick_lr(lrs: list[float], losses: list[float], scheduler: str) -> tuple[float, float] | None:
    """``(edge, lr)`` from an LR range test's curve (None when no loss was finite): the edge is the largest LR
    whose smoothed loss is within ``EDGE_TOLERANCE`` of the lowest, before the first non-finite loss (past it
    nothing the test read means anything; a spike that the loss recovers from is no edge)."""
    points = list(zip(lrs, losses, strict=True))[SKIP_FIRST:]
    first_bad = next((i for i, (_, loss) in enumerate(points) if not math.isfinite(loss)), len(points))
    points = points[:first_bad]
    if not points:
        return None
    lowest = min(loss for _, loss in points)
    edge = max(lr for lr, loss in points if loss <= EDGE_TOLERANCE * lowest)
    return edge, edge * PEAK_SHARE[scheduler]
