"""A run's folder, one object for its whole life: ``RunFolder``.

Training opens it once (``RunFolder.opened``): the folder is claimed atomically, locked for this process and its
start recorded; the run writes its config, results and record through it; on the way out it records how the run
ended (finished, stopped, failed), removes a folder that a refusal left empty, and releases the lock. Every script
that reads runs (``runs.py``, ``evaluate.py``, ``predict.py``, ``--resume``, the sweeps) reads them through it too:
its checked record and results, its state, its best and last checkpoints, the newest run under a log folder.

The mechanics live beside it, one concern a file: ``runs.py`` (records, locks, choosing runs), ``run_files.py``
(claiming the folder, the files beside the checkpoints, rolling logs back), ``records.py`` (the checked readers).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from project import internals
from project.errors import UsageError
from project.reliability import run_files, runs
from project.reliability.records import read_results, read_run_record


@dataclass(frozen=True)
class RunFolder:
    """``LOGDIR/NAME/VERSION``: one run's checkpoints, records, logs and outputs."""

    path: Path

    # ------------------------------------------------------------------ the run's own life

    @classmethod
    @contextmanager
    def opened(cls, config: Any, resuming: bool, recipe: str | None = None) -> Iterator[tuple[RunFolder | None, Any]]:
        """Claim the folder ``config`` names (or the next ``version_N``), hold it and record the start; yield it
        with the config that names it (``None`` for a run that writes no files: ``--fast-dev-run``, ranks other
        than 0). On the way out: how the run ended, recorded; a folder a refusal left empty, removed; the lock
        released."""

        named = Path(config.logdir) / config.name / str(config.run_version)
        existed = config.run_version is not None and named.exists()
        try:
            config = run_files.claim_run_folder(config, resuming=resuming, recipe=recipe)
            writes = internals.is_rank_zero() and not config.fast_dev_run
            folder = cls(Path(config.logdir) / config.name / str(config.run_version)) if writes else None
            try:
                yield folder, config
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
        runs.release_all()

    def record_end(self, error: BaseException | None) -> None:
        runs.end_record(self.path, error)

    def remove_if_refused(self) -> None:
        """A new run that Lightning's own checks refused leaves no folder behind (one with a checkpoint stays)."""
        import shutil

        if self.path.is_dir() and not (self.path / "checkpoints").exists():
            shutil.rmtree(self.path, ignore_errors=True)

    @classmethod
    def of(cls, trainer: Any) -> RunFolder:
        """The folder a Trainer's loggers write into (its checkpoints, model.pth, config.yaml, results.json)."""
        return cls(run_files.run_dir(trainer))

    @staticmethod
    def check_outputs_writable(config: Any) -> None:
        """An unwritable or full log folder, a taken ``--run-version`` or a bad export path: one line now, before
        the run trains."""
        run_files.check_outputs_writable(config)

    def save_config(self, config: Any, recipe: str | None = None) -> Path:
        return run_files.save_config(self.path, config, recipe)

    @property
    def saved_config(self) -> dict[str, Any]:
        """``config.yaml`` as the run saved it (empty where there is none)."""
        return run_files.read_config(self.path)

    @staticmethod
    def log_settings(trainer: Any, config: Any) -> None:
        """The exact command and the resolved settings, in TensorBoard's TEXT tab."""
        run_files.log_run_text(trainer, config)

    @staticmethod
    def log_hparams_with_results(trainer: Any, hparams: dict[str, Any], metrics: tuple[str, ...]) -> None:
        """TensorBoard's HPARAMS tab: every setting of the run with its real best and test accuracy."""
        run_files.log_hparams_with_results(trainer, hparams, metrics)

    def write_results(self, results: dict[str, Any]) -> Path:
        path = self.path / "results.json"
        run_files.write_results(path, results)
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

    def info(self) -> runs.RunInfo:
        """State, newest step, smoke limits, test accuracy, best checkpoint (``damaged`` with its reason)."""
        return runs.run_info(self.path)

    @property
    def best_checkpoint(self) -> Path | None:
        return runs.best_checkpoint(self.path)

    @property
    def last_checkpoint(self) -> Path | None:
        path = self.path / "checkpoints" / "last.ckpt"
        return path if path.is_file() else None

    @staticmethod
    def listed(logdir: str | os.PathLike, name: str) -> list[runs.RunInfo]:
        """Every run under ``logdir/name``, newest first (by when it started, whatever its folder is called)."""
        return runs.runs(logdir, name)

    @staticmethod
    def checkpoint(spec: str, logdir: str | os.PathLike, name: str, flag: str) -> tuple[Path, runs.RunInfo | None]:
        """``best`` / ``last``: that checkpoint of the newest run that has one (damaged and smoke runs passed over,
        and said); anything else is a path."""
        return runs.checkpoint_of(spec, logdir, name, flag)
