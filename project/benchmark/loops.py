"""The ways to train the recipe that ``scripts/benchmark.py`` times side by side, all on the same samples.

Every row trains the recipe's network with its loss on the training split of one datamodule
(the same samples, ``--limit`` included), so samples/s counts what each row trained.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, RandomSampler, Subset

from project import EVAL_BATCH_SIZE
from project.config.schema import RunConfig
from project.training.build import build_datamodule, build_model
from project.training.callbacks import EpochStats, RunsFirst
from project.training.tensor_data import TensorDataModule, TensorPairs, keep_batch, split_indices

ARTICLE_LR = 0.01


class EpochTimer:
    """Times an epoch with CUDA events on a GPU, with the wall clock elsewhere."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def __enter__(self) -> EpochTimer:
        if self.cuda:
            self._start, self._end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.cuda:
            self._end.record()
            self._end.synchronize()
            self.seconds = self._start.elapsed_time(self._end) / 1000
        else:
            self.seconds = time.perf_counter() - self._t0


def autocast(device: torch.device, precision: str) -> Any:
    if precision.endswith("-mixed"):
        dtype = torch.bfloat16 if precision.startswith("bf16") else torch.float16
        return torch.autocast(device.type, dtype=dtype)
    return torch.autocast(device.type, enabled=False)


@dataclass
class BenchData:
    """The samples every row trains on and is tested on, and the recipe's network and loss to train."""

    config: RunConfig
    train: TensorPairs  # normalised, as the template trains
    test: TensorPairs
    per_sample: Dataset | None  # the same training samples, unnormalised, one at a time (None: the recipe has none)
    datamodule: Callable[[str], TensorDataModule]  # a fresh datamodule holding exactly these samples

    def network(self) -> tuple[nn.Module, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]:
        """The recipe's network, freshly initialised from seed 0, and its loss."""
        torch.manual_seed(0)
        module = build_model(self.config)
        return module.model, module.loss


def bench_data(args: argparse.Namespace) -> BenchData:
    """The recipe's training split (its first ``--limit`` samples) and test set, loaded once."""
    config = RunConfig(data_dir=args.data_dir, batch_size=args.batch_size, accelerator=args.accelerator,
                       precision=args.precision)

    def datamodule(loader: str = "memory") -> TensorDataModule:
        data = build_datamodule(config.replace(loader=loader))
        data.setup("fit")
        data.setup("test")
        if args.limit:
            keep = list(range(min(args.limit, len(data.train_set))))
            train = data.train_set
            data.train_set = TensorPairs(*train.__getitems__(keep)) if isinstance(train, TensorPairs) else \
                Subset(train, keep)
        return data

    data = datamodule()
    per_sample = None
    if type(data).load_samples is not TensorDataModule.load_samples:
        samples = data.load_samples(train=True)
        train, _ = split_indices(len(samples), data.validation_count(len(samples)), data.seed)
        per_sample = Subset(samples, train[:len(data.train_set)])
    return BenchData(config, data.train_set, data.test_set, per_sample, datamodule)


def evaluate(network: nn.Module, test: TensorPairs, device: torch.device, normalize: Callable | None = None) -> float:
    """Test accuracy; ``normalize`` maps the normalised test inputs to what ``network`` was trained on."""
    network.eval()
    with torch.no_grad():
        correct = 0
        for x, y in zip(test.inputs.split(EVAL_BATCH_SIZE), test.targets.split(EVAL_BATCH_SIZE), strict=True):
            x = x.to(device)
            correct += int((network(normalize(x) if normalize else x).argmax(1) == y.to(device)).sum())
    network.train()
    return correct / len(test.targets)


def hand_loop(kind: str, args: argparse.Namespace, device: torch.device, precision: str,
              data: BenchData) -> dict[str, Any]:
    """The article's loop (``kind="article"``: a per-sample Dataset and DataLoader, unnormalised inputs as the
    article feeds them, fixed only to run), or a lean hand-written one over tensors on the device (batches by
    shuffled index)."""
    network, loss_fn = data.network()
    network.to(device)
    optimizer = torch.optim.SGD(network.parameters(), lr=ARTICLE_LR)
    unnormalize: Callable | None = None
    if kind == "article":
        loader: Iterable = DataLoader(data.per_sample, batch_size=args.batch_size, shuffle=True)
        to_pixels = data.datamodule("memory").to_image
        unnormalize = lambda x: to_pixels(x).to(device)  # noqa: E731 - the article trains on ToTensor() pixels

        def batches() -> Iterable:
            return loader
    else:
        inputs, labels = data.train.inputs.to(device), data.train.targets.to(device)

        def batches() -> Iterable:
            order = torch.randperm(len(labels), device=device)
            return ((inputs[i], labels[i]) for i in order.split(args.batch_size))

    times, steps = [], 0
    with counting_syncs(device) as caught:
        for _ in range(args.epochs + 1):
            times.append(_epoch(network, optimizer, loss_fn, batches(), device, precision))
            steps += -(-len(data.train) // args.batch_size)
    return {"epoch_times": times[1:], "test_acc": evaluate(network, data.test, device, unnormalize),
            "syncs_per_step": syncs_in(caught) / steps}


def _epoch(network: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: Callable, batches: Iterable,
           device: torch.device, precision: str) -> float:
    with EpochTimer(device) as timer:
        for inputs, targets in batches:
            inputs = inputs.to(device, non_blocking=True)
            targets = targets.to(device, non_blocking=True)
            with autocast(device, precision):
                loss = loss_fn(network(inputs).float(), targets)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    return timer.seconds


@contextmanager
def counting_syncs(device: torch.device, from_start: bool = True) -> Iterator[list[warnings.WarningMessage]]:
    """The host syncs a block makes on a GPU (torch's sync debug mode warns at each); none elsewhere.
    ``from_start=False`` counts only where something in the block turns the mode on (``SyncsInTrainingSteps``)."""
    caught: list[warnings.WarningMessage] = []
    if device.type != "cuda":
        yield caught
        return
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("warn" if from_start else 0)
    try:
        with warnings.catch_warnings(record=True) as recorded:
            warnings.simplefilter("always")
            yield recorded
            caught.extend(recorded)
    finally:
        torch.cuda.set_sync_debug_mode(previous)


class SyncsInTrainingSteps(RunsFirst):
    """Counting on from each training step's start until validation: the syncs of training steps (logging steps
    included), as the hand-written loop's are counted, not those of set-up, validation, testing or export."""

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        torch.cuda.set_sync_debug_mode("warn")

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        torch.cuda.set_sync_debug_mode(0)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        torch.cuda.set_sync_debug_mode(0)


def syncs_in(caught: list[warnings.WarningMessage]) -> int:
    return sum("synchroniz" in str(w.message) for w in caught)


class _Bare(L.LightningModule):
    """The least a LightningModule can be: Lightning's own per-step cost, nothing of the template's."""

    def __init__(self, network: nn.Module, loss_fn: Callable) -> None:
        super().__init__()
        self.net = network
        self.loss_fn = loss_fn

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return self.loss_fn(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=ARTICLE_LR)


def bare_lightning(args: argparse.Namespace, device: torch.device, precision: str, data: BenchData) -> dict[str, Any]:
    """A minimal LightningModule on the same in-memory tensors: no callbacks, logger, bar or validation."""
    train = data.train.to(device)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=RandomSampler(train), collate_fn=keep_batch)
    stats, module = EpochStats(), _Bare(*data.network())
    trainer = L.Trainer(accelerator=device.type, devices=1, precision=precision, max_epochs=args.epochs + 1,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[stats], limit_val_batches=0)
    trainer.fit(module, train_dataloaders=loader)
    module.to(device)
    return {"epoch_times": stats.epoch_times[1:], "test_acc": evaluate(module.net, data.test, device)}


def template(args: argparse.Namespace, data: BenchData, steps_per_call: int | str,
             loader: str = "memory") -> dict[str, Any]:
    """``train()`` itself on the article's recipe; on a GPU, with the host syncs it made per step."""
    from project.hardware.devices import resolve_accelerator
    from project.training.run import train

    with tempfile.TemporaryDirectory() as logdir:
        config = data.config.replace(
            logdir=logdir, name="bench", max_epochs=args.epochs + 1, loader=loader, steps_per_call=steps_per_call,
            optimizer="sgd", lr=ARTICLE_LR, momentum=0.0, weight_decay=0.0, scheduler="none",
            trainer={"enable_progress_bar": False},
        )
        device = torch.device(resolve_accelerator(args.accelerator))
        with counting_syncs(device, from_start=False) as caught:
            callbacks = [SyncsInTrainingSteps()] if device.type == "cuda" else []
            result = train(config, datamodule=data.datamodule(loader), callbacks=callbacks)
    return {"epoch_times": result.epoch_times[1:], "test_acc": float(result.test_metrics["test/acc"]),
            "steps_per_call": result.steps_per_call, "optimizer_steps": result.optimizer_steps,
            "syncs_per_step": syncs_in(caught) / max(result.optimizer_steps, 1)}
