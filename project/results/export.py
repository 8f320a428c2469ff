"""The trained network as files that need no project code: ``model.pth`` and a ``torch.export`` program."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from project.reliability.checkpointing import atomic_save
from project.recipe.model import MLP, build_sequential, export_state_dict


def save_weights(model: MLP, path: str | os.PathLike) -> Path:
    """Write the article-compatible ``model.pth`` (input normalisation folded in), atomically."""
    return atomic_save(export_state_dict(model), path)


def save_program(model: MLP, path: str | os.PathLike) -> Path:
    """A ``torch.export`` program of the article's network: runs with torch alone, on ``ToTensor()`` pixels."""
    network = build_sequential(model.hidden)
    network.load_state_dict(export_state_dict(model))
    portable = nn.Sequential(nn.Flatten(1), *network).eval()
    example = torch.rand(2, 1, 28, 28)
    program = torch.export.export(portable, (example,), dynamic_shapes=({0: torch.export.Dim("batch")},))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.stem}.tmp.pt2")  # torch.export wants the .pt2 suffix
    torch.export.save(program, temporary)
    os.replace(temporary, path)
    return path
