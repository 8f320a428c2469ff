"""The ways to train the recipe that ``scripts/benchmark.py`` times side by side, all on the same samples.

Every row trains the recipe's network with its loss on the training split of one datamodule
(the same samples, ``--limit`` included), so samples/s counts what each row trained; every row
but the article's trains with the run's default optimizer and per-step schedule
(``optimizer_and_schedule``), so they all do the same work per step.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch import nn
from torch.utils.data import DataLoader, Dataset, RandomSampler, Subset

from project import EVAL_BATCH_SIZE, internals
from project.config.schema import RunConfig
from project.contract import Recipe
from project.hardware.devices import StepMode
from project.training.build import build_datamodule, build_model
from project.training.callbacks import EpochStats, FetchClock, FetchProfiler, RunsFirst
from project.training.classifier import optimizer_and_schedule
from project.training.tensor_data import (
    Augmented,
    TensorDataModule,
    TensorPairs,
    batches_of,
    keep_batch,
    sample_count,
    set_up,
    split_indices,
)

ARTICLE_LR = 0.01
WARM_UP_STEPS = 3  # of the captured loop, on a side stream, before its capture


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


def autocast(device: torch.device, precision: str, cache: bool = True) -> Any:
    """The autocast of a mixed precision (``cache=False`` inside a graph capture), else none."""
    if precision.endswith("-mixed"):
        dtype = torch.bfloat16 if precision.startswith("bf16") else torch.float16
        return torch.autocast(device.type, dtype=dtype, cache_enabled=cache)
    return torch.autocast(device.type, enabled=False)


class AugmentedByHand(Dataset):
    """The recipe's ``augment`` as a hand-written loop applies it: with the worker's own random generator
    (torchvision's random transforms' way), without the template's per-sample seeding."""

    def __init__(self, dataset: Dataset, augment: Callable[[torch.Tensor, torch.Generator], torch.Tensor]) -> None:
        self.dataset, self.augment = dataset, augment

    def __len__(self) -> int:
        return sample_count(self.dataset)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, Any]:
        inputs, target = self.dataset[index]
        return self.augment(inputs, torch.default_generator), target


class DataWait(Callback):
    """The seconds each training epoch of a Lightning run waited for its batches, through the Trainer's own
    profiler hooks (its profiler is put back when training ends)."""

    def __init__(self, now: Callable[[], float] = time.perf_counter) -> None:
        self.clock, self.epoch_waits = FetchClock(now), list[float]()
        self._profiler: FetchProfiler | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._profiler = FetchProfiler.around(trainer, self.clock)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.clock.seconds = 0.0

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.epoch_waits.append(self.clock.seconds)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._profiler is not None:
            self._profiler.remove(trainer)


@dataclass
class BenchData:
    """The samples every row trains on and is tested on, and the recipe's network and loss to train."""

    recipe: Recipe
    config: RunConfig
    train: TensorPairs  # normalised, as the template trains
    test: TensorPairs
    per_sample: Dataset | None  # the same training samples, unnormalised, one at a time (None: the recipe has none)
    datamodule: Callable[..., TensorDataModule]  # a fresh datamodule holding exactly these samples
    reads_samples: bool = False  # the recipe's data is per sample (files): the template rows read it that way

    def network(self) -> tuple[nn.Module, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]:
        """The recipe's network, freshly initialised from seed 0, and its loss."""
        torch.manual_seed(0)
        module = build_model(self.config, self.recipe)
        return module.model, module.loss

    def samples(self) -> Dataset:
        """The per-sample training split (the per-sample rows run only where the recipe has one)."""
        if self.per_sample is None:
            raise ValueError(f"{self.recipe.name}: no per-sample dataset (load_samples) to read one at a time")
        return self.per_sample

    def steps(self, epochs: int, batch_size: int) -> int:
        """Optimizer steps in ``epochs`` epochs of these samples."""
        return epochs * batches_of(len(self.train), batch_size)

    def optimizer(self, network: nn.Module, total_steps: int, device: torch.device,
                  fused_kernels: bool = True) -> tuple[Any, Any]:
        """The run's default optimizer and schedule (what the template trains with), over ``total_steps``."""
        c = self.config
        return optimizer_and_schedule(network.parameters(), c.optimizer, c.lr, c.momentum, c.weight_decay,
                                      c.scheduler, c.warmup_steps, total_steps, device, fused_kernels=fused_kernels)


def bench_data(recipe: Recipe, args: argparse.Namespace, device: torch.device) -> BenchData:
    """The recipe's training split (its first ``--limit`` samples) and test set, loaded once; per-sample data is read
    by the run's (or ``--num-workers``) DataLoader workers into pinned memory on a GPU."""
    given = {name: getattr(args, name) for name in ("num_workers", "val_size") if getattr(args, name) is not None}
    config = RunConfig.for_recipe(recipe, data_dir=args.data_dir, batch_size=args.batch_size,
                                  accelerator=args.accelerator, precision=args.precision,
                                  pin_memory=device.type == "cuda", **given)

    def datamodule(per_sample: bool | None = None) -> TensorDataModule:
        data = build_datamodule(config, recipe, per_sample)
        data.setup("fit")
        data.setup("test")
        if args.limit:
            train = set_up(data.train_set)
            keep = list(range(min(args.limit, sample_count(train))))
            if isinstance(train, TensorPairs):
                data.train_set = TensorPairs(*train.__getitems__(keep))
            elif isinstance(train, Augmented):
                data.train_set = Augmented(Subset(train.dataset, keep), train.augment, train.seed)
            else:
                data.train_set = Subset(train, keep)
        return data

    data = datamodule()
    per_sample = None
    if type(data).load_samples is not TensorDataModule.load_samples:
        samples = data.load_samples(train=True)
        total = sample_count(samples)
        train, _ = split_indices(total, data.validation_count(total), data.seed)
        per_sample = Subset(samples, train[:sample_count(data.train_set)])
    if data.per_sample:  # the hand-written rows train on tensors: the samples read once, normalised
        train_set, test_set = in_memory(set_up(data.train_set), data), in_memory(set_up(data.test_set), data)
        return BenchData(recipe, config, train_set, test_set, per_sample, datamodule, reads_samples=True)
    held = (data.train_set, data.test_set)
    if not (isinstance(held[0], TensorPairs) and isinstance(held[1], TensorPairs)):
        raise TypeError(f"{type(data).__name__} holds its splits in memory as other than TensorPairs")
    return BenchData(recipe, config, held[0], held[1], per_sample, datamodule)


def in_memory(split: Dataset, data: TensorDataModule) -> TensorPairs:
    """A per-sample split read once into normalised tensors (without the training split's augmentation)."""
    split = split.dataset if isinstance(split, Augmented) else split
    inputs, targets = zip(*(split[i] for i in range(sample_count(split))), strict=True)
    return TensorPairs(data.normalize(torch.stack(inputs)), torch.as_tensor(targets))


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
    """A hand-written loop with the run's optimizer and schedule: ``"hand"``, lean, over tensors on the device
    (batches by shuffled index); ``"unfused"``, the same with torch.optim's own default kernels; ``"samples"``,
    over the recipe's per-sample training split (for a folder of images, its ``ImageFolder``) in a DataLoader with
    the run's workers, pinned memory on a GPU, normalised on the device, augmented as the recipe augments, as a
    user writes it by hand;
    ``"article"``, the article's loop (a per-sample DataLoader, unnormalised inputs as the article feeds them, its
    plain SGD), fixed only to run."""
    network, loss_fn = data.network()
    network.to(device)
    unnormalize: Callable | None = None
    prepare: Callable[[torch.Tensor], torch.Tensor] | None = None
    if kind in ("article", "samples"):
        if kind == "article":
            optimizer, scheduler = torch.optim.SGD(network.parameters(), lr=ARTICLE_LR), None
            loader: Iterable = DataLoader(data.samples(), batch_size=args.batch_size, shuffle=True)
            to_pixels = data.datamodule().to_image
            unnormalize = lambda x: to_pixels(x).to(device)  # noqa: E731 - the article trains on ToTensor() pixels
        else:
            optimizer, scheduler = data.optimizer(network, data.steps(args.epochs + 1, args.batch_size), device)
            workers, datamodule = data.config.num_workers, data.datamodule()
            samples = data.samples() if datamodule.augment is None else AugmentedByHand(data.samples(),
                                                                                          datamodule.augment)
            loader = DataLoader(samples, batch_size=args.batch_size, shuffle=True, num_workers=workers,
                                pin_memory=device.type == "cuda", persistent_workers=workers > 0)
            prepare = datamodule.normalize

        def batches() -> Iterable:
            return loader
    else:
        optimizer, scheduler = data.optimizer(network, data.steps(args.epochs + 1, args.batch_size), device,
                                              fused_kernels=kind != "unfused")
        inputs, labels = data.train.inputs.to(device), data.train.targets.to(device)

        def batches() -> Iterable:
            order = torch.randperm(len(labels), device=device)
            return ((inputs[i], labels[i]) for i in order.split(args.batch_size))

    times, waits = [], []
    with counting_syncs(device) as caught:
        for _ in range(args.epochs + 1):
            clock = FetchClock()
            times.append(_epoch(network, optimizer, scheduler, loss_fn, clock.timed(batches()), device, precision,
                                prepare))
            waits.append(clock.seconds)
    return {"epoch_times": times[1:], "warm_up_s": times[0], "wait_times": waits[1:],
            "test_acc": evaluate(network, data.test, device, unnormalize),
            "syncs_per_step": syncs_in(caught) / data.steps(args.epochs + 1, args.batch_size)}


def _epoch(network: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, loss_fn: Callable,
           batches: Iterable, device: torch.device, precision: str,
           prepare: Callable[[torch.Tensor], torch.Tensor] | None = None) -> float:
    with EpochTimer(device) as timer:
        for inputs, targets in batches:
            inputs = inputs.to(device, non_blocking=True)
            targets = targets.to(device, non_blocking=True)
            if prepare is not None:
                inputs = prepare(inputs)
            with autocast(device, precision):
                loss = loss_fn(network(inputs).float(), targets)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
    return timer.seconds


def hand_graphs(args: argparse.Namespace, device: torch.device, precision: str, data: BenchData) -> dict[str, Any]:
    """The hand-written loop with each step captured once as a CUDA graph and replayed: the bound for this model
    on this GPU. The step (gather of the batch by index, forward, loss, backward, the SGD update with its
    momentum and weight decay) reads the LR and momentum from tables on the device, made from the run's own
    schedule, at a step counter the graph advances; the host copies each batch's indices and replays. The
    epoch's last, smaller batch runs the same step eagerly. Plain SGD only (the run's default optimizer)."""
    network, loss_fn = data.network()
    network.to(device)
    total = data.steps(args.epochs + 1, args.batch_size)
    optimizer, scheduler = data.optimizer(network, total, device)
    group = optimizer.param_groups[0]
    table = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # stepping the schedule alone, to read it
        for _ in range(total):
            table.append((group["lr"], group["momentum"]))
            if scheduler is not None:
                scheduler.step()
    lrs, momenta = torch.tensor(table, device=device).unbind(1)
    params: list[torch.Tensor] = list(network.parameters())
    buffers = [torch.zeros_like(p) for p in params]
    inputs, labels = data.train.inputs.to(device), data.train.targets.to(device)
    step = torch.zeros((), dtype=torch.long, device=device)
    wd, nesterov = group["weight_decay"], group["nesterov"]

    def train_step(index: torch.Tensor) -> None:
        with autocast(device, precision, cache=False):
            loss = loss_fn(network(inputs.index_select(0, index)).float(), labels.index_select(0, index))
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            lr, momentum = lrs.index_select(0, step.view(1)).view(()), momenta.index_select(0, step.view(1)).view(())
            grads = internals.foreach_add(grads, params, alpha=wd)
            internals.foreach_mul_(buffers, momentum)
            internals.foreach_add_(buffers, grads)
            update = internals.foreach_add(grads, internals.foreach_mul(buffers, momentum)) if nesterov else buffers
            internals.foreach_sub_(params, internals.foreach_mul(update, lr))
            step.add_(1)

    static = torch.zeros(args.batch_size, dtype=torch.long, device=device)
    saved = [t.detach().clone() for t in [*params, *buffers, step]]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARM_UP_STEPS):
            train_step(static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        train_step(static)
    with torch.no_grad():  # undo the warm-up and the capture's own step
        for tensor, value in zip([*params, *buffers, step], saved, strict=True):
            tensor.copy_(value)
    times, waits = [], []
    with counting_syncs(device) as caught:
        for _ in range(args.epochs + 1):
            clock = FetchClock()
            with EpochTimer(device) as timer:
                for index in clock.timed(torch.randperm(len(labels), device=device).split(args.batch_size)):
                    if len(index) == args.batch_size:
                        static.copy_(index)
                        graph.replay()
                    else:
                        train_step(index)
            times.append(timer.seconds)
            waits.append(clock.seconds)
    return {"epoch_times": times[1:], "warm_up_s": times[0], "wait_times": waits[1:],
            "test_acc": evaluate(network, data.test, device),
            "syncs_per_step": syncs_in(caught) / total}


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


class BareModule(L.LightningModule):
    """The least a LightningModule can be: Lightning's own per-step cost, nothing of the template's."""

    def __init__(self, network: nn.Module, loss_fn: Callable, optimizer: Callable[[nn.Module], Any]) -> None:
        super().__init__()
        self.net = network
        self.loss_fn = loss_fn
        self.make_optimizer = optimizer

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return self.loss_fn(self.net(x), y)

    def configure_optimizers(self) -> Any:
        optimizer, scheduler = self.make_optimizer(self.net)
        if scheduler is None:
            return optimizer
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def bare_loader(train: TensorPairs, batch_size: int) -> DataLoader:
    """Shuffled batches of in-memory tensors, one ``index_select`` each (under DDP Lightning shards the sampler)."""
    return DataLoader(train, batch_size=batch_size, sampler=RandomSampler(train), collate_fn=keep_batch)


def bare_lightning(args: argparse.Namespace, device: torch.device, precision: str, data: BenchData) -> dict[str, Any]:
    """A minimal LightningModule on the same in-memory tensors: no callbacks, logger, bar or validation."""
    loader = bare_loader(data.train.to(device), args.batch_size)
    total = data.steps(args.epochs + 1, args.batch_size)
    stats, wait = EpochStats(), DataWait()
    module = BareModule(*data.network(), lambda net: data.optimizer(net, total, device))
    # precision is one of PRECISIONS, checked by the command line; Lightning types it as a Literal.
    trainer = L.Trainer(accelerator=device.type, devices=1, precision=cast(Any, precision), max_epochs=args.epochs + 1,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[stats, wait], limit_val_batches=0)
    trainer.fit(module, train_dataloaders=loader)
    module.to(device)
    return {"epoch_times": stats.epoch_times[1:], "warm_up_s": stats.epoch_times[0],
            "wait_times": wait.epoch_waits[1:], "test_acc": evaluate(module.net, data.test, device)}


def template(args: argparse.Namespace, data: BenchData, steps_per_call: int | str, per_sample: bool | None = None,
             cuda_graphs: bool | str = False, compile_mode: str | None = None) -> dict[str, Any]:
    """``train()`` itself, with the run's default optimizer and schedule; on a GPU, with the host syncs it made per
    step."""
    from project.hardware.devices import resolve_accelerator
    from project.training.run import train

    with tempfile.TemporaryDirectory() as logdir:
        config = data.config.replace(
            logdir=logdir, name="bench", max_epochs=args.epochs + 1, steps_per_call=steps_per_call,
            cuda_graphs=cuda_graphs, compile=compile_mode, trainer={"enable_progress_bar": False},
        )
        device = torch.device(resolve_accelerator(args.accelerator))
        wait = DataWait()
        with counting_syncs(device, from_start=False) as caught:
            callbacks = [wait, SyncsInTrainingSteps()] if device.type == "cuda" else [wait]
            result = train(config, data.recipe, datamodule=data.datamodule(per_sample), callbacks=callbacks)
    return {"epoch_times": result.epoch_times[1:], "warm_up_s": result.epoch_times[0],
            "wait_times": wait.epoch_waits[1:], "test_acc": float(result.test_metrics["test/acc"]),
            "steps_per_call": result.steps.k, "optimizer_steps": result.optimizer_steps,
            "cuda_graphs": result.steps.mode is StepMode.GRAPHS,
            "syncs_per_step": syncs_in(caught) / max(result.optimizer_steps, 1)}
