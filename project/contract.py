"""The contract between the engine and a recipe: all the engine knows of the model and the data.

A recipe is a package, ``project/recipe/`` unless ``PROJECT_RECIPE`` names another
(``PROJECT_RECIPE=tests.second_recipe``): a plain ``nn.Module``, a ``LightningModule`` that
subclasses ``project.training.classifier.ClassifierModule`` and a ``LightningDataModule`` that
subclasses ``project.training.tensor_data.TensorDataModule``. Its ``__init__.py`` names them in
one ``Recipe``, with the engine settings it trains best with, and may hold ``configs/*.yaml``
(presets: ``--config NAME``) and ``sweep.yaml`` (its search space). The classes are named as
``".module:Class"`` strings (relative to the recipe's package), so that reading the recipe (for
``--help``) imports no torch. This module imports nothing heavy either.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import os
import re
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from project.errors import UsageError, first_line

RECIPE_VARIABLE = "PROJECT_RECIPE"
DEFAULT_RECIPE = "project.recipe"
MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


class RecipeError(UsageError):
    """The recipe cannot be loaded: a bad ``PROJECT_RECIPE``, a package that fails to import, a class it names
    that is not there."""


def folder_name_problem(name: str) -> str | None:
    """The one rule for every name that becomes a folder (a recipe's, a run's, a study's): one plain name, no path,
    no '..', not too long for a file system. What is wrong with ``name``, or None."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name or name.startswith("-"):
        return "must be one plain folder name"
    if len(name.encode()) > 100:
        return f"must be at most 100 bytes long, got {len(name.encode())}"
    return None


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
    module: str  # ".module:Class" of its ClassifierModule subclass (or "package.module:Class")
    datamodule: str  # ".module:Class" of its TensorDataModule subclass
    description: str  # train.py's --help headline
    data_help: str  # what --data-dir must hold
    options: Mapping[str, Option] = field(default_factory=dict)
    # Engine settings this recipe trains best with (batch_size, max_epochs, optimizer, lr, scheduler, ...):
    # they replace the engine's defaults in --help, config.yaml and every run.
    defaults: Mapping[str, Any] = field(default_factory=dict)
    # ".module:function" that writes a small learnable dataset, laid out as the datamodule reads it, into a
    # folder: ``function(folder: Path, train: int, test: int, seed: int) -> None``. The conformance tests
    # (tests/test_recipe_conformance.py) train on it.
    example_data: str | None = None
    package: str = DEFAULT_RECIPE  # set by load_recipe(): the package the names above are relative to

    def __post_init__(self) -> None:
        problem = folder_name_problem(self.name) if isinstance(self.name, str) else "must be text"
        if problem:  # runs go to LOGDIR/NAME: a path there would write elsewhere
            raise RecipeError(f"Recipe(name=...): {problem}, got {self.name!r}")
        for field_name in ("module", "datamodule"):
            spec = getattr(self, field_name)
            if not isinstance(spec, str) or ":" not in spec:
                raise RecipeError(f"Recipe({field_name}=...): must be '.module:Class' (or 'package.module:Class'), "
                                  f"got {spec!r}")

    def module_class(self) -> Any:
        return _a_class(load_class(self.module, self.package), f"recipe {self.package}: module {self.module!r}")

    def datamodule_class(self) -> Any:
        return _a_class(load_class(self.datamodule, self.package),
                        f"recipe {self.package}: datamodule {self.datamodule!r}")

    def write_example_data(self, folder: Path, train: int = 320, test: int = 80, seed: int = 0) -> Path:
        """The recipe's example dataset in ``folder`` (for tests and first tries without the real data)."""
        if self.example_data is None:
            raise ValueError(f"recipe {self.name!r} names no example_data")
        write = load_class(self.example_data, self.package)
        try:
            write(folder, train, test, seed)
        except Exception as err:  # noqa: BLE001 - the recipe's own code can raise anything
            raise RecipeError(f"recipe {self.package}: its example_data {self.example_data} (called as "
                              f"f(folder, train, test, seed)) failed: {_one_line(err)}") from err
        return folder

    def checked_option(self, name: str) -> Callable[[Any], Any]:
        """Option ``name``'s check, whatever it raises said as the ValueError of a bad value: a check that fails
        on its own (a TypeError, an IndexError) is one line naming it, not a traceback."""
        check = self.options[name].check

        @functools.wraps(check)
        def checked(value: Any) -> Any:
            try:
                return check(value)
            except ValueError:
                raise
            except Exception as err:  # noqa: BLE001 - the recipe's own code can raise anything
                raise ValueError(f"the recipe's check of --{name.replace('_', '-')} failed on {value!r}: "
                                 f"{_one_line(err)}") from err

        return checked

    @property
    def folder(self) -> Path:
        """Where the recipe's package lives: its presets (configs/) and sweep space (sweep.yaml) are there."""
        return Path(str(importlib.import_module(self.package).__file__)).parent

    def presets(self) -> dict[str, Path]:
        """``--config NAME`` files: the recipe's ``configs/NAME.yaml``."""
        return {p.stem: p for p in sorted((self.folder / "configs").glob("*.yaml"))}


def load_class(spec: str, package: str = DEFAULT_RECIPE) -> Any:
    """``".module:Class"`` (relative to ``package``) or ``"package.module:Class"`` -> the class; one line
    (``RecipeError``) when the module does not import or has no such class."""
    module, _, name = spec.partition(":")
    where = f"recipe {package}: {spec!r}"
    loaded = _import(module, where, package if module.startswith(".") else None)
    if not hasattr(loaded, name):
        raise RecipeError(f"{where}: {loaded.__name__} has no {name!r}; fix the name in its Recipe(...)")
    return getattr(loaded, name)


def _a_class(found: Any, where: str) -> Any:
    """What a recipe names as its module or datamodule: a class (the engine calls it with settings by name)."""
    if not isinstance(found, type):
        raise RecipeError(f"{where}: is a {type(found).__name__}, not a class; name the class (e.g. '.model:LitNet')")
    return found


def _import(module: str, where: str, package: str | None = None) -> Any:
    """``import_module``, any failure of the module's own code said in one line with its file and line."""
    try:
        return importlib.import_module(module, package)
    except ModuleNotFoundError as err:
        wanted = importlib.util.resolve_name(module, package) if module.startswith(".") else module
        if err.name and (wanted == err.name or wanted.startswith(err.name + ".")):
            raise RecipeError(f"{where}: no such module {wanted!r}: {_why_not_importable(wanted)}") from err
        raise RecipeError(f"{where}: importing it failed: {_one_line(err)}") from err
    except Exception as err:  # noqa: BLE001 - the recipe's own code can raise anything
        raise RecipeError(f"{where}: importing it failed: {_one_line(err)}") from err


def _why_not_importable(module: str) -> str:
    """Where Python looked for ``module`` and did not find it, and the likely way to it."""
    top = module.split(".")[0]
    here = Path.cwd()
    looked = {Path(entry or ".").resolve() for entry in sys.path}
    if (here / top / "__init__.py").is_file() and here.resolve() not in looked:
        return (f"the current folder {here} holds {top}/, but this process's sys.path does not (a script's starts at "
                "its own folder): run with PYTHONPATH=. or add the folder to sys.path")
    return "no folder on this process's sys.path (PYTHONPATH, the script's folder) holds it, nor is it installed"


def _one_line(err: BaseException) -> str:
    """``Error: message (file:line)``, where the failing line is the recipe's own or the one that imported it."""
    if isinstance(err, SyntaxError) and err.filename:
        place = f"{err.filename}:{err.lineno}"
    else:
        frames = [f for f in traceback.extract_tb(err.__traceback__) if not f.filename.startswith("<frozen")]
        place = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"
    message = first_line(err) if not isinstance(err, SyntaxError) else err.msg
    return f"{type(err).__name__}: {message} ({place})"


def class_labels(names: Sequence[str] | None, count: int) -> list[str]:
    """Each class's name, in index order: a recipe's ``class_names``, else the indices (``0``, ``1``, ...)."""
    return list(names) if names else [str(index) for index in range(count)]


def recipe_package() -> str:
    """The recipe's package: ``$PROJECT_RECIPE``, else ``project.recipe``."""
    return os.environ.get(RECIPE_VARIABLE) or DEFAULT_RECIPE


def load_recipe(package: str, named_by: str | None = None) -> Recipe:
    """``RECIPE`` of ``package``, or a ``RecipeError`` naming where the name came from (``named_by``; default the
    call itself) and what to fix."""
    if not isinstance(package, str):
        raise RecipeError(f"load_recipe(package): expected a package's dotted name (str), such as "
                          f"'my_recipes.digits', got {type(package).__name__} {package!r}")
    where = named_by or f"load_recipe({package!r})"
    if not MODULE_NAME.fullmatch(package):
        raise RecipeError(f"{where}: not an importable module name; give an absolute, dotted name such as "
                          "my_recipes.cifar (a package on PYTHONPATH)")
    found = getattr(_import(package, where), "RECIPE", None)
    if found is None:
        raise RecipeError(f"{where}: the package has no RECIPE; its __init__.py names its classes in "
                          "RECIPE = Recipe(...) (project.contract)")
    if not isinstance(found, Recipe):
        raise RecipeError(f"{where}: its RECIPE is a {type(found).__name__}, not a project.contract.Recipe")
    return dataclasses.replace(found, package=package)


def installed_recipe() -> Recipe:
    """The recipe ``$PROJECT_RECIPE`` names (else ``project.recipe``), or exit 2 with one line saying why not
    (``--debug``: the traceback too). Only the scripts call it, once, before they read their command line (the
    recipe's options are flags); everything else is handed the recipe."""
    try:
        package = recipe_package()
        return load_recipe(package, named_by=f"{RECIPE_VARIABLE}={package}")
    except RecipeError as err:
        if "--debug" in sys.argv[1:]:
            traceback.print_exception(err.__cause__ or err)
        print(f"{Path(sys.argv[0]).name}: error: {err}", file=sys.stderr)
        raise SystemExit(err.exit_code) from None
