"""``--trainer.KEY VALUE``: any ``lightning.Trainer`` argument, checked against the Trainer's own signature and the
ranges Lightning checks late or never. Loaded (with Lightning) only for a run given one."""

from __future__ import annotations

import difflib
import inspect
import types
import typing
from typing import Any

from project.config.validators import shown
from project.errors import UsageError

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
