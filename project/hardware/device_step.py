"""One optimizer step as tensor operations on the run's device, with nothing for the host to read back.

A CUDA graph (``project/hardware/cuda_graphs.py``) replays kernels with the arguments they were
captured with, so everything that changes from one step to the next must live in a tensor the
kernels read:

- the schedule: each step's LR (and SGD's momentum, which one-cycle cycles) as a table, made by
  stepping the run's own PyTorch scheduler through the run once, read at a step counter kept on
  the device;
- the update: SGD (momentum, Nesterov, weight decay) in foreach ops on those tensors; Adam and
  AdamW are torch's own capturable implementations, their LR a tensor filled from the table;
- 16-mixed's loss scale: GradScaler's own scale and growth tensors, checked, unscaled and updated
  on the device; a step whose gradients overflow leaves the weights and the optimizer's state as
  they were;
- the training accuracy, counted in place (``RunningAccuracy``).

The same code runs without capture where a graph cannot (the epoch's last, smaller batch) and on
the CPU, where the tests compare it with ``torch.optim``.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torchmetrics import Metric

from project import internals

FEATURES = ("lr", "momentum")  # what the schedule table holds per step and parameter group


class NotCapturable(Exception):
    """Why this run's optimizer step cannot be a device-side step (said in one line; the run goes on eagerly)."""


class RunningAccuracy(Metric):
    """The share of correct predictions, counted in place.

    A captured training step adds to these very tensors at every replay, so ``reset()`` zeroes
    them where they are instead of making new ones; ``replayed(n)`` tells the metric about the
    updates a graph made without calling ``update``. Sync-free, and summed across DDP ranks.
    """

    full_state_update = False
    higher_is_better = True
    correct: torch.Tensor
    total: torch.Tensor

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(compute_with_cache=False, **kwargs)
        self.add_state("correct", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("total", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")

    def update(self, scores: torch.Tensor, target: torch.Tensor) -> None:
        self.correct += (scores.argmax(dim=1) == target).sum()
        self.total += target.numel()

    def compute(self) -> torch.Tensor:
        return self.correct.float() / self.total.clamp(min=1)

    def reset(self) -> None:
        kept = {name: getattr(self, name) for name in self._defaults}
        super().reset()
        for name, tensor in kept.items():
            setattr(self, name, tensor.zero_())

    def replayed(self, updates: int) -> None:
        self._update_count += updates


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
        self.scale = self.growth = self.found_inf = None
        if scaler is not None and scaler.is_enabled():
            scaler.scale(torch.ones((), device=self.device))  # makes GradScaler's scale and growth tensors
            self.scale, self.growth = internals.scaler_tensors(scaler)
            self.scaler_settings = (scaler.get_growth_factor(), scaler.get_backoff_factor(),
                                    scaler.get_growth_interval())
            self.found_inf = torch.zeros(1, device=self.device)

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
        scaled = loss.float() * self.scale if self.scale is not None else loss
        grads = torch.autograd.grad(scaled, self.params, allow_unused=True)
        used = [(p, g) for p, g in zip(self.params, grads, strict=True) if g is not None]
        skip = self._unscale([g for _, g in used]) if self.scale is not None else None
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
            if skip is not None:
                for tensor, before in zip(self._state(dict(used)), kept, strict=True):
                    tensor.copy_(torch.where(skip, before, tensor))
                internals.amp_update_scale_(self.scale, self.growth, self.found_inf, *self.scaler_settings)
            self.index.add_(1)
        return loss.detach()

    def _unscale(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """GradScaler's check and unscale of this step's gradients; whether to skip the step, as a device bool."""
        self.found_inf.zero_()
        inverse = self.scale.double().reciprocal().float()
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for g in grads:
            by_dtype.setdefault(g.dtype, []).append(g)
        for same in by_dtype.values():
            internals.amp_unscale_(same, self.found_inf, inverse)
        return self.found_inf.view(()).bool()

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
            g = [grads[p] for p in params]
            if group["weight_decay"]:
                g = internals.foreach_add(g, params, alpha=group["weight_decay"])
            buffers = [self.optimizer.state[p].get("momentum_buffer") for p in params]
            if all(b is not None for b in buffers):
                internals.foreach_mul_(buffers, momentum)
                internals.foreach_add_(buffers, g, alpha=1 - group["dampening"])
                g = internals.foreach_add(g, internals.foreach_mul(buffers, momentum)) if group["nesterov"] else buffers
            internals.foreach_sub_(params, internals.foreach_mul(g, lr))

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor a step changes: weights, optimizer state, loss scale, counters and in-place metrics."""
        tensors = list(self.params)
        for p in self.params:
            tensors += [v for v in self.optimizer.state[p].values() if torch.is_tensor(v)]
        tensors += [t for t in (self.scale, self.growth, self.index) if t is not None]
        for metric in self.module.modules():
            if isinstance(metric, RunningAccuracy):
                tensors += [metric.correct, metric.total]
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
