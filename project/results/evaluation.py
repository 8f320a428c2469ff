"""Load a trained model from a checkpoint or ``model.pth`` and measure it on the MNIST test set."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix

from project import EVAL_BATCH_SIZE, MNIST_MEAN, MNIST_STD, NUM_CLASSES
from project.reliability.checkpointing import find_checkpoint, read_checkpoint, read_weights
from project.errors import CheckpointError
from project.recipe.model import build_sequential, hidden_sizes_of


class Classifier(nn.Module):
    """Log-probabilities for *normalised* images, whichever file the weights came from.

    A checkpoint's MLP takes normalised input as in training, so its test accuracy is exactly
    the one training reported; an exported ``model.pth`` takes ``ToTensor()`` pixels, so its
    input is mapped back first.
    """

    def __init__(self, network: nn.Module, takes_raw_pixels: bool, source: str) -> None:
        super().__init__()
        self.network = network
        self.takes_raw_pixels = takes_raw_pixels
        self.source = source

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = images.reshape(images.shape[0], -1)
        if self.takes_raw_pixels:
            x = x * MNIST_STD + MNIST_MEAN
        return self.network(x)


def load_classifier(ckpt: str | None = None, weights: str | None = None, logdir: str = "lightning_logs",
                    name: str = "mnist") -> Classifier:
    """From ``--weights model.pth``, or ``--ckpt PATH|best|last`` (default: ``best``)."""
    if weights:
        state = read_weights(weights)
        network = build_sequential(hidden_sizes_of(state))
        try:
            network.load_state_dict(state, strict=True)
        except RuntimeError:
            raise CheckpointError(f"{weights}: tensors do not fit the article's MLP layout") from None
        return Classifier(network.eval(), takes_raw_pixels=True, source=str(weights))
    from project.recipe.module import LitMNIST

    path = find_checkpoint(ckpt or "best", logdir, name, "--ckpt")
    state = read_checkpoint(path)
    module = LitMNIST(**state["hyper_parameters"])
    module.load_state_dict(state["state_dict"], strict=True)
    return Classifier(module.model.eval(), takes_raw_pixels=False, source=str(path))


@torch.no_grad()
def evaluate(classifier: Classifier, images: torch.Tensor, targets: torch.Tensor,
             batch_size: int = EVAL_BATCH_SIZE) -> dict[str, Any]:
    """Test loss, accuracy, per-class accuracy and confusion matrix, all through torchmetrics."""
    loss = MeanMetric()
    accuracy = MulticlassAccuracy(num_classes=NUM_CLASSES, average="micro")
    per_class = MulticlassAccuracy(num_classes=NUM_CLASSES, average=None)
    confusion = MulticlassConfusionMatrix(num_classes=NUM_CLASSES)
    for x, y in zip(images.split(batch_size), targets.split(batch_size), strict=True):
        log_probs = classifier(x)
        loss.update(nn.functional.nll_loss(log_probs, y), weight=len(y))
        for metric in (accuracy, per_class, confusion):
            metric.update(log_probs, y)
    return {
        "source": classifier.source,
        "samples": len(targets),
        "test/loss": float(loss.compute()),
        "test/acc": float(accuracy.compute()),
        "per_class_acc": [float(v) for v in per_class.compute()],
        "confusion_matrix": confusion.compute().tolist(),
    }


def render(results: dict[str, Any]) -> str:
    lines = [
        f"model     {results['source']}",
        f"test set  {results['samples']} images",
        f"test/acc  {results['test/acc']:.4f}",
        f"test/loss {results['test/loss']:.4f}",
        "",
        "per-class accuracy",
        "  " + "  ".join(f"{d:>5}" for d in range(NUM_CLASSES)),
        "  " + "  ".join(f"{v:5.3f}" for v in results["per_class_acc"]),
        "",
        "confusion matrix (rows: true digit, columns: predicted)",
        "true " + "".join(f"{d:>6}" for d in range(NUM_CLASSES)),
    ]
    for row, counts in enumerate(results["confusion_matrix"]):
        lines.append(f"{row:>4} " + "".join(f"{v:>6}" for v in counts))
    return "\n".join(lines)


def evaluate_test_set(classifier: Classifier, data_dir: str | None = None) -> dict[str, Any]:
    """``evaluate`` on the 10,000 MNIST test images, normalised as in training."""
    from project.recipe.data import MNISTDataModule

    datamodule = MNISTDataModule(data_dir)
    datamodule.setup("test")
    return evaluate(classifier, datamodule.test_set.images, datamodule.test_set.targets)


def plot_confusion(results: dict[str, Any], path: str) -> None:
    from project.results.figures import confusion_figure

    title = f"test set, accuracy {results['test/acc']:.4f}"
    confusion_figure(torch.tensor(results["confusion_matrix"]), title).savefig(path, dpi=120)
