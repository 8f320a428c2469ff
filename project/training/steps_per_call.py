"""Several optimizer steps per Lightning step: the same training, without Lightning's per-step cost each time.

Lightning spends a fixed few hundred microseconds per training step (hooks, progress tracking,
the optimizer closure); for a small model that is as long as the step's math. Here one Lightning
step receives a *group* of consecutive batches of the epoch's order and runs one plain per-batch
function and one optimizer step for each: the same batches in the same order, the same LR at
every step, the same weights. Groups end wherever something counted in steps must happen (a
logging step, a checkpoint step, the end of the epoch), so all of those stay exact.

``Stepper`` is the one owner of a run's training step, and what ``ClassifierModule`` calls: the
plan made before the run (``plan_steps``: K, why, and how the steps run, ``StepMode``), the
groups, the device-side steps and their CUDA graphs (``project/hardware/device_step.py``).
"""

from __future__ import annotations

import collections
import copy
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from project import internals
from project.config.schema import TRAINER_ARGUMENTS, RunConfig
from project.config.validators import changes_the_default
from project.errors import UsageError
from project.hardware.devices import StepMode, capture_plan
from project.training.callbacks import FetchClock, FetchProfiler, LoggedLossBar, log_every
from project.training.tensor_data import EpochBatches, StepGroups, batches_of, tensor_datamodule

if TYPE_CHECKING:
    from project.hardware.device_step import StepRunner

AUTO_MAX = 64
# The fixed cost of one Lightning step (its loop, hooks and callbacks, the template's own): auto chooses K so that
# it is at most ~2.5 % of K steps' math. Before the run has timed its own (its first groups), a first guess: bare
# Lightning minus the hand-written loop in scripts/benchmark.py, per step, on the 2-core CPU.
FIXED_COST_GUESS_S = 1e-3
OVERHEAD_SHARE = 0.025
TIMED_GROUPS = 8  # auto follows the median of the run's last groups: one slow moment moves nothing
# Strategies whose wrapper must see each forward and backward (sharding, offloading), even on one device.
WRAPS_THE_FORWARD = ("fsdp", "deepspeed")


def why_one_step(config: RunConfig, world_size: int, per_sample: bool = False) -> str | None:
    """Why this run must take one optimizer step per Lightning step (None if it need not)."""
    if world_size > 1:
        return "DDP all-reduces gradients once per forward of its wrapper, so each Lightning step takes one batch"
    wrapping = next((name for name in WRAPS_THE_FORWARD if name in str(config.strategy).lower()), None)
    if wrapping:
        return f"--strategy {config.strategy} wraps the model's forward, and a Lightning step must be one forward " \
               "and backward of it"
    if config.fast_dev_run:
        return "--fast-dev-run runs one batch per stage"
    if config.wants_tuner:
        return "the tuners drive Lightning's own loop"
    if per_sample:
        return "the recipe reads its samples one by one from load_samples: a batch per Lightning step"
    passed = [key for key, argument in TRAINER_ARGUMENTS.items()
              if argument.counts_steps and changes_the_default(key, config.trainer)]
    if passed:
        return f"--trainer.{passed[0]} counts Lightning steps"
    return None


@dataclass(frozen=True)
class StepsPerCall:
    """How many optimizer steps one Lightning step takes, and why."""

    k: int
    why: str
    auto: bool = False  # chosen by --steps-per-call auto
    until_captured: bool = False  # auto's K for a captured step, until the capture has timed it

    def describe(self) -> str:
        return f"auto: {self.why}" if self.auto else self.why


@dataclass(frozen=True)
class StepPlan:
    """How a run takes its steps, decided before it starts."""

    steps: StepsPerCall
    mode: StepMode
    mode_reason: str
    grouped: bool  # batches come in groups and the module steps the optimizer itself (auto may raise a K of 1)
    follows_timing: bool  # K follows the run's measured step time (--steps-per-call auto)
    group_ends_every: tuple[int, ...] = ()  # step counts at which a group must end (logging, checkpoints)


def choose_steps_per_call(config: RunConfig, world_size: int, device: torch.device, datamodule: Any = None,
                          new_model: Callable[[RunConfig], Any] | None = None) -> StepsPerCall:
    """``--steps-per-call`` if given and possible, else K from the measured step time (of the recipe's model,
    ``new_model(config)``, on a batch of ``datamodule``'s training split)."""
    reason = why_one_step(config, world_size, bool(getattr(datamodule, "per_sample", False)))
    if isinstance(asked := config.steps_per_call, int):
        if reason and asked > 1:
            raise UsageError(f"--steps-per-call {asked}: not possible here ({reason}); use --steps-per-call 1 or auto")
        return StepsPerCall(asked, "as asked")
    if reason:
        return StepsPerCall(1, reason, auto=True)
    if device.type == "cuda" and _will_capture(config):
        return StepsPerCall(steps_for(0.0001, config.log_every_n_steps), "from the captured step's time", auto=True,
                            until_captured=True)
    if new_model is None:
        raise ValueError("auto steps per call times the recipe's model: new_model is needed")
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):  # leave the run's seeds alone
        step = measure_step_seconds(config, datamodule, device, new_model)
    return StepsPerCall(steps_for(step, config.log_every_n_steps), f"a step's math takes {step * 1e3:.2f} ms, "
                        f"a call's fixed cost {FIXED_COST_GUESS_S * 1e3:.1f} ms as first guessed", auto=True)


def _will_capture(config: RunConfig) -> bool:
    """Whether the run's steps will be captured: their time is measured then, an eager probe would be wasted."""
    mode, _ = capture_plan(config.replace(cuda_graphs="auto" if config.cuda_graphs else False), "cuda", AUTO_MAX)
    return mode is StepMode.GRAPHS


def plan_steps(config: RunConfig, datamodule: Any, new_model: Callable[[RunConfig], Any],
               resumed_k: int | None = None) -> StepPlan:
    """K for this run, and how its steps run. ``new_model`` builds the recipe's module for a config
    (``project.training.build.build_model``), whose step ``auto`` times; ``resumed_k``: the K that ``auto`` chose
    for the run this one resumes."""
    from project.hardware.devices import expected_world_size, resolve_accelerator

    world_size = expected_world_size(config)
    shard = batches_of(datamodule.train_size(), world_size)  # a batch never holds more than a rank's share
    steps = choose_steps_per_call(config.replace(batch_size=min(config.batch_size, shard)), world_size,
                                  torch.device(resolve_accelerator(config.accelerator)), datamodule, new_model)
    if resumed_k is not None and steps.k == resumed_k:
        steps = StepsPerCall(steps.k, "as the run it resumes chose", auto=True)
    mode, mode_reason = capture_plan(config, resolve_accelerator(config.accelerator), steps.k, steps.why)
    follows = config.steps_per_call == "auto"
    # Groups (the module steps itself) wherever K may change: auto may raise a K of 1 as the run goes.
    grouped = steps.k > 1 or (follows and why_one_step(config, world_size, datamodule.per_sample) is None)
    return StepPlan(steps, mode, mode_reason, grouped, follows,
                    (config.log_every_n_steps, config.checkpoint_every_n_steps or 0))


class Stepper:
    """The one owner of a run's training step, behind the two calls ``ClassifierModule`` makes.

    With K = 1 and no groups Lightning takes each step itself (``automatic``). Otherwise each
    Lightning step gets a group of batches and ``train`` takes one optimizer step per batch:
    eagerly with ``torch.optim``, or as device-side steps (``StepMode``), replayed from CUDA graphs
    on a GPU; a capture that cannot be made hands the run back to the eager steps.
    """

    def __init__(self, plan: StepPlan) -> None:
        self.plan = plan
        self.k = plan.steps.k  # optimizer steps per Lightning step, now: auto follows the run's step time
        self.runner: StepRunner | None = None
        if plan.grouped and plan.mode is not StepMode.OFF:
            from project.hardware.device_step import StepRunner  # device-side steps: loaded for a run that takes them

            self.runner = StepRunner(plan.mode, self._timed)
        self.step_seconds: float | None = None  # of a captured step, timed after its capture
        self.timed: StepTimes | None = None  # the run's own steps and calls, as auto timed them on CPU
        self._trainer: L.Trainer | None = None
        self._groups: StepGroups | None = None  # the groups being handed out, which a new K reaches at once

    def train_batches(self, size: int, batch_size: int, seed: int, device: torch.device,
                      position: Callable[[], tuple[int, int]]) -> EpochBatches:
        """The run's training batches in memory (``TensorDataModule.for_run``): one per Lightning step, or groups
        of K that end early where a step is logged or checkpointed."""
        if not self.plan.grouped:
            return EpochBatches(size, batch_size, seed, device, position)
        self._groups = StepGroups(size, batch_size, seed, device, position, self.k, self.plan.group_ends_every)
        return self._groups

    def use(self, k: int) -> None:
        """Groups of ``k`` batches from the next group on."""
        self.k = k
        if self._groups is not None:
            self._groups.k = k

    def retime(self, trainer: L.Trainer, times: StepTimes) -> None:
        """Set K from the run's measured times, where it moved by more than a quarter."""
        k = steps_for(times.step_seconds, log_every(trainer), times.fixed_seconds)
        if abs(k - self.k) > self.k / 4:
            self.use(k)

    @property
    def automatic(self) -> bool:
        """Lightning's own optimisation takes each step."""
        return not self.plan.grouped

    @property
    def capturable(self) -> bool:
        """The optimizer must keep its LR in a tensor: a captured step reads it there."""
        return self.plan.mode is StepMode.GRAPHS

    def train(self, module: L.LightningModule, group: tuple[torch.Tensor, torch.Tensor],
              batch_loss: Callable[[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]) -> torch.Tensor:
        """One Lightning step of a grouped run: the group's optimizer steps; their losses."""
        self._trainer = module.trainer
        return run_steps(module, group, tensor_datamodule(module.trainer).batch_size, batch_loss, self.runner)

    def _timed(self, step_seconds: float) -> None:
        self.step_seconds = step_seconds
        if self.plan.follows_timing and self._trainer is not None:
            self.retime(self._trainer, StepTimes(step_seconds, FIXED_COST_GUESS_S))

    def follow(self, trainer: L.Trainer, times: StepTimes) -> None:
        """The run's own times, measured as it goes (``AutoStepsPerCall``): K follows them."""
        self.timed = times
        if self.plan.follows_timing:
            self.retime(trainer, times)

    def taken(self) -> StepsTaken:
        """How the steps ran in the end."""
        runner = self.runner
        if runner is not None and runner.mode is StepMode.OFF:
            return StepsTaken(self.plan.steps, self.k, self.step_seconds, StepMode.OFF, runner.reason, self.timed)
        return StepsTaken(self.plan.steps, self.k, self.step_seconds, self.plan.mode, self.plan.mode_reason,
                          self.timed)


@dataclass(frozen=True)
class StepTimes:
    """A run's own times: one optimizer step's math, and the fixed cost of each Lightning step around it."""

    step_seconds: float
    fixed_seconds: float


@dataclass(frozen=True)
class StepsTaken:
    """How a run's steps ran: the K planned and the K it ended with, and how they ran (``RunResult``)."""

    planned: StepsPerCall
    k: int
    step_seconds: float | None  # a captured step's, timed after its capture
    mode: StepMode
    mode_reason: str
    timed: StepTimes | None = None  # the run's own, where auto timed them (CPU)

    def describe_k(self) -> str:
        """The run's ``steps per call`` line: K, and why."""
        planned = self.planned
        if planned.until_captured:
            return (f"auto: a captured step takes {self.step_seconds * 1e3:.3f} ms, a call's fixed cost "
                    f"{FIXED_COST_GUESS_S * 1e3:.1f} ms as first guessed" if self.step_seconds else
                    f"auto: {self.k}, the most (no step was captured)")
        timed = self.timed
        said = planned.describe() if timed is None else (
            f"auto: a step's math takes {timed.step_seconds * 1e3:.2f} ms, a call's fixed cost "
            f"{timed.fixed_seconds * 1e3:.2f} ms, as the run timed its own")
        return said if self.k == planned.k else f"{said}; {planned.k} at first, then {self.k}"

    def describe_mode(self) -> str:
        state = {StepMode.GRAPHS: " on", StepMode.DEVICE: "' step run eagerly"}.get(self.mode, " off")
        return f"CUDA graphs{state} ({self.mode_reason})"


def stepper_of(module: L.LightningModule) -> Stepper:
    """The stepper of a run's module (``ClassifierModule.stepper``)."""
    found = getattr(module, "stepper", None)
    if not isinstance(found, Stepper):
        raise TypeError(f"{type(module).__name__} has no Stepper: the engine's callbacks need a ClassifierModule")
    return found


def lightnings_own_steps() -> Stepper:
    """The stepper of a module built outside a run (checks, benchmark, evaluation): Lightning takes each step."""
    return Stepper(StepPlan(StepsPerCall(1, "as asked"), StepMode.OFF, "", grouped=False, follows_timing=False))


def measure_step_seconds(config: RunConfig, datamodule: Any, device: torch.device,
                         new_model: Callable[[RunConfig], Any], budget_s: float = 0.1, most: int = 200,
                         clock: Callable[[], float] = time.perf_counter) -> float:
    """Time of one training step of the run itself: the recipe's model and loss (``batch_loss``), on a batch
    of its training data at its batch size, backward and an optimizer step, on its device and precision.

    The fastest of as many steps as fit in ``budget_s`` (at least 5): a busy machine's pauses come
    and go, and a step that met none of them is the step's own cost.
    """
    module = new_model(config.replace(compile=None, cuda_graphs=False)).to(device)
    optimizer = torch.optim.SGD(module.parameters(), lr=1e-6)
    size = min(config.batch_size, len(datamodule.train_set))
    batch = [part.to(device) for part in datamodule.train_set.__getitems__(list(range(size)))]
    mixed = str(config.precision).endswith("-mixed") or str(config.precision) in ("16", "bf16")
    dtype = torch.float16 if device.type == "cuda" and str(config.precision).startswith("16") else torch.bfloat16

    def timed() -> float:
        started = clock()
        with torch.autocast(device.type, dtype=dtype, enabled=mixed):
            loss = module.batch_loss(batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return clock() - started

    timed()  # warm-up: allocations, kernel selection
    times: list[float] = []
    deadline = clock() + budget_s
    while len(times) < 5 or (clock() < deadline and len(times) < most):
        times.append(timed())
    return min(times)


def run_steps(module: L.LightningModule, group: tuple[torch.Tensor, torch.Tensor], batch_size: int,
              batch_loss: Callable[[tuple[torch.Tensor, torch.Tensor]], torch.Tensor],
              runner: Any = None) -> torch.Tensor:
    """One optimizer step per batch of ``group``: ``batch_loss``, backward, step, schedule; the losses.

    Each step calls the optimizer itself and counts itself in ``global_step``: Lightning's
    per-step backward and optimizer hooks would cost more than a small model's step. With a loss
    scaler (16-mixed) steps go through ``manual_backward`` and Lightning's optimizer wrapper,
    which scale and unscale each one. The step loss and LR are logged for the last step, which
    is where groups end when a logging step is due, at the step Lightning uses. ``runner``
    (``project/hardware/device_step.py``) takes the whole group as device-side steps, replayed
    from a CUDA graph, unless it has handed the run back to these eager steps.
    """
    trainer = module.trainer
    optimizer = module.optimizers()
    scheduler = module.lr_schedulers()
    losses = runner.run(module, group, batch_size) if runner is not None else None
    if losses is not None:
        from project.hardware.device_step import advance_schedule  # loaded with the runner

        count_optimizer_steps(trainer, len(losses))
        advance_schedule(scheduler, len(losses) - 1)
        lr = _current_lr(optimizer)
        advance_schedule(scheduler, 1)
    else:
        losses, lr = _eager_steps(module, group, batch_size, batch_loss, optimizer, scheduler)
    if trainer.global_step % log_every(trainer) == 0:
        module.log("train/loss", losses[-1])  # not prog_bar: see LoggedLossBar
        module.log("train/lr", lr)
    # Lightning numbers logged steps by Lightning steps; keep that count equal to optimizer steps.
    internals.count_logged_steps(trainer, len(losses) - 1)
    return losses


def _eager_steps(module: L.LightningModule, group: tuple[torch.Tensor, torch.Tensor], batch_size: int,
                 batch_loss: Callable[[tuple[torch.Tensor, torch.Tensor]], torch.Tensor], optimizer: Any,
                 scheduler: Any) -> tuple[torch.Tensor, Any]:
    """The group's steps with ``torch.optim``; their losses, and the LR the last one used."""
    trainer = module.trainer
    scaled = getattr(trainer.precision_plugin, "scaler", None) is not None
    images, targets = group
    losses = []
    batches = list(zip(images.split(batch_size), targets.split(batch_size), strict=True))
    for index, batch in enumerate(batches):
        if index == len(batches) - 1:
            lr = _current_lr(optimizer)
        loss = batch_loss(batch)
        if scaled:
            optimizer.zero_grad(set_to_none=True)
            module.manual_backward(loss)
            optimizer.step()
        else:
            optimizer.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.optimizer.step()
            count_optimizer_steps(trainer, 1)
        if scheduler is not None:
            scheduler.step()
        losses.append(loss.detach())
    return torch.stack(losses), lr


def _current_lr(optimizer: Any) -> Any:
    """The LR the next step uses (a copy: a tensor LR changes in place)."""
    lr = optimizer.param_groups[0]["lr"]
    return lr.clone() if torch.is_tensor(lr) else lr


def count_optimizer_steps(trainer: L.Trainer, steps: int) -> None:
    """What Lightning's optimizer wrapper records for each step, for steps taken without it."""
    progress = internals.manual_step_progress(trainer)
    for tracker in (progress.total, progress.current):
        tracker.ready += steps
        tracker.completed += steps


def steps_for(step_seconds: float, log_every: int | None = None, fixed_seconds: float = FIXED_COST_GUESS_S) -> int:
    """K that makes a Lightning step's fixed cost at most ~2.5 % of K steps' math; with ``log_every``, the divisor
    of the logging interval nearest to it: groups end at every logging step anyway, and a K that divides the
    interval adds no other group ends between them."""
    k = max(1, min(AUTO_MAX, math.ceil(fixed_seconds / (OVERHEAD_SHARE * step_seconds))))
    if not log_every or k == 1:
        return k
    divisors = [d for d in range(1, min(log_every, AUTO_MAX) + 1) if log_every % d == 0]
    return min(divisors, key=lambda d: abs(math.log(d / k)))


class AutoStepsPerCall(Callback):
    """``--steps-per-call auto`` keeps measuring, on CPU where the host's clock times the steps. Of each group: its
    steps, from its Lightning step's start to its end, plus the fetch of its batches (through Lightning's profiler
    hooks around it), over its K; and the fixed cost of its Lightning step, the rest of the time since the last
    group ended (Lightning's loop, hooks and callbacks, the template's). K follows the medians of the last
    ``TIMED_GROUPS`` groups, so a K chosen at a moment of load, or from the first guess of the fixed cost, does not
    hold a whole run. K never changes the training, only how many steps one Lightning step takes. A captured GPU
    run is timed once, with CUDA events, after its capture."""

    def __init__(self) -> None:
        self._ended: tuple[float, int, float] | None = None  # time, global step and fetch seconds at a group's end
        self._started = 0.0
        self._groups: collections.deque[StepTimes] = collections.deque(maxlen=TIMED_GROUPS)
        self._fetches = FetchClock(lambda: time.perf_counter())
        self._profiler: FetchProfiler | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._profiler = FetchProfiler.around(trainer, self._fetches)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._profiler is not None:
            self._profiler.remove(trainer)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._ended = None  # an epoch's start pays for its loader and the validation before it: not a call's cost

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self._started = time.perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if trainer.strategy.root_device.type != "cpu":
            return
        now, step, fetched = time.perf_counter(), trainer.global_step, self._fetches.seconds
        if self._ended is not None and step > self._ended[1]:
            steps = (now - self._started) + (fetched - self._ended[2])
            self._groups.append(StepTimes(steps / (step - self._ended[1]), max(now - self._ended[0] - steps, 0.0)))
            stepper_of(pl_module).follow(trainer, StepTimes(statistics.median(g.step_seconds for g in self._groups),
                                                        statistics.median(g.fixed_seconds for g in self._groups)))
        self._ended = (now, step, fetched)


class SharedStepCount(Callback):
    """Lets a checkpoint resume at its step whichever K wrote it and whichever K resumes it.

    Lightning counts optimizer steps in one place under automatic optimisation (K = 1) and in
    another under manual optimisation (K > 1); both are set to the count the checkpoint has.
    """

    AUTOMATIC, MANUAL, BATCHES = internals.AUTOMATIC_STEPS, internals.MANUAL_STEPS, internals.BATCHES

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        loops = checkpoint.get("loops", {}).get("fit_loop", {})
        if self.AUTOMATIC not in loops or self.MANUAL not in loops:
            return
        automatic, manual = loops[self.AUTOMATIC]["optimizer"]["step"], loops[self.MANUAL]
        counted = max(automatic, manual, key=lambda progress: progress["total"]["completed"])
        loops[self.AUTOMATIC]["optimizer"]["step"] = copy.deepcopy(counted)
        loops[self.MANUAL] = copy.deepcopy(counted)
        self._count_batches_as_steps(loops, checkpoint, pl_module.automatic_optimization, trainer)

    def _count_batches_as_steps(self, loops: dict[str, Any], checkpoint: dict[str, Any], automatic: bool,
                                trainer: L.Trainer) -> None:
        """Resuming with K = 1 what K > 1 wrote: Lightning's count of this epoch's batches was in groups.

        With K = 1 the loader has a length, and Lightning ends the epoch by that count (without its
        validation, if the count falls short): it must count the optimizer steps already taken.
        """
        position = next((v for v in checkpoint.values() if isinstance(v, dict) and "samples_done" in v), None)
        datamodule = getattr(trainer, "datamodule", None)
        if not automatic or position is None or self.BATCHES not in loops or datamodule is None:
            return
        steps_done = batches_of(int(position["samples_done"]), datamodule.batch_size)
        progress = loops[self.BATCHES]
        shift = steps_done - progress["current"]["ready"]
        for counts in (progress["current"], progress["total"]):
            for key in counts:
                counts[key] += shift


class StepProgressBar(LoggedLossBar):
    """The progress bar, counting optimizer steps rather than Lightning steps."""

    def __init__(self, steps_per_epoch: int, refresh_rate: int = 25) -> None:
        super().__init__(refresh_rate=refresh_rate)
        self.steps_per_epoch = steps_per_epoch
        self._bar_epoch: int | None = None  # the epoch the bar was set up for

    @property
    def total_train_batches(self) -> int:
        return self.steps_per_epoch

    def on_train_epoch_start(self, trainer: L.Trainer, *args: Any) -> None:
        super().on_train_epoch_start(trainer, *args)
        self._bar_epoch = trainer.current_epoch

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if self._bar_epoch != trainer.current_epoch:  # resumed: Lightning calls no on_train_epoch_start there
            self.on_train_epoch_start(trainer, pl_module)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self.remember_logged_loss(trainer)
        done = trainer.global_step - trainer.current_epoch * self.steps_per_epoch
        bar = self.train_progress_bar
        if done == self.steps_per_epoch or done // self.refresh_rate > bar.n // self.refresh_rate:
            bar.n = done
            bar.set_postfix(self.get_metrics(trainer, pl_module))
            bar.refresh()
