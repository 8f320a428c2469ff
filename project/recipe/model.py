"""The article's MLP as a plain ``nn.Module`` and its export to the article's ``nn.Sequential``."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from project import IMAGE_PIXELS, MNIST_MEAN, MNIST_STD, NUM_CLASSES


def build_sequential(hidden: Sequence[int] = (128,)) -> nn.Sequential:
    """The article's layer stack: ``Linear -> ReLU -> ... -> Linear -> LogSoftmax``.

    With ``hidden=(128,)`` this is exactly the article's model, so a state dict of it loads
    into the article's code with ``strict=True``.
    """
    if not hidden:
        raise ValueError("hidden needs at least one layer size")
    layers: list[nn.Module] = []
    width = IMAGE_PIXELS
    for size in hidden:
        if size <= 0:
            raise ValueError(f"hidden layer sizes must be positive, got {size}")
        layers += [nn.Linear(width, size), nn.ReLU()]
        width = size
    layers += [nn.Linear(width, NUM_CLASSES), nn.LogSoftmax(dim=1)]
    return nn.Sequential(*layers)


class MLP(nn.Module):
    """Classifies normalised MNIST images given as ``(B, 1, 28, 28)`` or ``(B, 784)``."""

    def __init__(self, hidden: Sequence[int] = (128,)) -> None:
        super().__init__()
        self.hidden = tuple(int(h) for h in hidden)
        self.layers = build_sequential(self.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x.reshape(x.shape[0], -1))


def export_state_dict(
    model: MLP, mean: float = MNIST_MEAN, std: float = MNIST_STD
) -> dict[str, torch.Tensor]:
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
