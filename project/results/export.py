"""The trained network as a ``torch.export`` program: a file that runs with torch alone, no project code.

(``model.pth`` is the recipe's to write: ``ClassifierModule.export_weights``.)
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn


def save_program(network: nn.Module, input_shape: tuple[int, ...], path: str | os.PathLike) -> Path:
    """``torch.export`` ``network`` for batches of ``input_shape`` (any batch size), written atomically."""
    example = torch.rand(2, *input_shape)
    program = torch.export.export(network, (example,), dynamic_shapes=({0: torch.export.Dim("batch")},))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.stem}.tmp.pt2")  # torch.export wants the .pt2 suffix
    torch.export.save(program, temporary)
    os.replace(temporary, path)
    return path
