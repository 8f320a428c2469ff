"""What a run is, for every script: its folder, its record (``run.json``), its state, its best checkpoint, the newest.

A run writes ``run.json`` into its folder when it claims it and again at every checkpoint and at
its end: when it started, where it stands (running, finished, stopped, failed), the step of its
newest checkpoint, its best checkpoint and that checkpoint's score. "The newest run" is the one
that started last, whatever its folder's name (``version_N``, ``--run-version``, a SLURM job's
``job_<id>``); "the best checkpoint" is the one with the best recorded score, not the last name.
A run folder is owned by one process at a time (``RunLock``): a second writer, a resume of a run
that is still training, or a second job racing for the same folder meets one line.

Imports nothing heavy: ``scripts/runs.py`` lists runs without torch.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from project.config.trainer_args import changes_the_default
from project.errors import UsageError, first_line, one_field
from project.reliability.records import LIMITS, RUN_RECORD, DamagedRecord, read_results, read_run_record
from project.secrets import redact_values

RECORD = RUN_RECORD
LOCK = ".run.lock"
BEST_NAME = re.compile(r"acc(\d+\.\d+)")


def read_record(folder: Path) -> dict[str, Any]:
    """The run's ``run.json``, checked (empty for a folder written before runs kept one)."""
    return read_run_record(folder)


def write_record(folder: Path, **changes: Any) -> None:
    """Update ``run.json`` atomically (a reader never sees half a file)."""
    record = {**read_record(folder), **changes}
    temporary = folder / f".{RECORD}.{os.getpid()}.tmp"
    try:
        temporary.write_text(json.dumps(redact_values(record), indent=2))
        os.replace(temporary, folder / RECORD)
    except OSError:
        temporary.unlink(missing_ok=True)
        raise


def start_record(folder: Path, trainer_args: dict[str, Any], resumed: bool, recipe: str | None = None,
                 data_dir: str | None = None) -> None:
    """A new run's record, or a resumed one's set running again; with the recipe and the data it trains on."""
    limited = sorted(key for key in LIMITS if changes_the_default(key, trainer_args))
    changes: dict[str, Any] = {"state": "running", "pid": os.getpid(), "host": socket.gethostname(),
                               "limited": limited, "error": None}
    changes.update({key: value for key, value in (("recipe", recipe), ("data_dir", data_dir)) if value is not None})
    if not resumed or "started" not in read_record(folder):
        changes["started"] = time.time()
    write_record(folder, **changes)


class RunLock:
    """An exclusive lock on a run folder for this process's lifetime (``fcntl``: the kernel releases it when the
    process dies, so a killed run never leaves its folder locked)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._handle: Any = None

    def acquire(self, flag: str) -> RunLock:
        import fcntl

        handle = open(self.folder / LOCK, "a+")  # noqa: SIM115 - held until release()
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            holder = read_record(self.folder)
            who = f" (pid {holder['pid']} on {holder['host']})" if holder.get("pid") else ""
            raise UsageError(f"{flag}: {self.folder} is in use by a run still training{who}; runs never share a "
                             "folder: wait for it to stop, or choose another") from None
        self._handle = handle
        return self

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


_OWNED: dict[Path, RunLock] = {}


def _forget_inherited_locks() -> None:
    """In a forked child (a DataLoader worker): close the copies of the lock files. A flock belongs to the open
    file, which a child shares; one that outlived a killed run would keep its folder locked until it noticed."""
    for lock in _OWNED.values():
        if lock._handle is not None:
            lock._handle.close()
            lock._handle = None
    _OWNED.clear()


os.register_at_fork(after_in_child=_forget_inherited_locks)


def own(folder: Path, flag: str) -> None:
    """Hold ``folder`` for this process until ``release_all`` (at the run's end); one line if another holds it."""
    folder = folder.resolve()
    if folder not in _OWNED:
        _OWNED[folder] = RunLock(folder).acquire(flag)


def release_all() -> None:
    for lock in _OWNED.values():
        lock.release()
    _OWNED.clear()


def end_record(folder: Path, error: BaseException | None) -> None:
    """How the run ended: finished, stopped (a signal, Ctrl-C) or failed (with its one line)."""
    from project.errors import NothingToDo, Terminated

    if isinstance(error, NothingToDo) or not (folder / RECORD).is_file():
        return
    if error is None:
        state: dict[str, Any] = {"state": "finished", "error": None}
    elif isinstance(error, (Terminated, KeyboardInterrupt)):
        state = {"state": "stopped", "error": None}
    else:
        state = {"state": "failed", "error": first_line(error)}
    try:
        write_record(folder, **state)
    except (OSError, DamagedRecord):
        pass  # a full disk or a damaged record (what stopped the run, maybe): its own error is the one to report


def is_locked(folder: Path) -> bool:
    """Whether a live process holds the folder (its run is training)."""
    import fcntl

    try:
        with open(folder / LOCK, "a+") as handle:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return True
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
            return False
    except OSError:
        return False


@dataclass(frozen=True)
class RunInfo:
    """One run folder, as ``runs.py`` lists it and the scripts choose among them."""

    folder: Path
    started: float
    state: str  # finished, stopped, failed, running, killed (no live process, no end recorded), unfinished, damaged
    step: int | None  # of the newest checkpoint
    limited: tuple[str, ...]  # smoke-test limits it ran under
    test_acc: float | None
    best: Path | None
    error: str | None

    @property
    def smoke(self) -> bool:
        return bool(self.limited)

    def describe(self) -> str:
        if self.state in ("stopped", "killed"):
            text = f"{self.state} at step {self.step}" if self.step is not None else \
                f"{self.state} before its first checkpoint"
        elif self.state == "failed":
            text = "failed" + (f": {self.error}" if self.error else "")
        elif self.state == "damaged":
            return f"damaged ({self.error})"
        else:
            text = self.state
        return text + (f" (smoke: --trainer.{', --trainer.'.join(self.limited)})" if self.limited else "")


def run_info(folder: Path) -> RunInfo:
    try:
        record, results = read_record(folder), read_results(folder)
    except DamagedRecord as damaged:
        return RunInfo(folder=folder, started=_first_written(folder), state="damaged", step=None, limited=(),
                       test_acc=None, best=None, error=damaged.reason)
    state = record.get("state", "finished" if results.get("weights") else "unfinished")
    if state == "running" and not is_locked(folder):
        state = "killed"
    started = record.get("started") or _first_written(folder)
    test_acc = results.get("test/acc")
    return RunInfo(folder=folder, started=float(started), state=state, step=record.get("step"),
                   limited=tuple(record.get("limited") or _limits_from_config(folder)),
                   test_acc=float(test_acc) if isinstance(test_acc, (int, float)) else None,
                   best=best_checkpoint(folder, record, results), error=record.get("error"))


def runs(logdir: str | os.PathLike, name: str) -> list[RunInfo]:
    """Every run under ``logdir/name``, newest first (by when it started, whatever its folder is called)."""
    parent = Path(logdir, name)
    if not parent.is_dir():
        return []
    folders = [p for p in parent.iterdir() if p.is_dir() and _is_run(p)]
    return sorted((run_info(p) for p in folders), key=lambda info: info.started, reverse=True)


def newest_run(logdir: str | os.PathLike, name: str, need: str, flag: str) -> RunInfo:
    """The newest run with what ``need`` names (``last``: a ``last.ckpt``; ``best``: a best checkpoint). A smoke run
    is passed over, and the choice is said on stderr, by the caller."""
    found = runs(logdir, name)
    candidates = [run for run in found if _has(run, need)]
    real = [run for run in candidates if not run.smoke]
    passed_over = [run for run in found if run.state == "damaged" and (not real or run.started > real[0].started)]
    for run in passed_over:
        print(f"{flag} {need}: passing over {one_field(str(run.folder))}: {one_field(run.describe())}",
              file=sys.stderr)
    if not candidates:
        raise UsageError(f"{flag} {need}: no run with a {need} checkpoint under {Path(logdir, name)}; train first or "
                         "pass a path")
    if not real:
        newest = candidates[0]
        raise UsageError(f"{flag} {need}: the runs under {Path(logdir, name)} are smoke tests ({newest.folder.name}: "
                         f"{newest.describe()}); pass its checkpoint's path to use one anyway")
    return real[0]


def best_checkpoint(folder: Path, record: dict[str, Any] | None = None,
                    results: dict[str, Any] | None = None) -> Path | None:
    """The run's best checkpoint by the score it recorded (``run.json``, else ``results.json``), else by the scores
    in the file names (runs written before ``run.json``); None if it has none."""
    checkpoints = folder / "checkpoints"
    for source in (record if record is not None else read_record(folder),
                   results if results is not None else read_results(folder)):
        named = source.get("best_checkpoint")
        if named and (checkpoints / Path(named).name).is_file():  # a moved folder: the same file, here
            return checkpoints / Path(named).name
    scored = [(float(m.group(1)), p) for p in checkpoints.glob("best-*.ckpt") if (m := BEST_NAME.search(p.name))]
    if scored:
        return max(scored, key=lambda pair: (pair[0], pair[1].stat().st_mtime))[1]
    return None


def checkpoint_of(spec: str, logdir: str | os.PathLike, name: str, flag: str) -> tuple[Path, RunInfo | None]:
    """``best`` / ``last``: that checkpoint of the newest run (and the run); anything else is a path."""
    if spec not in ("best", "last"):
        return Path(spec), None
    run = newest_run(logdir, name, spec, flag)
    path = run.best if spec == "best" else run.folder / "checkpoints" / "last.ckpt"
    assert path is not None
    return path, run


def _has(run: RunInfo, need: str) -> bool:
    if run.state == "damaged":
        return False
    if need == "last":
        return (run.folder / "checkpoints" / "last.ckpt").is_file()
    return run.best is not None


def _is_run(folder: Path) -> bool:
    return any((folder / marker).exists() for marker in (RECORD, "checkpoints", "config.yaml", "results.json"))


def _first_written(folder: Path) -> float:
    """When a run without a (readable) record started: its oldest file's time."""
    times = [p.stat().st_mtime for p in folder.iterdir() if p.is_file()]
    return min(times, default=folder.stat().st_mtime)


def _limits_from_config(folder: Path) -> list[str]:
    path = folder / "config.yaml"
    text = path.read_text(errors="replace") if path.is_file() else ""
    return [key for key in LIMITS if f"{key}:" in text]
