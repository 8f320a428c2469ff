"""MNIST as a ``LightningDataModule``: decoded once into tensors, batched by one gather."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, Subset, random_split
from torchvision import datasets, transforms

from project import EVAL_BATCH_SIZE, LOADERS, MNIST_MEAN, MNIST_STD, NUM_CLASSES
from project.errors import MNISTDataError
from project.recipe.mnist_files import ensure_mnist, label_problem, resolve_data_dir
from project.training.plan import eval_batch_size
from project.training.samplers import EpochBatches, EpochShardSampler, EpochShuffleSampler, EvalShardSampler, StepGroups


def normalize(images: torch.Tensor) -> torch.Tensor:
    """``uint8 (N, 28, 28)`` -> ``float (N, 1, 28, 28)``, the same numbers as ToTensor + Normalize."""
    return images.unsqueeze(1).float().div(255).sub(MNIST_MEAN).div(MNIST_STD)


def split_indices(n: int, val_size: int, seed: int) -> tuple[list[int], list[int]]:
    """Seeded train/val indices; the same split as ``random_split`` with that seed."""
    generator = torch.Generator().manual_seed(seed)
    train, val = random_split(range(n), [n - val_size, val_size], generator)
    return list(train.indices), list(val.indices)


class TensorMNIST(Dataset):
    """A split held as two tensors; ``__getitems__`` makes each batch one indexed gather.

    DataLoader calls ``__getitems__`` with the whole batch of indices, so a batch costs one
    ``index_select`` instead of 64 ``__getitem__`` calls and a collate.
    """

    def __init__(self, images: torch.Tensor, targets: torch.Tensor) -> None:
        if len(images) != len(targets):
            raise ValueError("images and targets differ in length")
        self.images = images
        self.targets = targets

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[index], self.targets[index]

    def __getitems__(self, indices: Sequence[int] | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(indices, torch.Tensor):  # from EpochBatches: already on the data's device
            index = indices
        elif self.targets.is_cuda:  # a host list (DDP's sampler): copy it without making the host wait
            index = torch.tensor(indices).pin_memory().to(self.targets.device, non_blocking=True)
        else:
            index = torch.as_tensor(indices)
        return self.images.index_select(0, index), self.targets.index_select(0, index)

    def to(self, device: torch.device) -> TensorMNIST:
        return TensorMNIST(self.images.to(device), self.targets.to(device))


def keep_batch(batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Collate for ``TensorMNIST``: ``__getitems__`` already returns a whole batch."""
    return batch


class MNISTDataModule(L.LightningDataModule):
    """Train/val split of the MNIST training file (seeded), and the 10,000-image test file."""

    def __init__(
        self,
        data_dir: str | os.PathLike | None = None,
        batch_size: int = 256,
        eval_batch_size: int = EVAL_BATCH_SIZE,
        num_workers: int = 0,
        pin_memory: bool = False,
        val_size: int = 5000,
        seed: int = 0,
        loader: str = "memory",
        download: bool = True,
    ) -> None:
        super().__init__()
        if loader not in LOADERS:
            raise ValueError(f"loader must be one of {LOADERS}, got {loader!r}")
        self.data_dir = resolve_data_dir(data_dir)
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.val_size = val_size
        self.seed = seed
        self.loader = loader
        self.download = download
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self.test_set: Dataset | None = None
        self._resume_at: tuple[int, int] | None = None
        self._train_sampler: EpochShuffleSampler | EpochBatches | None = None
        # Optimizer steps per Lightning step, and the step counts at which a group must end.
        self.steps_per_call = 1
        self.group_ends_every: tuple[int, ...] = ()

    def steps_per_epoch(self) -> int:
        """Optimizer steps in one epoch on one process (the last batch may be partial)."""
        return -(-len(self.train_set) // self.batch_size)

    def train_size(self) -> int:
        """Images in the training split (the training file less ``val_size``)."""
        self.setup("fit")
        return len(self.train_set)

    def prepare_data(self) -> None:
        ensure_mnist(self.data_dir, self.download)

    def _mnist(self, train: bool) -> datasets.MNIST:
        self.prepare_data()
        # Per-sample work is the classic path's cost, so it does only ToTensor; normalising
        # happens once per batch, on the device, in on_after_batch_transfer.
        transform = transforms.ToTensor() if self.loader == "torchvision" else None
        mnist = datasets.MNIST(self.data_dir, train=train, transform=transform)
        if len(mnist.targets):
            label_problem(self.data_dir, train, int(mnist.targets.max()), NUM_CLASSES)
        return mnist

    def _as_split(self, mnist: datasets.MNIST) -> Dataset:
        if self.loader == "torchvision":
            return mnist
        return TensorMNIST(normalize(mnist.data), mnist.targets.clone())

    def setup(self, stage: str | None = None) -> None:
        if stage in (None, "fit", "validate") and self.train_set is None:
            full = self._as_split(self._mnist(train=True))
            if not 0 < self.val_size < len(full):
                raise MNISTDataError(
                    f"val_size {self.val_size} must be between 0 and the {len(full)} training images"
                )
            train, val = split_indices(len(full), self.val_size, self.seed)
            self.train_set = self._materialise(Subset(full, train))
            self.val_set = self._materialise(Subset(full, val))
        if stage in (None, "test", "predict") and self.test_set is None:
            self.test_set = self._materialise(self._as_split(self._mnist(train=False)))

    def _materialise(self, split: Dataset) -> Dataset:
        """Gather a subset of tensors into its own tensors."""
        if isinstance(split, Subset) and isinstance(split.dataset, TensorMNIST):
            split = TensorMNIST(*split.dataset.__getitems__(split.indices))
        return split

    def _on_run_device(self, name: str) -> Dataset:
        """The split, moved once to the device the run trains on.

        Done when a loader is first asked for, not in ``setup()``: callbacks' ``setup`` (the GPU
        memory cap among them) runs after the datamodule's, and the data must count against it.
        """
        split = getattr(self, name)
        if split is None:
            raise RuntimeError("setup() must run before the dataloaders are requested")
        trainer = getattr(self, "trainer", None)
        device = trainer.strategy.root_device if trainer is not None else torch.device("cpu")
        if isinstance(split, TensorMNIST) and split.targets.device != device:
            split = split.to(device)
            setattr(self, name, split)
        return split

    def _loader(self, name: str, batch_size: int, shuffle: bool) -> DataLoader:
        dataset = self._on_run_device(name)
        trainer = getattr(self, "trainer", None)
        world_size, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        if isinstance(dataset, TensorMNIST) and shuffle and world_size == 1:
            return DataLoader(dataset, batch_sampler=self._train_batches(len(dataset), dataset.targets.device),
                              collate_fn=keep_batch)
        sampler: Sampler | None = None
        if shuffle:
            sampler = self._train_sampler = (EpochShardSampler(dataset, world_size, rank, self.seed)
                                             if world_size > 1 else EpochShuffleSampler(dataset, self.seed))
            if self._resume_at is not None:
                sampler.resume(*self._resume_at)
        elif world_size > 1:
            sampler = EvalShardSampler(dataset, world_size, rank)
        if isinstance(dataset, TensorMNIST):
            # Already a tensor (maybe on the GPU): workers and pinning would only add copies.
            return DataLoader(dataset, batch_size=batch_size, sampler=sampler, collate_fn=keep_batch)
        return DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=self.num_workers,
                          pin_memory=self.pin_memory, persistent_workers=self.num_workers > 0)

    def _train_batches(self, size: int, device: torch.device) -> EpochBatches:
        """Index tensors on the data's device: one batch, or one group of batches, per Lightning step."""
        trainer = getattr(self, "trainer", None)
        position = (lambda: (trainer.current_epoch, trainer.global_step)) if trainer is not None else (lambda: (0, 0))
        kind = StepGroups if self.steps_per_call > 1 else EpochBatches
        batches = self._train_sampler = kind(size, self.batch_size, self.seed, device, position, self.steps_per_call,
                                             self.group_ends_every)
        if self._resume_at is not None:
            batches.resume(*self._resume_at)
        return batches

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        if self.loader == "torchvision":
            x, y = batch
            return (x - MNIST_MEAN) / MNIST_STD, y
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
        return eval_batch_size(self.eval_batch_size, getattr(trainer, f"limit_{stage}_batches"), stage, len(split),
                               trainer.world_size)

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
        done = trainer.fit_loop.epoch_loop.batch_progress.current.processed  # on this rank, under DDP
        return {**position, "samples_done": done * self.batch_size}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Lightning may restore this before or after it asks for the train loader: both work."""
        if "epoch" in state_dict:
            self._resume_at = (int(state_dict["epoch"]), int(state_dict["samples_done"]))
            if self._train_sampler is not None:
                self._train_sampler.resume(*self._resume_at)
