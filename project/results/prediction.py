"""Classifying image files: each file's top-k digits, or the reason it could not be used."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from project.errors import ImageError
from project.results.evaluation import Classifier
from project.recipe.digits import image_files, load_digit


def classify_files(classifier: Classifier, inputs: list[str], topk: int = 1) -> Iterator[tuple[Path, Any]]:
    """``(path, result)`` per file; ``result`` is a dict, or a one-line reason when the file is unusable."""
    for path in image_files(inputs):
        try:
            image = load_digit(path)
        except ImageError as err:
            yield path, str(err)
            continue
        with torch.no_grad():
            probs = classifier(image.unsqueeze(0))[0].exp()
        top = probs.topk(min(topk, len(probs)))
        ranked = [(int(d), float(p)) for p, d in zip(top.values, top.indices, strict=True)]
        yield path, {"path": str(path), "digit": ranked[0][0], "probability": ranked[0][1], "topk": ranked}


def render_row(result: dict[str, Any]) -> str:
    """``PATH<TAB>DIGIT<TAB>PROBABILITY`` and, with top-k, ``<TAB>digit:p`` for the runners-up."""
    (digit, probability), *others = result["topk"]
    return f"{result['path']}\t{digit}\t{probability:.4f}" + "".join(f"\t{d}:{p:.4f}" for d, p in others)
