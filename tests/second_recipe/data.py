"""Coloured bars as tensors: ``bars/train.pt`` and ``bars/test.pt``, each ``(uint8 images N x 3 x 12 x 16, labels)``."""

from __future__ import annotations

from pathlib import Path

import torch

from project.api import DataError, TensorDataModule


class BarsDataModule(TensorDataModule):
    input_shape = (3, 12, 16)
    num_classes = 4
    mean, std = (0.33, 0.33, 0.33), (0.22, 0.22, 0.22)  # of the pixels in [0, 1]: bright bars on dark noise
    default_val_size = 0.2

    def prepare_data(self) -> None:
        for name in ("train.pt", "test.pt"):
            if not (self.data_dir / "bars" / name).is_file():
                raise DataError(f"{self.data_dir / 'bars' / name}: no such file")

    def load_tensors(self, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = torch.load(self.data_dir / "bars" / ("train.pt" if train else "test.pt"), weights_only=True)
        return self.normalize(images.float() / 255), labels


def write_bars(root: Path, train: int = 400, test: int = 100, seed: int = 0) -> Path:
    """A bar of random bright colour on dark noise; its class is where the bar is (top, bottom, left, right),
    except for 8 % of labels, drawn at random (so that even a good model makes mistakes to show)."""
    generator = torch.Generator().manual_seed(seed)
    folder = Path(root) / "bars"
    folder.mkdir(parents=True, exist_ok=True)
    for name, n in (("train.pt", train), ("test.pt", test)):
        labels = torch.randint(0, 4, (n,), generator=generator)
        images = torch.randint(0, 150, (n, 3, 12, 16), generator=generator, dtype=torch.uint8)
        colours = torch.randint(90, 256, (n, 3), generator=generator, dtype=torch.uint8)
        shifts = torch.randint(0, 2, (n,), generator=generator)
        for i, (k, shift) in enumerate(zip(labels.tolist(), shifts.tolist(), strict=True)):
            bar = images[i, :, 1 + shift: 3 + shift, 2:14] if k == 0 else \
                images[i, :, 8 + shift: 10 + shift, 2:14] if k == 1 else \
                images[i, :, 1:11, 2 + shift: 4 + shift] if k == 2 else images[i, :, 1:11, 11 + shift: 13 + shift]
            bar[:] = colours[i].view(3, 1, 1)
        noisy = torch.rand(n, generator=generator) < 0.08
        labels[noisy] = torch.randint(0, 4, (int(noisy.sum()),), generator=generator)
        torch.save((images, labels), folder / name)
    return Path(root)
