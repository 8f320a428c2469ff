"""TensorBoard pictures of a run, as callbacks: first batch, confusion matrices, worst mistakes; the model.

The datamodule shows its inputs as images (``to_image``); outputs become log-probabilities by
``log_softmax``, right for logits and for log-probabilities alike.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.model_summary import ModelSummary
from torch import nn
from torchmetrics.classification import MulticlassConfusionMatrix

from project.reliability.run_files import tensorboard_of
from project.results import figures


class WorstMistakes:
    """The test inputs misclassified with the highest loss, kept as a running top-k on the device."""

    def __init__(self, k: int = 32) -> None:
        self.k = k
        self.input_shape: tuple[int, ...] = ()
        self.num_classes = 0
        self.reset()

    def reset(self) -> None:
        self.loss = self.images = self.log_probs = self.targets = None

    def update(self, images: torch.Tensor, log_probs: torch.Tensor, targets: torch.Tensor) -> None:
        loss = nn.functional.nll_loss(log_probs, targets, reduction="none")
        loss = torch.where(log_probs.argmax(1) != targets, loss, torch.full_like(loss, -torch.inf))
        if self.loss is not None:
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
        if held == 0:
            return blanks
        parts = [self.loss, self.images.float(), self.log_probs, self.targets]
        return [torch.cat([part, blank]) for part, blank in zip(parts, blanks, strict=True)]

    def compute(self, module: L.LightningModule) -> dict[str, torch.Tensor]:
        """Gather every rank's candidates (all ranks must call this) and keep the real mistakes."""
        parts = self._padded(module.device)
        if module.trainer.world_size > 1:
            parts = [module.all_gather(p).flatten(0, 1) for p in parts]
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
        classes = pl_module.num_classes
        self.val_confusion = MulticlassConfusionMatrix(num_classes=classes, validate_args=False).to(pl_module.device)
        self.test_confusion = MulticlassConfusionMatrix(num_classes=classes, validate_args=False).to(pl_module.device)
        self.worst.input_shape, self.worst.num_classes = tuple(trainer.datamodule.input_shape), classes

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
            images = trainer.datamodule.to_image(self.first_batch)
            self._image(trainer, "train/first_batch", figures.batch_grid(images), step=0)
            self.first_batch = None

    def on_validation_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        self.val_confusion.update(outputs, batch[1])

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        confusion = self.val_confusion.compute()  # a collective under DDP: every rank takes part
        self.val_confusion.reset()
        if not trainer.sanity_checking and trainer.is_global_zero:
            title = f"validation, epoch {trainer.current_epoch + 1}"
            self._image(trainer, "val/confusion_matrix", figures.confusion_image(confusion, title))

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
        self._image(trainer, "test/confusion_matrix", figures.confusion_image(confusion, "test set"))
        if len(worst["predicted"]):
            images = trainer.datamodule.to_image(worst["inputs"])
            self._image(trainer, "test/worst_misclassified",
                        figures.mistakes_image(images, worst["predicted"], worst["true"], worst["confidence"]))


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
            network = copy.deepcopy(pl_module.model).float().cpu().eval()  # the run's own model is left as it is
            example = torch.zeros(1, *trainer.datamodule.input_shape)
            with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the tracer's notes on Python control flow
                tensorboard.experiment.add_graph(network, example)

    def _due(self, trainer: L.Trainer) -> bool:
        return bool(self.histograms_every) and (trainer.current_epoch + 1) % self.histograms_every == 0

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        """Hold the step's gradients: validation clears them before the epoch ends. A reference, not a copy: each
        step makes new ones (zero_grad sets them to None)."""
        if self._due(trainer):
            self.gradients = {name: p.grad for name, p in pl_module.model.named_parameters() if p.grad is not None}

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        tensorboard = tensorboard_of(trainer)
        if tensorboard is not None and trainer.is_global_zero and self._due(trainer):
            for name, parameter in pl_module.model.named_parameters():
                tensorboard.experiment.add_histogram(f"weights/{name}", parameter.detach().float().cpu(),
                                                     trainer.global_step)
                if name in self.gradients:  # the epoch's last step's
                    tensorboard.experiment.add_histogram(f"gradients/{name}", self.gradients[name].float().cpu(),
                                                         trainer.global_step)
        self.gradients = {}
