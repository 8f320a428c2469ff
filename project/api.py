"""What a recipe and a notebook import: the contract, the base classes, the checks, the errors and the entry points.

A recipe imports nothing of the project but this module (``lint-imports`` holds it to that). The
light names are imported at once, so that reading a recipe for ``--help`` imports no torch; the
base classes and the result types come from their modules the first time they are asked for.

In a notebook::

    from project.api import RunConfig, evaluate, load_recipe, train

    recipe = load_recipe("my_recipes.digits")  # a recipe package on PYTHONPATH
    result = train(RunConfig.for_recipe(recipe, max_epochs=1, data_dir="data"), recipe)
    print(result.test_metrics, evaluate(recipe, ckpt=result.best_checkpoint, data_dir="data")["test/acc"])
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from project.config.schema import RunConfig
from project.config.validators import sizes, sizes_of
from project.contract import Option, Recipe, RecipeError, load_recipe
from project.errors import CheckpointError, DataError, ImageError, UsageError, UserError, not_a_regular_file

if TYPE_CHECKING:
    from project.training.classifier import ClassifierModule
    from project.training.run import RunResult
    from project.training.tensor_data import TensorDataModule

__all__ = [
    "CheckpointError", "ClassifierModule", "DataError", "ImageError", "Option", "Recipe", "RecipeError", "RunConfig",
    "TensorDataModule", "UsageError", "UserError", "evaluate", "load_recipe", "not_a_regular_file", "predict",
    "sizes", "sizes_of", "train",
]

_HEAVY = {"ClassifierModule": "project.training.classifier", "TensorDataModule": "project.training.tensor_data",
          "RunResult": "project.training.run"}


def __getattr__(name: str) -> Any:
    """The base classes import torch and Lightning: only when a recipe's model or data module asks for them."""
    if name not in _HEAVY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_HEAVY[name]), name)


def train(config: RunConfig, recipe: Recipe, **options: Any) -> RunResult:
    """One run of ``recipe`` (``project.training.run.train``: ``callbacks``, ``test``, ``on_tested``...)."""
    from lightning.pytorch import Callback

    from project.training.run import train as run

    _check_recipe(recipe, "train")
    if not isinstance(config, RunConfig):
        raise UsageError(f"train(config=...): expected a RunConfig (RunConfig.for_recipe(recipe, ...)), got "
                         f"{_shown(config)}")
    callbacks = options.get("callbacks", ())
    if isinstance(callbacks, (str, bytes)) or not isinstance(callbacks, Sequence):
        raise UsageError(f"train(callbacks=...): expected a list of Lightning callbacks, got {_shown(callbacks)}")
    stranger = next((item for item in callbacks if not isinstance(item, Callback)), None)
    if stranger is not None:
        raise UsageError(f"train(callbacks=...): expected Lightning callbacks (lightning.pytorch.Callback), got "
                         f"{_shown(stranger)}")
    return run(config, recipe, **options)


def evaluate(recipe: Recipe, ckpt: str | None = None, weights: str | None = None, data_dir: str | None = None,
             logdir: str = "lightning_logs", name: str | None = None) -> dict[str, Any]:
    """``evaluate.py``'s numbers: a checkpoint (default: the newest run's best) or ``model.pth`` on the test set."""
    from project.results.evaluation import evaluate_test_set, load_classifier

    _check_recipe(recipe, "evaluate")
    ckpt, weights, data_dir, logdir, name = (_path(value, "evaluate", argument) for argument, value in (
        ("ckpt", ckpt), ("weights", weights), ("data_dir", data_dir), ("logdir", logdir), ("name", name)))
    return evaluate_test_set(recipe, load_classifier(recipe, ckpt, weights, str(logdir), name), data_dir)


def predict(recipe: Recipe, inputs: Sequence[str], ckpt: str | None = None, weights: str | None = None,
            topk: int = 1, logdir: str = "lightning_logs", name: str | None = None) -> list[dict[str, Any] | str]:
    """``predict.py``'s rows: for each image file (or folder of them), its classes, or why it could not be read."""
    from project.results.evaluation import load_classifier
    from project.results.prediction import classify_files

    _check_recipe(recipe, "predict")
    if isinstance(inputs, (str, bytes, os.PathLike)) or not isinstance(inputs, Sequence):
        raise UsageError(f"predict(inputs=...): expected a list of image files or folders, got {_shown(inputs)}"
                         + (f"; for one, pass [{inputs!r}]" if isinstance(inputs, (str, os.PathLike)) else ""))
    paths = [str(_path(item, "predict", "inputs")) for item in inputs]
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
        raise UsageError(f"predict(topk=...): expected a whole number of classes, 1 or more, got {_shown(topk)}")
    ckpt, weights, logdir, name = (_path(value, "predict", argument) for argument, value in (
        ("ckpt", ckpt), ("weights", weights), ("logdir", logdir), ("name", name)))
    classifier = load_classifier(recipe, ckpt, weights, str(logdir), name)
    return [outcome for _, outcome in classify_files(recipe, classifier, paths, topk)]


def _check_recipe(recipe: Any, function: str) -> None:
    if not isinstance(recipe, Recipe):
        raise UsageError(f"{function}(recipe=...): expected a Recipe (project.api.load_recipe('package')), got "
                         f"{_shown(recipe)}")


def _path(value: Any, function: str, argument: str) -> Any:
    """A path argument (None where it may be left out) as text, or one line naming the argument."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise UsageError(f"{function}({argument}=...): expected a path (str or pathlib.Path), got {_shown(value)}")


def _shown(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"
