"""The files a run writes for other programs to read (``run.json``, ``results.json``), read back through one checked
reader: every field of known meaning checked for type and range. A record damaged by hand, by a full disk or by
another tool is a ``DamagedRecord`` naming its file and field (``run.json: started is not a time``): ``runs.py``
lists that run as damaged, the scripts that choose a run pass over it, and one that names it meets that line.

Imports nothing heavy: ``scripts/runs.py`` lists runs without torch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from project.errors import UsageError, not_a_regular_file

RUN_RECORD = "run.json"
RESULTS = "results.json"
STATES = ("running", "finished", "stopped", "failed")
# Trainer arguments that make a run a smoke test: its numbers are not a model's.
LIMITS = ("limit_train_batches", "limit_val_batches", "limit_test_batches", "max_steps", "overfit_batches")
LATEST_TIME = 1e10  # 2286: a start time past it is not one a clock wrote


class DamagedRecord(UsageError):
    """A record file that is not what the project wrote; ``reason`` is ``"run.json: started is not a time"``."""

    def __init__(self, path: Path, problem: str) -> None:
        self.path, self.reason = path, f"{path.name}: {problem}"
        super().__init__(f"{path}: {problem}; repair or delete it (the run's checkpoints are untouched)")


Check = Callable[[Any], bool]


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _finite(value: Any) -> bool:
    return _number(value) and math.isfinite(value)


def _optional(check: Check) -> Check:
    return lambda value: value is None or check(value)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _share(value: Any) -> bool:
    return _finite(value) and 0 <= value <= 1


def _text(value: Any) -> bool:
    return isinstance(value, str)


def _time(value: Any) -> bool:
    return _finite(value) and 0 < value < LATEST_TIME


# field: (check, what it must be)
RUN_FIELDS: Mapping[str, tuple[Check, str]] = {
    "started": (_time, "a time"),
    "state": (lambda v: v in STATES, f"one of {', '.join(STATES)}"),
    "pid": (lambda v: _count(v) and v > 0, "a process id"),
    "host": (_text, "a host name"),
    "limited": (lambda v: isinstance(v, list) and all(item in LIMITS for item in v), "a list of Trainer limits"),
    "error": (_optional(_text), "a line of text"),
    "step": (_optional(_count), "a step number"),
    "best_checkpoint": (_optional(_text), "a file name"),
    "best_score": (_optional(_finite), "a finite number"),
    "recipe": (_text, "a recipe's package"),
    "data_dir": (_text, "a folder"),
}
RESULT_FIELDS: Mapping[str, tuple[Check, str]] = {
    "test/acc": (_share, "an accuracy between 0 and 1"),
    "test/loss": (_number, "a number"),
    "val/acc_best": (_optional(lambda v: _number(v) and (math.isnan(v) or 0 <= v <= 1)), "an accuracy between 0 and 1"),
    "best_checkpoint": (_optional(_text), "a path"),
    "last_checkpoint": (_optional(_text), "a path"),
    "weights": (_optional(_text), "a path"),
    "global_batch": (lambda v: _count(v) and v > 0, "a positive whole number"),
    "world_size": (lambda v: _count(v) and v > 0, "a positive whole number"),
    "precision": (_text, "a precision"),
    "lr": (lambda v: _finite(v) and v > 0, "a positive number"),
}


def read_mapping(path: Path, fields: Mapping[str, tuple[Check, str]]) -> dict[str, Any]:
    """The JSON object in ``path``, each field in ``fields`` checked (others, a recipe's own metrics, kept as they
    are); empty when there is no file (a run written before it, or one that has not got there)."""
    problem = not_a_regular_file(path)
    if problem:
        raise DamagedRecord(path, problem)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as err:
        raise DamagedRecord(path, f"cannot read it ({err.strerror or err})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise DamagedRecord(path, "not UTF-8 text") from None
    try:
        values = json.loads(text)
    except json.JSONDecodeError as err:
        problem = "empty" if not text.strip() else f"not valid JSON (cut short or edited: line {err.lineno})"
        raise DamagedRecord(path, problem) from None
    except RecursionError:
        raise DamagedRecord(path, "nested too deep to be a record") from None
    if not isinstance(values, dict):
        raise DamagedRecord(path, f"holds a {type(values).__name__}, not a JSON object")
    for key, (check, what) in fields.items():
        if key in values and not check(values[key]):
            raise DamagedRecord(path, f"{key} is not {what}")
    return values


def read_run_record(folder: Path) -> dict[str, Any]:
    """A run's ``run.json``, checked."""
    return read_mapping(folder / RUN_RECORD, RUN_FIELDS)


def read_results(folder: Path) -> dict[str, Any]:
    """A run's ``results.json``, checked (empty until its test is done)."""
    return read_mapping(folder / RESULTS, RESULT_FIELDS)
