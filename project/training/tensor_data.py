"""The data a run trains on: how many batches and optimizer steps its settings make, the order samples are seen in,
and the engine's ``LightningDataModule`` that holds them.

A recipe subclasses ``TensorDataModule`` and says what its data is (``input_shape``,
``num_classes``, the normalisation) and how to load it: ``load_tensors`` (the whole split in memory,
on the run's device, batched by one gather) or ``load_samples`` (a per-sample ``Dataset``, e.g. a
folder of image files, read by DataLoader workers). The split, the samplers that make resume exact
(a seeded per-epoch shuffle that resumes mid-epoch, unpadded eval shards), augmentation seeding
and DDP sharding are the same for every recipe; how many batches a Lightning step takes is the
run's ``Stepper``'s to say (``for_run``).

Lightning learns a fit's batches and steps only inside ``fit()``, after the run folder exists;
settings that cannot work are refused here instead (``train_batches``, ``planned_steps``), before
anything is written.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterator, Sequence, Sized
from typing import Any, cast

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader, Dataset, DistributedSampler, RandomSampler, Sampler, Subset

from project import EVAL_BATCH_SIZE, internals
from project.config.schema import RunConfig, resolve_data_dir
from project.contract import RecipeError, class_labels
from project.errors import DataError, UsageError


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


class EpochShuffleSampler(RandomSampler):
    """A shuffle whose order depends only on ``seed`` and the epoch Lightning sets (one process;
    ``EpochShardSampler`` is its DDP counterpart).
    """

    def __init__(self, data_source: Sized, seed: int = 0, keyed: bool = False) -> None:
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

    def __iter__(self) -> Iterator[Any]:  # an index, or an (index, epoch) key (``with_epoch``)
        self.epoch, self._resume_at = resuming(self.epoch, self._resume_at)
        order = epoch_order(sample_count(self.data_source), self.seed, self.epoch, self._resume_at)
        return with_epoch(order.tolist(), self.epoch, self.keyed)


def resuming(epoch: int, resume_at: tuple[int, int] | None) -> tuple[int, tuple[int, int] | None]:
    """``(epoch, resume_at)`` for an iteration: a resumed run's first iteration is its checkpoint's epoch, though
    Lightning iterates a loader before it sets the epoch (a loader with workers reads ahead at once); the skip
    holds for every iteration of that epoch, and ends with it."""
    if resume_at is None or epoch > resume_at[0]:
        return epoch, None
    return resume_at[0], resume_at


def with_epoch(indices: list[int], epoch: int, keyed: bool) -> Iterator[Any]:
    """The indices, or ``(index, epoch)`` keys for a dataset whose augmentation is seeded by both (``Augmented``):
    the same sample gets the same random crop in a resumed run, in any worker process."""
    return iter([(i, epoch) for i in indices]) if keyed else iter(indices)


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


# What makes a run's in-memory training batches: (samples, batch size, seed, device, position) -> the sampler.
TrainBatches = Callable[[int, int, int, torch.device, Callable[[], tuple[int, int]]], "EpochBatches"]


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

    def __init__(self, dataset: Dataset, num_replicas: int, rank: int, seed: int = 0, keyed: bool = False) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed)
        self.keyed = keyed
        self._resume_at: tuple[int, int] | None = None

    def resume(self, epoch: int, samples_done: int) -> None:
        self._resume_at = (epoch, samples_done)

    def __iter__(self) -> Iterator[Any]:  # an index, or an (index, epoch) key (``with_epoch``)
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

    def __init__(self, dataset: Dataset, num_replicas: int, rank: int) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=False)
        self.total_size = sample_count(dataset)
        self.num_samples = len(range(rank, self.total_size, num_replicas))

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.total_size, self.num_replicas))


def split_indices(n: int, val_size: int, seed: int) -> tuple[list[int], list[int]]:
    """Seeded train/val indices; the same split as torch's ``random_split`` with that seed (its permutation)."""
    order: list[int] = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    return order[:n - val_size], order[n - val_size:]


def sized(split: object) -> Sized:
    """The split, known to have a length: torch's ``Dataset`` does not promise one; every split the engine reads
    has one."""
    if not isinstance(split, Sized):
        raise TypeError(f"{type(split).__name__} has no length: a split must define __len__")
    return split


def tensor_datamodule(trainer: L.Trainer) -> TensorDataModule:
    """The run's datamodule, which Lightning sets on the Trainer at ``fit`` (unseen by a type checker)."""
    found = getattr(trainer, "datamodule", None)
    if not isinstance(found, TensorDataModule):
        raise TypeError(f"the run's datamodule is a {type(found).__name__}, not a TensorDataModule")
    return found


def set_up(split: Dataset | None) -> Dataset:
    """A split of a datamodule whose ``setup`` has run."""
    if split is None:
        raise RuntimeError("setup() must run before its splits are read")
    return split


def sample_count(split: object) -> int:
    return len(sized(split))


class TensorPairs(Dataset):
    """A split held as two tensors; ``__getitems__`` makes each batch one indexed gather.

    DataLoader calls ``__getitems__`` with the whole batch of indices, so a batch costs one
    ``index_select`` instead of 64 ``__getitem__`` calls and a collate.
    """

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        if len(inputs) != len(targets):
            raise ValueError("inputs and targets differ in length")
        self.inputs = inputs
        self.targets = targets

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[index], self.targets[index]

    def __getitems__(self, indices: Sequence[int] | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(indices, torch.Tensor):  # from EpochBatches: already on the data's device
            index = indices
        elif self.targets.is_cuda:  # a host list (DDP's sampler): copy it without making the host wait
            index = torch.tensor(indices).pin_memory().to(self.targets.device, non_blocking=True)
        else:
            index = torch.as_tensor(indices)
        return self.inputs.index_select(0, index), self.targets.index_select(0, index)

    def to(self, device: torch.device) -> TensorPairs:
        return TensorPairs(self.inputs.to(device), self.targets.to(device))


class Augmented(Dataset):
    """The training split with the recipe's ``augment`` applied per sample, its randomness drawn from a generator
    seeded by (seed, epoch, index): the same sample is changed the same way in a resumed run, whichever worker
    reads it. Indexed by the ``(index, epoch)`` keys the training samplers hand out when ``keyed``."""

    def __init__(self, dataset: Dataset, augment: Any, seed: int) -> None:
        self.dataset, self.augment, self.seed = dataset, augment, seed

    def __len__(self) -> int:
        return sample_count(self.dataset)

    def __getitem__(self, key: tuple[int, int]) -> tuple[torch.Tensor, Any]:
        index, epoch = key
        inputs, target = self.dataset[index]
        generator = torch.Generator().manual_seed(hash((self.seed, epoch, index)) & 0x7FFF_FFFF_FFFF_FFFF)
        return self.augment(inputs, generator), target


def keep_batch(batch: Sequence[Any]) -> Sequence[Any]:
    """Collate for ``TensorPairs``: ``__getitems__`` already returns a whole batch (inputs, targets)."""
    return batch


class TensorDataModule(L.LightningDataModule):
    """Train/validation split of a training set (seeded), and a test set; what a subclass provides:

    - ``input_shape``, ``num_classes``, ``mean`` and ``std`` (per channel, of the normalisation), and
      optionally ``class_names`` (one per class, in index order: what evaluate and predict print);
    - ``load_tensors(train)``: the training or test set as ``(inputs, targets)``, inputs normalised, or
      ``load_samples(train)``: the same as a per-sample ``Dataset`` of unnormalised ``[0, 1]`` inputs (read by
      ``--num-workers`` DataLoader workers, normalised per batch on the device). A recipe with only
      ``load_samples`` is read per sample; one with both, from memory;
    - optionally ``prepare_data()`` (check or download files: one clear line for what is wrong),
      ``augment(inputs, generator)`` (per training sample, per-sample recipes only: one held in memory that
      defines it is refused; draw randomness from ``generator`` only, so that a resumed run sees the same samples),
      ``read_image(path)`` and ``to_image``.
    """

    input_shape: tuple[int, ...] = ()
    num_classes: int = 0
    class_names: tuple[str, ...] = ()  # in index order; none: the indices are the names
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    default_val_size: int | float = 0.1  # images, or a share of the training set

    def __init__(
        self,
        data_dir: str | os.PathLike | None = None,
        batch_size: int = 256,
        eval_batch_size: int = EVAL_BATCH_SIZE,
        num_workers: int = 0,
        pin_memory: bool = False,
        val_size: int | float | None = None,
        seed: int = 0,
        per_sample: bool | None = None,
    ) -> None:
        super().__init__()
        own = type(self)
        has_tensors, has_samples = (getattr(own, name) is not getattr(TensorDataModule, name)
                                    for name in ("load_tensors", "load_samples"))
        if not (has_tensors or has_samples):
            raise TypeError(f"{own.__name__} must implement load_tensors(train) or load_samples(train)")
        self.per_sample = not has_tensors if per_sample is None else per_sample
        if self.per_sample and not has_samples:
            raise TypeError(f"{own.__name__} has no per-sample dataset (load_samples)")
        if own.class_names and len(own.class_names) != own.num_classes:
            raise RecipeError(f"{own.__name__}: class_names names {len(own.class_names)} classes, num_classes is "
                              f"{own.num_classes}: give one name a class, in index order")
        if not self.per_sample and own.augment is not None:
            raise RecipeError(f"{own.__name__} defines augment, but it holds its training set in memory "
                              "(load_tensors), where nothing augments: read it per sample (load_samples alone) to "
                              "augment it, or remove augment")
        self.data_dir = resolve_data_dir(data_dir)
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.val_size = self.default_val_size if val_size is None else val_size
        self.seed = seed
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self.test_set: Dataset | None = None
        self._resume_at: tuple[int, int] | None = None
        self._train_sampler: EpochShuffleSampler | EpochShardSampler | EpochBatches | None = None
        self.train_batches: TrainBatches = EpochBatches  # how a run hands out its batches in memory, step by step

    # ------------------------------------------------------------------ what a recipe provides

    def load_tensors(self, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """The training (``train=True``) or test set: normalised inputs ``(N, *input_shape)`` and class indices."""
        raise NotImplementedError(f"{type(self).__name__} must implement load_tensors(train)")

    def load_samples(self, train: bool) -> Dataset:
        """The same set as a per-sample ``Dataset`` of ``([0, 1] input, class)``; normalised per batch."""
        raise NotImplementedError(f"{type(self).__name__} must implement load_samples(train)")

    augment: Any = None  # a method (inputs, generator) -> inputs, in a recipe that augments its training samples

    def normalize(self, pixels: torch.Tensor) -> torch.Tensor:
        """``[0, 1]`` inputs ``(..., C, H, W)`` as the network sees them."""
        mean, std = self._per_channel(pixels.device)
        return (pixels - mean) / std

    def to_image(self, inputs: torch.Tensor) -> torch.Tensor:
        """A batch of network inputs as ``(N, C, H, W)`` pixels in ``[0, 1]``, for the figures."""
        mean, std = self._per_channel(torch.device("cpu"))
        pixels = inputs.detach().float().cpu().reshape(len(inputs), *self.input_shape)
        return (pixels * std + mean).clamp(0, 1)

    def _per_channel(self, device: torch.device) -> tuple[float | torch.Tensor, float | torch.Tensor]:
        """``mean`` and ``std`` shaped to broadcast over ``(C, H, W)``: plain numbers for one channel."""
        if len(self.mean) == 1:
            return self.mean[0], self.std[0]
        shape = (len(self.mean),) + (1,) * (len(self.input_shape) - 1)
        return torch.tensor(self.mean, device=device).view(shape), torch.tensor(self.std, device=device).view(shape)

    @staticmethod
    def open_image(path: str | os.PathLike, use: Callable[[Any], torch.Tensor]) -> torch.Tensor:
        """``use(image)`` on the Pillow image in ``path``, any problem with the file an ``ImageError`` in one line
        (for a recipe's own ``read_image``)."""
        from project.results.image_files import with_image

        return with_image(path, use)

    def read_image(self, path: str | os.PathLike) -> torch.Tensor:
        """An image file as one network input: ``read_pixels``, normalised (``ImageError`` if unusable)."""
        return self.normalize(self.read_pixels(path))

    def read_pixels(self, path: str | os.PathLike) -> torch.Tensor:
        """An image file as ``[0, 1]`` pixels of ``input_shape``, turned to the training images' polarity: a
        per-sample recipe that reads its files with it trains on exactly what ``predict.py`` gives the network."""
        from project.results.image_files import read_resized

        return read_resized(path, self.input_shape, self.dark_background())

    def dark_background(self) -> bool | None:
        """The training images' polarity, from their mean brightness (``mean``): True for light on dark (below
        0.4), False for dark on light (above 0.6), None (no inversion) between. Override to state it."""
        brightness = sum(self.mean) / len(self.mean)
        return True if brightness < 0.4 else False if brightness > 0.6 else None

    def class_labels(self) -> tuple[str, ...]:
        """Each class's name, in index order: ``class_names``, else the indices themselves (``0``, ``1``, ...)."""
        return tuple(class_labels(self.class_names, self.num_classes))

    # ------------------------------------------------------------------ the engine's side

    def steps_per_epoch(self) -> int:
        """Optimizer steps in one epoch on one process (the last batch may be partial)."""
        return batches_of(sample_count(self.train_set), self.batch_size)

    def train_size(self) -> int:
        """Samples in the training split (the training set less the validation split)."""
        self.setup("fit")
        return sample_count(self.train_set)

    def _load(self, train: bool) -> Dataset:
        self.prepare_data()
        if self.per_sample:
            # Per-sample work is the classic path's cost, so samples stay unnormalised; normalising
            # happens once per batch, on the device, in on_after_batch_transfer.
            return self.load_samples(train)
        inputs, targets = self.load_tensors(train)
        if len(targets) and int(targets.max()) >= self.num_classes:
            raise DataError(f"{self.data_dir}: label {int(targets.max())} is outside the recipe's "
                            f"{self.num_classes} classes")
        return TensorPairs(inputs, targets)

    def validation_count(self, total: int) -> int:
        """``val_size`` in samples: given as a count, or as a share of the training set."""
        size = self.val_size
        count = round(size * total) if isinstance(size, float) and size < 1 else int(size)
        if not 0 < count < total:
            raise UsageError(f"--val-size {size}: must leave both splits non-empty, and the training set has {total} "
                             "samples; give fewer, or a share such as 0.1")
        return count

    def setup(self, stage: str | None = None) -> None:
        if stage in (None, "fit", "validate") and self.train_set is None:
            full = self._load(train=True)
            total = sample_count(full)
            train, val = split_indices(total, self.validation_count(total), self.seed)
            self.train_set = self._materialise(Subset(full, train))
            if self.per_sample and self.augment is not None:
                self.train_set = Augmented(self.train_set, self.augment, self.seed)
            self.val_set = self._materialise(Subset(full, val))
        if stage in (None, "test", "predict") and self.test_set is None:
            self.test_set = self._load(train=False)

    def _materialise(self, split: Dataset) -> Dataset:
        """Gather a subset of tensors into its own tensors."""
        if isinstance(split, Subset) and isinstance(split.dataset, TensorPairs):
            split = TensorPairs(*split.dataset.__getitems__(split.indices))
        return split

    def _on_run_device(self, name: str) -> Dataset:
        """The split, moved once to the device the run trains on.

        Done when a loader is first asked for, not in ``setup()``: callbacks' ``setup`` (the GPU
        memory cap among them) runs after the datamodule's, and the data must count against it.
        """
        split = set_up(getattr(self, name))
        trainer = getattr(self, "trainer", None)
        device = trainer.strategy.root_device if trainer is not None else torch.device("cpu")
        if isinstance(split, TensorPairs) and split.targets.device != device:
            split = split.to(device)
            setattr(self, name, split)
        return split

    def _loader(self, name: str, batch_size: int, shuffle: bool) -> DataLoader:
        dataset = self._on_run_device(name)
        trainer = getattr(self, "trainer", None)
        world_size, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        if isinstance(dataset, TensorPairs) and shuffle and world_size == 1:
            # torch's types say a batch sampler yields lists; it takes any index sequence, a tensor included.
            batches = cast(Sampler[list[int]], self._train_batches(len(dataset), dataset.targets.device))
            return DataLoader(dataset, batch_sampler=batches, collate_fn=keep_batch)
        sampler: Sampler | None = None
        if shuffle:
            keyed = isinstance(dataset, Augmented)
            sampler = self._train_sampler = (
                EpochShardSampler(dataset, world_size, rank, self.seed, keyed) if world_size > 1
                else EpochShuffleSampler(sized(dataset), self.seed, keyed))
            if self._resume_at is not None:
                sampler.resume(*self._resume_at)
        elif world_size > 1:
            sampler = EvalShardSampler(dataset, world_size, rank)
        if isinstance(dataset, TensorPairs):
            # Already a tensor (maybe on the GPU): workers and pinning would only add copies.
            return DataLoader(dataset, batch_size=batch_size, sampler=sampler, collate_fn=keep_batch)
        return DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=self.num_workers,
                          pin_memory=self.pin_memory, persistent_workers=self.num_workers > 0)

    def _train_batches(self, size: int, device: torch.device) -> EpochBatches:
        """Index tensors on the data's device, per Lightning step as ``train_batches`` makes them."""
        trainer = getattr(self, "trainer", None)
        position = (lambda: (trainer.current_epoch, trainer.global_step)) if trainer is not None else (lambda: (0, 0))
        batches = self._train_sampler = self.train_batches(size, self.batch_size, self.seed, device, position)
        if self._resume_at is not None:
            batches.resume(*self._resume_at)
        return batches

    def for_run(self, batch_size: int, eval_batch_size: int, train_batches: TrainBatches = EpochBatches
                ) -> TensorDataModule:
        """This data as one planned run takes it: its batch sizes, and how it hands out its training batches in
        memory (the run's ``Stepper`` says: a batch per Lightning step, or a group). A copy sharing the splits loaded
        already (a sweep's trials load them once); this datamodule is left as it was."""
        run = copy.copy(self)
        run.batch_size, run.eval_batch_size, run.train_batches = batch_size, eval_batch_size, train_batches
        run._train_sampler, run._resume_at = None, None
        return run

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        if self.per_sample:
            x, y = batch
            return self.normalize(x), y
        return batch

    def train_dataloader(self) -> DataLoader:
        return self._loader("train_set", self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val_set", self._eval_batch_size("val", self.val_set), shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test_set", self._eval_batch_size("test", self.test_set), shuffle=False)

    def _eval_batch_size(self, stage: str, split: Dataset | None) -> int:
        trainer = getattr(self, "trainer", None)
        if split is None or trainer is None:
            return self.eval_batch_size
        return eval_batch_size(self.eval_batch_size, getattr(trainer, f"limit_{stage}_batches"), stage,
                               sample_count(split), trainer.world_size)

    def predict_dataloader(self) -> DataLoader:
        return self.test_dataloader()

    def state_dict(self) -> dict[str, Any]:
        """Where in the epoch's data order a checkpoint was taken, for an exact mid-epoch resume."""
        trainer = getattr(self, "trainer", None)
        if trainer is None or not trainer.training:
            return {}
        batches = self._train_sampler
        position = {"epoch": trainer.current_epoch, "world_size": trainer.world_size}
        if isinstance(batches, EpochBatches):  # counted in optimizer steps, whichever K took them
            done = (trainer.global_step - batches.epoch_start_step) * trainer.accumulate_grad_batches
            return {**position, "samples_done": min(done * self.batch_size, batches.size)}
        done = internals.batches_done_this_epoch(trainer)  # on this rank, under DDP
        return {**position, "samples_done": done * self.batch_size}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Lightning may restore this before or after it asks for the train loader: both work."""
        if "epoch" in state_dict:
            self._resume_at = (int(state_dict["epoch"]), int(state_dict["samples_done"]))
            if self._train_sampler is not None:
                self._train_sampler.resume(*self._resume_at)
