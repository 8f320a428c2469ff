"""An MLP that returns log-probabilities, trained with NLLLoss (the second recipe covers logits)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from project.api import CheckpointError, ClassifierModule

PIXELS, CLASSES = 28 * 28, 10


class MLP(nn.Module):
    def __init__(self, hidden: Sequence[int] = (128,)) -> None:
        super().__init__()
        widths = [PIXELS, *hidden]
        layers: list[nn.Module] = []
        for a, b in zip(widths, widths[1:], strict=False):
            layers += [nn.Linear(a, b), nn.ReLU()]
        self.layers = nn.Sequential(*layers, nn.Linear(widths[-1], CLASSES), nn.LogSoftmax(dim=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x.reshape(x.shape[0], -1))


class LitTiny(ClassifierModule):
    def __init__(self, hidden: Sequence[int] = (128,), **training: Any) -> None:
        super().__init__(MLP(hidden), num_classes=CLASSES, **training)
        self.save_hyperparameters({"hidden": [int(h) for h in hidden]}, logger=False)

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return nn.functional.nll_loss(outputs, targets)

    @classmethod
    def network_from_weights(cls, state: dict[str, torch.Tensor], source: str) -> nn.Module:
        """A ``model.pth`` of any hidden widths: they are read from its weights' shapes."""
        layers = [key.split(".") for key in state]
        if not all(len(parts) == 3 and parts[0] == "layers" and parts[1].isdigit() for parts in layers):
            raise CheckpointError(f"{source}: not an exported model.pth of this recipe's MLP")
        weights = sorted((key for key in state if key.endswith(".weight")), key=lambda k: int(k.split(".")[1]))
        network = MLP([int(state[key].shape[0]) for key in weights[:-1]])
        try:
            network.load_state_dict(state, strict=True)
        except RuntimeError:
            raise CheckpointError(f"{source}: not an exported model.pth of this recipe's MLP") from None
        return network
