"""Pictures of data and results: Pillow-drawn ones for TensorBoard during a run (milliseconds each), matplotlib
ones for the files the scripts write (``evaluate.py --plot``, ``plot_scalars.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torchvision.utils import make_grid


def batch_grid(images: torch.Tensor, count: int = 64) -> torch.Tensor:
    """A ``(3, H, W)`` grid of the first ``count`` images (``(N, C, H, W)`` pixels in [0, 1])."""
    return make_grid(images[:count], nrow=8, padding=2, pad_value=0.5)


def _font(size: int = 11) -> Any:
    """Pillow's own font (FreeType where Pillow has it), so the pictures need no font files."""
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow before 10.1: one bitmap size
        return ImageFont.load_default()


def _as_tensor(image: Any) -> torch.Tensor:
    """A Pillow RGB image as ``(3, H, W)`` floats in [0, 1], what TensorBoard's ``add_image`` takes."""
    pixels = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
    return pixels.view(image.height, image.width, 3).permute(2, 0, 1).float().div(255)


def confusion_image(matrix: torch.Tensor, title: str) -> torch.Tensor:
    """A labelled confusion matrix as a ``(3, H, W)`` image: true class down, predicted across, each cell's count
    written in it and shaded by its share of the row (green on the diagonal, red off it, relative to the largest
    confusion so that a few mistakes among thousands still show). Drawn with Pillow in a millisecond or two, so
    validation draws one every epoch."""
    from PIL import Image, ImageDraw

    counts = matrix.detach().cpu().long()
    classes = counts.shape[0]
    font = _font(15)
    share = counts.float() / counts.sum(dim=1, keepdim=True).clamp(min=1)
    diagonal = torch.eye(classes, dtype=torch.bool)
    errors = share.masked_fill(diagonal, 0)
    errors = errors / errors.max().clamp(min=1e-9)
    widest = max(font.getbbox(str(int(counts.max())))[2], font.getbbox(str(classes - 1))[2])
    line = font.getbbox("Ag")[3]
    cell = max(2 * line, widest + 12)
    left, top = line + widest + 14, 3 * line + 16
    image = Image.new("RGB", (left + classes * cell + 6, top + classes * cell + 6), "white")
    draw = ImageDraw.Draw(image)
    draw.text((left, 2), title, fill="black", font=font)
    draw.text((left + classes * cell / 2, line + 6), "predicted", fill="black", font=font, anchor="mt")
    draw.text((2, top + classes * cell / 2), "true", fill="black", font=font, anchor="lm")
    for index in range(classes):
        draw.text((left + index * cell + cell / 2, top - 2), str(index), fill="black", font=font, anchor="mb")
        draw.text((left - 4, top + index * cell + cell / 2), str(index), fill="black", font=font, anchor="rm")
    for row in range(classes):
        for col in range(classes):
            strength = float(share[row, col] if row == col else errors[row, col])
            base = (26, 128, 51) if row == col else (191, 26, 26)
            colour = tuple(int(255 - strength * (255 - c)) for c in base)
            x, y = left + col * cell, top + row * cell
            draw.rectangle((x, y, x + cell, y + cell), fill=colour, outline=(190, 190, 190))
            if counts[row, col]:
                ink = "white" if strength > 0.6 else "black"
                draw.text((x + cell / 2, y + cell / 2), str(int(counts[row, col])), fill=ink, font=font, anchor="mm")
    return _as_tensor(image)


def mistakes_image(images: torch.Tensor, predicted: torch.Tensor, true: torch.Tensor,
                   confidence: torch.Tensor, columns: int = 8) -> torch.Tensor:
    """Misclassified inputs (``(N, C, H, W)`` pixels in [0, 1]) in a grid, each under its predicted class, its
    confidence and its true class, as a ``(3, H, W)`` image. Small images are enlarged by a whole factor
    (nearest neighbour, no blur) so that every label stays readable; grey ones as dark ink on white paper."""
    from PIL import Image, ImageDraw

    font = _font()
    count = len(images)
    channels, height, width = images.shape[1:]
    label_width = max(font.getbbox("pred 00 (100%)")[2], font.getbbox("true 00")[2])
    factor = max(1, -(-56 // max(height, width)))
    shown_h, shown_w = height * factor, width * factor
    line = font.getbbox("Ag")[3] + 1
    cell_w, cell_h = max(shown_w, label_width) + 10, shown_h + 2 * line + 4
    rows = max(1, -(-count // columns))
    canvas = Image.new("RGB", (columns * cell_w, rows * cell_h), "white")
    draw = ImageDraw.Draw(canvas)
    pixels = (1 - images if channels == 1 else images).float().clamp(0, 1).expand(-1, 3, -1, -1)
    pixels = pixels.repeat_interleave(factor, dim=2).repeat_interleave(factor, dim=3)
    for index in range(count):
        row, col = divmod(index, columns)
        x, y = col * cell_w, row * cell_h
        tile = (pixels[index] * 255).round().to(torch.uint8).permute(1, 2, 0).contiguous()
        canvas.paste(Image.frombytes("RGB", (shown_w, shown_h), tile.numpy().tobytes()),
                     (x + (cell_w - shown_w) // 2, y + 2 * line + 2))
        draw.text((x + cell_w / 2, y + 1), f"pred {int(predicted[index])} ({float(confidence[index]):.0%})",
                  fill=(160, 20, 20), font=font, anchor="mt")
        draw.text((x + cell_w / 2, y + line + 1), f"true {int(true[index])}", fill="black", font=font, anchor="mt")
    return _as_tensor(canvas)


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
