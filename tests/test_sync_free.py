"""No tensor becomes a Python number or goes to the host, and no Python number becomes a tensor on the run's
device, between logging steps: on a GPU each would be a host sync.

Checked on CPU by counting every conversion (``item``, ``float``, ``int``, ``bool``, ``tolist``, ``numpy``), every
copy to the host (``cpu()``, ``to("cpu")``), every ``nonzero`` of any tensor, and every
``torch.tensor(..., device=...)``, made anywhere (Lightning's loop, its progress bar, logger connector and LR
monitor, the callbacks, the template), and filing each under the optimizer step it happened in: within a
group of steps per call, under the step whose ``batch_loss`` ran last. At default settings with the progress
bar on. The GPU test (``tests/test_gpu.py``) checks the same with CUDA's sync debug mode.
"""

from __future__ import annotations

import functools
import traceback

import lightning as L
import pytest
import torch

from helpers import tiny_config, train
from project.training import build
from project.training.callbacks import FiniteLossGuard, RunsFirst
from project.training.classifier import ClassifierModule

CONVERSIONS = ("item", "__float__", "__int__", "__bool__", "tolist", "__index__", "numpy", "cpu", "nonzero")
# Tensors that stay on the host in every run: a DataLoader iterator draws its base seed from a CPU generator.
HOST_ONLY = "torch/utils/data/dataloader.py"


class ConversionCounter(RunsFirst):
    """Which optimizer step each conversion happened in: from a Lightning step's start until its first
    ``batch_loss``, the step it ends at (``pending``); from a ``batch_loss`` on, that optimizer step's."""

    def __init__(self) -> None:
        self.step: int | None = None  # None outside training steps: validation, epoch ends, setup
        self.started = 0  # global_step when training (re)started
        self.losses = 0  # batch_loss calls since then
        self.pending: list[str] = []  # at a Lightning step's start, before its first batch_loss
        self.seen: list[tuple[int, str]] = []

    def on_train_start(self, trainer: L.Trainer, *args: object) -> None:
        self.started = trainer.global_step

    def on_train_batch_start(self, trainer: L.Trainer, *args: object) -> None:
        self.step, self.pending = -1, []

    def batch_loss_started(self) -> None:
        if self.step is not None:
            self.losses += 1
            self.step = self.started + self.losses

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        # The step's conversions before its first batch_loss, and those of the loop's bookkeeping until the next
        # step (the logger and the progress bar's values come after this hook), belong to the step it ended at.
        self.seen += [(trainer.global_step, where) for where in self.pending]
        self.pending = []
        self.step = trainer.global_step

    def on_train_epoch_end(self, trainer: L.Trainer, *args: object) -> None:
        self.step = None

    def on_validation_start(self, trainer: L.Trainer, *args: object) -> None:
        self.step = None

    def record(self) -> None:
        if self.step is None:
            return
        caller = traceback.extract_stack(limit=3)[0]
        where = f"{caller.filename.split('site-packages/')[-1]}:{caller.lineno}"
        if where.startswith(HOST_ONLY):
            return
        if self.step == -1:
            self.pending.append(where)
        else:
            self.seen.append((self.step, where))


@pytest.fixture
def counter(monkeypatch: pytest.MonkeyPatch) -> ConversionCounter:
    counting = ConversionCounter()
    for name in CONVERSIONS:
        original = getattr(torch.Tensor, name)

        def converted(self: torch.Tensor, *args: object, _original=original) -> object:
            counting.record()
            return _original(self, *args)

        monkeypatch.setattr(torch.Tensor, name, converted)
    to = torch.Tensor.to

    def moved(self: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        if (args[:1] or [kwargs.get("device")])[0] == "cpu":  # the host asked for by name (a GPU run's copy back)
            counting.record()
        return to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", moved)
    batch_loss = ClassifierModule.batch_loss

    def counted_batch_loss(module: ClassifierModule, batch: object) -> torch.Tensor:
        counting.batch_loss_started()
        return batch_loss(module, batch)

    monkeypatch.setattr(ClassifierModule, "batch_loss", counted_batch_loss)
    make_tensor = torch.tensor

    def tensor(*args: object, **kwargs: object) -> torch.Tensor:
        if kwargs.get("device") is not None:  # a Python value sent to a device: a blocking copy on a GPU
            counting.record()
        return make_tensor(*args, **kwargs)

    monkeypatch.setattr(torch, "tensor", tensor)
    return counting


@pytest.mark.parametrize(("steps_per_call", "cuda_graphs"), [(1, False), (4, False), (4, True)],
                         ids=["K1", "K4", "K4-device-step"])
def test_no_conversion_between_logging_steps(shared_tiny_data, tmp_path, counter, steps_per_call, cuda_graphs,
                                             monkeypatch):
    """K4-device-step: the step a CUDA graph captures (``--cuda-graphs``), run eagerly here."""
    # The non-finite-loss guard checks CPU losses at once (free on the host); on an accelerator it keeps a
    # flag on the device and looks at logging steps. Take that path here.
    monkeypatch.setattr(build, "FiniteLossGuard", functools.partial(FiniteLossGuard, deferred=True))
    log_every = 3
    config = tiny_config(shared_tiny_data, tmp_path, max_epochs=2, log_every_n_steps=log_every,
                         steps_per_call=steps_per_call, cuda_graphs=cuda_graphs, trainer={"enable_progress_bar": True})
    train(config, callbacks=[counter], test=False)
    # 200 training images in batches of 32: 7 steps an epoch; the steps that end at 3, 6, 9, 12 are logged.
    # The logger reads the logged values at each logging step: conversions there show the counter is wired in.
    assert {step for step, _ in counter.seen} >= {3, 6, 9, 12}, counter.seen
    assert counter.losses == 14  # every optimizer step counted, whatever the group it ran in
    between = [(step, where) for step, where in counter.seen if step % log_every != 0]
    assert not between, between
