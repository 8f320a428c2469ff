"""The trained network as a ``torch.export`` program: a file that runs with torch alone, no project code.

(``model.pth`` is the recipe's to write: ``ClassifierModule.export_weights``.)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from project.errors import UsageError, first_line


def export_program(network: nn.Module, input_shape: tuple[int, ...]) -> torch.export.ExportedProgram:
    """``torch.export`` of ``network`` for batches of ``input_shape`` of any size; one line if it cannot be."""
    example = torch.rand(2, *input_shape)
    try:
        return torch.export.export(network, (example,), dynamic_shapes=({0: torch.export.Dim("batch")},))
    except Exception as err:  # noqa: BLE001 - torch.export fails in many ways; each means the same here
        raise UsageError(f"--export-pt2: torch.export cannot export {type(network).__name__} ({first_line(err)}); "
                         "drop --export-pt2 or make the network exportable") from None


def check_exportable(module: Any, input_shape: tuple[int, ...]) -> None:
    """Before training: ``--export-pt2`` refused now, not after the run's work is done."""
    network, _ = module.portable_network()
    export_program(network, input_shape)


def save_program(network: nn.Module, input_shape: tuple[int, ...], path: str | os.PathLike) -> Path:
    """The ``torch.export`` program of ``network``, written atomically."""
    program = export_program(network, input_shape)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.stem}.tmp.pt2")  # torch.export wants the .pt2 suffix
    torch.export.save(program, temporary)
    os.replace(temporary, path)
    return path
