"""Optuna sweeps over the template's flags: search space from YAML, trials as real training runs."""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import optuna
import yaml
from lightning.pytorch.callbacks import Callback
from sqlalchemy.exc import SQLAlchemyError

from project.config.schema import RunConfig, Setting, resolve_config, settings_of
from project.config.validators import shown
from project.config.yaml_files import load_yaml
from project.contract import Recipe
from project.errors import NonFiniteLossError, Terminated, UsageError, UserError, first_line
from project.hardware.devices import expected_world_size
from project.reliability.run_folder import RunFolder
from project.sweeps.report import in_words
from project.sweeps.storage import (
    UNREADABLE_JOURNAL,
    describe,
    frozen_trial,
    open_storage,
    owner,
    retried_from,
    retry_dead_workers_trials,
    unreadable_study,
)
from project.sweeps.workers import Worker
from project.training.build import build_datamodule
from project.training.callbacks import quiet_lightning_info
from project.training.run import train
from project.training.tensor_data import TensorDataModule

TYPES = ("float", "int", "categorical")
TRAIN_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "train.py"


def load_space(path: str | Path, recipe: Recipe) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """``(fixed, params)`` from a sweep YAML for ``recipe``, checked key by key with errors that name the key."""
    document = load_yaml(str(path), str(path), "a mapping with 'params' (and optionally 'fixed')")
    for key in document:
        if key not in ("fixed", "params"):
            raise UsageError(f"{path}: unknown top-level key {shown(key)} (expected 'params' and 'fixed')")
    fixed, params = document.get("fixed") or {}, document.get("params") or {}
    if not isinstance(fixed, dict) or not isinstance(params, dict) or not params:
        raise UsageError(f"{path}: 'params' must map flag names to search specs (and 'fixed' to values)")
    settings = settings_of(recipe)
    for section, keys in (("fixed", fixed), ("params", params)):
        for key in keys:
            name = str(key).replace("-", "_")
            if name not in settings and name != "trainer":
                raise UsageError(f"{path}: {section}.{key}: not a train.py flag")
            if name in PER_TRIAL:
                raise UsageError(f"{path}: {section}.{key}: set by the sweep for each trial (its own run folder, "
                                 "a new run); leave it out of the space")
    for key, spec in params.items():
        name = str(key).replace("-", "_")
        _check_spec(path, name, spec, settings.get(name))
    resolve_config([(fixed, f"{path}: fixed")], recipe)  # a bad fixed value is reported now, not at the first trial
    return fixed, params


# A trial is a new run in a folder the sweep names: these belong to one invocation of train.py, not to a space.
PER_TRIAL = ("resume", "init_from", "run_version", "export", "export_pt2", "overwrite", "logdir", "name", "debug")


def _check_spec(path: str | Path, key: str, spec: Any, setting: Setting | None) -> None:
    """One parameter's search spec, and every value it can give checked as the flag checks it: a space that
    slipped through would fail its trials one by one instead."""
    where = f"{path}: params.{key}"
    if not isinstance(spec, dict) or spec.get("type") not in TYPES:
        raise UsageError(f"{where}: needs 'type: float', 'type: int' or 'type: categorical'")
    extra = set(spec) - {"type", "low", "high", "log", "step", "choices"}
    if extra:
        raise UsageError(f"{where}: unknown setting {shown(sorted(extra)[0])}")
    if spec["type"] == "categorical":
        if not isinstance(spec.get("choices"), list) or not spec["choices"]:
            raise UsageError(f"{where}: 'choices' must be a non-empty list")
        for choice in spec["choices"]:
            _check_value(where, key, choice, setting)
        return
    low: Any = spec.get("low")
    high: Any = spec.get("high")
    step: Any = spec.get("step")
    number = (int,) if spec["type"] == "int" else (int, float)
    for name, value in (("low", low), ("high", high), *((("step", step),) if step is not None else ())):
        if not isinstance(value, number) or isinstance(value, bool) or not math.isfinite(value):
            kind = "whole numbers" if spec["type"] == "int" else "finite numbers"
            raise UsageError(f"{where}: '{name}' must be one of the {kind} a type: {spec['type']} range takes, "
                             f"got {shown(value)}")
    if not low < high:
        raise UsageError(f"{where}: 'low' ({low}) must be below 'high' ({high})")
    if spec.get("log") and low <= 0:
        raise UsageError(f"{where}: a log scale needs 'low' > 0")
    if step is not None and step <= 0:
        raise UsageError(f"{where}: 'step' must be above 0, got {step}")
    if step is not None and spec.get("log"):
        raise UsageError(f"{where}: a log scale takes no 'step' (Optuna samples it continuously)")
    for value in (low, high):
        _check_value(where, key, value, setting)


def _check_value(where: str, key: str, value: Any, setting: Setting | None) -> None:
    if setting is None:  # trainer: checked against Trainer's signature when a trial's config is made
        return
    try:
        setting.check(value)
    except ValueError as err:
        raise UsageError(f"{where}: {shown(value)} is not a value --{key.replace('_', '-')} takes ({err})") from None


def suggest(trial: optuna.Trial, params: dict[str, dict[str, Any]]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for key, spec in params.items():
        if spec["type"] == "categorical":
            values[key] = trial.suggest_categorical(key, spec["choices"])
        elif spec["type"] == "int":
            values[key] = trial.suggest_int(key, int(spec["low"]), int(spec["high"]), log=bool(spec.get("log")),
                                            step=int(spec.get("step", 1)))
        else:
            values[key] = trial.suggest_float(key, float(spec["low"]), float(spec["high"]),
                                              log=bool(spec.get("log")), step=spec.get("step"))
    return values


class PruneOnValAcc(Callback):
    """Reports ``val/acc`` to Optuna each epoch; stops the run when the pruner says so."""

    def __init__(self, trial: optuna.Trial) -> None:
        self.trial = trial
        self.pruned = False
        self.epochs = 0

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or "val/acc" not in trainer.callback_metrics:
            return
        self.trial.report(float(trainer.callback_metrics["val/acc"]), step=trainer.current_epoch)
        if self.trial.should_prune():
            self.pruned = True
            self.epochs = trainer.current_epoch + 1
            trainer.should_stop = True


# sweep.py's flags that set a trial's setting: given, each overrides the space's `fixed`; left out, `fixed` or the
# recipe's default holds.
TRIAL_FLAGS = ("data_dir", "val_size", "accelerator")


def prepare(recipe: Recipe, args: argparse.Namespace) -> tuple[optuna.Study, optuna.storages.BaseStorage, Objective]:
    """The study ``sweep.py``'s arguments name (created or resumed) and the objective its trials run.

    Everything a user can get wrong (the space, the data, the storage) is checked here, before
    the study is opened, so no trial is ever recorded as failed for it.
    """
    fixed, params = load_space(args.space, recipe)
    quiet()
    folder = Path(args.logdir) / "sweeps" / args.study_name
    if "://" not in args.storage and Path(args.storage).parent == folder.parent:  # the default journal's folder
        try:
            folder.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise UsageError(f"--logdir {args.logdir}: cannot write there ({err.strerror or err})") from None
    given = {key: value for key in TRIAL_FLAGS if (value := getattr(args, key)) is not None}  # a flag over `fixed`
    base = {**given, "logdir": str(folder), "name": "trials", "trainer": {"enable_progress_bar": False}}
    objective = Objective(recipe, fixed, params, base, folder)
    build_datamodule(objective.trial_config({}), recipe).prepare_data()
    storage = open_storage(args.storage, args.heartbeat)
    try:
        study = open_study(args.study_name, storage, args.pruner, args.sampler_seed, args.sampler, params)
    except UNREADABLE_JOURNAL as err:
        raise unreadable_study(args.storage, err) from None
    check_same_space(study, params, args.study_name)
    leftover = sorted(p.name for p in (folder / "trials").glob("trial_*")) if (folder / "trials").is_dir() else []
    if leftover and not study.trials:
        raise UsageError(f"--study-name {args.study_name}: {folder / 'trials'} holds the trials of another study of "
                         f"this name ({leftover[0]}, ...), not in {describe(args.storage)}: choose another "
                         "--study-name or --logdir")
    return study, storage, objective


def check_same_space(study: optuna.Study, params: dict[str, dict[str, Any]], name: str) -> None:
    """A study resumed with another space would mix trials that searched different things."""
    before = {key for trial in study.trials for key in trial.params}
    if before and before != set(params):
        raise UsageError(f"--study-name {name}: its trials searched {', '.join(sorted(before))}; this space searches "
                         f"{', '.join(sorted(params))}: choose another --study-name for another space")


def open_study(name: str, storage: optuna.storages.BaseStorage | str, pruner: str, sampler_seed: int | None,
               sampler: str = "tpe", params: dict[str, dict[str, Any]] | None = None) -> optuna.Study:
    """The named study in ``storage`` (a storage, or a journal path or URL), created on first use and resumed after."""
    pruners: dict[str, Callable[[], optuna.pruners.BasePruner]] = {
        "median": lambda: optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=1),
        "halving": optuna.pruners.SuccessiveHalvingPruner, "none": optuna.pruners.NopPruner}
    samplers: dict[str, Callable[[], optuna.samplers.BaseSampler]] = {
        "tpe": lambda: optuna.samplers.TPESampler(seed=sampler_seed),
        "random": lambda: optuna.samplers.RandomSampler(seed=sampler_seed),
        "grid": lambda: optuna.samplers.GridSampler(grid(params or {}), seed=sampler_seed)}
    chosen = samplers[sampler]()
    storage = open_storage(storage) if isinstance(storage, str) else storage
    return optuna.create_study(study_name=name, storage=storage, direction="maximize", load_if_exists=True,
                               pruner=pruners[pruner](), sampler=chosen)


def run_trials(study: optuna.Study, storage: optuna.storages.BaseStorage, objective: Objective, n_trials: int) -> None:
    """This worker's trials; first, and after each, trials left running by a dead worker are enqueued again."""
    def recover(study: optuna.Study, _: object = None) -> None:
        for number in retry_dead_workers_trials(study, storage):
            print(f"trial {number}: its worker died; failed, and enqueued again", flush=True)

    recover(study)
    objective.trials_left = n_trials
    try:
        study.optimize(objective, n_trials=n_trials, callbacks=[recover])
    except (SQLAlchemyError, UnboundLocalError) as err:  # Optuna hides a lost connection as UnboundLocalError
        raise UserError(f"the study's storage stopped answering ({first_line(err)}); the trials that ended are in it: "
                        "run the same command again once it is back") from None


def grid(params: dict[str, dict[str, Any]]) -> dict[str, list[Any]]:
    """Every value each parameter takes in a grid search: its choices, or its range in steps."""
    values: dict[str, list[Any]] = {}
    for key, spec in params.items():
        if spec["type"] == "categorical":
            values[key] = list(spec["choices"])
        elif spec.get("step") is None and spec["type"] == "float":
            raise UsageError(f"--sampler grid: params.{key} needs 'choices' or a 'step' to be a grid")
        else:
            step, low, high = spec.get("step", 1), spec["low"], spec["high"]
            count = int(round((high - low) / step)) + 1
            values[key] = [low + i * step for i in range(count) if low + i * step <= high + 1e-12]
    return values


def grid_size(params: dict[str, dict[str, Any]]) -> int:
    return math.prod(len(v) for v in grid(params).values())


class Objective:
    """One trial = one ``train()`` run in this process, on data loaded once for all trials."""

    def __init__(self, recipe: Recipe, fixed: dict[str, Any], params: dict[str, Any], base: dict[str, Any],
                 folder: Path) -> None:
        self.recipe, self.fixed, self.params, self.base, self.folder = recipe, fixed, params, base, folder
        self.datamodule: TensorDataModule | None = None
        self.trials_left = 0  # of this worker's, set by run_trials
        self.seconds_each: list[float] = []  # the trials this worker ran, for its estimate of the rest

    def trial_config(self, values: dict[str, Any]) -> RunConfig:
        """The sweep's fixed settings, then this command's (data, logdir, ...), then the trial's sampled ones."""
        return resolve_config([(self.fixed, "fixed"), (self.base, "sweep.py"), (values, "params")], self.recipe)

    def __call__(self, trial: optuna.Trial) -> float:
        trial.set_user_attr("worker", owner())
        trial.set_user_attr("devices", Worker.current().describe())
        retried = retried_from(frozen_trial(trial.study, trial.number))
        config = self.trial_config(suggest(trial, self.params)).replace(run_version=f"trial_{trial.number:03d}")
        started = time.perf_counter()
        pruning = PruneOnValAcc(trial)
        self.trials_left = max(0, self.trials_left - 1)  # a diverged trial counts too
        try:
            if expected_world_size(config) > 1:
                best_val = train_in_own_process(config)
            else:
                if self.datamodule is None:
                    self.datamodule = build_datamodule(config, self.recipe)
                best_val = train(config, self.recipe, datamodule=self.datamodule, callbacks=[pruning],
                                 test=False).best_val
        except NonFiniteLossError as err:
            trial.set_user_attr("diverged", str(err))
            print(f"trial {trial.number}: diverged, pruned ({err})", flush=True)
            raise optuna.TrialPruned() from None
        except Terminated as err:  # Ctrl-C, SIGTERM: the sweep stops; this trial is recorded as failed
            stopped = Terminated(f"{str(err).split(' after ')[0].split(' before ')[0].split(' during ')[0]} during "
                                 f"trial {trial.number}; the trials that ended are in the study: run the same "
                                 "sweep.py command again to go on with it")
            stopped.exit_code = err.exit_code
            raise stopped from None
        seconds = time.perf_counter() - started
        self.seconds_each.append(seconds)
        state = f"pruned after {pruning.epochs} epoch(s)" if pruning.pruned else f"val/acc {best_val:.4f}"
        again = f" (repeats trial {retried})" if retried is not None else ""
        rest = (f"; about {in_words(time_left(self.seconds_each, self.trials_left))} for the {self.trials_left} "
                f"left at {in_words(statistics.fmean(self.seconds_each))} a trial" if self.trials_left else "")
        print(f"trial {trial.number}{again}: {state} in {seconds:.1f} s{rest}  {trial.params}", flush=True)
        if pruning.pruned:
            raise optuna.TrialPruned()
        return best_val


def time_left(seconds_each: list[float], trials_left: int) -> float:
    """The rest of a worker's trials at the mean time of those it ran (pruned ones included: they will be too)."""
    return statistics.fmean(seconds_each) * trials_left if seconds_each else math.nan


def train_in_own_process(config: RunConfig) -> float:
    """A trial on several devices runs as its own ``train.py``, and its ``results.json`` reports back.

    DDP starts its other ranks by running the current command again: that must be the trial's
    training run, not the whole sweep. Such trials are not pruned (they report only at the end).
    """
    run = Path(config.logdir) / config.name / str(config.run_version)
    with tempfile.TemporaryDirectory() as scratch:
        spec = Path(scratch) / "trial.yaml"
        spec.write_text(yaml.safe_dump({**config.to_mapping(), "fast_dev_run": config.fast_dev_run}))
        done = subprocess.run([sys.executable, str(TRAIN_SCRIPT), "--config", str(spec), "--run-version",
                               str(config.run_version)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1].removeprefix("train.py: error: ")
        if "became non-finite" in last:
            raise NonFiniteLossError(last)
        raise UserError(f"trial {config.run_version} (train.py --config, {config.devices} devices) failed: {last}")
    if config.fast_dev_run:  # writes no files
        return math.nan
    return float(RunFolder(run).results["val/acc_best"])


def quiet() -> None:
    """One line per trial instead of Lightning's and Optuna's banners for each."""
    quiet_lightning_info()
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # a failed trial's error is the sweep's one line
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    for importance_plot_note in ("Target and region quantiles select the same set",
                                 "The number of trials is too small to compute importances"):
        warnings.filterwarnings("ignore", message=importance_plot_note)
