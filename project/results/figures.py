"""Pictures of data and results: cheap tensor-drawn ones during training, matplotlib ones at the end."""

from __future__ import annotations

from typing import Any

import torch
from torchvision.utils import make_grid

_GREEN = torch.tensor([0.1, 0.5, 0.2]).view(3, 1, 1)
_RED = torch.tensor([0.75, 0.1, 0.1]).view(3, 1, 1)


def batch_grid(images: torch.Tensor, count: int = 64) -> torch.Tensor:
    """A ``(3, H, W)`` grid of the first ``count`` images (``(N, C, H, W)`` pixels in [0, 1])."""
    return make_grid(images[:count], nrow=8, padding=2, pad_value=0.5)


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
    from matplotlib.figure import Figure  # not pyplot: figures may be drawn off the main thread

    counts = matrix.detach().cpu().long()
    fig = Figure(figsize=(5.5, 5))
    ax = fig.subplots()
    ax.imshow((counts / counts.sum(dim=1, keepdim=True).clamp(min=1)).numpy(), cmap="Blues", vmin=0, vmax=1)
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
    """Grid of misclassified images (``(N, C, H, W)`` pixels in [0, 1]), each labelled with its predicted
    and true class.

    One image and one text per cell on a single axes: a subplot per image took matplotlib
    over a second, which every run paid at its end.
    """
    from matplotlib.figure import Figure

    count, columns = len(images), 8
    channels, height, width = images.shape[1:]
    label, margin = max(12, height // 2), max(6, width // 5)  # room for each label, and between columns
    cell_h, cell_w = height + label, width + 2 * margin
    rows = max(1, (count + columns - 1) // columns)
    canvas = torch.ones(3, rows * cell_h, columns * cell_w)
    # Grey images as dark ink on white paper, as a person reads them; colour images as they are.
    shown = (1 - images if channels == 1 else images).float().expand(-1, 3, -1, -1)
    fig = Figure(figsize=(columns * cell_w / 33, rows * cell_h / 27.5))
    ax = fig.add_axes((0, 0, 1, 1))
    for index in range(count):
        row, col = divmod(index, columns)
        top, left = row * cell_h + label, col * cell_w + margin
        canvas[:, top: top + height, left: left + width] = shown[index]
        ax.text(left + width / 2, row * cell_h + label / 2, f"pred {int(predicted[index])} "
                f"({float(confidence[index]):.0%}) true {int(true[index])}", ha="center", va="center", fontsize=6)
    ax.imshow(canvas.permute(1, 2, 0).numpy(), vmin=0, vmax=1, interpolation="nearest")
    ax.axis("off")
    return fig


def _cells(size: int) -> list[tuple[int, int]]:
    return [(row, col) for row in range(size) for col in range(size)]


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the file-only Agg backend: no display is needed or opened."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def scalars_figure(run: str, wanted: list[str]) -> Any:
    """A grid of line plots, one per scalar tag the run's event files hold."""
    from matplotlib.figure import Figure
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from project.errors import UserError

    events = EventAccumulator(run, size_guidance={"scalars": 0})
    events.Reload()
    available = set(events.Tags()["scalars"])
    tags = [t for t in wanted if t in available]
    if not tags:
        raise UserError(f"{run}: none of the tags {','.join(wanted)} are in its event files")
    columns = min(3, len(tags))
    rows = (len(tags) + columns - 1) // columns
    fig = Figure(figsize=(4.2 * columns, 2.8 * rows))
    axes = fig.subplots(rows, columns, squeeze=False)
    for ax, tag in zip(axes.flat, tags, strict=False):
        points = events.Scalars(tag)
        ax.plot([p.step for p in points], [p.value for p in points], marker="o" if len(points) < 20 else None)
        ax.set(title=tag, xlabel="step")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(tags):]:
        ax.axis("off")
    fig.tight_layout()
    return fig
