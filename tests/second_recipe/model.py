"""A small CNN that returns logits, and the LightningModule that trains it (cross-entropy, the default loss)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from project.api import ClassifierModule

CLASSES = 4


class CNN(nn.Module):
    def __init__(self, channels: Sequence[int] = (8, 16)) -> None:
        super().__init__()
        first, second = channels
        self.features = nn.Sequential(
            nn.Conv2d(3, first, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(first, second, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.head = nn.Linear(second * 3 * 4, CLASSES)  # where a feature is matters: a 3 x 4 map of it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class LitCNN(ClassifierModule):
    def __init__(self, channels: Sequence[int] = (8, 16), **training: Any) -> None:
        super().__init__(CNN(channels), num_classes=CLASSES, **training)
        self.save_hyperparameters({"channels": [int(c) for c in channels]}, logger=False)
