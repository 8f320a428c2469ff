"""The order samples are seen in: a seeded per-epoch shuffle that resumes mid-epoch, and unpadded eval shards."""

from __future__ import annotations

from collections.abc import Iterator, Sequence, Sized

import torch
from torch.utils.data import DistributedSampler, RandomSampler


class EpochShuffleSampler(RandomSampler):
    """A shuffle whose order depends only on ``seed`` and the epoch Lightning sets.

    Subclassing ``RandomSampler`` tells Lightning the loader shuffles, so under DDP it swaps in
    a ``DistributedSampler`` (also seeded by seed + epoch) that gives each rank a disjoint shard.
    """

    def __init__(self, data_source: Sequence, seed: int = 0) -> None:
        super().__init__(data_source)
        self.seed = seed
        self.epoch = 0
        self._resume_at: tuple[int, int] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def resume(self, epoch: int, samples_done: int) -> None:
        """Skip the samples a checkpointed run already trained on, once, when ``epoch`` comes round."""
        self._resume_at = (epoch, samples_done)

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(len(self.data_source), generator=generator).tolist()
        if self._resume_at is not None and self._resume_at[0] == self.epoch:
            order = order[self._resume_at[1]:]
        self._resume_at = None
        return iter(order)


class EvalShardSampler(DistributedSampler):
    """Splits an evaluation set across ranks without padding.

    ``DistributedSampler`` repeats samples so every rank gets the same count; that would count
    them twice in accuracy. Each sample here is seen by exactly one rank, and torchmetrics sums
    the ranks' states, so a DDP evaluation equals a single-process one.
    """

    def __init__(self, dataset: Sized, num_replicas: int, rank: int) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=False)
        self.num_samples = len(range(rank, len(dataset), num_replicas))
        self.total_size = len(dataset)

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.total_size, self.num_replicas))
