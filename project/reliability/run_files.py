"""A run's folder and what it writes beside its checkpoints: config.yaml, results.json, TensorBoard's TEXT and
HPARAMS; the folder claimed atomically, and its logs rolled back to a checkpoint when a run resumes."""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L

from project import internals
from project.config.schema import RunConfig
from project.errors import UsageError
from project.reliability import runs
from project.secrets import redact, redact_values

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


def check_outputs_writable(config: RunConfig) -> None:
    """Report an unwritable or full log folder, or a bad export path, now and not after training."""
    if config.fast_dev_run:
        return
    if config.export and config.export_pt2 and Path(config.export).resolve() == Path(config.export_pt2).resolve():
        raise UsageError(f"--export and --export-pt2 name the same file, {config.export}: one would overwrite the "
                         "other; give each its own path")
    _check_writable_dir(Path(config.logdir), "--logdir")
    named = Path(config.logdir) / config.name / (config.run_version or "")
    if config.run_version and named.exists() and internals.is_rank_zero() and not config.resume:
        raise UsageError(f"--run-version {config.run_version}: {named} exists; runs never share a folder, "
                         "choose another (or continue it with --resume)")
    exports = (("--export", config.export, "model.pth"), ("--export-pt2", config.export_pt2, "model.pt2"))
    for flag, value, example in exports:
        if not value:
            continue
        export = Path(value)
        if export.is_dir():
            raise UsageError(f"{flag} {export}: is a directory; give a file path such as {export / example}")
        if export.exists() and not config.overwrite:
            raise UsageError(f"{flag} {export}: the file exists; add --overwrite to replace it")
        _check_writable_dir(export.parent, flag)


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


def claim_run_folder(config: RunConfig, resuming: bool = False, recipe: str | None = None) -> RunConfig:
    """Make the run's folder now, atomically (``mkdir`` fails if it exists): runs started at the same
    moment never share one; then hold it (``runs.own``) and start its record. Rank 0 claims it; the
    ranks Lightning starts later are told its name. ``resuming``: the folder is the run's own, held
    already (``continue_in_its_folder``)."""
    if config.fast_dev_run:
        return config
    if not internals.is_rank_zero():
        return config.replace(run_version=os.environ.get(RUN_VERSION_ENV, config.run_version))
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
    runs.own(folder, "--run-version" if config.run_version else "--logdir")
    if existed and not resuming:
        start_over_in(folder)  # --resume auto, and nothing to resume from yet
    runs.start_record(folder, config.trainer, resumed=resuming, recipe=recipe, data_dir=config.data_dir)
    os.environ[RUN_VERSION_ENV] = version
    return config.replace(run_version=version)


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
    for stale in sorted((folder / "checkpoints").glob("*.ckpt")):
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
    for sub in (folder, folder / "checkpoints"):
        if sub.is_dir():
            for path in sub.glob(".*.tmp"):
                path.unlink(missing_ok=True)


def finished_results(folder: Path) -> dict[str, Any] | None:
    """A run is finished once its ``results.json`` names weights that exist; those results."""
    results = runs.read_results(folder)
    weights = results.get("weights")
    return results if weights and Path(weights).is_file() else None


def save_config(folder: Path, config: RunConfig, recipe: str | None = None) -> Path:
    """``config.yaml``: the settings as trained, which ``--config`` reads back to the same run, with the recipe they
    are for (``--config`` of another recipe's file is refused)."""
    import yaml

    path = folder / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    mapping = {**({"recipe": recipe} if recipe else {}), **config.to_mapping()}
    path.write_text(yaml.safe_dump(redact_values(mapping), sort_keys=False))
    return path


def read_config(folder: Path) -> dict[str, Any]:
    """``config.yaml`` as ``save_config`` wrote it; empty where there is none or it cannot be read as one."""
    import yaml

    try:
        saved = yaml.safe_load((folder / "config.yaml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    return saved if isinstance(saved, dict) else {}


def write_results(path: Path, results: dict[str, Any]) -> None:
    """The run's numbers for machines: full precision, unlike the printed summary."""
    values = {k: float(v) if hasattr(v, "item") else v for k, v in results.items()}
    path.write_text(json.dumps(redact_values(values), indent=2))


def log_run_text(trainer: L.Trainer, config: RunConfig) -> None:
    """The exact command and the resolved settings, in TensorBoard's TEXT tab."""
    tensorboard = tensorboard_of(trainer)
    if tensorboard is None:
        return
    command = " ".join(shlex.quote(redact(part)) for part in [Path(sys.executable).name, *sys.argv])
    settings = {**config.to_mapping(), "world_size": trainer.world_size}
    table = "| setting | value |\n|---|---|\n" + "\n".join(f"| {k} | `{redact(str(v))}` |" for k, v in settings.items())
    tensorboard.experiment.add_text("run/command", f"`{command}`", 0)
    tensorboard.experiment.add_text("run/config", table, 0)


def log_hparams_with_results(trainer: L.Trainer, hparams: dict[str, Any], metrics: tuple[str, ...]) -> None:
    """Fill TensorBoard's HPARAMS tab with every setting of the run and its real best and test accuracy (the
    other loggers get the settings; the metrics are in their rows already)."""
    from lightning.pytorch.core.saving import save_hparams_to_yaml

    hparams = redact_values(hparams)
    for logger in trainer.loggers:
        if hasattr(logger, "log_results"):
            logger.log_results(hparams, metrics)
        else:
            logger.log_hyperparams(hparams)
        logger.save()
    # The loggers wrote hparams.yaml when the run started, before these were known.
    if trainer.loggers:
        save_hparams_to_yaml(run_dir(trainer) / "hparams.yaml", hparams)
