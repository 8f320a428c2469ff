"""Coloured blocks as tensors: ``blocks/train.pt`` and ``blocks/test.pt``, each ``(uint8 N x 3 x 32 x 32, labels)``."""

from __future__ import annotations

from pathlib import Path

import torch

from project.api import DataError, TensorDataModule

ROWS, COLUMNS = 2, 5  # the class is the cell of this grid the block sits in


class BlocksDataModule(TensorDataModule):
    input_shape = (3, 32, 32)
    num_classes = ROWS * COLUMNS
    mean, std = (0.25, 0.25, 0.25), (0.16, 0.16, 0.16)  # of the pixels in [0, 1]: a bright block on dark noise
    default_val_size = 0.1

    def prepare_data(self) -> None:
        for name in ("train.pt", "test.pt"):
            if not (self.data_dir / "blocks" / name).is_file():
                raise DataError(f"{self.data_dir / 'blocks' / name}: no such file")

    def load_tensors(self, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = torch.load(self.data_dir / "blocks" / ("train.pt" if train else "test.pt"),
                                    weights_only=True)
        return self.normalize(images.float() / 255), labels


def write_blocks(root: Path, train: int = 400, test: int = 100, seed: int = 0) -> Path:
    """A 5 x 5 block of random bright colour on dark noise, somewhere inside one cell of a 2 x 5 grid."""
    generator = torch.Generator().manual_seed(seed)
    folder = Path(root) / "blocks"
    folder.mkdir(parents=True, exist_ok=True)
    for name, n in (("train.pt", train), ("test.pt", test)):
        labels = torch.randint(0, ROWS * COLUMNS, (n,), generator=generator)
        images = torch.randint(0, 120, (n, 3, 32, 32), generator=generator, dtype=torch.uint8)
        colours = torch.randint(120, 256, (n, 3), generator=generator, dtype=torch.uint8)
        jitter = torch.randint(0, 2, (n, 2), generator=generator)
        for i, label in enumerate(labels.tolist()):
            top = 16 * (label // COLUMNS) + 5 + int(jitter[i, 0])
            left = 6 * (label % COLUMNS) + 1 + int(jitter[i, 1])
            images[i, :, top: top + 5, left: left + 5] = colours[i].view(3, 1, 1)
        torch.save((images, labels), folder / name)
    return Path(root)
