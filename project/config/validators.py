"""Checks for setting values: each takes a command-line string or a YAML value and returns it typed.

A failed check raises ValueError with a message that reads well after the setting's name.
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable
from typing import Any, TypeVar

_SHORT = reprlib.Repr()
_SHORT.maxstring, _SHORT.maxother, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxlevel = 60, 60, 6, 6, 3


def shown(value: Any) -> str:
    """A value as an error message quotes it: cut short (a YAML file's aliases can make one as long as the memory)."""
    return _SHORT.repr(value)


NumberT = TypeVar("NumberT", int, float)


def _number(value: Any, kind: type[NumberT]) -> NumberT:
    if isinstance(value, bool) or (kind is int and isinstance(value, float)):
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
    """One plain folder name (a run's, under LOGDIR/NAME): no path, no '..', not too long for a file system."""
    name = text(value)
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name or name.startswith("-"):
        raise ValueError(f"must be one plain folder name, got {shown(name)}")
    if len(name.encode()) > 100:
        raise ValueError(f"must be at most 100 bytes long, got {len(name.encode())}")
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
    return positive_int(value)


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
