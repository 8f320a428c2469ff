"""Every private attribute of Lightning, torch and Optuna the project touches, in one place.

Each is used for a reason its owner offers no public way to serve (named beside it), and each is
listed in ``TOUCHED``: ``tests/test_internals.py`` checks every one on the installed versions and
fails naming the attribute when an upgrade moves it. Nothing else in ``project/`` reaches past a
public API.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import torch

# (where, attribute): what tests/test_internals.py checks on the installed versions.
TOUCHED = (
    ("lightning _TrainingEpochLoop", "_batches_that_stepped"),
    ("lightning _TrainingEpochLoop", "_should_check_val_fx"),
    ("lightning _ManualOptimization", "optim_step_progress"),
    ("lightning _FitLoop", "_data_fetcher"),
    ("lightning Trainer", "_signal_connector"),
    ("lightning _AcceleratorConnector", "_choose_auto_accelerator"),
    ("lightning checkpoint loops", "epoch_loop.manual_optimization.optim_step_progress"),
    ("lightning checkpoint loops", "epoch_loop.automatic_optimization.optim_progress"),
    ("lightning checkpoint loops", "epoch_loop.batch_progress"),
    ("torch SummaryWriter", "_get_file_writer"),
    ("torch LRScheduler", "_step_count"),
    ("torch GradScaler", "_scale"),
    ("torch GradScaler", "_growth_tracker"),
    ("torch", "_amp_update_scale_"),
    ("torch", "_amp_foreach_non_finite_check_and_unscale_"),
    ("torch", "_foreach_add"),
    ("torch", "_foreach_add_"),
    ("torch", "_foreach_mul"),
    ("torch", "_foreach_mul_"),
    ("torch", "_foreach_sub_"),
    ("optuna FrozenTrial", "_trial_id"),
    ("lightning launchers", "_SubprocessScriptLauncher"),
    ("lightning launchers", "_MultiProcessingLauncher"),
    ("lightning ModelCheckpoint", "_every_n_train_steps"),
    ("lightning ModelCheckpoint", "_should_skip_saving_checkpoint"),
    ("lightning ModelCheckpoint", "_save_topk_checkpoint"),
    ("lightning ModelCheckpoint", "_monitor_candidates"),
    ("lightning TensorBoardLogger", "_experiment"),
    ("lightning CSVLogger", "_experiment"),
    ("lightning lr_finder", "tqdm"),
    ("torchmetrics Metric", "_defaults"),
    ("torchmetrics Metric", "_update_count"),
    ("os", "_exit"),
)

# Where a Lightning 2 checkpoint keeps the fit loop's counts (``checkpoint["loops"]["fit_loop"]``).
AUTOMATIC_STEPS = "epoch_loop.automatic_optimization.optim_progress"
MANUAL_STEPS = "epoch_loop.manual_optimization.optim_step_progress"
BATCHES = "epoch_loop.batch_progress"

# torch.optim's own multi-tensor kernels: an SGD step written with them is one graph-capturable launch per list.
foreach_add = torch._foreach_add
foreach_add_ = torch._foreach_add_
foreach_mul = torch._foreach_mul
foreach_mul_ = torch._foreach_mul_
foreach_sub_ = torch._foreach_sub_
# GradScaler's own kernels, for a loss scale kept on the device inside a captured step.
amp_update_scale_ = torch._amp_update_scale_
amp_unscale_ = torch._amp_foreach_non_finite_check_and_unscale_


def is_rank_zero() -> bool:
    """Whether this process is rank 0: Lightning sets the rank on its decorator from the launcher's environment."""
    from lightning.pytorch.utilities.rank_zero import rank_zero_only

    return int(getattr(rank_zero_only, "rank", 0)) == 0


def count_logged_steps(trainer: Any, extra: int) -> None:
    """Lightning numbers logged steps by its own steps; a step of K optimizer steps adds ``extra`` = K - 1."""
    trainer.fit_loop.epoch_loop._batches_that_stepped += extra


def manual_step_progress(trainer: Any) -> Any:
    """The optimizer-step counts Lightning keeps under manual optimisation (``trainer.global_step`` reads them)."""
    return trainer.fit_loop.epoch_loop.manual_optimization.optim_step_progress


def batches_done_this_epoch(trainer: Any) -> int:
    """The training batches this rank has finished in the current epoch, as Lightning counts them for a resume."""
    return int(trainer.fit_loop.epoch_loop.batch_progress.current.processed)


def validation_due(trainer: Any) -> bool:
    """Lightning's own rule for whether it validates after this training step, the epoch's last or at a
    ``val_check_interval`` (no public form): no place to stop or to take a resume point."""
    loop = trainer.fit_loop.epoch_loop
    return bool(loop._should_check_val_fx(trainer.fit_loop._data_fetcher))


def stop_as_on_sigterm(trainer: Any) -> None:
    """Lightning's own graceful stop: it raises ``SIGTERMException`` once this step's metrics are logged."""
    trainer._signal_connector.received_sigterm = True


def auto_accelerator() -> str:
    """What Lightning resolves ``accelerator="auto"`` to on this machine."""
    from lightning.pytorch.trainer.connectors.accelerator_connector import _AcceleratorConnector

    return str(_AcceleratorConnector._choose_auto_accelerator())


def file_writer(summary_writer: Any) -> Any:
    """A ``SummaryWriter``'s event-file writer: HPARAMS summaries go into the run's own event file through it."""
    return summary_writer._get_file_writer()


def count_scheduler_steps(scheduler: Any, steps: int) -> None:
    """Count ``steps`` more scheduler steps, as stepping that often would (its warning on order reads it)."""
    scheduler._step_count += steps


def scaler_tensors(scaler: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """A ``GradScaler``'s scale and growth tracker, which a captured step updates in place."""
    return scaler._scale, scaler._growth_tracker


def started_ranks(launcher: Any) -> list[Any]:
    """The rank processes Lightning's script launcher started in this one (``Popen`` each); none under another."""
    from lightning.pytorch.strategies.launchers import _SubprocessScriptLauncher

    return launcher.procs if isinstance(launcher, _SubprocessScriptLauncher) else []


def spawns_ranks(launcher: Any) -> bool:
    """Whether Lightning spawned this process's ranks (each one's process ends with its fit or test)."""
    from lightning.pytorch.strategies.launchers import _MultiProcessingLauncher

    return isinstance(launcher, _MultiProcessingLauncher)


def trial_id(trial: Any) -> int:
    """An Optuna trial's key in its storage (the storage API takes it; the trial shows only its number)."""
    return int(trial._trial_id)


def saves_every_n_steps(checkpoint: Any) -> bool:
    """Whether a ``ModelCheckpoint`` was made with ``every_n_train_steps`` (it keeps the number to itself)."""
    return bool(checkpoint._every_n_train_steps)


def save_now(checkpoint: Any, trainer: Any) -> None:
    """Save as a ``ModelCheckpoint`` saves at one of its steps, under its own rules for skipping a save."""
    if not checkpoint._should_skip_saving_checkpoint(trainer):
        checkpoint._save_topk_checkpoint(trainer, checkpoint._monitor_candidates(trainer))


def opened_experiment(logger: Any) -> Any:
    """A Lightning logger's writer if it has made one, else None (its ``experiment`` property makes one)."""
    return logger._experiment


@contextmanager
def lr_finder_bars_disabled() -> Iterator[None]:
    """The LR finder's tqdm bars, disabled while it runs: its module's ``tqdm`` is the only handle on them
    (``TQDM_DISABLE`` is read once, when tqdm is imported)."""
    from lightning.pytorch.tuner import lr_finder

    drawing = lr_finder.tqdm
    lr_finder.tqdm = functools.partial(drawing, disable=True)
    try:
        yield
    finally:
        lr_finder.tqdm = drawing


def metric_state_names(metric: Any) -> list[str]:
    """The states a torchmetrics ``Metric`` registered with ``add_state`` (what its ``reset`` restores)."""
    return list(metric._defaults)


def count_metric_updates(metric: Any, updates: int) -> None:
    """Count ``updates`` more calls of ``update``, as that many calls would (``compute`` warns on none); in the
    metric's own ``__dict__``, where nn.Module keeps a number: its ``__setattr__`` would look in four others first."""
    vars(metric)["_update_count"] += updates


def exit_now(code: int) -> NoReturn:
    """End the process at once, running no handlers: a second Ctrl-C must not wait for the first one's cleanup."""
    os._exit(code)
