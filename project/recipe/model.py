"""The article's MLP: the plain ``nn.Module``, the ``LightningModule`` that trains it, and its export.

The exported ``model.pth`` is the article's own ``nn.Sequential`` state dict, with the input
normalisation folded into the first layer, so the article's code loads it and gets the same
predictions from ``ToTensor()`` pixels.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from project.api import CheckpointError, ClassifierModule
from project.recipe.mnist_files import MNIST_MEAN, MNIST_STD

PIXELS, CLASSES = 28 * 28, 10


def build_sequential(hidden: Sequence[int] = (128,)) -> nn.Sequential:
    """The article's layer stack: ``Linear -> ReLU -> ... -> Linear -> LogSoftmax``.

    With ``hidden=(128,)`` this is exactly the article's model, so a state dict of it loads
    into the article's code with ``strict=True``.
    """
    if not hidden:
        raise ValueError("hidden needs at least one layer size")
    layers: list[nn.Module] = []
    width = PIXELS
    for size in hidden:
        if size <= 0:
            raise ValueError(f"hidden layer sizes must be positive, got {size}")
        layers += [nn.Linear(width, size), nn.ReLU()]
        width = size
    layers += [nn.Linear(width, CLASSES), nn.LogSoftmax(dim=1)]
    return nn.Sequential(*layers)


class MLP(nn.Module):
    """Log-probabilities of the ten digits for normalised images ``(B, 1, 28, 28)`` or ``(B, 784)``."""

    def __init__(self, hidden: Sequence[int] = (128,)) -> None:
        super().__init__()
        self.hidden = tuple(int(h) for h in hidden)
        self.layers = build_sequential(self.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x.reshape(x.shape[0], -1))


class LitMNIST(ClassifierModule):
    """The article's recipe: the MLP trained with ``NLLLoss`` on its log-probabilities."""

    def __init__(self, hidden: Sequence[int] = (128,), **training: Any) -> None:
        super().__init__(MLP(hidden), num_classes=CLASSES, **training)
        self.save_hyperparameters({"hidden": [int(h) for h in hidden]}, logger=False)

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return nn.functional.nll_loss(outputs, targets)

    def export_weights(self, path: str | os.PathLike) -> tuple[Path, str]:
        saved = self.write_weights(export_state_dict(self.model), path)
        return saved, "loads into the article's nn.Sequential; ToTensor() pixels in"

    def portable_network(self) -> tuple[nn.Module, str]:
        network = build_sequential(self.model.hidden)
        network.load_state_dict(export_state_dict(self.model))
        return nn.Sequential(nn.Flatten(1), *network).eval(), "ToTensor() pixels in"

    @classmethod
    def network_from_weights(cls, state: dict[str, torch.Tensor], source: str) -> nn.Module:
        if not all(key.split(".")[0].isdigit() for key in state):
            raise CheckpointError(f"{source}: not an exported model.pth (expected an nn.Sequential state_dict)")
        network = build_sequential(hidden_sizes_of(state))
        try:
            network.load_state_dict(state, strict=True)
        except RuntimeError:
            raise CheckpointError(f"{source}: tensors do not fit the article's MLP layout") from None
        return TakesNormalised(network)


class TakesNormalised(nn.Module):
    """An exported network (which takes ``ToTensor()`` pixels) fed the normalised images training used."""

    def __init__(self, network: nn.Module) -> None:
        super().__init__()
        self.network = network

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.network(images.reshape(images.shape[0], -1) * MNIST_STD + MNIST_MEAN)


def export_state_dict(model: MLP, mean: float = MNIST_MEAN, std: float = MNIST_STD) -> dict[str, torch.Tensor]:
    """Weights for ``build_sequential(model.hidden)`` that take raw ``ToTensor()`` pixels.

    Training sees ``(x - mean) / std``; folding that affine map into the first layer lets the
    article's own code, which only applies ``ToTensor()``, give the same predictions.
    """
    state = {k: v.detach().clone().cpu() for k, v in model.layers.state_dict().items()}
    weight, bias = state["0.weight"], state["0.bias"]
    state["0.weight"] = weight / std
    state["0.bias"] = bias - weight.sum(dim=1) * (mean / std)
    return state


def hidden_sizes_of(state: dict[str, torch.Tensor]) -> tuple[int, ...]:
    """Recover the hidden sizes from an exported state dict's weight shapes."""
    weights = [state[k] for k in sorted(
        (k for k in state if k.endswith(".weight")), key=lambda k: int(k.split(".")[0])
    )]
    return tuple(int(w.shape[0]) for w in weights[:-1])
