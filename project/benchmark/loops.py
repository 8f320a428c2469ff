"""The ways to train the article's MLP that ``scripts/benchmark.py`` times side by side."""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, RandomSampler, Subset
from torchvision import datasets, transforms

from project import EVAL_BATCH_SIZE
from project.training.callbacks import EpochStats
from project.config.schema import RunConfig
from project.recipe.data import TensorMNIST, keep_batch, normalize, split_indices
from project.recipe.model import build_sequential

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


def train_split(data_dir: Path, limit: int | None) -> list[int]:
    """The template's seeded train split, so every implementation sees the same samples."""
    defaults = RunConfig()
    train, _ = split_indices(len(datasets.MNIST(data_dir, train=True)), defaults.val_size, defaults.seed)
    return train[:limit] if limit else train


def evaluate(model: nn.Module, images: torch.Tensor, targets: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        correct = sum(
            int((model(x.reshape(len(x), -1)).argmax(1) == y).sum())
            for x, y in zip(images.split(EVAL_BATCH_SIZE), targets.split(EVAL_BATCH_SIZE), strict=True)
        )
    model.train()
    return correct / len(targets)


def hand_loop(kind: str, args: argparse.Namespace, device: torch.device, precision: str, train_idx: list[int],
              data_dir: Path) -> dict[str, Any]:
    """The article's loop (``kind="article"``: DataLoader + ToTensor, fixed only to run), or a lean
    hand-written one over tensors on the device (batches by shuffled index)."""
    torch.manual_seed(0)
    model = build_sequential((128,)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=ARTICLE_LR)
    criterion = nn.NLLLoss()
    test = datasets.MNIST(data_dir, train=False)
    if kind == "article":
        train_data = Subset(datasets.MNIST(data_dir, train=True, transform=transforms.ToTensor()), train_idx)
        loader: Iterable = DataLoader(train_data, batch_size=args.batch_size, shuffle=True)
        test_x = test.data.unsqueeze(1).float().div(255).to(device)

        def batches() -> Iterable:
            return loader
    else:
        full = datasets.MNIST(data_dir, train=True)
        index = torch.tensor(train_idx)
        images, labels = normalize(full.data[index]).to(device), full.targets[index].to(device)
        test_x = normalize(test.data).to(device)

        def batches() -> Iterable:
            order = torch.randperm(len(labels), device=device)
            return ((images[i], labels[i]) for i in order.split(args.batch_size))

    times, steps = [], 0
    with counting_syncs(device) as caught:
        for _ in range(args.epochs + 1):
            times.append(_epoch(model, optimizer, criterion, batches(), device, precision))
            steps += -(-len(train_idx) // args.batch_size)
    return {"epoch_times": times[1:], "test_acc": evaluate(model, test_x, test.targets.to(device)),
            "syncs_per_step": syncs_in(caught) / steps}


def _epoch(model: nn.Module, optimizer: torch.optim.Optimizer, criterion: nn.Module, batches: Iterable,
           device: torch.device, precision: str) -> float:
    with EpochTimer(device) as timer:
        for inputs, targets in batches:
            inputs = inputs.to(device, non_blocking=True).reshape(len(inputs), -1)
            targets = targets.to(device, non_blocking=True)
            with autocast(device, precision):
                loss = criterion(model(inputs).float(), targets)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    return timer.seconds


@contextmanager
def counting_syncs(device: torch.device) -> Iterator[list[warnings.WarningMessage]]:
    """The host syncs a block makes on a GPU (torch's sync debug mode warns at each); none elsewhere."""
    caught: list[warnings.WarningMessage] = []
    if device.type != "cuda":
        yield caught
        return
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as recorded:
            warnings.simplefilter("always")
            yield recorded
            caught.extend(recorded)
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def syncs_in(caught: list[warnings.WarningMessage]) -> int:
    return sum("synchroniz" in str(w.message) for w in caught)


class _Bare(L.LightningModule):
    """The least a LightningModule can be: Lightning's own per-step cost, nothing of the template's."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = build_sequential((128,))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.nll_loss(self.net(x.reshape(len(x), -1)), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=ARTICLE_LR)


def bare_lightning(args: argparse.Namespace, device: torch.device, precision: str, train_idx: list[int],
                   data_dir: Path) -> dict[str, Any]:
    """A minimal LightningModule on the same in-memory tensors: no callbacks, logger, bar or validation."""
    full, test = datasets.MNIST(data_dir, train=True), datasets.MNIST(data_dir, train=False)
    index = torch.tensor(train_idx)
    data = TensorMNIST(normalize(full.data[index]).to(device), full.targets[index].to(device))
    loader = DataLoader(data, batch_size=args.batch_size, sampler=RandomSampler(data), collate_fn=keep_batch)
    stats, module = EpochStats(), _Bare()
    trainer = L.Trainer(accelerator=device.type, devices=1, precision=precision, max_epochs=args.epochs + 1,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[stats], limit_val_batches=0)
    trainer.fit(module, train_dataloaders=loader)
    module.to(device)
    accuracy = evaluate(module.net, normalize(test.data).to(device), test.targets.to(device))
    return {"epoch_times": stats.epoch_times[1:], "test_acc": accuracy}


def template(args: argparse.Namespace, data_dir: Path, limit: int | None, steps_per_call: int | str,
             loader: str = "memory") -> dict[str, Any]:
    """``train()`` itself on the article's recipe; on a GPU, with the host syncs it made per step."""
    from project.hardware.devices import resolve_accelerator
    from project.training.run import train

    with tempfile.TemporaryDirectory() as logdir:
        config = RunConfig(
            accelerator=args.accelerator, precision=args.precision, data_dir=str(data_dir), logdir=logdir,
            name="bench", max_epochs=args.epochs + 1, batch_size=args.batch_size, loader=loader,
            steps_per_call=steps_per_call, optimizer="sgd", lr=ARTICLE_LR, momentum=0.0, weight_decay=0.0,
            scheduler="none",
            trainer={"enable_progress_bar": False, **({"limit_train_batches": limit // args.batch_size}
                                                       if limit else {})},
        )
        with counting_syncs(torch.device(resolve_accelerator(args.accelerator))) as caught:
            result = train(config)
    return {"epoch_times": result.epoch_times[1:], "test_acc": float(result.test_metrics["test/acc"]),
            "steps_per_call": result.steps_per_call,
            "syncs_per_step": syncs_in(caught) / max(result.optimizer_steps, 1)}
