"""A VGG-like CNN in channels-last memory (what tensor cores read fastest), returning logits."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from project.api import ClassifierModule

CLASSES = 10


def stage(inputs: int, width: int) -> nn.Sequential:
    """Two 3x3 convolutions with batch norm, then half the resolution."""
    return nn.Sequential(
        nn.Conv2d(inputs, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
        nn.Conv2d(width, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
    )


class BlocksCNN(nn.Module):
    def __init__(self, widths: Sequence[int] = (64, 128, 256)) -> None:
        super().__init__()
        first, second, third = widths
        self.features = nn.Sequential(stage(3, first), stage(first, second), stage(second, third))
        self.head = nn.Linear(third * 4 * 4, CLASSES)  # where the block is is the class: keep the 4 x 4 map
        self.to(memory_format=torch.channels_last)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x.contiguous(memory_format=torch.channels_last))
        return self.head(x.flatten(1))


class LitBlocksCNN(ClassifierModule):
    def __init__(self, widths: Sequence[int] = (64, 128, 256), **training: Any) -> None:
        super().__init__(BlocksCNN(widths), num_classes=CLASSES, **training)
        self.save_hyperparameters({"widths": [int(w) for w in widths]}, logger=False)
