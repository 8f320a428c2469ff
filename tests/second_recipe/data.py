"""Coloured bars as tensors: ``bars/train.pt`` and ``bars/test.pt``, each ``(uint8 images N x 3 x 12 x 16, labels)``."""

from __future__ import annotations

import torch

from project.errors import DataError
from project.training.tensor_data import TensorDataModule


class BarsDataModule(TensorDataModule):
    input_shape = (3, 12, 16)
    num_classes = 4
    mean, std = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)
    default_val_size = 0.2

    def prepare_data(self) -> None:
        for name in ("train.pt", "test.pt"):
            if not (self.data_dir / "bars" / name).is_file():
                raise DataError(f"{self.data_dir / 'bars' / name}: no such file")

    def load_tensors(self, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = torch.load(self.data_dir / "bars" / ("train.pt" if train else "test.pt"), weights_only=True)
        return self.normalize(images.float() / 255), labels
