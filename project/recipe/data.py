"""MNIST as the recipe's ``LightningDataModule``: the four IDX files, decoded once into tensors."""

from __future__ import annotations

import os

import torch
from torchvision import datasets, transforms

from project.api import TensorDataModule
from project.recipe.mnist_files import MNIST_MEAN, MNIST_STD, ensure_mnist, label_problem


def normalize(images: torch.Tensor) -> torch.Tensor:
    """``uint8 (N, 28, 28)`` -> ``float (N, 1, 28, 28)``, the same numbers as ToTensor + Normalize (in place after
    the one copy: 60,000 images are 188 MB, and each new tensor of that size costs more than its arithmetic)."""
    return images.unsqueeze(1).float().div_(255).sub_(MNIST_MEAN).div_(MNIST_STD)


class MNISTDataModule(TensorDataModule):
    """The 60,000-image training file (less a seeded validation split) and the 10,000-image test file."""

    input_shape = (1, 28, 28)
    num_classes = 10
    mean, std = (MNIST_MEAN,), (MNIST_STD,)
    default_val_size = 5000

    def __init__(self, data_dir: str | os.PathLike | None = None, *, download: bool = True, **settings: object) -> None:
        super().__init__(data_dir, **settings)
        self.download = download

    def prepare_data(self) -> None:
        ensure_mnist(self.data_dir, self.download)

    def _mnist(self, train: bool, transform: transforms.ToTensor | None = None) -> datasets.MNIST:
        mnist = datasets.MNIST(self.data_dir, train=train, transform=transform)
        if len(mnist.targets):
            label_problem(self.data_dir, train, int(mnist.targets.max()), self.num_classes)
        return mnist

    def load_tensors(self, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        mnist = self._mnist(train)
        return normalize(mnist.data), mnist.targets.clone()

    def load_samples(self, train: bool) -> datasets.MNIST:
        return self._mnist(train, transforms.ToTensor())

    def read_image(self, path: str | os.PathLike) -> torch.Tensor:
        """A photo or scan of a digit, made to look like MNIST (light on dark, centred by mass in 28x28)."""
        from project.recipe.digits import load_digit  # predict.py's: a training run reads no image file

        return load_digit(path)
