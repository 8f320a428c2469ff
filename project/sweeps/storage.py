"""Where a study lives, and what happens to a trial whose worker died.

One machine: a journal file (Optuna's ``JournalStorage``; appends under a file lock, so any
number of processes share it safely). Several machines: a database URL, e.g. PostgreSQL, whose
trials send heartbeats. Either way a trial left ``RUNNING`` by a dead worker is failed and
enqueued again with the same parameters.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import time
import warnings
from pathlib import Path
from typing import Any, BinaryIO

import optuna
import psutil
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock, JournalStorage
from optuna.trial import FrozenTrial, TrialState

from project.errors import UsageError, first_line, not_a_regular_file, redact
from project.internals import trial_id

RETRIES = 2  # a trial whose worker died runs at most this many more times
# URL scheme: (SQLAlchemy dialect, driver module, the extra that installs it). Named in the URL, so
# every SQLAlchemy version picks the same driver.
DRIVERS = {"postgresql": ("postgresql+psycopg", "psycopg", "postgres")}
CONNINFO = re.compile(r"\s*[A-Za-z_]+\s*=")  # libpq's key=value form: host=... dbname=... password=...
# What Optuna raises replaying a journal whose records are not its own (cut short, or another program's lines).
UNREADABLE_JOURNAL = (ValueError, AssertionError, LookupError, TypeError)


def open_storage(spec: str, heartbeat: int = 60) -> optuna.storages.BaseStorage:
    """A journal file for a path, an RDB storage with heartbeats for a URL; a bad one is one line."""
    if "://" not in spec and CONNINFO.match(spec):  # a file by that name would hold the password
        raise UsageError(f"--storage {describe(spec)}: a libpq connection string, not a journal file's path; give "
                         "PostgreSQL as a URL: postgresql://USER:PASSWORD@HOST:PORT/DBNAME")
    if "://" not in spec:
        return _journal(Path(spec))
    scheme = spec.split("://", 1)[0].split("+", 1)[0]
    if scheme == "sqlite":
        raise UsageError(f"--storage {describe(spec)}: SQLite locks the whole file and fails under parallel workers; "
                         "use a journal file (--storage sweeps.journal) on one machine, PostgreSQL on several")
    if scheme in DRIVERS and "+" not in spec.split("://", 1)[0]:
        dialect, module, extra = DRIVERS[scheme]
        try:
            __import__(module)
        except ImportError:
            raise UsageError(f"--storage {scheme}://...: needs the {module} driver: pip install -e '.[{extra}]'") \
                from None
        return _rdb(dialect + spec[len(scheme):], heartbeat, shown=spec)
    return _rdb(spec, heartbeat, shown=spec)


def _journal(path: Path) -> JournalStorage:
    problem = not_a_regular_file(path) or (None if path.parent.is_dir() else "its folder does not exist")
    if problem:
        raise UsageError(f"--storage {path}: {problem}; give a journal file's path (or a database URL)")
    try:
        set_aside_a_cut_record(path)
        return JournalStorage(JournalFileBackend(str(path)))
    except OSError as err:
        raise UsageError(f"--storage {path}: cannot open it ({err.strerror or err})") from None
    except UNREADABLE_JOURNAL as err:
        raise unreadable_study(str(path), err) from None


def unreadable_study(spec: str, err: BaseException) -> UsageError:
    """The one line for a storage whose study cannot be read back, whether opening it or the study fails."""
    return UsageError(f"--storage {describe(spec)}: cannot read the study from it ({first_line(err)}); use another "
                      "journal file, or repair this one")


def set_aside_a_cut_record(path: Path) -> Path | None:
    """A kill or a full disk mid-append leaves the journal's last record without its newline, and the next append
    would land on it, making the whole journal unreadable. That cut record is moved to a file beside the journal
    (returned, and named on stderr) under the journal's own lock; the study goes on from the complete records."""
    if not path.is_file():
        return None
    lock = JournalFileSymlinkLock(str(path))  # the lock Optuna's appends take
    lock.acquire()
    try:
        with open(path, "rb+") as journal:
            complete = _end_of_last_record(journal)
            cut = journal.read()
            if not cut:
                return None
            aside = path.with_name(f"{path.name}.cut-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
            aside.write_bytes(cut)  # kept before the journal changes: nothing is lost if what follows fails
            journal.truncate(complete)
    finally:
        lock.release()
    print(f"sweep.py: {path}: its last record was cut short (a kill or a full disk mid-write); set aside in {aside} "
          f"({len(cut)} bytes), the study goes on from the complete records", file=sys.stderr, flush=True)
    return aside


def _end_of_last_record(journal: BinaryIO) -> int:
    """The offset just past the journal's last newline (0 if it has none), where ``journal`` is left."""
    end = journal.seek(0, os.SEEK_END)
    while end > 0:
        start = max(0, end - 65536)
        journal.seek(start)
        newline = journal.read(end - start).rfind(b"\n")
        if newline >= 0:
            end = start + newline + 1
            break
        end = start
    journal.seek(end)
    return end


def _rdb(url: str, heartbeat: int, shown: str) -> RDBStorage:
    """Workers that start together on a new database race to create its tables; the loser tries again."""
    for attempt in range(4):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return RDBStorage(url, heartbeat_interval=heartbeat, grace_period=2 * heartbeat,
                                  heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=RETRIES))
        except Exception as err:  # noqa: BLE001 - SQLAlchemy and the drivers raise many kinds
            message = re.sub(r"^\([\w.]+\) ", "", first_line(err))
            if attempt == 3 or not any(word in message for word in ("already exists", "duplicate key")):
                raise UsageError(f"--storage {describe(shown)}: cannot open it ({message})") from None
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


def describe(spec: str) -> str:
    """The storage as printed: a URL without its password."""
    return redact(spec)


def owner() -> str:
    """This process, as a trial records it: host, PID and start time (a reused PID is another process)."""
    return f"{socket.gethostname()}:{os.getpid()}:{psutil.Process().create_time():.2f}"


def _alive(recorded: str) -> bool:
    host, pid, started = recorded.rsplit(":", 2)
    if host != socket.gethostname():
        return True  # another machine's worker: only heartbeats can tell
    try:
        return f"{psutil.Process(int(pid)).create_time():.2f}" == started
    except (psutil.NoSuchProcess, ValueError):
        return False


def retry_dead_workers_trials(study: optuna.Study, storage: Any) -> list[int]:
    """Fail the trials this machine's dead workers left ``RUNNING`` and enqueue each again; their numbers.

    Database storages do this through heartbeats (``optuna.storages.fail_stale_trials``); a
    journal file has none, so its trials record the process that runs them.
    """
    if isinstance(storage, RDBStorage):
        return []
    failed = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        recorded = trial.user_attrs.get("worker")
        if recorded is None or _alive(recorded):
            continue
        try:
            storage.set_trial_state_values(trial_id(trial), TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            continue  # another worker failed it first, and enqueued the retry
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            RetryHeartbeatStaleTrialCallback(max_retry=RETRIES)(study, frozen_trial(study, trial.number))
        failed.append(trial.number)
    return failed


def frozen_trial(study: optuna.Study, number: int) -> FrozenTrial:
    """Trial ``number`` as the storage holds it now, system attributes included."""
    return next(t for t in study.get_trials(deepcopy=True) if t.number == number)


def retried_from(trial: FrozenTrial) -> int | None:
    """The number of the trial this one repeats after its worker died, if any."""
    return trial.system_attrs.get("failed_trial")
