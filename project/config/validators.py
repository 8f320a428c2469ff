"""Checks for setting values: each takes a command-line string or a YAML value and returns it typed; a failed check
raises ValueError with a message that reads well after the setting's name. ``--trainer.KEY VALUE``'s are checked in
``trainer_args.py``.
"""

from __future__ import annotations

import inspect
import reprlib
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from project.contract import folder_name_problem
from project.errors import UsageError

_SHORT = reprlib.Repr()
_SHORT.maxstring, _SHORT.maxother, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxlevel = 60, 60, 6, 6, 3


def shown(value: Any) -> str:
    """A value as an error message quotes it: cut short (a YAML file's aliases can make one as long as the memory)."""
    return _SHORT.repr(value)


NumberT = TypeVar("NumberT", int, float)
BuilderT = TypeVar("BuilderT")


def _number(value: Any, kind: type[NumberT]) -> NumberT:
    typo = isinstance(value, str) and "_" in value  # int() and float() read "1_0" as 10: a typo for 1.0 or 1e0
    if isinstance(value, bool) or (kind is int and isinstance(value, float)) or typo:
        raise ValueError(f"not a valid {kind.__name__}: {shown(value)}")
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise ValueError(f"not a valid {kind.__name__}: {shown(value)}") from None


def positive_int(value: Any) -> int:
    number = _number(value, int)
    if number <= 0:
        raise ValueError(f"must be a positive integer, got {value}")
    return number


def non_negative_int(value: Any) -> int:
    number = _number(value, int)
    if number < 0:
        raise ValueError(f"must be zero or more, got {value}")
    return number


def positive_float(value: Any) -> float:
    number = _number(value, float)
    if not 0 < number < float("inf"):
        raise ValueError(f"must be a positive number, got {value}")
    return number


FLOAT32_MAX = 3.4028234663852886e38  # what a float32 tensor (an optimizer's LR, a schedule's) can hold


def learning_rate(value: Any) -> float:
    """A positive LR that fits the float32 tensors the optimizer and its schedule keep it in."""
    number = positive_float(value)
    if number > FLOAT32_MAX:
        raise ValueError(f"must fit a float32 (at most {FLOAT32_MAX:.3g}), got {value}")
    return number


def non_negative_float(value: Any) -> float:
    number = _number(value, float)
    if not 0 <= number < float("inf"):
        raise ValueError(f"must be zero or more, got {value}")
    return number


def memory_fraction(value: Any) -> float:
    number = _number(value, float)
    if not 0 < number <= 1:
        raise ValueError(f"must be in (0, 1], got {value}")
    return number


def flag(value: Any) -> bool:
    """A YAML boolean, or its spelling on the command line (``--trainer.benchmark true``)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ValueError(f"must be true or false, got {shown(value)}")


def folder_name(value: Any) -> str:
    """One plain folder name (a run's, under LOGDIR/NAME), by the contract's one rule for every such name."""
    name = text(value)
    problem = folder_name_problem(name)
    if problem:
        raise ValueError(problem if problem.startswith("must be at most") else f"{problem}, got {shown(name)}")
    return name


def names_from(*choices: str) -> Callable[[Any], str]:
    """Comma-separated names from ``choices``, each at most once (a repeated logger would write every row twice)."""
    def check(value: Any) -> str:
        names = [name.strip() for name in text(value).split(",") if name.strip()]
        unknown = next((name for name in names if name not in choices), None)
        if unknown is not None or not names:
            raise ValueError(f"choose from {', '.join(choices)} (comma-separated), got {shown(text(value))}")
        repeated = next((name for name in names if names.count(name) > 1), None)
        if repeated is not None:
            raise ValueError(f"{repeated} is named twice in {shown(text(value))}")
        return ",".join(names)
    return check


def flag_or_auto(value: Any) -> bool | str:
    """An on/off setting whose default, ``auto``, is decided by the run (on where it can be)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    return flag(value)


def flag_value(value: Any) -> str:
    """A value as it is typed after its flag: a list comma-separated (``--channels 8,16``)."""
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def text(value: Any) -> str:
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise ValueError(f"must be a string, got {shown(value)}")
    return str(value)


def one_of(*choices: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if isinstance(value, bool) or str(value) not in choices:
            raise ValueError(f"invalid choice: {shown(str(value))} (choose from {', '.join(choices)})")
        return str(value)

    return check


def sizes(value: Any) -> list[int]:
    """``128``, ``256,128`` or a YAML list: one or more positive sizes (layer widths, channels)."""
    parts = value if isinstance(value, list) else [p for p in str(value).replace(" ", "").split(",") if p]
    if not parts or isinstance(value, bool):
        raise ValueError("needs at least one size, e.g. 128 or 256,128")
    return [positive_int(p) for p in parts]


def sizes_of(count: int, example: str) -> Callable[[Any], list[int]]:
    """Exactly ``count`` positive sizes (a module that unpacks two channel counts needs two), e.g. ``8,16``."""
    def check(value: Any) -> list[int]:
        found = sizes(value)
        if len(found) != count:
            raise ValueError(f"needs exactly {count} sizes, e.g. {example}; got {len(found)}")
        return found

    check.__name__ = "sizes"
    return check


def size_or_share(value: Any) -> int | float:
    """A count (``5000``) or a share of a whole (``0.1``, strictly between 0 and 1)."""
    if isinstance(value, bool):
        raise ValueError(f"expected a count or a share between 0 and 1, got {shown(value)}")
    text_value = str(value).strip()
    try:
        number = float(text_value)
    except ValueError:
        raise ValueError(f"expected a count or a share between 0 and 1, got {shown(value)}") from None
    if 0 < number < 1:
        return number
    try:  # 0, 1.5, 1.0, 1_0: said as the count-or-share it takes, not as an int alone
        return positive_int(value)
    except ValueError:
        raise ValueError(f"expected a count or a share between 0 and 1, got {shown(value)}") from None


def devices_spec(value: Any) -> int | list[int] | str:
    """A count (``2``), ``-1``/``auto`` for all, or device indices (``0,1``, ``1,`` or a YAML list)."""
    if isinstance(value, list) or (isinstance(value, str) and "," in value):
        parts = value if isinstance(value, list) else [p for p in value.split(",") if p.strip()]
        try:
            indices = [_number(p, int) for p in parts]
        except ValueError:
            raise ValueError(f"device indices must be integers, got {shown(value)}") from None
        if not indices or any(i < 0 for i in indices) or len(set(indices)) != len(indices):
            raise ValueError(f"device indices must be distinct and >= 0, got {shown(value)}")
        return indices
    if str(value).strip() == "auto":
        return "auto"
    count = _number(value, int)
    if count == 0 or count < -1:
        raise ValueError(f"device count must be >= 1 (or -1 for all), got {value}")
    return count


def optional(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``null`` in YAML means 'not set' for settings whose default is None."""
    def check_or_none(value: Any) -> Any:
        return None if value is None else check(value)

    return check_or_none


def count_or_auto(value: Any) -> int | str:
    """A positive count, or ``auto``."""
    if isinstance(value, str) and value.strip() == "auto":
        return "auto"
    return positive_int(value)


def seed_value(value: Any) -> int:
    """A seed NumPy and Lightning accept: 0 to 2**32 - 1."""
    number = _number(value, int)
    if not 0 <= number < 2**32:
        raise ValueError(f"must be between 0 and {2**32 - 1}, got {value}")
    return int(number)


def top_k(value: Any) -> int:
    """A count of checkpoints to keep, or -1 for all (Lightning's ``save_top_k``)."""
    number = _number(value, int)
    if number < -1:
        raise ValueError(f"must be -1 (all), 0 or more, got {value}")
    return number


NONE_MEANS = {"limit_train_batches": 1.0, "limit_val_batches": 1.0, "limit_test_batches": 1.0,
              "limit_predict_batches": 1.0, "gradient_clip_algorithm": "norm", "val_check_interval": 1.0}


def trainer_default(key: str) -> Any:
    """What ``lightning.Trainer`` uses for ``key`` when it is not given: a value given equal to it changes nothing."""
    from lightning.pytorch import Trainer

    parameter = inspect.signature(Trainer.__init__).parameters.get(key)
    default = None if parameter is None or parameter.default is inspect.Parameter.empty else parameter.default
    return NONE_MEANS.get(key) if default is None else default


def same_trainer_value(key: str, first: Any, second: Any) -> bool:
    """Whether two values of a Trainer argument ask for the same (``limit_*`` 1 is one batch, 1.0 all of them)."""
    if key.startswith("limit_") or key == "val_check_interval":
        return first == second and isinstance(first, float) == isinstance(second, float)
    return first == second


def changes_the_default(key: str, values: dict[str, Any]) -> bool:
    """Whether ``values`` gives ``key`` a value other than the one the Trainer would use without it."""
    return key in values and not same_trainer_value(key, values[key], trainer_default(key))


def parse_text(text: str) -> Any:
    """A command-line value as YAML reads it: ``0.5`` a float, ``true`` a bool, ``null`` None, ``simple`` a string."""
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def registries_problem(names: tuple[str, ...], builders: Mapping[str, Any], where: str, module: str) -> str | None:
    """Why a registry (in ``module``) and the names the command line offers (``project.<where>``) disagree; None
    where they agree."""
    file = module.replace(".", "/") + ".py"
    unbuilt = [name for name in names if name not in builders]
    if unbuilt:
        return f"{unbuilt[0]!r} is in project.{where} but has no builder in {file}"
    unnamed = [name for name in builders if name not in names]
    if unnamed:
        return f"{unnamed[0]!r} has a builder in {file} but is not in project.{where} (project/__init__.py)"
    return None


def registered(registry: Mapping[str, BuilderT], name: str, flag: str) -> BuilderT:
    """The builder ``name`` names, or one line listing the known names."""
    if name not in registry:
        raise UsageError(f"{flag} {name}: unknown; choose from {', '.join(registry)}")
    return registry[name]
