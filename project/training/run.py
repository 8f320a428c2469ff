"""One training run: ``train(config, recipe)`` checks, builds, tunes, fits, tests, exports and records it."""

from __future__ import annotations

import errno
import math
import os
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from project.config.schema import RunConfig, settings_of
from project.contract import Recipe
from project.errors import Terminated, UsageError, UserError, first_line
from project.hardware.devices import (
    StepMode,
    expected_world_size,
    peak_memory_mb,
    release_cuda_cache,
    resolve_hardware,
    warm_up_cuda,
)
from project.reliability.checkpointing import LastCheckpoint, RunRecord, read_checkpoint
from project.reliability.processes import DdpJobEnd, StopAtSafePoints, StopSignals, stop_signals
from project.reliability.run_folder import RESULTS, WEIGHTS, RunFolder, last_checkpoint
from project.training.build import (
    OneFileTensorBoardLogger,
    build_datamodule,
    build_model,
    build_trainer,
    global_batch,
    log_hparams_with_results,
    log_settings,
)
from project.training.callbacks import EpochStats, find_callback, quiet_known_warnings
from project.training.classifier import ClassifierModule
from project.training.data_card import DataCard, announce, checked_data_card, log_card
from project.training.steps_per_call import Stepper, StepsTaken, plan_steps
from project.training.tensor_data import TensorDataModule, planned_steps, tensor_datamodule

if TYPE_CHECKING:  # the tuners, the export and the resume load only for a run that uses them
    from project.reliability.resume import Resume
    from project.training.tuning import LrScaling


@dataclass
class RunResult:
    """What a run produced; ``summary()`` is what ``train.py`` prints."""

    config: RunConfig  # as trained: precision resolved, the tuner's batch size and LR filled in
    is_global_zero: bool
    world_size: int
    devices: int  # per node
    global_batch: int
    test_metrics: dict[str, float]
    best_val: float
    peak_memory_mb: float
    device: str
    steps: StepsTaken  # K, why, and how the steps ran
    epoch_times: list[float] = field(default_factory=list)
    optimizer_steps: int = 0
    best_checkpoint: str | None = None
    last_checkpoint: str | None = None
    run_dir: Path | None = None
    weights: Path | None = None
    weights_kind: str = ""
    program: Path | None = None
    program_input: str = ""
    config_file: Path | None = None
    lr_scaling: LrScaling | None = None

    def record(self) -> dict[str, object]:
        """``results.json``: the run's numbers at full precision (``weights`` is set once it is written)."""
        config = self.config
        return {**self.test_metrics, "val/acc_best": self.best_val, "best_checkpoint": self.best_checkpoint,
                "last_checkpoint": self.last_checkpoint, "weights": str(self.weights) if self.weights else None,
                "global_batch": self.global_batch, "world_size": self.world_size, "precision": config.precision,
                "lr": config.lr}

    def scaled(self) -> str:
        scaling = self.lr_scaling
        if scaling is None:
            return ""
        why = f"--scale-lr auto: {self.world_size} processes" if scaling.auto else "--scale-lr"
        return f" ({scaling.given:g} x {scaling.batch}/{scaling.base_batch}, the linear scaling rule; {why})"

    def summary(self, with_test_metrics: bool = True) -> str:
        config = self.config
        memory = f"max allocated on {self.device}" if self.device.startswith("cuda") else "peak resident set"
        lines = [test_line(self.test_metrics)] if with_test_metrics else []
        lines += [
            f"global batch {self.global_batch} = {config.batch_size} per device x "
            f"{self.devices} device(s) x {config.num_nodes} node(s); "
            f"world size {self.world_size}; precision {config.precision}; lr {config.lr:g}{self.scaled()}",
            f"peak memory {self.peak_memory_mb:.0f} MiB ({memory})",
            f"steps per call {self.steps.k} ({self.steps.describe_k()})",
        ]
        if self.device.startswith("cuda") or self.steps.mode is not StepMode.OFF:
            lines.append(self.steps.describe_mode())
        if self.program:
            lines.append(f"portable program {self.program}  (torch.export.load(path).module(); {self.program_input})")
        if self.run_dir:
            lines += [
                f"best checkpoint  {self.best_checkpoint}  (val/acc {self.best_val:.4f})",
                f"last checkpoint  {self.last_checkpoint}",
                f"weights          {self.weights}  ({self.weights_kind})",
                f"config           {self.config_file}  (--config reproduces this run)",
                f"results          {self.run_dir / RESULTS}",
                f"TensorBoard      {tensorboard_command()} --logdir {self.run_dir.parent}  (this run: "
                f"{self.run_dir.name})",
            ]
        return "\n".join(lines)


def tensorboard_command() -> str:
    """TensorBoard as it runs from here in a new shell: the one beside this Python (a venv's, not on the PATH until
    the venv is activated), relative to this folder where it is under it."""
    beside = Path(sys.executable).parent / "tensorboard"
    if not beside.is_file():
        return "tensorboard"
    try:
        return str(beside.relative_to(Path.cwd()))
    except ValueError:
        return str(beside)


def test_line(metrics: dict[str, float]) -> str:
    return f"test/acc {metrics.get('test/acc', math.nan):.4f}   test/loss {metrics.get('test/loss', math.nan):.4f}"


@dataclass
class Plan:
    """A run worked out and checked, before its folder exists: what ``train`` then runs."""

    config: RunConfig
    datamodule: TensorDataModule
    model: ClassifierModule
    resume: Resume | None
    stepper: Stepper
    card: DataCard


def train(config: RunConfig, recipe: Recipe, *, datamodule: TensorDataModule | None = None,
          callbacks: Sequence[Callback] = (), test: bool = True,
          on_tested: Callable[[dict[str, float]], None] | None = None) -> RunResult:
    """Run ``config`` (a ``RunConfig`` of ``recipe``) end to end. Every rank returns; only rank 0 writes files.

    ``datamodule`` lets several runs share data loaded once (sweeps), ``callbacks`` are added to
    the template's, ``test=False`` stops after fitting, ``on_tested`` receives the test metrics
    (on rank 0) as soon as they exist, before anything that could still fail.
    """
    quiet_known_warnings()
    check_made_for(config, recipe)
    warm_up_cuda(config.accelerator)
    L.seed_everything(config.seed, workers=True, verbose=False)
    job_end = DdpJobEnd()
    try:
        plan = plan_run(config, recipe, datamodule, test)
        with RunFolder.opened(plan.config, resuming=plan.resume is not None, recipe=recipe.package) as (folder,
                                                                                                          version):
            result = run_plan(plan, recipe, folder, version, [job_end, *callbacks], test, on_tested)
    finally:
        RunFolder.release_all()  # a resume's folder is held from the moment it is chosen
        job_end.end(sys.exc_info()[1])
    return result


def check_made_for(config: RunConfig, recipe: Recipe) -> None:
    """A config made for another recipe (or with none: ``RunConfig()``) would train with options the model does not
    take: one line instead of a TypeError deep in the model."""
    if set(config.options) != set(recipe.options):
        given = ", ".join(config.options) or "none"
        raise UsageError(f"this config holds the options {given}, recipe {recipe.name!r} takes "
                         f"{', '.join(recipe.options) or 'none'}: make it with RunConfig.for_recipe(recipe, ...)")


def plan_run(asked: RunConfig, recipe: Recipe, given: TensorDataModule | None, test: bool) -> Plan:
    """Everything a run can be refused for, checked before anything is written: hardware, data, settings, the
    checkpoint to resume (its folder then held by this process), outputs, steps per call, CUDA graphs, the model.

    The plan's config is the one the run keeps: ``asked`` with its precision resolved for this
    machine, its data folder as found, and a resume's folder and steps per call; its datamodule is
    ``given`` (or the recipe's), batched as planned.
    """
    here = resolve_hardware(asked)
    source = given if given is not None else build_datamodule(here, recipe)
    source.prepare_data()  # a missing dataset is reported before any process starts
    train_size, world_size = source.train_size(), expected_world_size(here)
    if test:
        source.setup("test")  # a test set the recipe cannot use is said now, not after the training
    steps = planned_steps(here, train_size, world_size)  # settings that would train on nothing: refused now
    card = checked_data_card(source)  # statistics declared wrong: refused now
    resume, carried = None, {}
    if here.resume:
        from project.reliability.resume import checkpoint_to_resume, continue_in_its_folder

        resume = checkpoint_to_resume(here, recipe, steps, world_size)
        carried = continue_in_its_folder(here, resume)
    # The data folder as found (DATA_DIR, data/): the run's scripts use it again later.
    found = str(source.data_dir.resolve()) if here.data_dir is None else here.data_dir
    config = here.replace(data_dir=found, **carried)
    RunFolder.check_outputs_writable(config)
    stepper = Stepper(plan_steps(config, source, lambda trial: build_model(trial, recipe),
                                 resume.auto_steps_per_call() if resume else None))
    datamodule = source.for_run(config.batch_size, config.eval_batch_size, stepper.train_batches)
    model = build_model(config, recipe, stepper)
    if config.init_from:
        from project.reliability.resume import load_initial_weights

        load_initial_weights(model, config, recipe)
    if resume is not None:
        resume.check_fits(model)
    if config.export_pt2:
        from project.results.export import check_exportable

        check_exportable(model, datamodule.input_shape)
    announce(card)
    return Plan(config, datamodule, model, resume, stepper, card)


def run_plan(plan: Plan, recipe: Recipe, folder: RunFolder | None, version: str | None,
             callbacks: Sequence[Callback], test: bool,
             on_tested: Callable[[dict[str, float]], None] | None) -> RunResult:
    """Fit, test and record the planned run in its claimed folder (``folder`` on rank 0; ``version``: its name)."""
    config, datamodule, model, resume = plan.config, plan.datamodule, plan.model, plan.resume
    with stop_signals() as signals:
        stopper, record = StopAtSafePoints(signals), RunRecord(config, plan.stepper)
        trainer = build_trainer(config, [*callbacks, record, stopper],
                                steps_per_epoch=datamodule.steps_per_epoch() if plan.stepper.plan.grouped else None,
                                version=version)
        try:
            tuning = None
            if config.tunes(trainer.world_size):
                from project.training.tuning import tune

                tuning = tune(trainer, model, datamodule, config, base_batch=settings_of(recipe)["batch_size"].default)
            trained = tuning.trained(config) if tuning is not None else config
            record.config = trained
            log_settings(trainer, trained)
            log_card(trainer, plan.card)
            config_file = folder.save_config(trained, recipe.package) if folder is not None else None
            with reported_failures(folder.path if folder is not None else None):
                best, last, best_val = fit(trainer, model, datamodule, resume, stopper)
                metrics = run_test(trainer, model, datamodule, best, signals) if test else {}
            stats = find_callback(trainer, EpochStats)
            device = trainer.strategy.root_device
            result = RunResult(
                config=trained, is_global_zero=trainer.is_global_zero, world_size=trainer.world_size,
                devices=trainer.num_devices, global_batch=global_batch(trainer, trained.batch_size),
                test_metrics=dict(metrics), best_val=best_val,
                peak_memory_mb=peak_memory_mb(device), device=str(device),
                epoch_times=stats.epoch_times if stats else [], best_checkpoint=best, last_checkpoint=last,
                config_file=config_file, optimizer_steps=trainer.global_step,
                steps=plan.stepper.taken(),
                lr_scaling=tuning.scaling if tuning is not None else None,
            )
            if folder is not None and trainer.is_global_zero:  # rank 0 of a run that writes files
                finish(trainer, model, result, folder, signals, on_tested if test else None)
        finally:
            close_loggers(trainer)
    return result


def close_loggers(trainer: L.Trainer) -> None:
    """The run's event file ends with the run (``OneFileTensorBoardLogger`` keeps it open from fit to test)."""
    for logger in trainer.loggers:
        if isinstance(logger, OneFileTensorBoardLogger):
            logger.close()


def finish(trainer: L.Trainer, model: ClassifierModule, result: RunResult, folder: RunFolder, signals: StopSignals,
           on_tested: Callable[[dict[str, float]], None] | None) -> None:
    """Rank 0's last phase: the results first (nothing that fails after can lose them), then the outputs."""
    result.run_dir = folder.path
    folder.write_results(result.record())
    if on_tested is not None:
        on_tested(result.test_metrics)
    signals.check("after the test (its metrics are above); model.pth is not written yet: continue with --resume last")
    with reported_failures(folder.path, kept="the test metrics are above and in results.json"):
        write_outputs(trainer, model, result, folder)
    if signals.received is not None:
        print(f"train.py: {signals.name()} came while the outputs were written; they are complete and the run is "
              "finished", file=sys.stderr, flush=True)


def fit(trainer: L.Trainer, model: L.LightningModule, datamodule: L.LightningDataModule, resume: Resume | None,
        stopper: StopAtSafePoints) -> tuple[str | None, str | None, float]:
    """``trainer.fit``, stopped by a signal only where it can resume exactly; best and last checkpoints."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    try:
        trainer.fit(model, datamodule=datamodule, ckpt_path=str(resume.path) if resume else None)
    except SIGTERMException:
        raise stopper.signals.terminated(stopper.where(resume is not None)) from None
    stopper.signals.check(stopper.where(resume is not None))
    release_cuda_cache()
    # Read before test(): restoring the best checkpoint also restores the callbacks' old state.
    return checkpoint_paths(trainer)


def run_test(trainer: L.Trainer, model: L.LightningModule, datamodule: L.LightningDataModule, best: str | None,
             signals: StopSignals) -> dict[str, float]:
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    try:
        metrics = trainer.test(model, datamodule=datamodule, ckpt_path=best, verbose=False)[0]
    except SIGTERMException:
        raise signals.terminated("during the test; training is complete: continue with --resume last (it tests "
                                 "and exports)") from None
    release_cuda_cache()
    return dict(metrics)


def checkpoint_paths(trainer: L.Trainer) -> tuple[str | None, str | None, float]:
    """Best and last checkpoint paths (None where nothing was saved), and the best ``val/acc``: the best
    checkpoint's score, else the logged ``val/acc_best`` (no checkpoints under fast_dev_run), else NaN."""
    last = next((cb for cb in trainer.checkpoint_callbacks if isinstance(cb, LastCheckpoint)), None)
    best = next((cb for cb in trainer.checkpoint_callbacks
                 if isinstance(cb, ModelCheckpoint) and not isinstance(cb, LastCheckpoint)), None)
    last_path = last.best_model_path if last else None
    kept = RunFolder.of(trainer).last_checkpoint
    if last and not last_path and kept is not None:
        last_path = str(kept)  # ddp_spawn keeps it in the workers
    best_path = best.best_model_path if best and best.best_model_path else None
    score = best.best_model_score if best is not None and best_path else None
    if best_path and score is None:  # ddp_spawn: the workers hand back the best path but not its score
        state = read_checkpoint(best_path).get("callbacks", {})
        score = next((s["best_model_score"] for s in state.values()
                      if isinstance(s, dict) and s.get("best_model_path") == best_path), None)
    if score is None:
        score = trainer.callback_metrics.get("val/acc_best")
    return best_path, last_path, math.nan if score is None else float(score)


def write_outputs(trainer: L.Trainer, model: ClassifierModule, result: RunResult, folder: RunFolder) -> None:
    """``model.pth`` (and ``.pt2``), HPARAMS with the real results, and the final ``results.json``; rank 0 only."""
    config = result.config
    result.weights, result.weights_kind = model.export_weights(config.export or folder.path / WEIGHTS)
    if config.export_pt2:
        from project.results.export import save_program

        network, result.program_input = model.portable_network()
        result.program = save_program(network, tensor_datamodule(trainer).input_shape, config.export_pt2)
    settings = {key: value for key, value in config.to_mapping().items() if key != "trainer"}
    trainer_args = {f"trainer.{key}": value for key, value in config.trainer.items()}
    hparams = {**settings, **trainer_args, "global_batch": result.global_batch, "world_size": result.world_size}
    metrics = ("val/acc_best", *(("test/acc",) if result.test_metrics else ()))
    log_hparams_with_results(trainer, hparams, metrics)
    folder.write_results(result.record())


@contextmanager
def reported_failures(run_folder: Path | None = None, kept: str | None = None) -> Iterator[None]:
    """Turn the failures a user causes or expects into one-line errors with a non-zero exit (``run_folder``: where a
    failed write says what it kept; ``kept``: what survives it, where that is not a checkpoint).

    Lightning exits with status 0 on SIGTERM, which schedulers and scripts would read as success.
    """
    from lightning.fabric.utilities.exceptions import MisconfigurationException
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    try:
        yield
    except MisconfigurationException as err:  # Lightning's word on a setting (often a --trainer. one)
        raise UsageError(first_line(err)) from None
    except ValueError as err:
        if not _raised_by_lightning(err):
            raise
        raise UsageError(first_line(err)) from None  # Lightning checking a setting as it runs
    except SIGTERMException:
        raise Terminated("stopped by SIGTERM") from None
    except OSError as err:  # a full disk, a folder that went away: while writing a checkpoint or the outputs
        raise UserError(failed_write(err, run_folder, kept)) from None
    except torch.OutOfMemoryError as err:
        first = first_line(err) if str(err) else "CUDA out of memory"
        raise UserError(
            f"{first}; lower --batch-size, try --precision 16-mixed, or raise --gpu-memory-fraction"
        ) from None
    except RuntimeError as err:
        if not _peer_failed(err):
            raise
        raise UserError("another process of this DDP job failed (its error is above), so this one stopped too; "
                        "the newest checkpoint is kept") from None


def failed_write(err: OSError, run_folder: Path | None, kept: str | None = None) -> str:
    """A write that failed, said as it is: its cause (a full disk, a file size limit), what is on disk now, and the
    way on from there."""
    where = f" {err.filename}" if err.filename else " the run's files"
    fix = "raise the file size limit (ulimit -f)" if err.errno == errno.EFBIG else "free space"
    last = last_checkpoint(run_folder) if run_folder is not None else None
    if kept is None and (last is None or not last.is_file()):
        return (f"cannot write{where} ({err.strerror or err}); no checkpoint was written yet, nothing to resume: "
                f"{fix} and start the run again")
    return f"cannot write{where} ({err.strerror or err}); {kept or f'{last} is kept'}: {fix} and continue with " \
           "--resume last"


def _raised_by_lightning(err: BaseException) -> bool:
    """Whether Lightning's own code raised ``err`` (it checks some settings, such as ``val_check_interval``
    against the data, only when the fit starts)."""
    frames = traceback.extract_tb(err.__traceback__)
    return bool(frames) and f"{os.sep}lightning{os.sep}" in frames[-1].filename


def _peer_failed(err: RuntimeError) -> bool:
    """A collective broke because another rank's process ended (gloo and NCCL say it differently)."""
    text = str(err)
    return isinstance(err, torch.distributed.DistError) or "remote worker crashing" in text or \
        "Connection closed by peer" in text or "Connection reset by peer" in text
