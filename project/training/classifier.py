"""The engine's ``LightningModule`` for classifiers: steps, metrics, optimiser and schedule around any network.

A recipe subclasses ``ClassifierModule`` with its own network (``project/recipe/model.py``) and, if it
wants, its own loss and exported files; everything else here is the same for every recipe.
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import lightning as L
import torch
from lightning.pytorch.core.optimizer import LightningOptimizer
from torch import nn
from torchmetrics import MaxMetric, MeanMetric, Metric

from project import OPTIMIZERS, SCHEDULERS, internals
from project.config.validators import registered, registries_problem
from project.errors import CheckpointError, UsageError
from project.reliability.checkpointing import atomic_save
from project.training.callbacks import log_every
from project.training.steps_per_call import Stepper, lightnings_own_steps
from project.training.tensor_data import tensor_datamodule

Batch = tuple[torch.Tensor, torch.Tensor]
FUSED_DEVICES = ("cuda", "cpu")  # where torch's optimizers have fused kernels, fp32 to bf16 alike


def default_warmup(total_steps: int) -> int:
    """Cosine's warm-up when none is given: 5 % of the run, the usual share."""
    return max(1, total_steps // 20)


class WarmupCosine(torch.optim.lr_scheduler.LRScheduler):
    """Linear warm-up from ~0 to the LR over ``warmup_steps``, then cosine decay to 0 at ``total_steps``.

    ``total_steps`` is saved with the schedule's state, so a resume that would stretch or cut
    the schedule can be refused, as for one-cycle. Its state is plain values (LambdaLR's would
    hold its function, which a checkpoint cannot always pickle).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int) -> None:
        self.total_steps = total_steps
        self.warmup_steps = min(warmup_steps, total_steps)
        super().__init__(optimizer)

    def get_lr(self) -> list[float | torch.Tensor]:
        return [base_lr * self.factor(self.last_epoch) for base_lr in self.base_lrs]

    def factor(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / (self.warmup_steps + 1)
        progress = (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


@dataclass(frozen=True)
class OptimizerSettings:
    """What every optimizer builder is given: the run's settings, and where its steps run."""

    lr: float
    momentum: float
    weight_decay: float
    device: torch.device
    capturable: bool  # the step may be captured: an optimizer that can keeps its LR in a tensor there
    fused_kernels: bool = True  # False: torch.optim's own default, the benchmark's hand-unfused reference

    @property
    def fused(self) -> bool | None:
        """Fused kernels where torch has them: one pass over each weight per step instead of several (the
        benchmark's ``hand-unfused`` row measures the difference), and on a GPU one launch and no host sync for
        GradScaler to skip a step (None elsewhere: torch's own choice)."""
        return True if self.fused_kernels and self.device.type in FUSED_DEVICES else None


def _sgd(parameters: Any, s: OptimizerSettings) -> torch.optim.Optimizer:
    built = torch.optim.SGD(parameters, lr=s.lr, momentum=s.momentum, weight_decay=s.weight_decay,
                            nesterov=s.momentum > 0, fused=s.fused)
    if s.fused and s.momentum > 0:
        # Fused SGD makes its momentum buffers with empty_like at the first step: one that 16-mixed's loss
        # scaler skips leaves them uninitialised, and the weights turn to NaN a step later. Zeros are what a
        # first step starts from (the same weights, bit for bit).
        for group in built.param_groups:
            for p in group["params"]:
                built.state[p]["momentum_buffer"] = torch.zeros_like(p)
    return built


def _adam(kind: type[torch.optim.Adam] | type[torch.optim.AdamW]) -> Callable[[Any, OptimizerSettings],
                                                                             torch.optim.Optimizer]:
    """Adam or AdamW; capturable, its LR a tensor that a captured step fills from the schedule."""
    def build(parameters: Any, s: OptimizerSettings) -> torch.optim.Optimizer:
        if s.capturable:
            return kind(parameters, lr=torch.tensor(s.lr, device=s.device), weight_decay=s.weight_decay,
                        capturable=True)
        return kind(parameters, lr=s.lr, weight_decay=s.weight_decay, fused=s.fused)
    return build


# The optimizers --optimizer names: name -> builder. A new one is a builder here and its name in
# project.OPTIMIZERS (which the command line reads without importing torch); an optimizer a captured
# step cannot replay runs eagerly, and the summary says why.
OPTIMIZER_BUILDERS: dict[str, Callable[[Any, OptimizerSettings], torch.optim.Optimizer]] = {
    "sgd": _sgd,
    "adam": _adam(torch.optim.Adam),
    "adamw": _adam(torch.optim.AdamW),
}


@dataclass(frozen=True)
class ScheduleSettings:
    """What every schedule builder is given."""

    optimizer_name: str
    lr: float
    momentum: float
    warmup_steps: int | None
    total_steps: int


def _one_cycle(optimizer: torch.optim.Optimizer, s: ScheduleSettings) -> Any:
    # One-cycle also cycles SGD's momentum (0.95 -> 0.85 -> 0.95, PyTorch's defaults) against the LR, in place of
    # --momentum; --momentum 0 keeps plain SGD without momentum.
    cycle = s.optimizer_name != "sgd" or s.momentum > 0
    return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=s.lr, total_steps=s.total_steps,
                                               cycle_momentum=cycle)


# The per-step LR schedules --scheduler names: name -> builder (None: the LR stays). A new one is a builder
# here and its name in project.SCHEDULERS.
SCHEDULE_BUILDERS: dict[str, Callable[[torch.optim.Optimizer, ScheduleSettings], Any]] = {
    "none": lambda optimizer, s: None,
    "onecycle": _one_cycle,
    "cosine": lambda optimizer, s: WarmupCosine(
        optimizer, s.total_steps, default_warmup(s.total_steps) if s.warmup_steps is None else s.warmup_steps),
}


_DISAGREE = registries_problem(OPTIMIZERS, OPTIMIZER_BUILDERS, "OPTIMIZERS", __name__) or \
    registries_problem(SCHEDULERS, SCHEDULE_BUILDERS, "SCHEDULERS", __name__)
if _DISAGREE:  # at import, in one line: before any run could train with something else
    raise UsageError(_DISAGREE)


def optimizer_and_schedule(parameters: Any, optimizer: str, lr: float, momentum: float, weight_decay: float,
                           scheduler: str, warmup_steps: int | None, total_steps: int, device: torch.device,
                           capturable: bool = False, fused_kernels: bool = True) -> tuple[torch.optim.Optimizer, Any]:
    """The run's optimizer and its per-step LR schedule (None for ``none``); the benchmark's loops use it too.

    ``capturable``: the steps may be captured (Adam and AdamW then read the LR from a tensor the step fills).
    ``fused_kernels``: False for torch.optim's own default (the benchmark's reference of what fusing saves).
    """
    build = registered(OPTIMIZER_BUILDERS, optimizer, "--optimizer")
    schedule = registered(SCHEDULE_BUILDERS, scheduler, "--scheduler")
    built = build(parameters, OptimizerSettings(lr, momentum, weight_decay, device, capturable, fused_kernels))
    return built, schedule(built, ScheduleSettings(optimizer, lr, momentum, warmup_steps, total_steps))


def one_optimizer(module: L.LightningModule) -> LightningOptimizer:
    """The run's optimizer, as Lightning wraps it: ``configure_optimizers`` makes one."""
    found = module.optimizers()
    if isinstance(found, list):
        raise TypeError(f"{type(module).__name__} has {len(found)} optimizers; the engine steps one")
    return found


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
        # torchmetrics wraps update to count its calls, drop a cached value (this metric caches none) and turn
        # gradients off (argmax has none): 40 Python calls, as long as the update's own work at every training step.
        self.update = self._count  # type: ignore[method-assign]

    def __setstate__(self, state: dict[str, Any]) -> None:  # unpickled (a spawned DDP rank): wrapped anew
        super().__setstate__(state)
        self.update = self._count  # type: ignore[method-assign]

    def update(self, scores: torch.Tensor, target: torch.Tensor) -> None:
        # In place: no new tensors to set through nn.Module's __setattr__ at every training step.
        self.correct.add_((scores.argmax(dim=1) == target).sum())
        self.total.add_(target.numel())

    def _count(self, scores: torch.Tensor, target: torch.Tensor) -> None:
        """``update``, counted as torchmetrics' wrapper counts it."""
        type(self).update(self, scores, target)
        internals.count_metric_updates(self, 1)

    def compute(self) -> torch.Tensor:
        return self.correct.float() / self.total.clamp(min=1)

    def reset(self) -> None:
        kept = {name: getattr(self, name) for name in internals.metric_state_names(self)}
        super().reset()
        for name, tensor in kept.items():
            setattr(self, name, tensor.zero_())

    def replayed(self, updates: int) -> None:
        internals.count_metric_updates(self, updates)


class ClassifierModule(L.LightningModule):
    """Trains ``network`` (any ``nn.Module`` from inputs to class scores) to classify ``num_classes`` classes.

    The network may return logits (the usual case; the default ``loss`` is cross-entropy) or
    log-probabilities (override ``loss`` with NLL); wherever the engine needs probabilities it
    takes ``log_softmax`` of the outputs, which is right for both (it leaves log-probabilities
    unchanged). ``batch_loss`` is the training logic of one batch. With ``steps_per_call`` K > 1,
    each Lightning step gets K consecutive batches and takes one optimizer step per batch (manual
    optimisation in ``project/training/steps_per_call.py``); with K = 1, Lightning's usual
    automatic optimisation. Validation and test steps return the network's outputs, so callbacks
    (the figures) can use them without running the network again.
    """

    def __init__(
        self,
        network: nn.Module,
        num_classes: int,
        optimizer: str = "sgd",
        lr: float = 0.2,
        momentum: float = 0.9,
        weight_decay: float = 5e-4,
        scheduler: str = "onecycle",
        warmup_steps: int | None = None,
    ) -> None:
        super().__init__()
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
        if scheduler not in SCHEDULERS:
            raise ValueError(f"scheduler must be one of {SCHEDULERS}, got {scheduler!r}")
        # Plain values only, so checkpoints load under torch.load(weights_only=True). The recipe's
        # subclass saves its own options next to these, so that Class(**hparams) rebuilds it.
        self.save_hyperparameters(
            {"optimizer": optimizer, "lr": float(lr), "momentum": float(momentum),
             "weight_decay": float(weight_decay), "scheduler": scheduler, "warmup_steps": warmup_steps},
            logger=False,
        )
        self.model = network
        self.num_classes = num_classes
        # Counted in place and without a host sync: a captured step replays the training one's update.
        self.train_acc, self.val_acc, self.test_acc = RunningAccuracy(), RunningAccuracy(), RunningAccuracy()
        # No train loss metric: the step losses the logger writes are the training curve,
        # and a per-step MeanMetric update would cost more than a small model's own step.
        self.val_loss, self.test_loss = MeanMetric(), MeanMetric()
        self.val_acc_best = MaxMetric()
        # Not a hyperparameter: how the steps run changes how fast the same training goes, not what it learns.
        self.stepper = lightnings_own_steps()

    def use_stepper(self, stepper: Stepper) -> None:
        """How the engine takes this run's steps: Lightning's own, or groups of K (``steps_per_call.Stepper``)."""
        self.stepper = stepper
        self.automatic_optimization = stepper.automatic

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The training and evaluation loss of the network's outputs: cross-entropy of logits."""
        return nn.functional.cross_entropy(outputs, targets)

    def batch_loss(self, batch: Batch) -> torch.Tensor:
        """The training logic of one batch: its loss, and the training accuracy."""
        x, y = batch
        outputs = self.model(x)
        loss = self.loss(outputs, y)
        self.train_acc.update(outputs.detach(), y)
        return loss

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        if not self.automatic_optimization:
            return self.stepper.train(self, batch, self.batch_loss)
        loss = self.batch_loss(batch)
        # self.log costs more than a small model's step: only the steps the logger writes pay for it.
        if (self.trainer.global_step + 1) % log_every(self.trainer) == 0:
            self.log("train/loss", loss.detach())  # not prog_bar: see LoggedLossBar
            self.log("train/lr", one_optimizer(self).param_groups[0]["lr"])  # the LR this step takes
        return loss

    def _eval_step(self, stage: str, batch: Batch, loss: MeanMetric, acc: RunningAccuracy) -> torch.Tensor:
        x, y = batch
        outputs = self.model(x)
        loss.update(self.loss(outputs, y), weight=y.shape[0])
        acc.update(outputs, y)
        # Logging the metric objects: Lightning computes them at epoch end, synced across DDP
        # ranks, and resets them.
        self.log(f"{stage}/loss", loss, prog_bar=True)
        self.log(f"{stage}/acc", acc, prog_bar=True)
        return outputs

    def validation_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        return self._eval_step("val", batch, self.val_loss, self.val_acc)

    def test_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        return self._eval_step("test", batch, self.test_loss, self.test_acc)

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        return torch.softmax(self.model(x).float(), dim=1)

    # ------------------------------------------------------------------ what the run leaves behind

    def export_weights(self, path: str | os.PathLike) -> tuple[Path, str]:
        """Write ``model.pth``; its path, and what it is (for the run's summary).

        By default the network's own ``state_dict``: it loads into the recipe's ``nn.Module``
        and takes inputs normalised as in training.
        """
        state = {k: v.detach().clone().cpu() for k, v in self.model.state_dict().items()}
        return self.write_weights(state, path), f"the state_dict of {type(self.model).__name__}; normalised " \
                                                "inputs, as in training"

    @staticmethod
    def write_weights(state: dict[str, Any], path: str | os.PathLike) -> Path:
        """Save ``state`` to ``path`` atomically (a crash mid-write leaves the previous file whole); for a recipe's
        own ``export_weights``."""
        return atomic_save(state, path)

    def portable_network(self) -> tuple[nn.Module, str]:
        """The network ``--export-pt2`` writes as a ``torch.export`` program, and what it takes as input."""
        return copy.deepcopy(self.model).float().cpu().eval(), "normalised inputs, as in training"

    @classmethod
    def network_from_weights(cls, state: dict[str, torch.Tensor], source: str) -> nn.Module:
        """A network for a ``model.pth`` that ``export_weights`` wrote, taking inputs as training gave them.

        By default the recipe's network with its default options: a ``model.pth`` of other options
        is refused (evaluate its checkpoint instead, which records them).
        """
        with_defaults = cast(Callable[[], ClassifierModule], cls)  # a recipe's module: every option has a default
        network = with_defaults().model
        try:
            network.load_state_dict(state, strict=True)
        except RuntimeError:
            raise CheckpointError(f"{source}: its tensors do not fit {type(network).__name__} with the recipe's "
                                  "default options; use the run's checkpoint (--ckpt) instead") from None
        return network

    def on_train_epoch_end(self) -> None:
        self.log("train/acc", self.train_acc, prog_bar=True)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """The epoch's training accuracy so far (every rank's counts, summed), so that a run resumed mid-epoch logs
        the whole epoch's ``train/acc``, as the run never stopped does."""
        counts = torch.stack([self.train_acc.correct, self.train_acc.total]).detach().clone()
        if self.trainer.world_size > 1:
            torch.distributed.all_reduce(counts)
        checkpoint["train_acc"] = {"epoch": self.current_epoch, "counts": counts.cpu()}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._resumed_train_acc = checkpoint.get("train_acc")

    def on_train_start(self) -> None:
        saved, self._resumed_train_acc = getattr(self, "_resumed_train_acc", None), None
        # Mid-epoch only: a checkpoint taken at an epoch's end resumes at the next epoch's start.
        if saved is not None and saved["epoch"] == self.current_epoch and self.trainer.is_global_zero:
            correct, total = saved["counts"].to(self.train_acc.correct.device)
            self.train_acc.correct.add_(correct)
            self.train_acc.total.add_(total)

    def on_validation_epoch_end(self) -> None:
        if not self.trainer.sanity_checking:
            self.val_acc_best.update(self.val_acc.compute())
            # Already synced by compute(); sync_dist only marks the value as global (no-op mean).
            self.log("val/acc_best", self.val_acc_best.compute(), sync_dist=True)

    def configure_optimizers(self) -> Any:
        hp = self.hparams
        optimizer, scheduler = optimizer_and_schedule(
            self.model.parameters(), hp["optimizer"], hp["lr"], hp["momentum"], hp["weight_decay"], hp["scheduler"],
            hp.get("warmup_steps"), self.optimizer_steps() if hp["scheduler"] != "none" else 0, self.device,
            capturable=self.stepper.capturable)
        if scheduler is None:
            return optimizer
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def optimizer_steps(self) -> int:
        """How many optimizer steps this fit takes (Lightning counts Lightning steps, K of ours each)."""
        if self.automatic_optimization:
            return int(self.trainer.estimated_stepping_batches)
        epochs = self.trainer.max_epochs
        if epochs is None:  # the engine's Trainer always has it (config.max_epochs)
            raise RuntimeError("a grouped run needs max_epochs to count its optimizer steps")
        return tensor_datamodule(self.trainer).steps_per_epoch() * epochs
