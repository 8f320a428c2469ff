"""``scripts/train.py`` with one fault injected, in every process (DDP re-runs this script for each rank).

``FAIL_RANK`` and ``FAIL_STEP``: that rank runs out of memory at that step. ``FILL_DISK`` (``PHASE:PATH``):
at PHASE, the file system holding PATH is filled up. ``STOP_AT`` (``PHASE:SIGNAL``):
the process sends itself SIGNAL (TERM, INT or KILL) at PHASE: ``start`` (before the first step),
``step-N`` (after the Lightning step that reaches optimizer step N), ``validation-E`` (mid-way through
epoch E's validation, from 0), ``test`` (mid-way through the test) or ``export`` (while ``model.pth`` is
written). ``STEP_SECONDS``: ``--steps-per-call auto`` reads this as every step's time, before the run and
during it, so that the K it chooses does not depend on how busy the machine is. Started by the tests.

In every process (the launcher, each rank Lightning starts, each rank ``ddp_spawn`` spawns) it says at exit
whether the process group was still open then: one left to the interpreter's exit can abort a finished run.
"""

import atexit
import importlib.util
import os
import signal
import sys
import time
from pathlib import Path

import lightning as L
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from helpers import fill_file_system  # noqa: E402
from project.config.cli import parse_run_command  # noqa: E402
from project.contract import installed_recipe  # noqa: E402
from project.errors import run_cli  # noqa: E402
from project.training import run, steps_per_call  # noqa: E402


def say_if_the_process_group_is_still_open() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        print(f"faulty_train.py: process {os.getpid()} exits with its process group still open", file=sys.stderr,
              flush=True)


atexit.register(say_if_the_process_group_is_still_open)  # at import: ddp_spawn's ranks import this file too


class FailAt(L.Callback):
    def __init__(self, rank: int, step: int) -> None:
        self.rank, self.step = rank, step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_rank == self.rank and trainer.global_step >= self.step:
            raise torch.OutOfMemoryError(f"CUDA out of memory (injected on rank {self.rank} at step "
                                         f"{trainer.global_step})")


class StopAt(L.Callback):
    """Sends the signal once, at the phase asked for."""

    def __init__(self, phase: str, signum: int) -> None:
        self.phase, self.signum, self.sent = phase, signum, False

    def act(self) -> None:
        os.kill(os.getpid(), self.signum)

    def send(self, phase: str, step: int | None = None) -> None:
        if step is not None and self.phase.startswith("step-"):
            phase = self.phase if step >= int(self.phase[5:]) else ""  # K > 1: steps come in groups
        if phase == self.phase and not self.sent:
            self.sent = True
            self.act()

    def on_train_start(self, trainer, pl_module):
        self.send("start")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.send("step", trainer.global_step)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if not trainer.sanity_checking and batch_idx == 1:
            self.send(f"validation-{trainer.current_epoch}")

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if batch_idx == 1:
            self.send("test")


class FillDiskAt(StopAt):
    """Fills the file system of ``path`` (a real ENOSPC for every write after it), at the phase asked for."""

    def __init__(self, phase: str, path: str) -> None:
        super().__init__(phase, 0)
        self.path = path

    def act(self) -> None:
        fill_file_system(Path(self.path))


def main() -> int:
    recipe = installed_recipe()
    config, given = parse_run_command(recipe)
    callbacks = []
    if "FAIL_RANK" in os.environ:
        callbacks.append(FailAt(int(os.environ["FAIL_RANK"]), int(os.environ["FAIL_STEP"])))
    stop = None
    if "STOP_AT" in os.environ:
        phase, name = os.environ["STOP_AT"].split(":")
        stop = StopAt(phase, getattr(signal, f"SIG{name}"))
    if "FILL_DISK" in os.environ:
        stop = FillDiskAt(*os.environ["FILL_DISK"].split(":", 1))
    if stop is not None:
        callbacks.append(stop)
        module_class = recipe.module_class()
        export_weights = module_class.export_weights

        def interrupted_export(*args, **kwargs):
            stop.send("export")
            return export_weights(*args, **kwargs)

        module_class.export_weights = interrupted_export
    if "STEP_SECONDS" in os.environ:
        seconds = float(os.environ["STEP_SECONDS"])
        steps_per_call.measure_step_seconds = lambda *args, **kwargs: seconds
        steps_per_call.AutoStepsPerCall.on_train_batch_end = \
            lambda self, trainer, module, *args: steps_per_call.stepper_of(module).retime(
                trainer, steps_per_call.StepTimes(seconds, steps_per_call.FIXED_COST_GUESS_S))
    train_script = _load_train_script()
    plain_train = run.train
    run.train = lambda config, recipe, **kwargs: plain_train(config, recipe, **kwargs, callbacks=callbacks)
    run_cli(lambda: train_script.main(recipe, config, given, time.perf_counter()), "train.py", debug=config.debug)
    return 0


def _load_train_script():
    """``scripts/train.py`` itself (what it prints, and when), with ``train`` given the faults."""
    spec = importlib.util.spec_from_file_location("train_script", ROOT / "scripts" / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    main()
