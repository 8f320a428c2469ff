"""What a run trains on, and checks that catch a broken recipe rather than a broken engine.

The data card (every run prints it at its start and logs it to TensorBoard): split sizes, the input shape, the
training split's class counts, its pixel statistics measured against what the datamodule declares, and the test
inputs that also occur in training. A declared ``mean``/``std`` far from the measured one is refused before a
run starts: normalisation and predict's choice of polarity both follow the declaration.

``check_recipe`` (``scripts/check_recipe.py``) runs the classic recipe bugs' checks on a recipe's data, each
failing with one line that names the bug and its fix: labels and classes, inputs and augmentation, statistics,
leakage, evaluation that is not deterministic, and a model that does not learn (one batch, then a short run).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import Dataset

from project.errors import DataError, UsageError, UserError
from project.training.tensor_data import Augmented, TensorDataModule, TensorPairs

SAMPLED = 1000  # a recipe read per sample (files on disk): the card reads this many of each split
MEAN_TOLERANCE = 0.1  # pixel units ([0, 1]): declared and measured means further apart are a wrong declaration
STD_RATIO = 1.5  # a declared std more than this factor off the measured one, likewise
LEAKAGE_SHARE = 0.01  # test inputs also in the training split, as a share of the test set, past which it fails


def _fmt(values: tuple[float, ...]) -> str:
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
    declared_mean: tuple[float, ...]
    declared_std: tuple[float, ...]
    duplicates: int  # test inputs that also occur in the training split
    sampled: int | None = None  # per-sample recipes: samples read from each split

    def line(self) -> str:
        sizes = " / ".join(f"{count:,} {name}" for name, count in self.sizes.items())
        present = [c for c in self.class_counts if c]
        spread = f"{min(present):,}-{max(present):,} each" if present else "none"
        missing = self.num_classes - len(present)
        classes = f"{self.num_classes} classes ({spread}" + (f", {missing} absent" if missing else "") + ")"
        stats = f"pixel mean {_fmt(self.mean)} std {_fmt(self.std)}"
        stats += " (as declared)" if self.statistics_problem() is None else \
            f" (declared {_fmt(self.declared_mean)} {_fmt(self.declared_std)})"
        read = f"; statistics of {self.sampled:,} samples a split" if self.sampled else ""
        return (f"data: {sizes}, inputs {'x'.join(map(str, self.input_shape))}, {classes}, {stats}, "
                f"{self.duplicates:,} test inputs also in training{read}")

    def markdown(self) -> str:
        rows = [("splits", ", ".join(f"{name} {count:,}" for name, count in self.sizes.items())),
                ("input shape", " x ".join(map(str, self.input_shape))),
                ("training samples per class", ", ".join(f"{k}: {c:,}" for k, c in enumerate(self.class_counts))),
                ("pixel mean (measured / declared)", f"{_fmt(self.mean)} / {_fmt(self.declared_mean)}"),
                ("pixel std (measured / declared)", f"{_fmt(self.std)} / {_fmt(self.declared_std)}"),
                ("test inputs also in training", f"{self.duplicates:,}")]
        if self.sampled:
            rows.append(("samples read per split", f"{self.sampled:,}"))
        return "| | |\n|---|---|\n" + "\n".join(f"| {name} | {value} |" for name, value in rows)

    def statistics_problem(self) -> str | None:
        far_mean = any(abs(m - d) > MEAN_TOLERANCE for m, d in zip(self.mean, self.declared_mean, strict=False))
        far_std = any(not (1 / STD_RATIO <= d / max(s, 1e-8) <= STD_RATIO)
                      for s, d in zip(self.std, self.declared_std, strict=False))
        if len(self.declared_mean) not in (1, len(self.mean)) or len(self.declared_std) not in (1, len(self.std)):
            return (f"{self.recipe} declares mean {_fmt(self.declared_mean)} std {_fmt(self.declared_std)} for "
                    f"{len(self.mean)} channel(s): give one value per channel, {_fmt(self.mean)} and {_fmt(self.std)}")
        if not (far_mean or far_std):
            return None
        return (f"{self.recipe} declares mean {_fmt(self.declared_mean)} std {_fmt(self.declared_std)}, but the "
                f"training split's pixels measure mean {_fmt(self.mean)} std {_fmt(self.std)}: set mean = "
                f"{_fmt(self.mean)}, std = {_fmt(self.std)} in the datamodule (normalisation and predict's polarity "
                "follow them)")

    def leakage_problem(self) -> str | None:
        share = self.duplicates / max(1, self.sizes["test"] if not self.sampled else min(self.sampled,
                                                                                         self.sizes["test"]))
        if share <= LEAKAGE_SHARE:
            return None
        return (f"{self.duplicates:,} test inputs ({share:.0%}) also occur in the training split: the test accuracy "
                "measures memory, not generalisation; remove them from one of the splits")


def _plain(split: Dataset) -> Dataset:
    return split.dataset if isinstance(split, Augmented) else split


@dataclass(frozen=True)
class Split:
    """A split's inputs as the datamodule holds them (normalised in memory, ``[0, 1]`` pixels per sample)."""

    inputs: torch.Tensor
    targets: torch.Tensor
    normalised: bool
    sampled: bool  # only some samples were read


def gather(datamodule: TensorDataModule, split: Dataset, limit: int | None = SAMPLED) -> Split:
    """A split whole when it is in memory, else up to ``limit`` samples spread evenly over it (reading files is the
    slow part of a per-sample recipe)."""
    split = _plain(split)
    if isinstance(split, TensorPairs):
        return Split(split.inputs.cpu(), split.targets.cpu(), True, False)
    size = len(split)
    picked = range(size) if limit is None or size <= limit else \
        sorted({int(i * size / limit) for i in range(limit)})
    items = [split[i] for i in picked]
    inputs = torch.stack([torch.as_tensor(x) for x, _ in items])
    return Split(inputs, torch.as_tensor([int(y) for _, y in items]), False, len(picked) < size)


def pixel_statistics(datamodule: TensorDataModule, split: Split) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std of a split's pixels in ``[0, 1]``: normalised inputs measured as they are, then the
    declared normalisation undone on the two numbers (not on every pixel)."""
    inputs = split.inputs.float().reshape(len(split.inputs), *datamodule.input_shape)
    dims = [d for d in range(inputs.dim()) if d != 1]
    var, mean = torch.var_mean(inputs, dim=dims)
    std = var.sqrt()
    if split.normalised:
        declared_mean = torch.tensor(datamodule.mean).expand_as(mean)
        declared_std = torch.tensor(datamodule.std).expand_as(std)
        mean, std = mean * declared_std + declared_mean, std * declared_std
    return tuple(mean.tolist()), tuple(std.tolist())


def fingerprints(inputs: torch.Tensor) -> list[float]:
    """One number per input, the same for inputs equal bit for bit (a random weighting of its values, summed: each
    row is reduced the same way); 70,000 MNIST images in a fraction of a second."""
    rows = inputs.float().contiguous().reshape(len(inputs), -1)
    weights = torch.rand(rows.shape[1], generator=torch.Generator().manual_seed(0)) + 0.5
    return (rows * weights).sum(1).tolist()


def shared_inputs(train: torch.Tensor, test: torch.Tensor) -> int:
    """How many test inputs occur, bit for bit, in the training split (by fingerprint, then compared whole)."""
    by_print: dict[float, list[int]] = {}
    for index, value in enumerate(fingerprints(train)):
        by_print.setdefault(value, []).append(index)
    return sum(any(torch.equal(test[i], train[j]) for j in by_print.get(value, ()))
               for i, value in enumerate(fingerprints(test)))


def data_card(datamodule: TensorDataModule) -> DataCard:
    """The card of a datamodule whose ``fit`` and ``test`` splits are set up."""
    train, test = gather(datamodule, datamodule.train_set), gather(datamodule, datamodule.test_set)
    mean, std = pixel_statistics(datamodule, train)
    counts = torch.bincount(train.targets.long().clamp(0, datamodule.num_classes),
                            minlength=datamodule.num_classes)[:datamodule.num_classes]
    return DataCard(
        recipe=type(datamodule).__name__,
        sizes={"train": len(datamodule.train_set), "val": len(datamodule.val_set), "test": len(datamodule.test_set)},
        input_shape=tuple(datamodule.input_shape), num_classes=datamodule.num_classes,
        class_counts=counts.tolist(), mean=mean, std=std, declared_mean=tuple(datamodule.mean),
        declared_std=tuple(datamodule.std), duplicates=shared_inputs(train.inputs, test.inputs),
        sampled=SAMPLED if train.sampled or test.sampled else None)


def announce(card: DataCard) -> None:
    """The card on stderr as the run starts (rank zero), and its leakage, if any, as a warning line."""
    from lightning.pytorch.utilities import rank_zero_info

    rank_zero_info(card.line())
    leak = card.leakage_problem()
    if leak is not None:
        rank_zero_info(f"data: warning: {leak}")


def log_card(trainer: Any, card: DataCard) -> None:
    """The card in TensorBoard's TEXT tab, beside the command and the settings."""
    from project.results.tensorboard_figures import tensorboard_of

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


# ---------------------------------------------------------------------------------------------- recipe checks

@dataclass
class Finding:
    """One check's outcome: ``problem`` is None when it passed, else the one line naming the bug and the fix."""

    check: str
    detail: str
    problem: str | None = None

    def line(self) -> str:
        return f"{'ok  ' if self.problem is None else 'FAIL'}  {self.check}: {self.problem or self.detail}"


@dataclass
class Subject:
    """The recipe under check: its datamodule on the given data, and a way to build a fresh model."""

    datamodule: TensorDataModule
    new_model: Callable[[], Any]
    config: Any
    found: list[Finding] = field(default_factory=list)


def check_recipe(config: Any, learn: bool = True) -> list[Finding]:
    """Every recipe check on ``config``'s data (its ``data_dir``); ``learn``: the two training checks too."""
    from project.training.build import build_datamodule, build_model

    datamodule = build_datamodule(config)
    try:
        datamodule.setup("fit")
        datamodule.setup("test")
    except DataError as err:
        return [Finding("data", "", f"the datamodule cannot load its data: {err}")]
    subject = Subject(datamodule, lambda: build_model(config, 1, "off", False), config)
    checks: list[Callable[[Subject], Finding]] = [check_inputs, check_augment, check_labels, check_outputs,
                                                  check_statistics, check_leakage, check_eval_determinism]
    if learn:
        checks += [check_fits_one_batch, check_learns]
    for check in checks:
        name = check.__name__.removeprefix("check_").replace("_", " ")
        try:
            subject.found.append(check(subject))
        except UserError as err:  # the engine refused what the check asked of it: that is the finding
            subject.found.append(Finding(name, "", str(err)))
        except Exception as err:  # noqa: BLE001 - a broken recipe can raise anything; said in one line
            first = (str(err).strip().splitlines() or [""])[0][:200]
            failed = [f.check for f in subject.found if f.problem]
            hint = f" (after {', '.join(failed)} failed: fix that first)" if failed else ""
            subject.found.append(Finding(name, "", f"the recipe raised {type(err).__name__}: {first}{hint}"))
    return subject.found


def _samples(datamodule: TensorDataModule, count: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``count`` training inputs as the network sees them (normalised), and their labels."""
    split = _plain(datamodule.train_set)
    if isinstance(split, TensorPairs):
        return split.inputs[:count].cpu(), split.targets[:count].cpu()
    items = [split[i] for i in range(min(count, len(split)))]
    pixels = torch.stack([torch.as_tensor(x) for x, _ in items]).float()
    return datamodule.normalize(pixels), torch.as_tensor([int(y) for _, y in items])


def check_inputs(subject: Subject) -> Finding:
    datamodule = subject.datamodule
    shape = tuple(datamodule.input_shape)
    for name in ("train_set", "test_set"):
        inputs = gather(datamodule, getattr(datamodule, name), 16).inputs
        if tuple(inputs.shape[1:]) != shape:
            return Finding("inputs", "", f"the {name.split('_')[0]} split yields inputs of shape "
                           f"{tuple(inputs.shape[1:])}, but input_shape is {shape}: make them agree")
        if not inputs.is_floating_point():
            return Finding("inputs", "", f"the {name.split('_')[0]} split yields {inputs.dtype} inputs: give "
                           "floating-point pixels in [0, 1] (divide 8-bit images by 255)")
    return Finding("inputs", f"{'x'.join(map(str, shape))} floating-point inputs in both splits")


def check_augment(subject: Subject) -> Finding:
    datamodule = subject.datamodule
    if datamodule.augment is None:
        return Finding("augment", "the recipe does not augment")
    split = _plain(datamodule.train_set)
    originals = [torch.as_tensor(split[i][0]).float() for i in range(min(16, len(split)))]
    outcomes = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)  # randomness drawn anywhere but the generator shows up as a difference
        outcomes.append([datamodule.augment(x.clone(), torch.Generator().manual_seed(7 + i))
                         for i, x in enumerate(originals)])
    for original, first, second in zip(originals, *outcomes, strict=True):
        if first.shape != original.shape or first.dtype != original.dtype:
            return Finding("augment", "", f"augment turns a {tuple(original.shape)} {original.dtype} input into "
                           f"{tuple(first.shape)} {first.dtype}: keep the shape and dtype")
        if not torch.equal(first, second):
            return Finding("augment", "", "augment draws randomness outside the generator it is given (the same "
                           "generator seed gave other outputs): use torch.rand(..., generator=generator), so that a "
                           "resumed run sees the same samples")
    return Finding("augment", "keeps shape and dtype; draws only from its generator")


def check_labels(subject: Subject) -> Finding:
    datamodule, classes = subject.datamodule, subject.datamodule.num_classes
    for name in ("train_set", "test_set"):
        targets = gather(datamodule, getattr(datamodule, name), None).targets
        outside = targets[(targets < 0) | (targets >= classes)]
        if len(outside):
            return Finding("labels", "", f"the {name.split('_')[0]} split has label {int(outside[0])}, outside "
                           f"[0, {classes}): set num_classes to cover every label, or fix the labels")
        if targets.is_floating_point():
            return Finding("labels", "", f"the {name.split('_')[0]} split's labels are {targets.dtype}: give class "
                           "indices as integers")
    targets = gather(datamodule, datamodule.train_set, None).targets
    absent = sorted(set(range(classes)) - set(targets.tolist()))
    if absent:
        return Finding("labels", "", f"class(es) {', '.join(map(str, absent[:5]))} never occur in the training split "
                       f"of {len(targets):,} samples: a model cannot learn them (num_classes {classes} too large, or a "
                       "split that is not shuffled)")
    return Finding("labels", f"every label in [0, {classes}), every class in the training split")


def check_outputs(subject: Subject) -> Finding:
    model = subject.new_model().eval()
    inputs, _ = _samples(subject.datamodule, 2)
    with torch.no_grad():
        out = model(inputs)
    classes = subject.datamodule.num_classes
    if tuple(out.shape) != (len(inputs), classes):
        return Finding("outputs", "", f"the network gives outputs of shape {tuple(out.shape)} for {len(inputs)} "
                       f"inputs, but the datamodule has {classes} classes: make its last layer {classes} wide")
    return Finding("outputs", f"{classes} outputs per input")


def check_statistics(subject: Subject) -> Finding:
    card = data_card(subject.datamodule)
    problem = card.statistics_problem()
    return Finding("statistics", f"mean {_fmt(card.mean)} std {_fmt(card.std)} as declared", problem)


def check_leakage(subject: Subject) -> Finding:
    card = data_card(subject.datamodule)
    return Finding("leakage", f"{card.duplicates} test inputs also in training", card.leakage_problem())


def check_eval_determinism(subject: Subject) -> Finding:
    model = subject.new_model()
    model.train()  # a few steps' worth of batch statistics, as after training
    inputs, _ = _samples(subject.datamodule, 8)
    with torch.no_grad():
        model(inputs)
    model.eval()
    with torch.no_grad():
        first, second, alone = model(inputs), model(inputs), model(inputs[:1])
    if not torch.equal(first, second):
        return Finding("eval determinism", "", "in eval mode two passes over the same inputs differ: something "
                       "random stays on (dropout called with training=True?); use nn.Dropout, which eval() turns off")
    if not torch.allclose(first[:1], alone, rtol=1e-4, atol=1e-5):
        return Finding("eval determinism", "", "in eval mode an input's output depends on the rest of its batch "
                       "(batch statistics used in evaluation: BatchNorm with track_running_stats=False?); "
                       "evaluation must treat each input alone")
    return Finding("eval determinism", "eval mode is deterministic and per input")


def check_fits_one_batch(subject: Subject, steps: int = 150) -> Finding:
    """A model that cannot fit 32 samples cannot learn: the input is ignored, the loss does not reach it, ..."""
    torch.manual_seed(0)
    module = subject.new_model()
    inputs, targets = _samples(subject.datamodule, 32)
    optimizer = torch.optim.Adam(module.parameters(), lr=3e-3)
    module.train()
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        module.loss(module(inputs), targets).backward()
        optimizer.step()
    module.eval()
    with torch.no_grad():
        accuracy = float((module(inputs).argmax(1) == targets).float().mean())
    if accuracy < 0.9:
        return Finding("fits one batch", "", f"after {steps} Adam steps on one batch of {len(inputs)} training "
                       f"samples the model gets {accuracy:.0%} of them right: it cannot learn (inputs ignored, "
                       "outputs detached, a loss that does not match the outputs?)")
    return Finding("fits one batch", f"{accuracy:.0%} of one batch of {len(inputs)} after {steps} steps")


def check_learns(subject: Subject) -> Finding:
    """A short real run: the test accuracy must be clearly above chance (labels that do not belong to their inputs,
    a test split read with other labels or another normalisation, all end at chance)."""
    from project.training.run import train

    classes = subject.datamodule.num_classes
    needed = min(1 / classes + 0.25, (1 + 1 / classes) / 2)
    with tempfile.TemporaryDirectory(prefix="recipe-check-") as logs:
        config = subject.config.replace(logdir=logs, accelerator="cpu", devices=1, steps_per_call=1,
                                        trainer={**subject.config.trainer, "enable_progress_bar": False})
        result = train(config)
    accuracy = float(result.test_metrics["test/acc"])
    epochs = config.max_epochs
    if accuracy < needed:
        return Finding("learns", "", f"a {epochs}-epoch run ends at test/acc {accuracy:.3f}, chance is "
                       f"{1 / classes:.3f} (needed {needed:.2f}): labels out of step with their inputs, or the test "
                       "split read differently from the training split?")
    return Finding("learns", f"test/acc {accuracy:.3f} after {epochs} epochs (chance {1 / classes:.3f})")


def fmt_findings(findings: list[Finding]) -> str:
    return "\n".join(finding.line() for finding in findings)

