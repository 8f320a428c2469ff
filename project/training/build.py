"""The three objects of a run, built from its ``RunConfig``: the recipe's datamodule and module, and the Trainer."""

from __future__ import annotations

import contextlib
import csv
import importlib.util
import re
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import (
    Callback,
    DeviceStatsMonitor,
    EarlyStopping,
)
from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger
from lightning.pytorch.profilers import PassThroughProfiler
from lightning.pytorch.utilities import rank_zero_only

from project import LOGGERS
from project.config.schema import RunConfig
from project.config.validators import flag_value, names_from, registered, registries_problem
from project.contract import Recipe
from project.errors import UsageError, first_line, redact, redact_values
from project.internals import file_writer, opened_experiment
from project.reliability.checkpointing import AtomicCheckpointIO, BestCheckpoints, LastCheckpoint
from project.reliability.processes import cluster_plugins
from project.reliability.run_folder import BEST_FILENAME, run_dir, tensorboard_of
from project.results.figures import ModelInTensorBoard, TensorBoardFigures
from project.training.callbacks import (
    EpochLines,
    EpochStats,
    FiniteLossGuard,
    GpuMemoryFraction,
    LoggedLossBar,
    QuietWarnings,
    ScheduleResumeCheck,
    grouped,
)
from project.training.classifier import ClassifierModule
from project.training.steps_per_call import AutoStepsPerCall, SharedStepCount, Stepper, StepProgressBar
from project.training.tensor_data import TensorDataModule


def build_datamodule(config: RunConfig, recipe: Recipe, per_sample: bool | None = None) -> TensorDataModule:
    """The recipe's datamodule for ``config`` (``per_sample``: read its samples one by one even where it could hold
    them in memory, as the benchmark compares)."""
    return recipe.datamodule_class()(
        data_dir=config.data_dir, batch_size=config.batch_size, eval_batch_size=config.eval_batch_size,
        num_workers=config.num_workers, pin_memory=config.pin_memory, val_size=config.val_size, seed=config.seed,
        per_sample=per_sample,
    )


def build_model(config: RunConfig, recipe: Recipe, stepper: Stepper | None = None) -> ClassifierModule:
    """The recipe's module: its own options from ``config``, the engine's training settings, and how its steps are
    taken (``stepper``; default: Lightning's own)."""
    try:
        model = recipe.module_class()(**config.options, optimizer=config.optimizer, lr=config.lr,
                                      momentum=config.momentum, weight_decay=config.weight_decay,
                                      scheduler=config.scheduler, warmup_steps=config.warmup_steps)
    except RuntimeError as err:  # torch.OutOfMemoryError too
        if "alloc" not in str(err) and "out of memory" not in str(err):
            raise
        asked = re.search(r"allocate (\d+) bytes", str(err))
        size = f"{int(asked.group(1)) / 2**30:,.1f} GiB for one tensor" if asked else first_line(err)
        options = ", ".join(f"--{name.replace('_', '-')} {flag_value(value)}" for name, value in config.options.items())
        raise UsageError(f"the model does not fit in memory ({size}); choose smaller options ({options})") from None
    if stepper is not None:
        model.use_stepper(stepper)
    if config.compile:
        model.model.compile(mode=None if config.compile == "default" else config.compile)
    return model


def _installed(package: str) -> None:
    if importlib.util.find_spec(package) is None:
        raise UsageError(f"--logger {package} needs the {package} package: pip install -e '.[{package}]'")


def _wandb(config: RunConfig, version: int | str | None) -> Logger:
    _installed("wandb")
    from lightning.pytorch.loggers import WandbLogger

    return WandbLogger(project=config.name, save_dir=config.logdir)


def _mlflow(config: RunConfig, version: int | str | None) -> Logger:
    _installed("mlflow")
    from lightning.pytorch.loggers import MLFlowLogger

    return MLFlowLogger(experiment_name=config.name, save_dir=str(Path(config.logdir) / "mlruns"))


# --logger NAME -> its builder, given the run's config and folder name (None: the next version_N). A logger that
# writes into LOGDIR/NAME/VERSION takes ``version``; the engine's TensorBoard and CSV loggers always do.
LOGGER_BUILDERS: dict[str, Callable[[RunConfig, int | str | None], Logger]] = {
    "tensorboard": lambda config, version: OneFileTensorBoardLogger(config.logdir, name=config.name, version=version,
                                                                    default_hp_metric=False),
    "csv": lambda config, version: AppendingCSVLogger(config.logdir, name=config.name, version=version),
    "wandb": _wandb,
    "mlflow": _mlflow,
}
_DISAGREE = registries_problem(LOGGERS, LOGGER_BUILDERS, "LOGGERS", __name__)
if _DISAGREE:
    raise UsageError(_DISAGREE)


def build_loggers(config: RunConfig, version: str | None) -> list[Logger]:
    """``--logger tensorboard,csv,...``: all write into the same run folder, ``LOGDIR/NAME/VERSION`` (``version``: the
    claimed folder's name; None: the loggers' next ``version_N``)."""
    try:  # the setting's own check, for a RunConfig built in code too
        names = names_from(*LOGGER_BUILDERS)(config.logger).split(",")
    except ValueError as err:
        raise UsageError(f"--logger: {err}") from None
    builders = [registered(LOGGER_BUILDERS, name, "--logger") for name in names]
    loggers: list[Logger] = []
    joined: int | str | None = version
    for build in builders:
        logger = build(config, joined)
        if joined is None and isinstance(logger, (TensorBoardLogger, CSVLogger)):
            joined = logger.version  # the next loggers join this run's folder
        loggers.append(logger)
    if not any(isinstance(logger, (TensorBoardLogger, CSVLogger)) for logger in loggers):
        raise UsageError(f"--logger {config.logger}: the run's folder (its checkpoints, model.pth, results.json) is "
                         f"where a TensorBoard or CSV logger writes, and none is named; add one: --logger "
                         f"tensorboard,{config.logger}")
    return loggers


class OneFileTensorBoardLogger(TensorBoardLogger):
    """Lightning's TensorBoard logger, writing one event file for the whole run.

    Lightning finalizes its loggers after fit and after test, and the next write opens a new file,
    named with a counter that sorts as text: in a process that has made ten writers (a sweep's
    trials, a resumed run in the tests) ``.10`` comes before ``.9``, and TensorBoard reads the test's
    file before the training's. Here ``finalize`` flushes; ``close`` ends the file with the run.
    """

    @rank_zero_only
    def finalize(self, status: str) -> None:
        if (writer := opened_experiment(self)) is not None:
            writer.flush()
        if status == "success":
            self.save()

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        # Lightning adds the epoch to every logged row: a curve that says nothing a step axis does not.
        super().log_metrics({k: v for k, v in metrics.items() if k != "epoch"}, step)

    @rank_zero_only
    def log_results(self, hparams: dict[str, Any], metrics: tuple[str, ...]) -> None:
        """The HPARAMS tab: every setting of the run beside the metric tags it already logged (``val/acc_best``,
        ``test/acc``), read from their curves; nothing logged twice, no extra points at step 0."""
        from torch.utils.tensorboard.summary import hparams as hparams_summary

        plain = {key: value if isinstance(value, (bool, int, float, str)) else str(value)
                 for key, value in hparams.items()}
        writer = file_writer(self.experiment)
        for summary in hparams_summary(plain, dict.fromkeys(metrics, 0.0)):
            writer.add_summary(summary)
        self.experiment.flush()

    @rank_zero_only
    def close(self) -> None:
        if (writer := opened_experiment(self)) is not None:
            writer.close()


def log_settings(trainer: L.Trainer, config: RunConfig) -> None:
    """The exact command and the resolved settings, in TensorBoard's TEXT tab."""
    tensorboard = tensorboard_of(trainer)
    if tensorboard is None:
        return
    command = " ".join(shlex.quote(redact(part)) for part in [Path(sys.executable).name, *sys.argv])
    settings = {**config.to_mapping(), "world_size": trainer.world_size}
    rows = "\n".join(f"| {k} | `{redact(str(v))}` |" for k, v in settings.items())
    table = "| setting | value |\n|---|---|\n" + rows
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


class AppendingCSVLogger(CSVLogger):
    """Lightning's CSV logger, continuing a resumed run's ``metrics.csv``: Lightning's own writer deletes the file
    it finds and starts with no columns. The rows from before the checkpoint are put back, and the writer
    goes on under their header."""

    @property
    def experiment(self) -> Any:
        if (writer := opened_experiment(self)) is not None:
            return writer
        path = Path(self.log_dir) / "metrics.csv"
        kept = path.read_bytes() if path.is_file() else None
        writer = super().experiment
        if kept is not None:
            path.write_bytes(kept)
            with open(path, newline="") as stream:
                writer.metrics_keys = next(csv.reader(stream), [])
        return writer


def build_callbacks(config: RunConfig, steps_per_epoch: int | None = None) -> list[Callback]:
    """The template's callbacks; each is cheap next to a small model's step.

    ``steps_per_epoch`` is given when each Lightning step takes several optimizer steps: the
    progress bar then counts optimizer steps, and the step loop logs the LR itself.
    """
    callbacks: list[Callback] = [QuietWarnings(), FiniteLossGuard(),
                                 ScheduleResumeCheck(), SharedStepCount()]
    if config.gpu_memory_fraction is not None:
        callbacks.append(GpuMemoryFraction(config.gpu_memory_fraction))
    if steps_per_epoch and config.steps_per_call == "auto":
        callbacks.append(AutoStepsPerCall())
    if animated_progress(config):
        callbacks.append(StepProgressBar(steps_per_epoch) if steps_per_epoch else LoggedLossBar())
    elif "enable_progress_bar" not in config.trainer:
        callbacks.append(EpochLines())
    if config.fast_dev_run:
        return callbacks
    if config.trainer.get("enable_checkpointing", True):
        callbacks += [
            BestCheckpoints(monitor="val/acc", mode="max", save_top_k=config.save_top_k,
                            filename=BEST_FILENAME, auto_insert_metric_name=False),
            # Not save_last=True: Lightning writes that only when the best improves, and a
            # resume needs the newest state whether or not it was the best.
            LastCheckpoint(every_n_train_steps=config.checkpoint_every_n_steps),
        ]
    if config.early_stopping is not None:
        callbacks.append(EarlyStopping(monitor="val/acc", mode="max", patience=config.early_stopping))
    callbacks += [EpochStats(), TensorBoardFigures(), ModelInTensorBoard(config.log_histograms, config.log_graph)]
    if config.device_stats:
        callbacks.append(DeviceStatsMonitor(cpu_stats=True))
    return callbacks


class NoProfiler(PassThroughProfiler):
    """Lightning's default profiler, which profiles nothing, without a generator context manager around each of the
    ~180 hook calls of a training step (about 1.2 µs each). ``--trainer.profiler simple`` still profiles."""

    _NOTHING = contextlib.nullcontext()

    def profile(self, action_name: str) -> Any:
        return self._NOTHING


def build_trainer(config: RunConfig, callbacks: Sequence[Callback] = (), steps_per_epoch: int | None = None,
                  version: str | None = None) -> L.Trainer:
    """The Trainer for ``config`` (its precision already resolved), plus any extra callbacks, logging into the run
    folder ``version`` (``RunFolder.opened``).

    ``config.trainer`` (``--trainer.KEY VALUE``) is applied last, so any Trainer argument can be set.
    """
    settings: dict[str, Any] = dict(
        accelerator=config.accelerator,
        devices=config.devices,
        num_nodes=config.num_nodes,
        strategy=config.strategy,
        precision=config.precision,
        max_epochs=config.max_epochs,
        deterministic=config.deterministic,
        detect_anomaly=config.detect_anomaly,
        fast_dev_run=config.fast_dev_run,
        logger=False if config.fast_dev_run else build_loggers(config, version),
        callbacks=grouped([*build_callbacks(config, steps_per_epoch), *callbacks]),
        log_every_n_steps=config.log_every_n_steps,
        enable_model_summary=False,
        enable_progress_bar=animated_progress(config),
        default_root_dir=config.logdir,  # where the tuner's temporary checkpoints go
        profiler=NoProfiler(),
        plugins=[AtomicCheckpointIO(), *cluster_plugins()],
        # The datamodule shards every split itself (resumable, evaluation unpadded); Lightning's own
        # sampler cannot wrap the one-process batch sampler that a one-device DDP or FSDP run keeps.
        use_distributed_sampler=False,
    )
    return L.Trainer(**{**settings, **config.trainer})


def animated_progress(config: RunConfig) -> bool:
    """The animated bar where someone watches stderr; piped or redirected, one line per epoch instead."""
    return bool(config.trainer.get("enable_progress_bar", sys.stderr.isatty()))


def global_batch(trainer: L.Trainer, batch_size: int) -> int:
    """Samples per optimizer step across every device of every node."""
    return batch_size * trainer.num_devices * trainer.num_nodes

