"""The order samples are seen in: a seeded per-epoch shuffle that resumes mid-epoch, and unpadded eval shards."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence, Sized

import torch
from torch.utils.data import DistributedSampler, RandomSampler, Sampler

from project.training.plan import batches_of


class EpochShuffleSampler(RandomSampler):
    """A shuffle whose order depends only on ``seed`` and the epoch Lightning sets (one process;
    ``EpochShardSampler`` is its DDP counterpart).
    """

    def __init__(self, data_source: Sequence, seed: int = 0, keyed: bool = False) -> None:
        super().__init__(data_source)
        self.seed = seed
        self.epoch = 0
        self.keyed = keyed
        self._resume_at: tuple[int, int] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def resume(self, epoch: int, samples_done: int) -> None:
        """Skip the samples a checkpointed run already trained on, in every iteration of ``epoch``: Lightning
        starts one to check the loader, and a loader with workers reads ahead from it at once."""
        self._resume_at = (epoch, samples_done)

    def __iter__(self) -> Iterator[int] | Iterator[tuple[int, int]]:
        self.epoch, self._resume_at = resuming(self.epoch, self._resume_at)
        order = epoch_order(len(self.data_source), self.seed, self.epoch, self._resume_at)
        return with_epoch(order.tolist(), self.epoch, self.keyed)


def resuming(epoch: int, resume_at: tuple[int, int] | None) -> tuple[int, tuple[int, int] | None]:
    """``(epoch, resume_at)`` for an iteration: a resumed run's first iteration is its checkpoint's epoch, though
    Lightning iterates a loader before it sets the epoch (a loader with workers reads ahead at once); the skip
    holds for every iteration of that epoch, and ends with it."""
    if resume_at is None or epoch > resume_at[0]:
        return epoch, None
    return resume_at[0], resume_at


def with_epoch(indices: list[int], epoch: int, keyed: bool) -> Iterator[int] | Iterator[tuple[int, int]]:
    """The indices, or ``(index, epoch)`` keys for a dataset whose augmentation is seeded by both (``Augmented``):
    the same sample gets the same random crop in a resumed run, in any worker process."""
    return iter([(i, epoch) for i in indices] if keyed else indices)


def epoch_order(size: int, seed: int, epoch: int, resume_at: tuple[int, int] | None) -> torch.Tensor:
    """The epoch's shuffled indices (seeded by seed + epoch), less those a resumed run already trained on."""
    order = torch.randperm(size, generator=torch.Generator().manual_seed(seed + epoch))
    if resume_at is not None and resume_at[0] == epoch:
        order = order[resume_at[1]:]
    return order


def group_ends_at(step: int, k: int, every: tuple[int, ...]) -> bool:
    """Whether a group of batches must end once ``step`` optimizer steps are done."""
    return step % k == 0 or any(n and step % n == 0 for n in every)


class EpochBatches(Sampler[torch.Tensor]):
    """The same shuffled order as ``EpochShuffleSampler``, handed out as index tensors on ``device``.

    The epoch's permutation is copied to the device once; each batch is a slice of it, so a
    step makes no host list and no host-to-device copy (which would make the host wait for
    the GPU). ``position`` gives the trainer's ``(epoch, global step)`` when iteration starts.
    """

    def __init__(self, size: int, batch_size: int, seed: int, device: torch.device,
                 position: Callable[[], tuple[int, int]] = lambda: (0, 0), k: int = 1,
                 every: tuple[int, ...] = ()) -> None:
        self.size, self.batch_size, self.seed, self.device = size, batch_size, seed, device
        self.position, self.k, self.every = position, k, every
        self._resume_at: tuple[int, int] | None = None
        self.epoch_start_step = 0  # the global step this epoch began at (a resumed one too)

    def resume(self, epoch: int, samples_done: int) -> None:
        self._resume_at = (epoch, samples_done)

    def __len__(self) -> int:
        return batches_of(self.size, self.batch_size)

    def __iter__(self) -> Iterator[torch.Tensor]:
        epoch, step = self.position()
        order = epoch_order(self.size, self.seed, epoch, self._resume_at)
        if not len(order):  # resumed from the end of this epoch, before Lightning moved on: the next one
            epoch += 1
            order = epoch_order(self.size, self.seed, epoch, None)
        if self.device.type == "cuda":  # from pinned memory, without waiting for the work queued before it
            order = order.pin_memory().to(self.device, non_blocking=True)
        else:
            order = order.to(self.device)
        self.epoch_start_step = step - (self.size - len(order)) // self.batch_size
        self._resume_at = None
        start = 0
        while start < len(order):
            batches = 1
            while start + batches * self.batch_size < len(order) and not group_ends_at(step + batches, self.k,
                                                                                        self.every):
                batches += 1
            yield order[start: start + batches * self.batch_size]
            start, step = start + batches * self.batch_size, step + batches


class StepGroups(EpochBatches):
    """``EpochBatches`` of ``k`` consecutive batches per Lightning step (``project/training/steps_per_call.py``).

    A group ends after ``k`` batches, or earlier where ``group_ends_at`` says (logging and
    checkpoint steps, counted from the run's global step), or at the end of the epoch. It has
    no length, so Lightning ends the epoch when the groups run out, whatever their count; it
    then starts iterating before it sets a resumed epoch, hence ``position``.
    """

    def __len__(self) -> int:
        raise TypeError("the number of groups depends on where the epoch starts")


class EpochShardSampler(DistributedSampler):
    """This rank's shard of the epoch's shuffled order, resumable mid-epoch (DDP training).

    The order is ``DistributedSampler``'s (a permutation seeded by seed + epoch, padded to a
    multiple of the world size, every world-size-th index from this rank's offset), so it
    depends only on seed, epoch and world size. Being a ``DistributedSampler``, Lightning keeps
    it instead of putting its own in its place, so a resumed epoch skips exactly the samples
    this rank already trained on.
    """

    def __init__(self, dataset: Sized, num_replicas: int, rank: int, seed: int = 0, keyed: bool = False) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed)
        self.keyed = keyed
        self._resume_at: tuple[int, int] | None = None

    def resume(self, epoch: int, samples_done: int) -> None:
        self._resume_at = (epoch, samples_done)

    def __iter__(self) -> Iterator[int]:
        self.epoch, self._resume_at = resuming(self.epoch, self._resume_at)
        shard = list(super().__iter__())
        if self._resume_at is not None:
            shard = shard[self._resume_at[1]:]
        return with_epoch(shard, self.epoch, self.keyed)


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
