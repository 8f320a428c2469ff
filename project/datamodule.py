"""MNIST as a ``LightningDataModule``: decoded once into tensors, batched by one gather."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence, Sized
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, RandomSampler, Sampler, Subset, random_split
from torchvision import datasets, transforms

from project import LOADERS, MNIST_MEAN, MNIST_STD, NUM_CLASSES
from project.errors import UserError

RAW_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
EVAL_BATCH_SIZE = 1000


class MNISTDataError(UserError):
    """The MNIST files are missing or unreadable."""


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """``--data-dir`` wins, then the ``DATA_DIR`` environment variable, then ``data/``."""
    return Path(data_dir or os.environ.get("DATA_DIR") or "data")


def raw_folder(data_dir: Path) -> Path:
    return data_dir / "MNIST" / "raw"


def missing_files(data_dir: Path) -> list[str]:
    folder = raw_folder(data_dir)
    return [name for name in RAW_FILES if not (folder / name).exists()]


IMAGES_MAGIC, LABELS_MAGIC = 0x00000803, 0x00000801  # IDX: unsigned bytes, 3 or 1 dimensions


def _idx_problem(path: Path, magic: int) -> tuple[str | None, int]:
    """What is wrong with one IDX file (None if nothing), and the record count its header gives."""
    if path.is_dir():
        return "is a directory, not a file", 0
    try:
        with path.open("rb") as stream:
            header = stream.read(4 + 4 * 3)
    except PermissionError:
        return "cannot read it (permission denied)", 0
    except OSError as err:
        return f"cannot read it ({err.strerror or err})", 0
    size = path.stat().st_size
    if size == 0:
        return "empty file", 0
    ndim = magic & 0xFF
    header_size = 4 + 4 * ndim
    if size < header_size:
        return f"truncated: {size} bytes, shorter than the {header_size}-byte IDX header", 0
    found = int.from_bytes(header[:4], "big")
    if found != magic:
        kind = "images" if magic == IMAGES_MAGIC else "labels"
        return f"wrong magic number 0x{found:08x}, expected 0x{magic:08x} (IDX {kind} of unsigned bytes)", 0
    dims = [int.from_bytes(header[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    if ndim == 3 and dims[1:] != [28, 28]:
        return f"images are {dims[1]}x{dims[2]}, expected 28x28", dims[0]
    expected = header_size + dims[0] * (28 * 28 if ndim == 3 else 1)
    if size != expected:
        state = "truncated" if size < expected else "too long"
        return f"{state}: {size} bytes, but its header announces {dims[0]} records ({expected} bytes)", dims[0]
    return None, dims[0]


def check_raw_files(data_dir: Path) -> None:
    """Raise one clear line for the first unusable MNIST file, before torchvision reads them."""
    folder = raw_folder(data_dir)
    for images_name, labels_name in (RAW_FILES[:2], RAW_FILES[2:]):
        counts = []
        for name, magic in ((images_name, IMAGES_MAGIC), (labels_name, LABELS_MAGIC)):
            problem, count = _idx_problem(folder / name, magic)
            if problem:
                raise MNISTDataError(f"{folder / name}: {problem}")
            counts.append(count)
        if counts[0] != counts[1]:
            raise MNISTDataError(
                f"{folder / images_name} has {counts[0]} images but {folder / labels_name} has {counts[1]} labels"
            )


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

    def __getitems__(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.as_tensor(indices, device=self.targets.device)
        return self.images.index_select(0, index), self.targets.index_select(0, index)

    def to(self, device: torch.device) -> TensorMNIST:
        return TensorMNIST(self.images.to(device), self.targets.to(device))


def keep_batch(batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Collate for ``TensorMNIST``: ``__getitems__`` already returns a whole batch."""
    return batch


class EpochShuffleSampler(RandomSampler):
    """A shuffle whose order depends only on ``seed`` and the epoch Lightning sets.

    Subclassing ``RandomSampler`` tells Lightning the loader shuffles, so under DDP it swaps in
    a ``DistributedSampler`` (also seeded by seed + epoch) that gives each rank a disjoint shard.
    """

    def __init__(self, data_source: Sequence, seed: int = 0) -> None:
        super().__init__(data_source)
        self.seed = seed
        self.epoch = 0
        self.resume_at: tuple[int, int] | None = None  # (epoch, samples already trained on)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(len(self.data_source), generator=generator).tolist()
        if self.resume_at is not None and self.resume_at[0] == self.epoch:
            order = order[self.resume_at[1]:]  # a run resumed mid-epoch continues where it stopped
        self.resume_at = None
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


class MNISTDataModule(L.LightningDataModule):
    """Train/val split of the MNIST training file (seeded), and the 10,000-image test file."""

    def __init__(
        self,
        data_dir: str | os.PathLike | None = None,
        batch_size: int = 256,
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
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.val_size = val_size
        self.seed = seed
        self.loader = loader
        self.download = download
        self.train_set: Dataset | None = None
        self._train_sampler: EpochShuffleSampler | None = None
        self._resume_at: tuple[int, int] | None = None
        self.val_set: Dataset | None = None
        self.test_set: Dataset | None = None

    def prepare_data(self) -> None:
        """Download MNIST only when a file is missing; explain what is needed when that fails."""
        missing = missing_files(self.data_dir)
        if not missing:
            check_raw_files(self.data_dir)
            return
        if self.download:
            try:
                for train in (True, False):
                    datasets.MNIST(self.data_dir, train=train, download=True)
            except Exception:  # noqa: BLE001 - any failure means the same thing to the user
                pass
            missing = missing_files(self.data_dir)
        if missing:
            raise MNISTDataError(
                f"MNIST not found in {raw_folder(self.data_dir)} and it could not be downloaded; "
                f"put the four uncompressed files there ({', '.join(RAW_FILES)}) "
                "or point --data-dir / DATA_DIR at a folder that has MNIST/raw/"
            )
        check_raw_files(self.data_dir)

    def _mnist(self, train: bool) -> datasets.MNIST:
        self.prepare_data()
        # Per-sample work is the classic path's cost, so it does only ToTensor; normalising
        # happens once per batch, on the device, in on_after_batch_transfer.
        transform = transforms.ToTensor() if self.loader == "torchvision" else None
        mnist = datasets.MNIST(self.data_dir, train=train, transform=transform)
        if len(mnist.targets) and int(mnist.targets.max()) >= NUM_CLASSES:
            name = RAW_FILES[1] if train else RAW_FILES[3]
            raise MNISTDataError(
                f"{raw_folder(self.data_dir) / name}: label {int(mnist.targets.max())} is not a digit 0-9"
            )
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

    def _on_run_device(self, name: str) -> Dataset | None:
        """The split, moved once to the device the run trains on.

        Done when a loader is first asked for, not in ``setup()``: callbacks' ``setup`` (the GPU
        memory cap among them) runs after the datamodule's, and the data must count against it.
        """
        split = getattr(self, name)
        device = self._device()
        if isinstance(split, TensorMNIST) and split.targets.device != device:
            split = split.to(device)
            setattr(self, name, split)
        return split

    def _world(self) -> tuple[int, int]:
        trainer = getattr(self, "trainer", None)
        return (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)

    def _device(self) -> torch.device:
        trainer = getattr(self, "trainer", None)
        if trainer is None:
            return torch.device("cpu")
        return trainer.strategy.root_device

    def _loader(self, dataset: Dataset | None, batch_size: int, shuffle: bool) -> DataLoader:
        if dataset is None:
            raise RuntimeError("setup() must run before the dataloaders are requested")
        world_size, rank = self._world()
        if shuffle:
            sampler: Sampler | None = EpochShuffleSampler(dataset, self.seed)
        else:
            sampler = EvalShardSampler(dataset, world_size, rank) if world_size > 1 else None
        if isinstance(dataset, TensorMNIST):
            # Already a tensor (maybe on the GPU): workers and pinning would only add copies.
            return DataLoader(dataset, batch_size=batch_size, sampler=sampler, collate_fn=keep_batch)
        return DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            persistent_workers=self.num_workers > 0,
        )

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        if self.loader == "torchvision":
            x, y = batch
            return (x - MNIST_MEAN) / MNIST_STD, y
        return batch

    def train_dataloader(self) -> DataLoader:
        loader = self._loader(self._on_run_device("train_set"), self.batch_size, shuffle=True)
        self._train_sampler = loader.sampler
        self._train_sampler.resume_at = self._resume_at
        return loader

    def state_dict(self) -> dict[str, Any]:
        """Where in the epoch's data order a checkpoint was taken, for an exact mid-epoch resume."""
        trainer = getattr(self, "trainer", None)
        if trainer is None or not trainer.training:
            return {}
        done = trainer.fit_loop.epoch_loop.batch_progress.current.processed
        return {"epoch": trainer.current_epoch, "samples_done": done * self.batch_size}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if "epoch" in state_dict:
            self._resume_at = (int(state_dict["epoch"]), int(state_dict["samples_done"]))
            if self._train_sampler is not None:
                self._train_sampler.resume_at = self._resume_at

    def val_dataloader(self) -> DataLoader:
        return self._loader(self._on_run_device("val_set"), max(self.batch_size, EVAL_BATCH_SIZE), shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self._on_run_device("test_set"), max(self.batch_size, EVAL_BATCH_SIZE), shuffle=False)

    def predict_dataloader(self) -> DataLoader:
        return self.test_dataloader()
