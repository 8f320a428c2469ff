"""What a fit will do, worked out from its settings: batches per epoch, optimizer steps, eval batches.

Lightning learns these only inside ``fit()``, after the run folder exists; settings that
cannot work are refused here instead, before anything is written.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.utilities import rank_zero_info

from project.config.schema import RunConfig
from project.errors import UsageError


def batches_of(samples: int, batch_size: int) -> int:
    """Batches that hold ``samples``, the last one partial: an epoch's steps, a rank's share of a split, ..."""
    return -(-samples // batch_size)


def train_batches(config: RunConfig, train_size: int, world_size: int) -> int:
    """Training batches per epoch on each rank, after ``limit_train_batches``."""
    per_rank = batches_of(train_size, world_size)  # the distributed sampler pads every rank to the same length
    batches = batches_of(per_rank, config.batch_size)
    limit = config.trainer.get("limit_train_batches")
    if limit == 0:
        raise UsageError(f"--trainer.limit_train_batches {limit}: no training batch, so no optimizer step: the run "
                         "would train nothing; give a count of batches or a share above 0")
    if isinstance(limit, int) and not isinstance(limit, bool):
        return min(batches, limit)
    if isinstance(limit, float):
        if int(batches * limit) == 0:
            raise UsageError(f"--trainer.limit_train_batches {limit}: {limit} of {batches} batches per epoch "
                             f"is none; use at least {1 / batches:.3g} or a count of batches")
        return int(batches * limit)
    return batches


def planned_steps(config: RunConfig, train_size: int, world_size: int) -> int:
    """Optimizer steps a fit of ``config`` takes, by Lightning's rules (limits, accumulation, max_steps)."""
    trainer: dict[str, Any] = config.trainer
    batches = train_batches(config, train_size, world_size)
    accumulate = int(trainer.get("accumulate_grad_batches", 1))
    if accumulate > batches:  # Lightning divides each loss by it: an epoch's only step would barely move
        raise UsageError(f"--trainer.accumulate_grad_batches {accumulate}: more than the {batches} batches of an "
                         f"epoch, whose one step would see their loss divided by {accumulate}; use at most {batches}")
    steps = batches_of(batches, accumulate) * config.max_epochs
    max_steps = trainer.get("max_steps", -1)
    return min(steps, max_steps) if max_steps not in (None, -1) else steps


def eval_batch_size(batch_size: int, limit: float | int, stage: str, split_size: int, world_size: int) -> int:
    """Smaller evaluation batches where a fractional ``limit_{stage}_batches`` would cover none.

    With 1000-image batches a rank's 2,500 validation images make 3 batches, and Lightning
    refuses ``limit_val_batches=0.1`` (0.3 of a batch); 250-image batches make it one.
    """
    if not isinstance(limit, float) or limit >= 1.0:
        return batch_size
    shard = batches_of(split_size, world_size)
    if limit * batches_of(shard, batch_size) >= 1:
        return batch_size
    smaller = max(1, int(limit * shard))
    rank_zero_info(f"limit_{stage}_batches={limit}: {stage} batches of {smaller} images (not {batch_size}), so the "
                   f"limit covers {limit:.0%} of each rank's {shard}")
    return smaller
