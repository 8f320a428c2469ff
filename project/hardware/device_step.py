"""One optimizer step as tensor operations on the run's device, replayed from a CUDA graph on a GPU.

A CUDA graph replays kernels with the arguments they were captured with, so everything that
changes from one step to the next must live in a tensor the kernels read (``DeviceStep``):

- the schedule: each step's LR (and SGD's momentum, which one-cycle cycles) as a table, made by
  stepping the run's own PyTorch scheduler through the run once, read at a step counter kept on
  the device;
- the update: SGD (momentum, Nesterov, weight decay) in foreach ops on those tensors; Adam and
  AdamW are torch's own capturable implementations, their LR a tensor filled from the table;
- 16-mixed's loss scale: GradScaler's own scale and growth tensors, checked, unscaled and updated
  on the device; a step whose gradients overflow leaves the weights and the optimizer's state as
  they were;
- the metrics the step updates, which must count in place (``counts_in_place``: the training
  accuracy).

Replaying a graph launches a whole step's kernels with one call, so the host's Python work per
step all but disappears: the step is captured once (``StepRunner``), checked against an eager step
on another batch (a step that cannot be captured faithfully gives other numbers), timed, and
replayed for every full-size batch; the epoch's last, smaller batch runs the same step eagerly,
as does the CPU, where the tests compare it with ``torch.optim``. Whatever stops a capture (a host
sync, a data-dependent shape, an optimizer or metric it cannot read) is said in one line and the
run goes on with the eager steps from the same state.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torchmetrics import Metric

from project import internals
from project.errors import first_line
from project.hardware.devices import StepMode

FEATURES = ("lr", "momentum")  # what the schedule table holds per step and parameter group


def counts_in_place(metric: Any) -> bool:
    """A metric a graph can replay: its ``update`` adds into its own state tensors, and ``replayed(n)`` tells it of
    the updates a replay made without calling it (the training accuracy's ``RunningAccuracy``)."""
    return callable(getattr(metric, "replayed", None))


class NotCapturable(Exception):
    """Why this run's optimizer step cannot be a device-side step (said in one line; the run goes on eagerly)."""


def schedule_table(optimizer: torch.optim.Optimizer, scheduler: Any, steps: int) -> torch.Tensor:
    """``(T, groups, 2)`` float32 on the parameters' device: LR and momentum at each of the next ``T <= steps``
    optimizer steps, as the run's own scheduler sets them (``T = 1`` when they never change).

    The scheduler is stepped through the run and then put back as it was. Anything else it changes
    (one-cycle's Adam ``betas``) is a Python number a captured step could not see: ``NotCapturable``.
    """
    groups = optimizer.param_groups
    saved_groups = [{k: v.clone() if torch.is_tensor(v) else v for k, v in group.items() if k != "params"}
                    for group in groups]
    saved_scheduler = scheduler.state_dict() if scheduler is not None else None

    def row() -> list[list[float]]:
        return [[float(group.get(name, 0.0)) for name in FEATURES] for group in groups]

    def others() -> list[dict[str, Any]]:
        return [{k: v for k, v in group.items() if k not in ("params", *FEATURES)} for group in groups]

    rows, fixed = [row()], others()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "scheduler.step() before optimizer.step()": a dry run
            while scheduler is not None and len(rows) < steps:
                try:
                    scheduler.step()
                except ValueError:  # one-cycle past its last step
                    break
                changed = next((k for now, before in zip(others(), fixed, strict=True) for k, v in now.items()
                                if v != before.get(k)), None)
                if changed is not None:
                    raise NotCapturable(f"the schedule changes the optimizer's {changed!r} every step, a Python "
                                        "number a captured step cannot read")
                rows.append(row())
    finally:
        if scheduler is not None:
            scheduler.load_state_dict(saved_scheduler)
        for group, saved in zip(groups, saved_groups, strict=True):
            for key, value in saved.items():
                if torch.is_tensor(group.get(key)):
                    group[key].copy_(value)  # a tensor LR (Adam's, captured) stays the tensor the step reads
                else:
                    group[key] = value
    device = groups[0]["params"][0].device
    table = torch.tensor(rows, dtype=torch.float32)
    if bool((table == table[0]).all()):
        table = table[:1]
    return table.to(device)


def advance_schedule(scheduler: Any, steps: int) -> None:
    """The host's scheduler moved on by ``steps`` optimizer steps taken on the device (its state is saved in
    checkpoints, and sets the LR the run logs). One-cycle's and ``LambdaLR``'s LR is a function of the step
    count: they jump there in one step."""
    if scheduler is None or steps <= 0:
        return
    closed_form = isinstance(scheduler, (torch.optim.lr_scheduler.OneCycleLR, torch.optim.lr_scheduler.LambdaLR))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if closed_form:
            scheduler.last_epoch += steps - 1
            internals.count_scheduler_steps(scheduler, steps - 1)
            scheduler.step()
        else:
            for _ in range(steps):
                scheduler.step()


@dataclass(frozen=True)
class LossScale:
    """GradScaler's loss scale, growth tracker and overflow flag as device tensors a captured step updates in
    place, and its growth factor, backoff factor and growth interval."""

    scale: torch.Tensor
    growth: torch.Tensor
    found_inf: torch.Tensor
    settings: tuple[float, float, int]

    def unscale(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """GradScaler's check and unscale of this step's gradients; whether to skip the step, as a device bool."""
        self.found_inf.zero_()
        inverse = self.scale.double().reciprocal().float()
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for g in grads:
            by_dtype.setdefault(g.dtype, []).append(g)
        for same in by_dtype.values():
            internals.amp_unscale_(same, self.found_inf, inverse)
        return self.found_inf.view(()).bool()

    def update(self) -> None:
        internals.amp_update_scale_(self.scale, self.growth, self.found_inf, *self.settings)


class DeviceStep:
    """Forward, loss, backward, update and schedule of one batch, reading every changing number from device
    tensors; ``__call__`` returns the step's loss.

    ``index`` counts the steps taken since the schedule table's first row; set it from the run's
    step count (``at_step``) before a group of steps.
    """

    def __init__(self, module: Any, optimizer: torch.optim.Optimizer, scheduler: Any, scaler: Any,
                 start_step: int, total_steps: int) -> None:
        self.module, self.optimizer, self.start_step = module, optimizer, start_step
        self.groups = [[p for p in group["params"] if p.requires_grad] for group in optimizer.param_groups]
        self.params = [p for group in self.groups for p in group]
        if not self.params:
            raise NotCapturable("the optimizer has no trainable parameters")
        self.device = self.params[0].device
        self.sgd = type(optimizer) is torch.optim.SGD
        self._check_optimizer()
        self.table = schedule_table(optimizer, scheduler, max(1, total_steps - start_step + 1))
        self.index = torch.zeros((), dtype=torch.long, device=self.device)
        if self.sgd and bool((self.table[..., 1] != 0).any()):
            for p in self.params:  # zeros: what SGD's first step starts from
                if self.optimizer.state[p].get("momentum_buffer") is None:
                    self.optimizer.state[p]["momentum_buffer"] = torch.zeros_like(p)
        self.loss_scale: LossScale | None = None
        if scaler is not None and scaler.is_enabled():
            scaler.scale(torch.ones((), device=self.device))  # makes GradScaler's scale and growth tensors
            self.loss_scale = LossScale(*internals.scaler_tensors(scaler), torch.zeros(1, device=self.device),
                                        (scaler.get_growth_factor(), scaler.get_backoff_factor(),
                                         scaler.get_growth_interval()))

    def _check_optimizer(self) -> None:
        optimizer, name = self.optimizer, type(self.optimizer).__name__
        for group in optimizer.param_groups:
            if group.get("maximize") or group.get("differentiable"):
                raise NotCapturable(f"{name} with maximize or differentiable is not a device-side step here")
            if self.sgd and group.get("dampening"):  # torch's first step skips it; buffers made up front cannot
                raise NotCapturable("SGD with dampening is not a device-side step here")
            if not self.sgd:
                if type(optimizer) not in (torch.optim.Adam, torch.optim.AdamW):
                    raise NotCapturable(f"a captured step updates with SGD, Adam or AdamW, not {name}")
                if not (group.get("capturable") and torch.is_tensor(group["lr"])):
                    raise NotCapturable(f"{name} must be built with capturable=True and a tensor LR "
                                        "(ClassifierModule does so for a captured run)")

    def at_step(self, global_step: int) -> None:
        """Point the schedule at the run's step count (a kernel launch: the host waits for nothing)."""
        self.index.fill_(global_step - self.start_step)

    def schedule(self) -> torch.Tensor:
        """``(groups, 2)``: this step's LR and momentum, read at the device's step counter."""
        if len(self.table) == 1:
            return self.table[0]
        return self.table.index_select(0, self.index.clamp(max=len(self.table) - 1).view(1))[0]

    def __call__(self, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        loss = self.module.batch_loss((images, targets))
        scaling = self.loss_scale
        scaled = loss.float() * scaling.scale if scaling is not None else loss
        grads = torch.autograd.grad(scaled, self.params, allow_unused=True)
        used = [(p, g) for p, g in zip(self.params, grads, strict=True) if g is not None]
        skip = scaling.unscale([g for _, g in used]) if scaling is not None else None
        kept = [t.clone() for t in self._state(dict(used))] if skip is not None else []
        with torch.no_grad():
            hyper = self.schedule()
            if self.sgd:
                self._sgd(dict(used), hyper)
            else:
                for index, group in enumerate(self.optimizer.param_groups):
                    group["lr"].copy_(hyper[index, 0])
                for p, g in used:
                    p.grad = g
                self.optimizer.step()
            if scaling is not None and skip is not None:
                for tensor, before in zip(self._state(dict(used)), kept, strict=True):
                    tensor.copy_(torch.where(skip, before, tensor))
                scaling.update()
            self.index.add_(1)
        return loss.detach()

    def _state(self, grads: dict[torch.Tensor, torch.Tensor]) -> list[torch.Tensor]:
        """What one step changes: the updated parameters and their optimizer state tensors."""
        tensors = []
        for p in self.params:
            if p in grads:
                tensors.append(p)
                tensors += [v for v in self.optimizer.state[p].values() if torch.is_tensor(v)]
        return tensors

    def _sgd(self, grads: dict[torch.Tensor, torch.Tensor], hyper: torch.Tensor) -> None:
        """``torch.optim.SGD``'s update with the LR and momentum of this step taken from ``hyper``."""
        for index, (group, params) in enumerate(zip(self.optimizer.param_groups, self.groups, strict=True)):
            params = [p for p in params if p in grads]
            if not params:
                continue
            lr, momentum = hyper[index, 0], hyper[index, 1]
            g: tuple[torch.Tensor, ...] | list[torch.Tensor] = [grads[p] for p in params]
            if group["weight_decay"]:
                g = internals.foreach_add(g, params, alpha=group["weight_decay"])
            buffers = [b for p in params if (b := self.optimizer.state[p].get("momentum_buffer")) is not None]
            if len(buffers) == len(params):
                internals.foreach_mul_(buffers, momentum)
                internals.foreach_add_(buffers, g, alpha=1 - group["dampening"])
                g = internals.foreach_add(g, internals.foreach_mul(buffers, momentum)) if group["nesterov"] else buffers
            internals.foreach_sub_(params, internals.foreach_mul(g, lr))

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor a step changes: weights, optimizer state, loss scale, counters and in-place metrics."""
        tensors = list(self.params)
        for p in self.params:
            tensors += [v for v in self.optimizer.state[p].values() if torch.is_tensor(v)]
        tensors += [self.loss_scale.scale, self.loss_scale.growth] if self.loss_scale is not None else []
        tensors.append(self.index)
        for metric in self.module.modules():
            if counts_in_place(metric):
                tensors += [getattr(metric, name) for name in internals.metric_state_names(metric)]
        return tensors

    def snapshot(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(t, t.detach().clone()) for t in self.tensors()]

    def restore(self, snapshot: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Back to ``snapshot``; optimizer state made since (Adam's, at its first step) goes back to zeros,
        which is what a first step starts from."""
        saved = {id(t): copy for t, copy in snapshot}
        with torch.no_grad():
            for tensor in self.tensors():
                if id(tensor) in saved:
                    tensor.copy_(saved[id(tensor)])
                else:
                    tensor.zero_()


WARM_UP_STEPS = 3  # on a side stream before capture, as PyTorch's graph capture requires
TIMED_REPLAYS = 10
GROUP_BUFFER_BYTES = 256 * 2**20  # the inputs a group's buffer holds at most (it holds two batches at least)


class StepRunner:
    """Runs a group of steps as ``DeviceStep``s: replayed (``graphs``) or eagerly (``device``); hands the group
    back (``None``) once it is ``off``, for the eager ``torch.optim`` steps.

    ``on_timed`` receives a replayed step's seconds, measured with CUDA events after the capture.
    """

    def __init__(self, mode: StepMode, on_timed: Callable[[float], None] | None = None) -> None:
        self.mode, self.on_timed = mode, on_timed
        self.reason = ""
        self.program: DeviceStep | None = None
        self.graph: torch.cuda.CUDAGraph | None = None

    def run(self, module: Any, group: tuple[torch.Tensor, torch.Tensor], batch_size: int) -> torch.Tensor | None:
        """The group's step losses, or None when the eager steps must take it."""
        if self.mode is StepMode.OFF:
            return None
        trainer = module.trainer
        if self.program is None:
            try:
                self.program = DeviceStep(module, module.optimizers().optimizer, module.lr_schedulers(),
                                          getattr(trainer.precision_plugin, "scaler", None), trainer.global_step,
                                          module.optimizer_steps())
            except NotCapturable as err:
                self._off(str(err))
                return None
        self.program.at_step(trainer.global_step)
        images, targets = group
        full = len(targets) // batch_size * batch_size
        losses = []
        if self.mode is StepMode.GRAPHS and full:
            if self.graph is None and not self._capture(images[:full], targets[:full], batch_size):
                return None
            losses.append(self._replay(images[:full], targets[:full]))
            images, targets = images[full:], targets[full:]
        if len(targets):  # split() of an empty tensor is one empty batch
            for x, y in zip(images.split(batch_size), targets.split(batch_size), strict=True):
                losses.append(self.program(x, y).float().view(1))
        return torch.cat(losses) if len(losses) > 1 else losses[0]

    def _off(self, reason: str) -> None:
        self.mode, self.reason = StepMode.OFF, reason
        if self.program is None or self.program.device.type == "cuda":
            print(f"train.py: CUDA graphs off ({reason}); the same steps run eagerly", file=sys.stderr, flush=True)

    # ------------------------------------------------------------------ capture and replay

    @property
    def built(self) -> DeviceStep:
        """The device step, built by the group's first ``run``."""
        if self.program is None:
            raise RuntimeError("the device step is used before run() built it")
        return self.program

    @property
    def captured(self) -> torch.cuda.CUDAGraph:
        if self.graph is None:
            raise RuntimeError("the step is replayed before it was captured")
        return self.graph

    def _capture(self, images: torch.Tensor, targets: torch.Tensor, batch_size: int) -> bool:
        """Capture one step that reads its batch from the group buffer at ``cursor``; check it and time it.
        False (and the state as it was) if it cannot be."""
        program = self.built
        sample_bytes = images[:1].numel() * images.element_size()
        batches = max(2, min(len(targets) // batch_size, GROUP_BUFFER_BYTES // max(1, sample_bytes * batch_size)))
        self.batch_size = batch_size
        self.images = torch.empty((batches * batch_size, *images.shape[1:]), dtype=images.dtype, device=images.device)
        self.targets = torch.empty(batches * batch_size, dtype=targets.dtype, device=targets.device)
        self.losses = torch.zeros(batches, device=images.device)
        self.cursor = torch.zeros((), dtype=torch.long, device=images.device)
        self.rows = torch.arange(batch_size, device=images.device)
        loaded = min(len(targets), len(self.targets))
        self.images[:loaded].copy_(images[:loaded])
        self.targets[:loaded].copy_(targets[:loaded])
        metrics = self._metrics()
        counts = [m.update_count for m in metrics]
        saved = program.snapshot()
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(WARM_UP_STEPS):
                    self.cursor.zero_()
                    self._step()
            torch.cuda.current_stream().wait_stream(side)
            updated = [m for m, count in zip(metrics, counts, strict=True) if m.update_count != count]
            self._check_metrics(updated)
            program.restore(saved)
            self.cursor.zero_()
            self.graph = _captured(self._step, side)
            self._check_against_eager(saved, 1 if loaded >= 2 * batch_size else 0)
            self._time(saved)
        except (NotCapturable, RuntimeError) as err:
            try:
                torch.cuda.synchronize()
            except RuntimeError:
                pass  # the failed capture's own error, already in hand
            self.graph = None
            program.restore(saved)
            self._off(first_line(err))
            return False
        program.restore(saved)
        self.counting = updated
        return True

    def _step(self) -> None:
        rows = self.cursor * self.batch_size + self.rows
        loss = self.built(self.images.index_select(0, rows), self.targets.index_select(0, rows))
        self.losses.index_copy_(0, self.cursor.view(1), loss.float().view(1))
        self.cursor.add_(1)

    def _replay(self, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Every full batch of the group, in buffer-sized chunks; their losses."""
        losses, size = [], len(self.targets)
        for start in range(0, len(targets), size):
            chunk = min(size, len(targets) - start)
            self.images[:chunk].copy_(images[start:start + chunk])
            self.targets[:chunk].copy_(targets[start:start + chunk])
            self.cursor.zero_()
            for _ in range(chunk // self.batch_size):
                self.captured.replay()
            losses.append(self.losses[: chunk // self.batch_size].clone())
        for metric in self.counting:
            metric.replayed(len(targets) // self.batch_size)
        return torch.cat(losses) if len(losses) > 1 else losses[0]

    def _check_against_eager(self, saved: list, batch: int) -> None:
        """The replay on batch ``batch`` (not the one captured) against the eager step on it, from the same state:
        a step that baked in its first batch, or worked on the host, gives other numbers."""
        program = self.built
        program.restore(saved)
        start = slice(batch * self.batch_size, (batch + 1) * self.batch_size)
        eager_loss = program(self.images[start], self.targets[start])
        eager = [t.detach().clone() for t in program.params]
        program.restore(saved)
        self.cursor.fill_(batch)
        self.captured.replay()
        replayed_loss = self.losses[batch]
        worst = max(float((a.detach() - b).abs().max()) for a, b in zip(program.params, eager, strict=True))
        if not torch.allclose(replayed_loss, eager_loss.float(), rtol=1e-4, atol=1e-6) or \
                not all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(program.params, eager, strict=True)):
            raise NotCapturable(f"the captured step does not reproduce the eager one (weights differ by up to "
                                f"{worst:.2g}: random ops, or work on the host inside the step)")

    def _time(self, saved: list) -> None:
        """Seconds per replayed step, with CUDA events (after warm-up), for ``steps per call auto``."""
        self.built.restore(saved)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.captured.replay()
        start.record()
        for _ in range(TIMED_REPLAYS):
            self.cursor.zero_()
            self.captured.replay()
        end.record()
        end.synchronize()
        if self.on_timed is not None:
            self.on_timed(start.elapsed_time(end) / 1000 / TIMED_REPLAYS)

    def _metrics(self) -> list[Any]:
        return [m for m in self.built.module.modules() if isinstance(m, Metric)]

    @staticmethod
    def _check_metrics(updated: list[Any]) -> None:
        """A metric the step updates that does not count in place would lose every replay's update."""
        for metric in updated:
            if not counts_in_place(metric):
                raise NotCapturable(f"{type(metric).__name__} is updated in the step; only metrics that count in "
                                    "place (the training accuracy's RunningAccuracy) can be replayed")


def _captured(step: Any, stream: torch.cuda.Stream) -> torch.cuda.CUDAGraph:
    """``step``'s kernels as a graph, captured on ``stream``: what ``torch.cuda.graph`` does, less its
    ``gc.collect()``, which walks Lightning's whole object graph (a tenth of a second) for memory a
    training step has no use for."""
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        graph.capture_begin()
        try:
            step()
        except BaseException:
            try:
                graph.capture_end()
            except RuntimeError:
                pass  # the capture the step broke; its own error says why
            raise
        graph.capture_end()
    torch.cuda.current_stream().wait_stream(stream)
    return graph
