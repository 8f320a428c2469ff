"""Small callbacks the template adds to Lightning's own."""

from __future__ import annotations

import resource
import time
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from project.errors import UserError


class NonFiniteLossError(UserError):
    """Training diverged; raised so that no checkpoint of the broken weights is written."""


def peak_memory_mb(device: torch.device) -> float:
    """Peak allocated memory on a CUDA device, else this process's peak resident set."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def _batch_size(trainer: L.Trainer) -> int:
    loader = trainer.train_dataloader
    return loader.batch_size or loader.batch_sampler.batch_size


class EpochStats(Callback):
    """Logs ``perf/epoch_time_s``, ``perf/samples_per_s`` and ``perf/peak_memory_mb`` per epoch.

    The time covers the training batches only: validation, which Lightning runs before
    ``on_train_epoch_end``, is left out so that samples/s measures training.
    """

    def __init__(self) -> None:
        self._start: float | None = None
        self.epoch_times: list[float] = []
        self.last: dict[str, float] = {}

    def _now(self, trainer: L.Trainer) -> float:
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize(trainer.strategy.root_device)
        return time.perf_counter()

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = self._now(trainer)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._stop(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._stop(trainer)
        if self.last:
            # Across DDP ranks: the slowest epoch, the highest peak.
            pl_module.log_dict(self.last, reduce_fx="max", sync_dist=True)

    def _stop(self, trainer: L.Trainer) -> None:
        if self._start is None:
            return
        elapsed = self._now(trainer) - self._start
        self._start = None
        # Counted here, not per batch: a per-batch hook would cost every step.
        batches = trainer.fit_loop.epoch_loop.batch_progress.current.ready
        samples = min(batches * _batch_size(trainer), len(trainer.train_dataloader.sampler))
        self.epoch_times.append(elapsed)
        self.last = {
            "perf/epoch_time_s": elapsed,
            "perf/samples_per_s": samples * trainer.world_size / elapsed,
            "perf/peak_memory_mb": peak_memory_mb(trainer.strategy.root_device),
        }


class GpuMemoryFraction(Callback):
    """Caps this process's CUDA caching allocator; under DDP each rank caps its own device."""

    def __init__(self, fraction: float) -> None:
        self.fraction = fraction

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        device = trainer.strategy.root_device
        if device.type == "cuda":
            torch.cuda.set_per_process_memory_fraction(self.fraction, device)


def release_cuda_cache() -> None:
    """Hand cached, unused CUDA blocks back to the driver (other processes can use them)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


class FiniteLossGuard(Callback):
    """Stops at the first non-finite training loss, before a checkpoint can store broken weights.

    The check runs on the host every step only on CPU, where it is free; on an accelerator the
    flag stays on the device and is read when the logger syncs anyway, so steps never block.
    """

    def __init__(self) -> None:
        self._first_bad: torch.Tensor | None = None

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if loss is None:
            return
        step = trainer.global_step
        if loss.device.type == "cpu":
            if not torch.isfinite(loss):
                self._raise(trainer, step)
            return
        bad_step = torch.where(torch.isfinite(loss), torch.iinfo(torch.int64).max, step)
        self._first_bad = bad_step if self._first_bad is None else torch.minimum(self._first_bad, bad_step)
        if step % trainer.log_every_n_steps == 0:
            self._check(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._check(trainer)

    def _check(self, trainer: L.Trainer) -> None:
        if self._first_bad is not None:
            first = int(self._first_bad)
            if first != torch.iinfo(torch.int64).max:
                self._raise(trainer, first)

    def _raise(self, trainer: L.Trainer, step: int) -> None:
        raise NonFiniteLossError(
            f"training loss became non-finite at epoch {trainer.current_epoch}, step {step}; "
            "stopped before saving it (lower --lr, or try --precision 32); "
            "the last good checkpoint is kept"
        )
