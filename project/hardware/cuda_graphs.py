"""CUDA graphs: every optimizer step of a group replayed from one capture, on by default on a GPU.

Replaying a graph launches a whole step's kernels (forward, loss, backward, update, schedule,
loss scale, accuracy counts, the step's loss into the group's buffer) with one call, so the
host's Python work per step all but disappears. The step is ``DeviceStep``
(``project/hardware/device_step.py``); here it is captured once, checked against an eager step on
another batch (a step that cannot be captured faithfully gives other numbers), timed, and
replayed for every full-size batch; the epoch's last, smaller batch runs the same step eagerly.
Whatever stops a capture (a host sync, a data-dependent shape, an optimizer or metric it cannot
read) is said in one line and the run goes on with the eager steps from the same state.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from enum import Enum
from typing import Any

import torch

from project.config.schema import RunConfig
from project.errors import UsageError, first_line
from project.hardware.device_step import DeviceStep, NotCapturable, RunningAccuracy

WARM_UP_STEPS = 3  # on a side stream before capture, as PyTorch's graph capture requires
TIMED_REPLAYS = 10
GROUP_BUFFER_BYTES = 256 * 2**20  # the inputs a group's buffer holds at most (it holds two batches at least)


class StepMode(Enum):
    """How a group's optimizer steps run."""

    GRAPHS = "graphs"  # each step a DeviceStep replayed from one CUDA graph capture
    DEVICE = "device"  # the same DeviceStep, uncaptured (--cuda-graphs on a CPU: their arithmetic, checked)
    OFF = "off"  # torch.optim's own eager steps


def capture_plan(config: RunConfig, accelerator: str, steps_per_call: int, why_one: str | None = None) -> \
        tuple[StepMode, str]:
    """The step mode and why. ``--cuda-graphs`` asked for where it cannot be: refused in one line."""
    asked = config.cuda_graphs
    if asked is False:
        return StepMode.OFF, "--no-cuda-graphs"
    reason = None
    if steps_per_call < 2:
        reason = why_one or f"--steps-per-call {steps_per_call}: a graph replays the steps of a group"
    elif config.compile:
        reason = "--compile makes its own graphs"
    elif config.detect_anomaly:
        reason = "--detect-anomaly checks every backward on the host"
    elif config.optimizer != "sgd" and config.scheduler == "onecycle":
        reason = f"one-cycle cycles {config.optimizer}'s beta1, a Python number in torch's optimizer"
    if reason is not None:
        if asked is True:
            raise UsageError(f"--cuda-graphs: not possible here ({reason}); drop it or use --no-cuda-graphs")
        return StepMode.OFF, reason
    if accelerator == "cuda":
        return StepMode.GRAPHS, "each optimizer step replayed from one capture"
    if asked is True:
        return StepMode.DEVICE, f"no GPU here: --cuda-graphs checks their arithmetic on {accelerator}"
    return StepMode.OFF, f"{accelerator}: CUDA graphs need a GPU"


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

    def _capture(self, images: torch.Tensor, targets: torch.Tensor, batch_size: int) -> bool:
        """Capture one step that reads its batch from the group buffer at ``cursor``; check it and time it.
        False (and the state as it was) if it cannot be."""
        program = self.program
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
        loss = self.program(self.images.index_select(0, rows), self.targets.index_select(0, rows))
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
                self.graph.replay()
            losses.append(self.losses[: chunk // self.batch_size].clone())
        for metric in self.counting:
            metric.replayed(len(targets) // self.batch_size)
        return torch.cat(losses) if len(losses) > 1 else losses[0]

    def _check_against_eager(self, saved: list, batch: int) -> None:
        """The replay on batch ``batch`` (not the one captured) against the eager step on it, from the same state:
        a step that baked in its first batch, or worked on the host, gives other numbers."""
        program = self.program
        program.restore(saved)
        start = slice(batch * self.batch_size, (batch + 1) * self.batch_size)
        eager_loss = program(self.images[start], self.targets[start])
        eager = [t.detach().clone() for t in program.params]
        program.restore(saved)
        self.cursor.fill_(batch)
        self.graph.replay()
        replayed_loss = self.losses[batch]
        worst = max(float((a.detach() - b).abs().max()) for a, b in zip(program.params, eager, strict=True))
        if not torch.allclose(replayed_loss, eager_loss.float(), rtol=1e-4, atol=1e-6) or \
                not all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(program.params, eager, strict=True)):
            raise NotCapturable(f"the captured step does not reproduce the eager one (weights differ by up to "
                                f"{worst:.2g}: random ops, or work on the host inside the step)")

    def _time(self, saved: list) -> None:
        """Seconds per replayed step, with CUDA events (after warm-up), for ``steps per call auto``."""
        self.program.restore(saved)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.graph.replay()
        start.record()
        for _ in range(TIMED_REPLAYS):
            self.cursor.zero_()
            self.graph.replay()
        end.record()
        end.synchronize()
        if self.on_timed is not None:
            self.on_timed(start.elapsed_time(end) / 1000 / TIMED_REPLAYS)

    def _metrics(self) -> list[Any]:
        from torchmetrics import Metric

        return [m for m in self.program.module.modules() if isinstance(m, Metric)]

    @staticmethod
    def _check_metrics(updated: list[Any]) -> None:
        """A metric the step updates that does not count in place would lose every replay's update."""
        for metric in updated:
            if not isinstance(metric, RunningAccuracy):
                raise NotCapturable(f"{type(metric).__name__} is updated in the step; only metrics that count in "
                                    "place (RunningAccuracy) can be replayed")


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

