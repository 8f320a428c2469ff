"""What a fit will do, worked out before it starts: batches per epoch and optimizer steps.

Lightning learns these only inside ``fit()``, after the run folder exists; settings that
cannot work are refused here instead, before anything is written.
"""

from __future__ import annotations

from typing import Any

from project.config import RunConfig
from project.errors import UsageError


def train_batches(config: RunConfig, train_size: int, world_size: int) -> int:
    """Training batches per epoch on each rank, after ``limit_train_batches``."""
    per_rank = -(-train_size // world_size)  # the distributed sampler pads every rank to the same length
    batches = -(-per_rank // config.batch_size)
    limit = config.trainer.get("limit_train_batches")
    if isinstance(limit, int) and not isinstance(limit, bool):
        return min(batches, limit)
    if isinstance(limit, float):
        if 0 < limit and int(batches * limit) == 0:
            raise UsageError(f"--trainer.limit_train_batches {limit}: {limit} of {batches} batches per epoch "
                             f"is none; use at least {1 / batches:.3g} or a count of batches")
        return int(batches * limit)
    return batches


def planned_steps(config: RunConfig, train_size: int, world_size: int) -> int:
    """Optimizer steps a fit of ``config`` takes, by Lightning's rules (limits, accumulation, max_steps)."""
    trainer: dict[str, Any] = config.trainer
    batches = train_batches(config, train_size, world_size)
    steps = -(-batches // int(trainer.get("accumulate_grad_batches", 1))) * config.max_epochs
    max_steps = trainer.get("max_steps", -1)
    return min(steps, max_steps) if max_steps not in (None, -1) else steps
