"""The contract between the engine and a recipe: all the engine knows of the model and the data.

A recipe is ``project/recipe/``: a plain ``nn.Module``, a ``LightningModule`` that subclasses
``project.training.classifier.ClassifierModule`` and a ``LightningDataModule`` that subclasses
``project.training.tensor_data.TensorDataModule``. Its ``__init__.py`` names them in one
``Recipe``, which the engine reads from ``project.recipe.RECIPE`` and nowhere else. The classes
are named as ``"package.module:Class"`` strings, so that reading the recipe (for ``--help``)
imports no torch. This module imports nothing heavy either.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Option:
    """One of the recipe's own hyperparameters (layer widths, a CNN's channels, ...).

    It becomes a ``train.py`` flag, a config key and a sweep parameter, is saved with the run and
    checked on resume, and is passed to the ``LightningModule`` by name. ``check`` turns a flag's
    text or a YAML value into the value, or raises ValueError saying what is wrong.
    """

    default: Any
    check: Callable[[Any], Any]
    help: str = ""
    metavar: str | None = None


@dataclass(frozen=True)
class Recipe:
    """What the engine needs from a recipe, in one place (the role torchtitan's ``TrainSpec`` plays)."""

    name: str  # the default experiment name: runs go to LOGDIR/NAME/version_N
    module: str  # "package.module:Class" of its ClassifierModule subclass
    datamodule: str  # "package.module:Class" of its TensorDataModule subclass
    description: str  # train.py's --help headline
    data_help: str  # what --data-dir must hold
    options: Mapping[str, Option] = field(default_factory=dict)

    def module_class(self) -> Any:
        return load_class(self.module)

    def datamodule_class(self) -> Any:
        return load_class(self.datamodule)

    def options_of(self, values: Any) -> dict[str, Any]:
        """The recipe's options as keyword arguments for its module, read from a ``RunConfig``."""
        return {name: getattr(values, name) for name in self.options}


def load_class(spec: str) -> Any:
    """``"package.module:Class"`` -> the class."""
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def recipe() -> Recipe:
    """The recipe the engine trains: ``project.recipe.RECIPE``."""
    from project.recipe import RECIPE

    return RECIPE
