"""Classifying image files: each file's top-k classes, or the reason it could not be used."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from project.contract import Recipe
from project.errors import ImageError, one_field
from project.results.evaluation import Classifier, recipe_data
from project.results.image_files import image_files


def classify_files(recipe: Recipe, classifier: Classifier, inputs: list[str],
                   topk: int = 1) -> Iterator[tuple[Path, Any]]:
    """``(path, result)`` per file, each read as ``recipe`` reads images; ``result`` is a dict, or a one-line reason
    when the file is unusable."""
    datamodule = recipe_data(recipe)
    read_image, names = datamodule.read_image, datamodule.class_labels()
    for path in image_files(inputs):
        try:
            image = read_image(path)
        except ImageError as err:
            yield path, str(err)
            continue
        with torch.no_grad():
            probs = classifier(image.unsqueeze(0))[0].exp()
        top = probs.topk(min(topk, len(probs)))
        ranked = [(int(d), float(p)) for p, d in zip(top.values, top.indices, strict=True)]
        yield path, {"path": str(path), "class": ranked[0][0], "name": names[ranked[0][0]],
                     "probability": ranked[0][1], "topk": ranked, "topk_names": [names[d] for d, _ in ranked]}


def render_row(result: dict[str, Any]) -> str:
    """``PATH<TAB>CLASS<TAB>PROBABILITY`` and, with top-k, ``<TAB>class:p`` for the runners-up, each class by its
    name. A tab, newline or backslash in the path or a name is written as ``\\t``, ``\\n``, ``\\\\``, so that each
    line stays one row of three or more fields."""
    (_, probability), *others = result["topk"]
    name, *other_names = result["topk_names"]
    return f"{one_field(result['path'])}\t{one_field(name)}\t{probability:.4f}" + "".join(
        f"\t{one_field(n)}:{p:.4f}" for n, (_, p) in zip(other_names, others, strict=True))

