"""``--cuda-graphs``: one optimizer step (``batch_loss``, backward, optimizer step) captured once and replayed.

Replaying a CUDA graph launches the whole step's kernels with one call, so the host's Python
work per step all but disappears. Off by default: it needs a GPU, full precision, and the
same batch shape every step (the epoch's last, smaller batch runs the ordinary way).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from torchmetrics import Metric

from project.config.schema import RunConfig
from project.errors import UsageError
from project.training.steps_per_call import count_optimizer_step

WARM_UP_STEPS = 3  # on a side stream before capture, as PyTorch's graph capture requires


def check_cuda_graphs(config: RunConfig, accelerator: str, steps_per_call: int) -> None:
    """Refuse ``--cuda-graphs`` where a captured step could not be the same training."""
    if not config.cuda_graphs:
        return
    if accelerator != "cuda":
        raise UsageError("--cuda-graphs captures GPU work; it needs --accelerator gpu")
    if steps_per_call < 2:
        raise UsageError("--cuda-graphs replays the steps of one Lightning step; it needs --steps-per-call 2 or more "
                         f"(this run takes {steps_per_call})")
    if config.precision.endswith("-mixed"):
        raise UsageError("--cuda-graphs cannot capture mixed precision (autocast's cache, the loss scaler); "
                         "use --precision 32 or bf16-true")
    if config.scheduler == "onecycle":
        # OneCycleLR writes momentum (Adam's betas) into the optimizer as Python numbers every step; a captured
        # step keeps the value it was captured with. The LR alone is a tensor the schedule updates in place.
        raise UsageError("--cuda-graphs with --scheduler onecycle: one-cycle changes the momentum every step, which a "
                         "captured step cannot see; use --scheduler cosine or none")


class _Recorder:
    """Stands in for a metric during capture: remembers the (static) tensors ``update`` got."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def update(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append((args, kwargs))


class GraphedStep:
    """``batch_loss``, backward and the optimizer step of one batch, as a replayable CUDA graph.

    Metrics that ``batch_loss`` updates are updated after each replay from the graph's output
    tensors (a metric's state is re-created when it resets, which a graph would not see). The
    warm-up steps' changes to weights and optimizer state are undone before training goes on.
    """

    def __init__(self, module: L.LightningModule, batch_loss: Callable[[Any], torch.Tensor]) -> None:
        self.module, self.batch_loss = module, batch_loss
        self.graph: torch.cuda.CUDAGraph | None = None
        self.images = self.targets = self.loss = None
        self.recorded: dict[str, _Recorder] = {}

    def __call__(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        if self.graph is None:
            self._capture(batch)
        self.images.copy_(batch[0])
        self.targets.copy_(batch[1])
        self.graph.replay()
        for name, recorder in self.recorded.items():
            metric = getattr(self.module, name)
            for args, kwargs in recorder.calls:
                metric.update(*args, **kwargs)
        count_optimizer_step(self.module.trainer)
        return self.loss.clone()

    def _step(self, optimizer: torch.optim.Optimizer) -> torch.Tensor:
        loss = self.batch_loss((self.images, self.targets))
        loss.backward()
        optimizer.step()
        return loss

    def _capture(self, batch: tuple[torch.Tensor, torch.Tensor]) -> None:
        optimizer = self.module.optimizers().optimizer
        self.images, self.targets = batch[0].clone(), batch[1].clone()
        params = [p.detach().clone() for p in self.module.parameters()]
        state = {id(p): {k: v.clone() for k, v in optimizer.state[p].items() if torch.is_tensor(v)}
                 for p in self.module.parameters()}
        metrics = {name: child for name, child in self.module.named_children() if isinstance(child, Metric)}
        self.recorded = {name: _Recorder() for name in metrics}
        for name, recorder in self.recorded.items():
            object.__setattr__(self.module, name, recorder)
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(WARM_UP_STEPS):
                    optimizer.zero_grad(set_to_none=True)
                    self._step(optimizer)
            torch.cuda.current_stream().wait_stream(side)
            optimizer.zero_grad(set_to_none=True)
            self.graph = torch.cuda.CUDAGraph()
            for recorder in self.recorded.values():
                recorder.calls.clear()
            with torch.cuda.graph(self.graph):
                self.loss = self._step(optimizer)
        finally:
            for name in metrics:
                self.module.__dict__.pop(name, None)  # the registered metric shows through again
        with torch.no_grad():  # undo the warm-up, in place: the graph holds these very tensors
            for p, saved in zip(self.module.parameters(), params, strict=True):
                p.copy_(saved)
            for p in self.module.parameters():
                for key, value in optimizer.state[p].items():
                    if not torch.is_tensor(value):
                        continue
                    if key in state[id(p)]:
                        value.copy_(state[id(p)][key])
                    else:  # made by the warm-up: zeros are what a first step starts from
                        value.zero_()
