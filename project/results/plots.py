"""The matplotlib figures the scripts write to files: ``evaluate.py --plot``'s confusion matrix, ``plot_scalars.py``'s
curves, the benchmark's and the sweep's charts. A run draws its own pictures with Pillow (``figures.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from project.contract import class_labels


def confusion_figure(matrix: torch.Tensor, title: str, names: Sequence[str] | None = None) -> Any:
    """A labelled confusion-matrix figure with counts in each cell, each class by its name (else its index)."""
    from matplotlib.figure import Figure  # not pyplot: figures may be drawn off the main thread

    counts = matrix.detach().cpu().long()
    fig = Figure(figsize=(5.5, 5))
    ax = fig.subplots()
    ax.imshow((counts / counts.sum(dim=1, keepdim=True).clamp(min=1)).numpy(), cmap="Blues", vmin=0, vmax=1)
    for (row, col), value in ((rc, int(counts[rc])) for rc in _cells(counts.shape[0])):
        if value:
            colour = "white" if row == col else "black"
            ax.text(col, row, str(value), ha="center", va="center", fontsize=7, color=colour)
    labels = class_labels(names, counts.shape[0])
    ax.set(xticks=range(counts.shape[1]), yticks=range(counts.shape[0]), xlabel="predicted", ylabel="true",
           title=title)
    ax.set_xticklabels(labels, rotation=45 if max(map(len, labels)) > 2 else 0, ha="right" if max(
        map(len, labels)) > 2 else "center")
    ax.set_yticklabels(labels)
    fig.tight_layout()
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

    if not Path(run).is_dir() or not any(Path(run).glob("events.out.tfevents.*")):
        raise UserError(f"{run}: not a run folder (no TensorBoard event files in it)")
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
