"""Tiny made-up digits as tensors: class k lights up a band of rows of a dark 28 x 28 image, plus noise."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import TensorDataset

from project.api import DataError, TensorDataModule

MEAN, STD = 0.16, 0.3  # of the made-up images' pixels in [0, 1]


class TinyDataModule(TensorDataModule):
    input_shape = (1, 28, 28)
    num_classes = 10
    mean, std = (MEAN,), (STD,)
    default_val_size = 40

    def _file(self, train: bool) -> Path:
        return self.data_dir / "tiny" / ("train.pt" if train else "test.pt")

    def prepare_data(self) -> None:
        for train in (True, False):
            if not self._file(train).exists():
                raise DataError(f"{self._file(train)}: no such file")
            if not self._file(train).is_file():  # a pipe would block the read
                raise DataError(f"{self._file(train)}: not a regular file")

    def _pixels(self, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = torch.load(self._file(train), weights_only=True)
        return images.unsqueeze(1).float() / 255, labels

    def load_tensors(self, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        pixels, labels = self._pixels(train)
        return self.normalize(pixels), labels

    def load_samples(self, train: bool) -> TensorDataset:
        return TensorDataset(*self._pixels(train))


def write_tiny(root: Path, train: int = 240, test: int = 80, seed: int = 0, wrong_labels: float = 0.0) -> Path:
    """Learnable made-up digits in ``root/tiny/``. ``wrong_labels``: the share of labels drawn at random instead,
    so that no model gets every image right and the metrics can tell runs apart."""
    generator = torch.Generator().manual_seed(seed)
    folder = Path(root) / "tiny"
    folder.mkdir(parents=True, exist_ok=True)
    for name, n in (("train.pt", train), ("test.pt", test)):
        labels = torch.randint(0, 10, (n,), generator=generator)
        images = torch.randint(0, 60, (n, 28, 28), generator=generator, dtype=torch.uint8)
        for i, k in enumerate(labels.tolist()):
            images[i, 2 + 2 * k: 4 + 2 * k, 4:24] = 255
        wrong = torch.rand(n, generator=generator) < wrong_labels
        labels[wrong] = torch.randint(0, 10, (int(wrong.sum()),), generator=generator)
        torch.save((images, labels), folder / name)
    return Path(root)
