"""The pictures a run logs to TensorBoard, drawn with Pillow (milliseconds each; the matplotlib figures the scripts
write are ``plots.py``'s); then the callbacks that log them: first batch, confusion matrices, worst mistakes; the
model.

The datamodule shows its inputs as images (``to_image``); outputs become log-probabilities by
``log_softmax``, right for logits and for log-probabilities alike.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Sequence
from typing import Any, cast

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.model_summary import ModelSummary
from torch import nn
from torchmetrics.classification import MulticlassConfusionMatrix
from torchvision.utils import make_grid

from project.contract import class_labels
from project.reliability.run_folder import tensorboard_of


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


def confusion_image(matrix: torch.Tensor, title: str, names: Sequence[str] | None = None) -> torch.Tensor:
    """A labelled confusion matrix as a ``(3, H, W)`` image: true class down, predicted across (each by its name in
    ``names``, else its index), each cell's count
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
    labels = class_labels(names, classes)
    widest = max(font.getbbox(str(int(counts.max())))[2], *(font.getbbox(label)[2] for label in labels))
    line = font.getbbox("Ag")[3]
    cell = max(2 * line, widest + 12)
    left, top = line + widest + 14, 3 * line + 16
    image = Image.new("RGB", (left + classes * cell + 6, top + classes * cell + 6), "white")
    draw = ImageDraw.Draw(image)
    draw.text((left, 2), title, fill="black", font=font)
    draw.text((left + classes * cell / 2, line + 6), "predicted", fill="black", font=font, anchor="mt")
    draw.text((2, top + classes * cell / 2), "true", fill="black", font=font, anchor="lm")
    for index in range(classes):
        draw.text((left + index * cell + cell / 2, top - 2), labels[index], fill="black", font=font, anchor="mb")
        draw.text((left - 4, top + index * cell + cell / 2), labels[index], fill="black", font=font, anchor="rm")
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
                   confidence: torch.Tensor, columns: int = 8, names: Sequence[str] | None = None) -> torch.Tensor:
    """Misclassified inputs (``(N, C, H, W)`` pixels in [0, 1]) in a grid, each under its predicted class, its
    confidence and its true class (by name in ``names``, else by index), as a ``(3, H, W)`` image. Small images are
    enlarged by a whole factor (nearest neighbour, no blur) so that every label stays readable; grey ones as dark
    ink on white paper."""
    from PIL import Image, ImageDraw

    font = _font()
    count = len(images)
    channels, height, width = images.shape[1:]
    shown = [int(c) for c in torch.cat([predicted, true]).tolist()]
    labels = class_labels(names, max(shown, default=0) + 1)
    widest = max((labels[c] for c in shown), key=lambda label: font.getbbox(label)[2], default="00")
    label_width = max(font.getbbox(f"pred {widest} (100%)")[2], font.getbbox("pred 00 (100%)")[2])
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
        draw.text((x + cell_w / 2, y + 1), f"pred {labels[int(predicted[index])]} ({float(confidence[index]):.0%})",
                  fill=(160, 20, 20), font=font, anchor="mt")
        draw.text((x + cell_w / 2, y + line + 1), f"true {labels[int(true[index])]}", fill="black", font=font,
                  anchor="mt")
    return _as_tensor(canvas)


def datamodule_of(trainer: L.Trainer) -> Any:
    """The run's datamodule (``TensorDataModule``), which Lightning sets on the Trainer at ``fit``."""
    return trainer.datamodule  # type: ignore[attr-defined]


def classifier(module: L.LightningModule) -> Any:
    """The run's module as these callbacks read it: a ``ClassifierModule`` (its ``model``, its ``num_classes``)."""
    return module


class WorstMistakes:
    """The test inputs misclassified with the highest loss, kept as a running top-k on the device."""

    def __init__(self, k: int = 32) -> None:
        self.k = k
        self.input_shape: tuple[int, ...] = ()
        self.num_classes = 0
        self.reset()

    def reset(self) -> None:
        self.loss: torch.Tensor | None = None
        self.images: torch.Tensor | None = None
        self.log_probs: torch.Tensor | None = None
        self.targets: torch.Tensor | None = None

    def update(self, images: torch.Tensor, log_probs: torch.Tensor, targets: torch.Tensor) -> None:
        loss = nn.functional.nll_loss(log_probs, targets, reduction="none")
        loss = torch.where(log_probs.argmax(1) != targets, loss, torch.full_like(loss, -torch.inf))
        if self.loss is not None and self.images is not None and self.log_probs is not None and \
                self.targets is not None:
            loss, images = torch.cat([self.loss, loss]), torch.cat([self.images, images])
            log_probs, targets = torch.cat([self.log_probs, log_probs]), torch.cat([self.targets, targets])
        keep = loss.topk(min(self.k, len(loss))).indices
        self.loss, self.images, self.log_probs, self.targets = loss[keep], images[keep], log_probs[keep], targets[keep]

    def _padded(self, device: torch.device) -> list[torch.Tensor]:
        """Exactly k rows (padding has loss -inf), so every rank gathers tensors of one shape."""
        held = 0 if self.loss is None else len(self.loss)
        pad = self.k - held
        blanks = [torch.full((pad,), -torch.inf, device=device), torch.zeros(pad, *self.input_shape, device=device),
                  torch.zeros(pad, self.num_classes, device=device), torch.zeros(pad, dtype=torch.long, device=device)]
        if self.loss is None or self.images is None or self.log_probs is None or self.targets is None:
            return blanks
        parts = [self.loss, self.images.float(), self.log_probs, self.targets]
        return [torch.cat([part, blank]) for part, blank in zip(parts, blanks, strict=True)]

    def compute(self, module: L.LightningModule) -> dict[str, torch.Tensor]:
        """Gather every rank's candidates (all ranks must call this) and keep the real mistakes."""
        parts = self._padded(module.device)
        if module.trainer.world_size > 1:
            parts = [cast(torch.Tensor, module.all_gather(p)).flatten(0, 1) for p in parts]
        loss, images, log_probs, targets = parts
        order = loss.argsort(descending=True)[: self.k]
        order = order[torch.isfinite(loss[order])]
        probs = log_probs[order].exp()
        return {"inputs": images[order].cpu(), "predicted": probs.argmax(1).cpu(), "true": targets[order].cpu(),
                "confidence": probs.max(1).values.cpu()}


class TensorBoardFigures(Callback):
    """``train/first_batch``, ``val/confusion_matrix`` each epoch, and at the end of testing
    ``test/confusion_matrix`` and ``test/worst_misclassified``: drawn with Pillow, a few
    milliseconds each, while the run is there to write them."""

    def __init__(self, worst_k: int = 32) -> None:
        self.worst = WorstMistakes(worst_k)
        self.first_batch: torch.Tensor | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        classes = int(classifier(pl_module).num_classes)
        self.val_confusion = MulticlassConfusionMatrix(num_classes=classes, validate_args=False).to(pl_module.device)
        self.test_confusion = MulticlassConfusionMatrix(num_classes=classes, validate_args=False).to(pl_module.device)
        self.worst.input_shape, self.worst.num_classes = tuple(datamodule_of(trainer).input_shape), classes

    def _image(self, trainer: L.Trainer, tag: str, image: torch.Tensor, step: int | None = None) -> None:
        tensorboard = tensorboard_of(trainer)
        if tensorboard is not None and trainer.is_global_zero:
            tensorboard.experiment.add_image(tag, image, trainer.global_step if step is None else step)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if trainer.global_step == 0 and batch_idx == 0:  # kept on the device: drawn where the host waits anyway
            self.first_batch = batch[0][:64].detach().clone()

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._first_batch_image(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._first_batch_image(trainer)  # a run that does not validate

    def _first_batch_image(self, trainer: L.Trainer) -> None:
        if self.first_batch is not None:
            images = datamodule_of(trainer).to_image(self.first_batch)
            self._image(trainer, "train/first_batch", batch_grid(images), step=0)
            self.first_batch = None

    def on_validation_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        self.val_confusion.update(outputs, batch[1])

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        confusion = self.val_confusion.compute()  # a collective under DDP: every rank takes part
        self.val_confusion.reset()
        if not trainer.sanity_checking and trainer.is_global_zero:
            title = f"validation, epoch {trainer.current_epoch + 1}"
            self._image(trainer, "val/confusion_matrix",
                        confusion_image(confusion, title, datamodule_of(trainer).class_labels()))

    def on_test_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.test_confusion.reset()
        self.worst.reset()

    def on_test_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                          batch_idx: int, dataloader_idx: int = 0) -> None:
        self.test_confusion.update(outputs, batch[1])
        self.worst.update(batch[0], torch.log_softmax(outputs.float(), dim=1), batch[1])

    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        confusion = self.test_confusion.compute()  # collectives under DDP: every rank takes part
        worst = self.worst.compute(pl_module)
        if tensorboard_of(trainer) is None or not trainer.is_global_zero:
            return
        names = datamodule_of(trainer).class_labels()
        self._image(trainer, "test/confusion_matrix", confusion_image(confusion, "test set", names))
        if len(worst["predicted"]):
            images = datamodule_of(trainer).to_image(worst["inputs"])
            self._image(trainer, "test/worst_misclassified",
                        mistakes_image(images, worst["predicted"], worst["true"], worst["confidence"], names=names))


class ModelInTensorBoard(Callback):
    """What users look for after the curves: the model summary and parameter count (TEXT, every run), and on
    request each weight's and its last gradient's histogram every ``histograms_every`` epochs and the graph."""

    def __init__(self, histograms_every: int | None = None, graph: bool = False) -> None:
        self.histograms_every, self.graph = histograms_every, graph
        self.gradients: dict[str, torch.Tensor] = {}

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        tensorboard = tensorboard_of(trainer)
        if tensorboard is None or not trainer.is_global_zero:
            return
        summary = ModelSummary(pl_module, max_depth=-1)
        table = "\n".join(f"    {line}" for line in str(summary).splitlines())  # Markdown's preformatted text
        tensorboard.experiment.add_text(
            "run/model", f"{summary.trainable_parameters:,} trainable parameters "
                         f"({summary.total_parameters:,} in all)\n\n{table}", 0)
        if self.graph:
            network = copy.deepcopy(classifier(pl_module).model).float().cpu().eval()  # the run's own is left as is
            example = torch.zeros(1, *datamodule_of(trainer).input_shape)
            with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the tracer's notes on Python control flow
                tensorboard.experiment.add_graph(network, example)

    def _due(self, trainer: L.Trainer) -> bool:
        every = self.histograms_every
        return every is not None and every > 0 and (trainer.current_epoch + 1) % every == 0

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        """Hold the step's gradients: validation clears them before the epoch ends. A reference, not a copy: each
        step makes new ones (zero_grad sets them to None)."""
        if self._due(trainer):
            self.gradients = {name: p.grad for name, p in classifier(pl_module).model.named_parameters()
                              if p.grad is not None}

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        tensorboard = tensorboard_of(trainer)
        if tensorboard is not None and trainer.is_global_zero and self._due(trainer):
            for name, parameter in classifier(pl_module).model.named_parameters():
                tensorboard.experiment.add_histogram(f"weights/{name}", parameter.detach().float().cpu(),
                                                     trainer.global_step)
                if name in self.gradients:  # the epoch's last step's
                    tensorboard.experiment.add_histogram(f"gradients/{name}", self.gradients[name].float().cpu(),
                                                         trainer.global_step)
        self.gradients = {}
