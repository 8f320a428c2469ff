"""What a run trains on: the data card every run prints at its start and logs to TensorBoard.

Split sizes, the input shape, the training split's class counts, its pixel statistics measured against what the
datamodule declares, and the test inputs that also occur in training. A declared ``mean``/``std`` far from the
measured one is refused before a run starts: normalisation and predict's choice of polarity both follow the
declaration. The recipe checks (``recipe_checks.py``) use the same measurements.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol, cast

import torch
from torch.utils.data import Dataset

from project.errors import UsageError
from project.training.tensor_data import Augmented, TensorDataModule, TensorPairs

SAMPLED = 1000  # a recipe read per sample (files on disk): the card reads this many of each split
MEAN_TOLERANCE = 0.1  # pixel units ([0, 1]): declared and measured means further apart are a wrong declaration
STD_RATIO = 1.5  # a declared std more than this factor off the measured one, likewise
RANGE_TOLERANCE = 0.02  # pixel units: inputs measured outside [0, 1] by more were not normalised as declared
CONSTANT_STD = 1e-6  # pixel units: a channel whose std is below it holds one value in every input
LEAKAGE_SHARE = 0.01  # test inputs also in the training split, as a share of the test set, past which it fails
# Validation inputs a class, on average, below which val/acc moves in steps too coarse to rank checkpoints by.
VAL_PER_CLASS = 20


def fmt_values(values: tuple[float, ...]) -> str:
    """``(0.13,)``, ``(0.34, 0.34, 0.34)``: per-channel values as a recipe declares them."""
    return "(" + ", ".join(f"{v:.2f}" for v in values) + ("," if len(values) == 1 else "") + ")"


@dataclass(frozen=True)
class DataCard:
    """What a run trains on, measured on its splits."""

    recipe: str  # the datamodule's class name
    sizes: dict[str, int]  # train, val, test
    input_shape: tuple[int, ...]
    num_classes: int
    class_counts: list[int]  # of the training split (of the samples read, where sampled)
    mean: tuple[float, ...]  # measured on the training split, in [0, 1] pixel units
    std: tuple[float, ...]
    pixel_range: tuple[float, float]  # the training split's lowest and highest pixel, in the same units
    declared_mean: tuple[float, ...]
    declared_std: tuple[float, ...]
    duplicates: int  # test inputs that also occur in the training split
    sampled: int | None = None  # per-sample recipes: samples read from each split
    # In-memory recipes: the training inputs as the datamodule holds them (normalised, if it normalises as declared):
    # their mean, std and (lowest, highest) value. None where the recipe reads pixels per sample.
    held: tuple[tuple[float, ...], tuple[float, ...], tuple[float, float]] | None = None
    validation_in_test: int = 0  # validation inputs that also occur in the test split

    def line(self) -> str:
        sizes = " / ".join(f"{count:,} {name}" for name, count in self.sizes.items())
        present = [c for c in self.class_counts if c]
        spread = f"{min(present):,}-{max(present):,} each" if present else "none"
        missing = self.num_classes - len(present)
        classes = f"{self.num_classes} classes ({spread}" + (f", {missing} absent" if missing else "") + ")"
        stats = f"pixel mean {fmt_values(self.mean)} std {fmt_values(self.std)}"
        stats += " (as declared)" if self.statistics_problem() is None else \
            f" (declared {fmt_values(self.declared_mean)} {fmt_values(self.declared_std)})"
        read = f"; statistics of {self.sampled:,} samples a split" if self.sampled else ""
        return (f"data: {sizes}, inputs {'x'.join(map(str, self.input_shape))}, {classes}, {stats}, "
                f"{self.duplicates:,} test inputs also in training{read}")

    def markdown(self) -> str:
        rows = [("splits", ", ".join(f"{name} {count:,}" for name, count in self.sizes.items())),
                ("input shape", " x ".join(map(str, self.input_shape))),
                ("training samples per class", ", ".join(f"{k}: {c:,}" for k, c in enumerate(self.class_counts))),
                ("pixel mean (measured / declared)", f"{fmt_values(self.mean)} / {fmt_values(self.declared_mean)}"),
                ("pixel std (measured / declared)", f"{fmt_values(self.std)} / {fmt_values(self.declared_std)}"),
                ("test inputs also in training", f"{self.duplicates:,}")]
        if self.sampled:
            rows.append(("samples read per split", f"{self.sampled:,}"))
        return "| | |\n|---|---|\n" + "\n".join(f"| {name} | {value} |" for name, value in rows)

    def statistics_problem(self) -> str | None:
        """What is wrong with the declared statistics, told apart by cause: constant inputs, inputs left
        unnormalised, normalised twice, normalised with other numbers, or simply declared wrong."""
        channels = len(self.mean)  # one declared value stands for every channel: each is compared with it
        far_mean = any(abs(m - d) > MEAN_TOLERANCE for m, d in zip(self.mean, _per_channel(self.declared_mean,
                                                                                          channels), strict=False))
        far_std = any(not (1 / STD_RATIO <= d / max(s, 1e-8) <= STD_RATIO)
                      for s, d in zip(self.std, _per_channel(self.declared_std, channels), strict=False))
        declared = f"{self.recipe} declares mean {fmt_values(self.declared_mean)} std {fmt_values(self.declared_std)}"
        measured_mean, measured_std = fmt_values(self.mean), fmt_values(self.std)
        low, high = self.pixel_range
        if not all(math.isfinite(value) for value in (*self.mean, *self.std, low, high)):
            return (f"{self.recipe}'s training inputs hold NaN or infinite pixels (mean {measured_mean}): a failed "
                    "read or a division by zero in the data; fix the data, no statistics can be declared for them")
        if any(s < CONSTANT_STD for s in self.std):
            return (f"{self.recipe}'s training inputs are constant (pixel std {measured_std}, mean {measured_mean}): "
                    "every input holds the same values (all-zero images, or a failed read); fix the data before "
                    "declaring statistics")
        cause = self._misapplied_normalisation(far_mean or far_std)
        if cause:
            return f"{declared}, but {cause}"
        if low < -RANGE_TOLERANCE or high > 1 + RANGE_TOLERANCE:
            return (f"{declared}, but with that normalisation undone the training inputs range over [{low:.2f}, "
                    f"{high:.2f}], not pixels in [0, 1]: its inputs are normalised with other numbers than it declares "
                    "(normalise with self.normalize, which uses the declared mean and std) or are not in [0, 1]")
        if len(self.declared_mean) not in (1, len(self.mean)) or len(self.declared_std) not in (1, len(self.std)):
            return (f"{declared} for {len(self.mean)} channel(s): give one value per channel, {measured_mean} and "
                    f"{measured_std}")
        if not (far_mean or far_std):
            return None
        return (f"{declared}, but the training split's pixels measure mean {measured_mean} std {measured_std}: set "
                f"mean = {measured_mean}, std = {measured_std} in the datamodule (normalisation and predict's "
                "polarity follow them)")

    def _misapplied_normalisation(self, off: bool) -> str | None:
        """Inputs held unnormalised, or normalised twice: then the measured numbers are a moving target, and the
        fix is in the code, not in the declaration."""
        identity = all(abs(m) < 0.05 for m in self.declared_mean) and all(abs(s - 1) < 0.05 for s in self.declared_std)
        if self.held is None or identity:
            return None
        held_mean, held_std, (held_low, held_high) = self.held
        if off and -RANGE_TOLERANCE <= held_low and held_high <= 1 + RANGE_TOLERANCE:
            return (f"the inputs it holds are pixels in [0, 1] (mean {fmt_values(held_mean)} std "
                    f"{fmt_values(held_std)}), not normalised: normalise them with self.normalize, which uses the "
                    "declared mean and std")
        dm = self.declared_mean * (len(self.mean) // max(len(self.declared_mean), 1))
        ds = self.declared_std * (len(self.std) // max(len(self.declared_std), 1))
        low, high = self.pixel_range
        twice_mean = [m * s + d for m, s, d in zip(self.mean, ds, dm, strict=False)]
        twice_std = [v * s for v, s in zip(self.std, ds, strict=False)]
        twice_low, twice_high = low * min(ds) + min(dm), high * max(ds) + max(dm)
        matches = all(abs(m - d) <= MEAN_TOLERANCE for m, d in zip(twice_mean, dm, strict=False)) and \
            all(1 / STD_RATIO <= d / max(s, 1e-8) <= STD_RATIO for s, d in zip(twice_std, ds, strict=False))
        if matches and -RANGE_TOLERANCE <= twice_low and twice_high <= 1 + RANGE_TOLERANCE:
            return ("its inputs are normalised twice (undone twice, they are pixels with the declared statistics): "
                    "normalise once, in load_tensors with self.normalize or in the augment, not both")
        return None

    def validation_problem(self) -> str | None:
        """A validation split too small to rank checkpoints by, and the ``--val-size`` that would not be."""
        val, classes = self.sizes.get("val", 0), self.num_classes
        needed = VAL_PER_CLASS * classes
        if not val or val >= needed:
            return None
        total = val + self.sizes.get("train", 0)
        advice = (f"--val-size {needed} would hold {VAL_PER_CLASS} a class" if needed <= total // 2 else
                  f"the {total:,} training inputs are too few to hold out {VAL_PER_CLASS} a class and train on the "
                  "rest: more would")
        return (f"the validation split holds {val:,} inputs for {classes} classes ({val / classes:.1f} a class): "
                f"val/acc moves in steps of {1 / val:.1%}, and the best checkpoint is picked on noise; {advice}")

    def leakage_problem(self) -> str | None:
        share = self.duplicates / max(1, self.sizes["test"] if not self.sampled else min(self.sampled,
                                                                                         self.sizes["test"]))
        if share > LEAKAGE_SHARE:
            return (f"{self.duplicates:,} test inputs ({share:.0%}) also occur in the training split: the test "
                    "accuracy measures memory, not generalisation; remove them from one of the splits")
        val_share = self.validation_in_test / max(1, self.sizes.get("val", 0) if not self.sampled else
                                                  min(self.sampled, self.sizes.get("val", 0)))
        if val_share <= LEAKAGE_SHARE:
            return None
        return (f"{self.validation_in_test:,} validation inputs ({val_share:.0%}) also occur in the test split: the "
                "best checkpoint is chosen on the test set, and test/acc overstates what the model does on unseen "
                "data; hold the validation split out of the training data")


class Samples(Protocol):
    """A split set up by the datamodule: its length and its samples by index (every split the engine makes)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...


def unaugmented(split: Dataset | None) -> Samples:
    """The training split as read, before the recipe's augmentation (a split must be set up first)."""
    if split is None:
        raise RuntimeError("the datamodule's splits are read before its setup")  # the engine's order, not a user's
    return cast(Samples, split.dataset if isinstance(split, Augmented) else split)


@dataclass(frozen=True)
class Split:
    """A split's inputs as the datamodule holds them (normalised in memory, ``[0, 1]`` pixels per sample)."""

    inputs: torch.Tensor
    targets: torch.Tensor
    normalised: bool
    sampled: bool  # only some samples were read


def gather(split: Dataset | None, limit: int | None = SAMPLED) -> Split:
    """A split whole when it is in memory, else up to ``limit`` samples spread evenly over it (reading files is the
    slow part of a per-sample recipe)."""
    samples = unaugmented(split)
    if isinstance(samples, TensorPairs):
        return Split(samples.inputs.cpu(), samples.targets.cpu(), True, False)
    size = len(samples)
    picked = range(size) if limit is None or size <= limit else \
        sorted({int(i * size / limit) for i in range(limit)})
    items = [samples[i] for i in picked]
    inputs = torch.stack([torch.as_tensor(x) for x, _ in items])
    return Split(inputs, torch.stack([torch.as_tensor(y) for _, y in items]), False, len(picked) < size)


Statistics = tuple[tuple[float, ...], tuple[float, ...], tuple[float, float]]  # per-channel mean, std; lowest, highest


def pixel_statistics(datamodule: TensorDataModule, split: Split) -> tuple[Statistics, Statistics | None]:
    """Per-channel mean and std of a split's pixels in ``[0, 1]``, and their range over all channels; with, for a
    split held normalised, the same of the inputs as held. Normalised inputs are measured as they are, then the
    declared normalisation is undone on the numbers (not on every pixel). Inputs normalised with other numbers than
    the declared ones come out of ``[0, 1]``: their statistics would only echo the declaration."""
    inputs = split.inputs.float().reshape(len(split.inputs), *datamodule.input_shape)
    dims = [d for d in range(inputs.dim()) if d != 1]
    var, mean = torch.var_mean(inputs, dim=dims)
    std, low, high = var.sqrt(), inputs.amin(dim=dims), inputs.amax(dim=dims)
    held = (tuple(mean.tolist()), tuple(std.tolist()), (low.min().item(), high.max().item()))
    if not split.normalised:
        return held, None
    declared_mean = torch.tensor(datamodule.mean).expand_as(mean)
    declared_std = torch.tensor(datamodule.std).expand_as(std)
    mean, std = mean * declared_std + declared_mean, std * declared_std
    low, high = low * declared_std + declared_mean, high * declared_std + declared_mean
    return (tuple(mean.tolist()), tuple(std.tolist()), (low.min().item(), high.max().item())), held


def fingerprints(inputs: torch.Tensor) -> torch.Tensor:
    """One number per input, the same for inputs equal bit for bit (a random weighting of its values, summed: each
    row is reduced the same way); 70,000 small images in a fraction of a second."""
    rows = inputs.float().contiguous().reshape(len(inputs), -1)
    weights = torch.rand(rows.shape[1], generator=torch.Generator().manual_seed(0)) + 0.5
    return (rows * weights).sum(1)


def shared_inputs(train: torch.Tensor, test: torch.Tensor) -> int:
    """How many test inputs occur, bit for bit, in the training split (by fingerprint, then compared whole: only the
    few test inputs whose fingerprint a training input has are looked at one by one)."""
    train_prints, test_prints = fingerprints(train), fingerprints(test)
    candidates = torch.isin(test_prints, train_prints).nonzero().flatten().tolist()
    if not candidates:
        return 0
    by_print: dict[float, list[int]] = {}
    wanted = set(test_prints[candidates].tolist())
    for index, value in enumerate(train_prints.tolist()):
        if value in wanted:
            by_print.setdefault(value, []).append(index)
    return sum(any(torch.equal(test[i], train[j]) for j in by_print[float(test_prints[i])]) for i in candidates)


def _per_channel(values: tuple[float, ...], channels: int) -> tuple[float, ...]:
    return values * channels if len(values) == 1 else values


def shape_problem(declared: tuple[int, ...], train: tuple[int, ...], test: tuple[int, ...]) -> str | None:
    """Inputs of another shape than ``input_shape``, saying which side is the odd one."""
    if train == test != declared:
        return (f"both splits yield inputs of shape {train}, but input_shape is {declared}: set input_shape = "
                f"{train}, or read the images at {declared}")
    if train != declared and test != declared:
        return (f"the train split yields inputs of shape {train}, the test split {test}, and input_shape is "
                f"{declared}: read both splits at one size, and declare it")
    for name, shape, other in (("train", train, "test"), ("test", test, "train")):
        if shape != declared:
            return (f"the {name} split yields inputs of shape {shape} where the {other} split and input_shape "
                    f"have {declared}: read the {name} split as the {other} split is read")
    return None


def data_card(datamodule: TensorDataModule) -> DataCard:
    """The card of a datamodule whose ``fit`` and ``test`` splits are set up."""
    train, test = gather(datamodule.train_set), gather(datamodule.test_set)
    problem = shape_problem(tuple(datamodule.input_shape), tuple(train.inputs.shape[1:]), tuple(test.inputs.shape[1:]))
    if problem is not None:
        raise UsageError(f"{type(datamodule).__name__}: {problem}")
    (mean, std, pixel_range), held = pixel_statistics(datamodule, train)
    counts = torch.bincount(train.targets.long().clamp(0, datamodule.num_classes),
                            minlength=datamodule.num_classes)[:datamodule.num_classes]
    return DataCard(
        recipe=type(datamodule).__name__,
        sizes={name: len(unaugmented(split)) for name, split in
               (("train", datamodule.train_set), ("val", datamodule.val_set), ("test", datamodule.test_set))},
        input_shape=tuple(datamodule.input_shape), num_classes=datamodule.num_classes,
        class_counts=counts.tolist(), mean=mean, std=std, pixel_range=pixel_range, declared_mean=tuple(datamodule.mean),
        declared_std=tuple(datamodule.std), duplicates=shared_inputs(train.inputs, test.inputs),
        sampled=SAMPLED if train.sampled or test.sampled else None, held=held,
        validation_in_test=shared_inputs(gather(datamodule.val_set).inputs, test.inputs)
        if datamodule.val_set is not None and len(unaugmented(datamodule.val_set)) else 0)


def announce(card: DataCard) -> None:
    """The card on stderr as the run starts (rank zero), and a validation split too small or a leak, if any, as a
    warning line each."""
    from lightning.pytorch.utilities import rank_zero_info

    rank_zero_info(card.line())
    for problem in (card.validation_problem(), card.leakage_problem()):
        if problem is not None:
            rank_zero_info(f"data: warning: {problem}")


def log_card(trainer: Any, card: DataCard) -> None:
    """The card in TensorBoard's TEXT tab, beside the command and the settings."""
    from project.reliability.run_folder import tensorboard_of

    tensorboard = tensorboard_of(trainer)
    if tensorboard is not None:
        tensorboard.experiment.add_text("run/data", card.markdown(), 0)


def checked_data_card(datamodule: TensorDataModule) -> DataCard:
    """The card, refusing statistics declared wrong before anything is written (one line)."""
    datamodule.setup("fit")
    datamodule.setup("test")
    card = data_card(datamodule)
    problem = card.statistics_problem()
    if problem is not None:
        raise UsageError(problem)
    return card
