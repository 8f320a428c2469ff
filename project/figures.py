"""Pictures for TensorBoard: cheap tensor-drawn ones during training, matplotlib ones at the end."""

from __future__ import annotations

from typing import Any

import torch
from torchvision.utils import make_grid

from project import MNIST_MEAN, MNIST_STD

_GREEN = torch.tensor([0.1, 0.5, 0.2]).view(3, 1, 1)
_RED = torch.tensor([0.75, 0.1, 0.1]).view(3, 1, 1)


def denormalize(images: torch.Tensor) -> torch.Tensor:
    """Back to the [0, 1] pixels of the original images (what a person would see)."""
    return (images * MNIST_STD + MNIST_MEAN).clamp(0, 1)


def batch_grid(images: torch.Tensor, count: int = 64) -> torch.Tensor:
    """A ``(3, H, W)`` grid of the first ``count`` images of a normalised batch."""
    shown = denormalize(images[:count].detach().float().cpu().reshape(-1, 1, 28, 28))
    return make_grid(shown, nrow=8, padding=2, pad_value=0.5)


def confusion_heatmap(matrix: torch.Tensor, cell: int = 24) -> torch.Tensor:
    """Confusion matrix as a ``(3, H, W)`` image: true class down, predicted across.

    Diagonal cells are green by per-class accuracy; off-diagonal cells are red relative to the
    largest confusion, so that a few dozen mistakes among thousands still show. Drawn with
    tensor ops in about a millisecond, so it can be logged every epoch.
    """
    counts = matrix.detach().float().cpu()
    share = counts / counts.sum(dim=1, keepdim=True).clamp(min=1)
    diagonal = torch.eye(len(share), dtype=torch.bool)
    errors = share.masked_fill(diagonal, 0)
    errors = errors / errors.max().clamp(min=1e-9)
    strength = torch.where(diagonal, share, errors).unsqueeze(0)
    colour = torch.where(diagonal.unsqueeze(0), _GREEN, _RED)
    image = 1 - strength * (1 - colour)  # white (0) to full colour (1)
    image = image.repeat_interleave(cell, dim=1).repeat_interleave(cell, dim=2)
    image[:, ::cell, :] = 0.75  # grid lines
    image[:, :, ::cell] = 0.75
    return image


def confusion_figure(matrix: torch.Tensor, title: str) -> Any:
    """A labelled confusion-matrix figure with counts in each cell."""
    plt = _pyplot()
    counts = matrix.detach().cpu().long()
    fig, ax = plt.subplots(figsize=(5.5, 5))
    ax.imshow(counts / counts.sum(dim=1, keepdim=True).clamp(min=1), cmap="Blues", vmin=0, vmax=1)
    for (row, col), value in ((rc, int(counts[rc])) for rc in _cells(counts.shape[0])):
        if value:
            colour = "white" if row == col else "black"
            ax.text(col, row, str(value), ha="center", va="center", fontsize=7, color=colour)
    ax.set(xticks=range(counts.shape[1]), yticks=range(counts.shape[0]), xlabel="predicted", ylabel="true",
           title=title)
    fig.tight_layout()
    return fig


def misclassified_figure(images: torch.Tensor, predicted: torch.Tensor, true: torch.Tensor,
                         confidence: torch.Tensor) -> Any:
    """Grid of misclassified images, each titled with its predicted and true label."""
    plt = _pyplot()
    count = len(images)
    columns = 8
    rows = max(1, (count + columns - 1) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(columns * 1.2, rows * 1.45), squeeze=False)
    shown = denormalize(images.detach().float().cpu().reshape(-1, 28, 28))
    for index, ax in enumerate(axes.flat):
        ax.axis("off")
        if index < count:
            ax.imshow(shown[index], cmap="gray", vmin=0, vmax=1)
            ax.set_title(f"pred {int(predicted[index])} ({float(confidence[index]):.0%})\ntrue {int(true[index])}",
                         fontsize=7)
    fig.tight_layout()
    return fig


def _cells(size: int) -> list[tuple[int, int]]:
    return [(row, col) for row in range(size) for col in range(size)]


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
