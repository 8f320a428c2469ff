"""A run's folder, one module for its whole life: ``RunFolder`` and the records, locks and files behind it.

Training opens it once (``RunFolder.opened``): the folder is claimed atomically, locked for this process and its
start recorded; the run writes its config, results and record through it; on the way out it records how the run
ended (finished, stopped, failed), removes a folder that a refusal left empty, and releases the lock. Every script
that reads runs (``runs.py``, ``evaluate.py``, ``predict.py``, ``--resume``, the sweeps) reads them through it too:
its checked record and results, its state, its best and last checkpoints, the newest run under a log folder.
In the order below: the checked readers of ``run.json`` and ``results.json``; records, locks and choosing runs;
claiming the folder, the files beside the checkpoints, logs rolled back on resume; ``RunFolder``.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from project.config.schema import RunConfig
from project.config.validators import changes_the_default
from project.errors import UsageError, first_line, not_a_regular_file, one_field, redact_values

if TYPE_CHECKING:  # runs.py lists run folders without importing torch or Lightning
    import lightning as L

RUN_RECORD = "run.json"
RESULTS = "results.json"
CONFIG = "config.yaml"  # the settings as trained: --config reads it back to the same run
WEIGHTS = "model.pth"  # the exported weights, unless --export names another file
LOCK = ".run.lock"
CHECKPOINTS = "checkpoints"  # a run's checkpoint folder (Lightning's default place for them)
LAST = "last"  # last.ckpt: the newest training state, what a resume reads
BEST = "best"  # the best checkpoints: best-epochEE-accA.AAAA.ckpt, the epoch counted from 1
BEST_FILENAME = BEST + "-epoch{epoch:02d}-acc{val/acc:.4f}"  # ModelCheckpoint's pattern for them
BEST_NAME = re.compile(r"acc(\d+\.\d+)")  # a best checkpoint's score in its file name, for runs before run.json
STATES = ("running", "finished", "stopped", "failed")
# Trainer arguments that make a run a smoke test: its numbers are not a model's.
LIMITS = ("limit_train_batches", "limit_val_batches", "limit_test_batches", "max_steps", "overfit_batches")
LATEST_TIME = 1e10  # 2286: a start time past it is not one a clock wrote


def last_checkpoint(run: Path) -> Path:
    """A run folder's ``last.ckpt``."""
    return run / CHECKPOINTS / f"{LAST}.ckpt"


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
    """A run's ``run.json``, checked (empty for a folder written before runs kept one)."""
    return read_mapping(folder / RUN_RECORD, RUN_FIELDS)


def read_results(folder: Path) -> dict[str, Any]:
    """A run's ``results.json``, checked (empty until its test is done)."""
    return read_mapping(folder / RESULTS, RESULT_FIELDS)


def write_record(folder: Path, **changes: Any) -> None:
    """Update ``run.json`` atomically (a reader never sees half a file)."""
    record = {**read_run_record(folder), **changes}
    temporary = folder / f".{RUN_RECORD}.{os.getpid()}.tmp"
    try:
        temporary.write_text(json.dumps(redact_values(record), indent=2))
        os.replace(temporary, folder / RUN_RECORD)
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
    if not resumed or "started" not in read_run_record(folder):
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

        try:
            handle = open(self.folder / LOCK, "a+")  # noqa: SIM115 - held until release()
        except OSError as err:  # a read-only mount, a folder of another user's
            raise UsageError(f"{flag}: {self.folder} cannot be written ({err.strerror or err}): a run writes its "
                             "checkpoints and logs into its folder; copy it somewhere writable first") from None
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            holder = read_run_record(self.folder)
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
    """One run folder, as ``py`` lists it and the scripts choose among them."""

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
        record, results = read_run_record(folder), read_results(folder)
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
    checkpoints = folder / CHECKPOINTS
    for source in (record if record is not None else read_run_record(folder),
                   results if results is not None else read_results(folder)):
        named = source.get("best_checkpoint")
        if named and (checkpoints / Path(named).name).is_file():  # a moved folder: the same file, here
            return checkpoints / Path(named).name
    scored = [(float(m.group(1)), p) for p in checkpoints.glob(f"{BEST}-*.ckpt") if (m := BEST_NAME.search(p.name))]
    if scored:
        return max(scored, key=lambda pair: (pair[0], pair[1].stat().st_mtime))[1]
    return None


def checkpoint_of(spec: str, logdir: str | os.PathLike, name: str, flag: str) -> tuple[Path, RunInfo | None]:
    """``best`` / ``last``: that checkpoint of the newest run (and the run); anything else is a path."""
    if spec not in ("best", "last"):
        return Path(spec), None
    run = newest_run(logdir, name, spec, flag)
    path = run.best if spec == "best" else last_checkpoint(run.folder)
    assert path is not None
    return path, run


def _has(run: RunInfo, need: str) -> bool:
    if run.state == "damaged":
        return False
    if need == "last":
        return last_checkpoint(run.folder).is_file()
    return run.best is not None


def _is_run(folder: Path) -> bool:
    return any((folder / marker).exists() for marker in (RUN_RECORD, CHECKPOINTS, CONFIG, RESULTS))


def _first_written(folder: Path) -> float:
    """When a run without a (readable) record started: its oldest file's time."""
    times = [p.stat().st_mtime for p in folder.iterdir() if p.is_file()]
    return min(times, default=folder.stat().st_mtime)


def _limits_from_config(folder: Path) -> list[str]:
    path = folder / CONFIG
    text = path.read_text(errors="replace") if path.is_file() else ""
    return [key for key in LIMITS if f"{key}:" in text]


RUN_VERSION_ENV = "RUN_VERSION"  # rank 0's run folder, for the ranks Lightning starts after it


def run_dir(trainer: L.Trainer) -> Path:
    """The run's folder: where checkpoints, model.pth, config.yaml and results.json go."""
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    local = next((lg for lg in trainer.loggers if isinstance(lg, (TensorBoardLogger, CSVLogger))), None)
    return Path(local.log_dir) if local else Path(trainer.default_root_dir)


def tensorboard_of(trainer: L.Trainer) -> Any:
    """The run's ``TensorBoardLogger``, if it has one."""
    from lightning.pytorch.loggers import TensorBoardLogger

    return next((lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)), None)


def _check_writable_dir(folder: Path, flag: str) -> None:
    """A real write of a checkpoint-sized block: an empty file fits on a full disk too."""
    probe = folder / f".write-test-{os.getpid()}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as stream:
            stream.write(b"\0" * (1 << 20))
            stream.flush()
            os.fsync(stream.fileno())
    except OSError as err:
        raise UsageError(f"{flag} {folder}: cannot write there ({err.strerror or err})") from None
    finally:
        try:
            probe.unlink(missing_ok=True)
        except OSError:
            pass  # the folder was not there to write in: reported above


def claim_run_folder(config: RunConfig, resuming: bool = False, recipe: str | None = None) -> str | None:
    """Make the run's folder now, atomically (``mkdir`` fails if it exists): runs started at the same
    moment never share one; then hold it (``own``) and start its record. Rank 0 claims it; the
    ranks Lightning starts later are told its name. ``resuming``: the folder is the run's own, held
    already (``continue_in_its_folder``). Its name (None: ``--fast-dev-run`` makes no folder)."""
    if config.fast_dev_run:
        return None
    if not is_rank_zero():
        return os.environ.get(RUN_VERSION_ENV, config.run_version)
    parent = Path(config.logdir) / config.name
    existed = False
    try:
        parent.mkdir(parents=True, exist_ok=True)
        if config.run_version:
            folder = parent / config.run_version
            existed = folder.is_dir()
            folder.mkdir(exist_ok=bool(config.resume))
            version = config.run_version
        else:
            version = _next_free_version(parent)
    except FileExistsError:
        raise UsageError(f"--run-version {config.run_version}: {parent / str(config.run_version)} exists; runs never "
                         "share a folder, choose another") from None
    except OSError as err:
        raise UsageError(f"--logdir {config.logdir}: cannot make the run folder in {parent} "
                         f"({err.strerror or err})") from None
    folder = parent / version
    own(folder, "--run-version" if config.run_version else "--logdir")
    if existed and not resuming:
        start_over_in(folder)  # --resume auto, and nothing to resume from yet
    start_record(folder, config.trainer, resumed=resuming, recipe=recipe, data_dir=config.data_dir)
    os.environ[RUN_VERSION_ENV] = version
    return version


def start_over_in(folder: Path) -> None:
    """``--resume auto`` of a folder with no ``last.ckpt``: a finished run (one without checkpoints) is left alone, in
    one line; one that ended before its first ``last.ckpt`` (the same job, requeued, or a disk that filled) starts
    again there: its logs cleared, and the best checkpoints of the attempt removed, which the new one would
    otherwise find beside its own."""
    from project.errors import NothingToDo

    done = finished_results(folder)
    if done is not None:
        raise NothingToDo(f"{folder} is finished (test/acc {done.get('test/acc', float('nan')):.4f}, weights "
                          f"{done['weights']}); nothing to resume, nothing written")
    for stale in sorted((folder / CHECKPOINTS).glob("*.ckpt")):
        stale.unlink()
    remove_partial_files(folder)
    roll_back_logs(folder, 0)


def _next_free_version(parent: Path) -> str:
    taken = [int(p.name[8:]) for p in parent.glob("version_*") if re.fullmatch(r"version_\d+", p.name)]
    number = max(taken, default=-1) + 1
    while True:
        try:
            (parent / f"version_{number}").mkdir()
            return f"version_{number}"
        except FileExistsError:  # another run took it a moment ago
            number += 1


def roll_back_logs(folder: Path, step: int) -> None:
    """Cut the logs back to the checkpoint at ``step``, so that a resumed run's curves continue with no gap
    and no overlap: what was logged at steps from ``step`` on is logged again by the resumed run.

    Lightning logs optimizer step N's metrics (and the validation after it) at step N - 1, so the
    checkpoint taken after step N holds exactly what is logged below N.
    """
    stamps = [0]
    for path in sorted(folder.iterdir()):
        written = EVENT_FILE.fullmatch(path.name)
        if written:  # other files (a user's events.out.tfevents.bak) are left alone
            _keep_events_before(path, step)
            stamps.append(int(written.group(1)))
        elif path.name == "metrics.csv":
            _keep_rows_before(path, step)
    # TensorBoard reads a folder's event files in name order, which starts with the second they were
    # made in: the resumed run's must come after the old ones, or its steps look like a restart.
    while int(time.time()) <= max(stamps):
        time.sleep(0.05)


EVENT_FILE = re.compile(r"events\.out\.tfevents\.(\d+)\..+")  # TensorBoard's: the second it was made, host, ...


def _keep_events_before(path: Path, step: int) -> None:
    """The events logged below ``step`` (the file's version record too); a file cut short by a kill keeps what it
    holds whole, and one that is not an event file at all is left as it is."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.summary.writer.record_writer import RecordWriter

    try:
        records = list(RawEventFileLoader(str(path)).Load())
        events = [Event.FromString(record) for record in records]
    except Exception:  # noqa: BLE001 - a damaged file: TensorBoard itself skips what it cannot read
        return
    kept = [record for record, event in zip(records, events, strict=True)
            if event.step < step or event.HasField("file_version")]
    if len(kept) == len(records):
        return
    cut = path.with_name(f".{path.name}.cut")
    with open(cut, "wb") as stream:
        writer = RecordWriter(stream)
        for record in kept:
            writer.write(record)
    os.replace(cut, path)


def _keep_rows_before(path: Path, step: int) -> None:
    with open(path, newline="") as stream:
        rows = list(csv.reader(stream))
    if not rows or "step" not in rows[0]:
        return
    column = rows[0].index("step")
    kept = [rows[0]] + [row for row in rows[1:] if _step_of(row, column) < step]
    if len(kept) < len(rows):
        with open(path, "w", newline="") as stream:
            csv.writer(stream).writerows(kept)


def _step_of(row: list[str], column: int) -> float:
    """A metrics.csv row's step; a row cut short by a kill (no step) is dropped with the rows after the checkpoint."""
    try:
        return float(row[column]) if row[column] else -1.0
    except (IndexError, ValueError):
        return float("inf")


def remove_partial_files(folder: Path) -> None:
    """Temporary files a killed save left behind (``.last.ckpt.XXXX.tmp``)."""
    for sub in (folder, folder / CHECKPOINTS):
        if sub.is_dir():
            for path in sub.glob(".*.tmp"):
                path.unlink(missing_ok=True)


def finished_results(folder: Path) -> dict[str, Any] | None:
    """A run is finished once its ``results.json`` names weights that exist; those results."""
    results = read_results(folder)
    weights = results.get("weights")
    return results if weights and Path(weights).is_file() else None


@dataclass(frozen=True)
class RunFolder:
    """``LOGDIR/NAME/VERSION``: one run's checkpoints, records, logs and outputs."""

    path: Path

    # ------------------------------------------------------------------ the run's own life

    @classmethod
    @contextmanager
    def opened(cls, config: Any, resuming: bool, recipe: str | None = None) -> Iterator[tuple[RunFolder | None,
                                                                                             str | None]]:
        """Claim the folder ``config`` names (or the next ``version_N``), hold it and record the start; yield it
        (``None`` for a run that writes no files: ``--fast-dev-run``, ranks other than 0) with its name, which
        every rank's loggers write under. On the way out: how the run ended, recorded; a folder a refusal left
        empty, removed; the lock released."""

        named = Path(config.logdir) / config.name / str(config.run_version)
        existed = config.run_version is not None and named.exists()
        try:
            version = claim_run_folder(config, resuming=resuming, recipe=recipe)
            writes = is_rank_zero() and not config.fast_dev_run
            folder = cls(Path(config.logdir) / config.name / str(version)) if writes else None
            try:
                yield folder, version
            except BaseException as err:
                if folder is not None:
                    folder.record_end(err)
                    if not existed and isinstance(err, UsageError):
                        folder.remove_if_refused()
                raise
            if folder is not None:
                folder.record_end(None)
        finally:
            cls.release_all()

    @staticmethod
    def release_all() -> None:
        """Give up every run folder this process holds (a resume holds its run's from the moment it is chosen)."""
        release_all()

    def record_end(self, error: BaseException | None) -> None:
        """How the run ended: finished, stopped (a signal, Ctrl-C) or failed (with its one line)."""
        from project.errors import NothingToDo, Terminated

        if isinstance(error, NothingToDo) or not (self.path / RUN_RECORD).is_file():
            return
        if error is None:
            state: dict[str, Any] = {"state": "finished", "error": None}
        elif isinstance(error, (Terminated, KeyboardInterrupt)):
            state = {"state": "stopped", "error": None}
        else:
            state = {"state": "failed", "error": first_line(error)}
        try:
            write_record(self.path, **state)
        except (OSError, DamagedRecord):
            pass  # a full disk or a damaged record (what stopped the run, maybe): its own error is the one to report

    def remove_if_refused(self) -> None:
        """A new run that Lightning's own checks refused leaves no folder behind (one with a checkpoint stays)."""
        import shutil

        if self.path.is_dir() and not (self.path / CHECKPOINTS).exists():
            shutil.rmtree(self.path, ignore_errors=True)

    @classmethod
    def of(cls, trainer: Any) -> RunFolder:
        """The folder a Trainer's loggers write into (its checkpoints, model.pth, config.yaml, results.json)."""
        return cls(run_dir(trainer))

    @staticmethod
    def check_outputs_writable(config: RunConfig) -> None:
        """Report an unwritable or full log folder, or a bad export path, now and not after training."""
        if config.fast_dev_run:
            return
        if config.export and config.export_pt2 and Path(config.export).resolve() == Path(config.export_pt2).resolve():
            raise UsageError(f"--export and --export-pt2 name the same file, {config.export}: one would overwrite the "
                             "other; give each its own path")
        _check_writable_dir(Path(config.logdir), "--logdir")
        named = Path(config.logdir) / config.name / (config.run_version or "")
        if config.run_version and named.exists() and is_rank_zero() and not config.resume:
            raise UsageError(f"--run-version {config.run_version}: {named} exists; runs never share a folder, "
                             "choose another (or continue it with --resume)")
        exports = (("--export", config.export, WEIGHTS), ("--export-pt2", config.export_pt2, "model.pt2"))
        for flag, value, example in exports:
            if not value:
                continue
            export = Path(value)
            if export.is_dir():
                raise UsageError(f"{flag} {export}: is a directory; give a file path such as {export / example}")
            if export.exists() and not config.overwrite:
                raise UsageError(f"{flag} {export}: the file exists; add --overwrite to replace it")
            _check_writable_dir(export.parent, flag)

    def save_config(self, config: RunConfig, recipe: str | None = None) -> Path:
        """``config.yaml``: the settings as trained, which ``--config`` reads back to the same run, with the recipe they
        are for (``--config`` of another recipe's file is refused)."""
        import yaml

        path = self.path / CONFIG
        path.parent.mkdir(parents=True, exist_ok=True)
        mapping = {**({"recipe": recipe} if recipe else {}), **config.to_mapping()}
        path.write_text(yaml.safe_dump(redact_values(mapping), sort_keys=False))
        return path

    @property
    def saved_config(self) -> dict[str, Any]:
        """``config.yaml`` as ``save_config`` wrote it; empty where there is none or it cannot be read as one."""
        import yaml

        try:
            saved = yaml.safe_load((self.path / CONFIG).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            return {}
        return saved if isinstance(saved, dict) else {}

    def write_results(self, results: dict[str, Any]) -> Path:
        """The run's numbers for machines: full precision, unlike the printed summary."""
        values = {k: float(v) if hasattr(v, "item") else v for k, v in results.items()}
        path = self.path / RESULTS
        path.write_text(json.dumps(redact_values(values), indent=2))
        return path

    # ------------------------------------------------------------------ reading a run, any script

    @property
    def record(self) -> dict[str, Any]:
        """``run.json``, checked (``DamagedRecord`` in one line if it is not what a run wrote)."""
        return read_run_record(self.path)

    @property
    def results(self) -> dict[str, Any]:
        """``results.json``, checked (empty until the run's test is done)."""
        return read_results(self.path)

    def refuse_if_damaged(self) -> None:
        """One line (``DamagedRecord``) before a run continues in a folder whose records are damaged."""
        read_run_record(self.path)
        read_results(self.path)

    def info(self) -> RunInfo:
        """State, newest step, smoke limits, test accuracy, best checkpoint (``damaged`` with its reason)."""
        return run_info(self.path)

    @property
    def best_checkpoint(self) -> Path | None:
        return best_checkpoint(self.path)

    @property
    def last_checkpoint(self) -> Path | None:
        path = last_checkpoint(self.path)
        return path if path.is_file() else None


def is_rank_zero() -> bool:
    """Rank zero writes a run's files; imported when asked (reading run folders needs no torch)."""
    from project import internals

    return internals.is_rank_zero()
