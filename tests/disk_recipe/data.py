"""Shape images on disk, one PNG a sample, in class folders: read per sample, never all at once."""

from __future__ import annotations

from pathlib import Path

import torch
from PIL import Image
from torchvision import datasets, transforms

from project.api import DataError, TensorDataModule

CLASSES = ("bar", "column", "square")


class ShapesDataModule(TensorDataModule):
    input_shape = (3, 16, 16)
    num_classes = len(CLASSES)
    class_names = CLASSES
    mean, std = (0.25, 0.25, 0.25), (0.25, 0.25, 0.25)
    default_val_size = 0.2

    def prepare_data(self) -> None:
        for split in ("train", "test"):
            if not (self.data_dir / "shapes" / split).is_dir():
                raise DataError(f"{self.data_dir / 'shapes' / split}: no such folder")

    def load_samples(self, train: bool) -> datasets.ImageFolder:
        folder = self.data_dir / "shapes" / ("train" if train else "test")
        return datasets.ImageFolder(str(folder), transform=transforms.Compose(
            [transforms.Resize(self.input_shape[1:]), transforms.ToTensor()]))

    def augment(self, inputs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """A left-right flip half the time: no class changes under it."""
        return inputs.flip(-1) if torch.rand(1, generator=generator).item() < 0.5 else inputs


def write_shapes(root: Path, train: int = 300, test: int = 90, seed: int = 0) -> Path:
    """A bright bar, column or square of random colour at a random place on dark noise, as PNG files."""
    generator = torch.Generator().manual_seed(seed)
    for split, count in (("train", train), ("test", test)):
        for index in range(count):
            label = index % len(CLASSES)
            image = torch.randint(0, 90, (16, 16, 3), generator=generator, dtype=torch.uint8)
            colour = torch.randint(150, 256, (3,), generator=generator, dtype=torch.uint8)
            height, width = ((2, 12) if label == 0 else (12, 2) if label == 1 else (6, 6))
            row = int(torch.randint(1, 16 - height, (1,), generator=generator))
            col = int(torch.randint(1, 16 - width, (1,), generator=generator))
            image[row: row + height, col: col + width] = colour
            folder = Path(root) / "shapes" / split / CLASSES[label]
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image.numpy()).save(folder / f"{index:04d}.png")
    return Path(root)
