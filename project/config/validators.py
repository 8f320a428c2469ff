"""Checks for setting values: each takes a command-line string or a YAML value and returns it typed; a failed check
raises ValueError with a message that reads well after the setting's name. Then ``--trainer.KEY VALUE``: any
``lightning.Trainer`` argument, checked against the Trainer's own signature (Lightning imported only then).
"""

from __future__ import annotations

import difflib
import inspect
import reprlib
import types
import typing
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


IMAGE_SUFFIXES = (".png", ".pdf", ".svg", ".jpg", ".jpeg")  # what the figures' files can be (matplotlib writes them)


def _writable_folder(folder: Any, what: str) -> None:
    import os
    from pathlib import Path

    folder = Path(folder)
    existing = next((p for p in (folder, *folder.parents) if p.exists()), Path("."))
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"cannot write {what} in {folder} ({existing} is not a folder this user can write in)")


def image_file(value: Any) -> str:
    """A figure's file: a suffix matplotlib writes, in a folder that exists and can be written."""
    from pathlib import Path

    path = Path(text(value))
    if path.suffix.lower() not in IMAGE_SUFFIXES:
        raise ValueError(f"{shown(str(path))}: name a {', '.join(IMAGE_SUFFIXES)} file")
    if not path.parent.is_dir():
        raise ValueError(f"{shown(str(path))}: the folder {path.parent} does not exist")
    _writable_folder(path.parent, "the figure")
    return str(path)


def output_folder(value: Any) -> str:
    """A folder for a script's reports: it may not exist yet, but it must be possible to make and write."""
    from pathlib import Path

    path = Path(text(value))
    if path.exists() and not path.is_dir():
        raise ValueError(f"{shown(str(path))}: is a file, not a folder")
    _writable_folder(path, "the reports")
    return str(path)


# Arguments the template fills itself; the hint says where a user changes them instead.
OWNED = {
    "logger": "use --logger",
    "callbacks": "the template's callbacks are set in project/training/build.py; add yours there",
    "plugins": "set in project/training/build.py (the template installs its atomic checkpoint writer)",
    "default_root_dir": "use --logdir",
}


def _count_or_share(value: Any) -> str | None:
    if isinstance(value, float) and not 0.0 <= value <= 1.0:  # nan fails both comparisons
        return "a share must be in [0, 1]"
    if isinstance(value, int) and value < 0:
        return "a count of batches must be 0 or more"
    return None


def _at_least_one(value: Any) -> str | None:  # Lightning divides by these, or loops over them, unchecked
    return "must be 1 or more" if isinstance(value, int) and value < 1 else None


def _steps(value: Any) -> str | None:  # max_steps 0 trains nothing, and a schedule over 0 steps fails mid-run
    return "must be -1 (no limit) or 1 or more" if isinstance(value, int) and value < 1 and value != -1 else None


def _finite_non_negative(value: Any) -> str | None:  # gradient_clip_val -1 would mean no clipping, silently
    return "must be a finite number, 0 or more" if isinstance(value, (int, float)) and \
        not 0 <= value < float("inf") else None


def _duration(value: Any) -> str | None:  # a max_time of 0 or less stops the run before its first step
    seconds = None
    if isinstance(value, dict):
        parts = {key: part for key, part in value.items() if key in DURATION_KEYS}
        if len(parts) != len(value) or not all(isinstance(part, (int, float)) and not isinstance(part, bool)
                                                for part in parts.values()):
            return f"must map {', '.join(DURATION_KEYS)} to numbers"
        seconds = sum(part * DURATION_KEYS[key] for key, part in parts.items())
    elif isinstance(value, str):
        fields = value.split(":")
        if len(fields) != 4 or not all(field.isdigit() for field in fields):
            return "must be DD:HH:MM:SS"
        seconds = sum(int(field) * unit for field, unit in zip(fields, (86400, 3600, 60, 1), strict=True))
    if seconds is not None and not 0 < seconds < float("inf"):
        return "must be a positive length of time"
    return None


DURATION_KEYS = {"weeks": 604800, "days": 86400, "hours": 3600, "minutes": 60, "seconds": 1, "milliseconds": 1e-3,
                 "microseconds": 1e-6}
# Each Trainer argument whose range Lightning checks late (deep in its loop, after the run folder exists) or never.
RANGES = {
    "limit_train_batches": _count_or_share, "limit_val_batches": _count_or_share, "limit_test_batches": _count_or_share,
    "limit_predict_batches": _count_or_share, "overfit_batches": _count_or_share, "val_check_interval": _count_or_share,
    "check_val_every_n_epoch": _at_least_one, "accumulate_grad_batches": _at_least_one,
    "max_steps": _steps, "min_steps": _finite_non_negative, "min_epochs": _finite_non_negative,
    "gradient_clip_val": _finite_non_negative, "max_time": _duration,
}


def check_trainer_args(values: dict[str, Any]) -> dict[str, Any]:
    """The values, each checked against the type ``lightning.Trainer`` declares for it."""
    from lightning.pytorch import Trainer

    parameters = [name for name in inspect.signature(Trainer.__init__).parameters if name != "self"]
    hints = typing.get_type_hints(Trainer.__init__)
    for key, value in values.items():
        if key in OWNED:
            raise UsageError(f"--trainer.{key}: set by the template; {OWNED[key]}")
        if key not in parameters:
            close = difflib.get_close_matches(key, parameters, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise UsageError(f"--trainer.{key}: not an argument of lightning.Trainer{hint}")
        expected = hints.get(key)
        if expected is not None and not fits(value, expected):
            raise UsageError(f"--trainer.{key}: expected {describe(expected)}, got {shown(value)}")
        problem = RANGES[key](value) if key in RANGES and not isinstance(value, bool) else None
        if problem:
            raise UsageError(f"--trainer.{key}: {problem}, got {shown(value)}")
    return dict(values)


# What Lightning documents a ``None`` default of these to mean.
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


def _members(hint: Any) -> tuple[Any, ...]:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return tuple(m for arg in typing.get_args(hint) for m in _members(arg))
    return (hint,)


def fits(value: Any, hint: Any) -> bool:
    """Whether a plain value (from YAML or the command line) is one of the types ``hint`` allows."""
    for member in _members(hint):
        origin = typing.get_origin(member)
        if member is Any:
            return True
        if origin is typing.Literal:
            if value in typing.get_args(member) and not isinstance(value, bool):
                return True
        elif member is type(None):
            if value is None:
                return True
        elif member is bool:
            if isinstance(value, bool):
                return True
        elif member in (int, float):
            if isinstance(value, (int, float) if member is float else int) and not isinstance(value, bool):
                return True
        elif member is str:
            if isinstance(value, str):
                return True
        elif origin is list:
            (item,) = typing.get_args(member) or (Any,)
            if isinstance(value, list) and all(fits(v, item) for v in value):
                return True
        elif origin is dict:
            if isinstance(value, dict):
                return True
    return False


def describe(hint: Any) -> str:
    """The plain values a hint allows, in words; Python objects (profilers, loggers) are left out. Plain types in
    one fixed order: ``Union[int, float]`` and ``Union[float, int]`` are one cached object, whichever came first."""
    words: list[str] = []
    plain = (bool, int, float, str)
    for member in sorted(_members(hint), key=lambda m: plain.index(m) if m in plain else len(plain)):
        origin = typing.get_origin(member)
        if origin is typing.Literal:
            words += [repr(v) for v in typing.get_args(member)]
        elif member is type(None):
            words.append("null")
        elif member in (bool, int, float, str):
            words.append(member.__name__)
        elif origin is list:
            words.append("a list")
        elif origin is dict:
            words.append("a mapping")
    return ", ".join(dict.fromkeys(words)) or "a Python object (set it in code)"


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
