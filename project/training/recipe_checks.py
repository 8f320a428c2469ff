"""Checks that catch a broken recipe rather than a broken engine (``scripts/check_recipe.py``).

Each checks one of the classic bugs of a recipe's own data and model and fails with one line that names the bug
and its fix: inputs and augmentation, labels and classes, the output width, statistics, leakage, evaluation that
is random or depends on the batch, and a model that does not learn (one batch, then a short real run).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from project.config.schema import RunConfig
from project.contract import Recipe, RecipeError
from project.errors import DataError, UserError, first_line
from project.training.data_card import data_card, fmt_values, gather, unaugmented
from project.training.tensor_data import TensorDataModule, TensorPairs


@dataclass
class Finding:
    """One check's outcome: ``problem`` is None when it passed, else the one line naming the bug and the fix."""

    check: str
    detail: str = ""  # what a passing check found
    problem: str | None = None

    def line(self) -> str:
        return f"{'ok  ' if self.problem is None else 'FAIL'}  {self.check}: {self.problem or self.detail}"


@dataclass
class Subject:
    """The recipe under check: its datamodule on the given data, and a way to build a fresh model."""

    datamodule: TensorDataModule
    new_model: Callable[[], Any]
    config: RunConfig
    recipe: Recipe
    found: list[Finding] = field(default_factory=list)


def check_recipe(config: RunConfig, recipe: Recipe, learn: bool = True) -> list[Finding]:
    """Every check of ``recipe`` on ``config``'s data (its ``data_dir``); ``learn``: the two training checks too."""
    from project.training.build import build_datamodule, build_model

    try:
        datamodule = build_datamodule(config, recipe)
    except RecipeError as err:  # a datamodule the engine refuses: no check can run on it
        return [Finding("datamodule", problem=str(err))]
    try:
        datamodule.setup("fit")
        datamodule.setup("test")
    except DataError as err:
        return [Finding("data", problem=f"the datamodule cannot load its data: {err}")]
    subject = Subject(datamodule, lambda: build_model(config, recipe), config, recipe)
    checks: list[Callable[[Subject], Finding]] = [check_options, check_inputs, check_augment, check_labels,
                                                  check_outputs, check_statistics, check_leakage,
                                                  check_eval_determinism]
    if learn:
        checks += [check_fits_one_batch, check_learns]
    for check in checks:
        name = check.__name__.removeprefix("check_").replace("_", " ")
        try:
            subject.found.append(check(subject))
        except UserError as err:  # the engine refused what the check asked of it: that is the finding
            subject.found.append(Finding(name, problem=str(err)))
        except Exception as err:  # noqa: BLE001 - a broken recipe can raise anything; said in one line
            first = first_line(err)
            failed = [f.check for f in subject.found if f.problem]
            hint = f" (after {', '.join(failed)} failed: fix that first)" if failed else ""
            subject.found.append(Finding(name, problem=f"the recipe raised {type(err).__name__}: {first}{hint}"))
    return subject.found


def _samples(datamodule: TensorDataModule, count: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``count`` training inputs as the network sees them (normalised), and their labels."""
    split = unaugmented(datamodule.train_set)
    if isinstance(split, TensorPairs):
        return split.inputs[:count].cpu(), split.targets[:count].cpu()
    items = [split[i] for i in range(min(count, len(split)))]
    pixels = torch.stack([torch.as_tensor(x) for x, _ in items]).float()
    return datamodule.normalize(pixels), torch.as_tensor([int(y) for _, y in items])


def check_inputs(subject: Subject) -> Finding:
    datamodule = subject.datamodule
    shape = tuple(datamodule.input_shape)
    for name in ("train_set", "test_set"):
        inputs = gather(getattr(datamodule, name), 16).inputs
        if tuple(inputs.shape[1:]) != shape:
            return Finding("inputs", problem=(
                f"the {name.split('_')[0]} split yields inputs of shape "
                f"{tuple(inputs.shape[1:])}, but input_shape is {shape}: make them agree"
            ))
        if not inputs.is_floating_point():
            return Finding("inputs", problem=(
                f"the {name.split('_')[0]} split yields {inputs.dtype} inputs: give "
                "floating-point pixels in [0, 1] (divide 8-bit images by 255)"
            ))
    return Finding("inputs", f"{'x'.join(map(str, shape))} floating-point inputs in both splits")


def check_augment(subject: Subject) -> Finding:
    datamodule = subject.datamodule
    if datamodule.augment is None:
        return Finding("augment", "the recipe does not augment")
    split = unaugmented(datamodule.train_set)
    originals = [torch.as_tensor(split[i][0]).float() for i in range(min(16, len(split)))]
    outcomes = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)  # randomness drawn anywhere but the generator shows up as a difference
        outcomes.append([datamodule.augment(x.clone(), torch.Generator().manual_seed(7 + i))
                         for i, x in enumerate(originals)])
    for original, first, second in zip(originals, *outcomes, strict=True):
        if first.shape != original.shape or first.dtype != original.dtype:
            return Finding("augment", problem=(
                f"augment turns a {tuple(original.shape)} {original.dtype} input into "
                f"{tuple(first.shape)} {first.dtype}: keep the shape and dtype"
            ))
        if not torch.equal(first, second):
            return Finding("augment", problem=(
                "augment draws randomness outside the generator it is given (the same "
                "generator seed gave other outputs): use torch.rand(..., generator=generator), so that a "
                "resumed run sees the same samples"
            ))
    return Finding("augment", "keeps shape and dtype; draws only from its generator")


def check_options(subject: Subject) -> Finding:
    """Each of the recipe's options checks its own default, as a value and as the flag's text: a check that fails
    there fails every ``train.py --OPTION`` too."""
    recipe = subject.recipe
    for name, option in recipe.options.items():
        flag = f"--{name.replace('_', '-')}"
        text = ",".join(map(str, option.default)) if isinstance(option.default, (list, tuple)) else \
            str(option.default)
        try:
            value, typed = recipe.checked_option(name)(option.default), recipe.checked_option(name)(text)
        except ValueError as err:
            return Finding("options", problem=f"{flag}: its check refuses its own default {text!r}: {err}")
        if value != typed:
            return Finding("options", problem=(
                f"{flag}: its check gives {value!r} for its default but {typed!r} for the "
                f"same typed on the command line ({flag} {text})"
            ))
    return Finding("options", f"{len(recipe.options)} option(s), each checking its own default")


def check_labels(subject: Subject) -> Finding:
    datamodule, classes = subject.datamodule, subject.datamodule.num_classes
    for name in ("train_set", "test_set"):
        targets = gather(getattr(datamodule, name), None).targets
        outside = targets[(targets < 0) | (targets >= classes)]
        if len(outside):
            return Finding("labels", problem=(
                f"the {name.split('_')[0]} split has label {int(outside[0])}, outside "
                f"[0, {classes}): set num_classes to cover every label, or fix the labels"
            ))
        if targets.is_floating_point():
            return Finding("labels", problem=(
                f"the {name.split('_')[0]} split's labels are {targets.dtype}: give class "
                "indices as integers"
            ))
    targets = gather(datamodule.train_set, None).targets
    absent = sorted(set(range(classes)) - set(targets.tolist()))
    if absent:
        return Finding("labels", problem=(
            f"class(es) {', '.join(map(str, absent[:5]))} never occur in the training split "
            f"of {len(targets):,} samples: a model cannot learn them (num_classes {classes} too large, or a "
            "split that is not shuffled)"
        ))
    return Finding("labels", f"every label in [0, {classes}), every class in the training split")


def check_outputs(subject: Subject) -> Finding:
    model = subject.new_model().eval()
    inputs, _ = _samples(subject.datamodule, 8)
    with torch.no_grad():
        out = model(inputs)
    classes = subject.datamodule.num_classes
    if tuple(out.shape) != (len(inputs), classes):
        return Finding("outputs", problem=(
            f"the network gives outputs of shape {tuple(out.shape)} for {len(inputs)} "
            f"inputs, but the datamodule has {classes} classes: make its last layer {classes} wide"
        ))
    if not bool(torch.isfinite(out).all()):
        return Finding("outputs", problem=(
            "the freshly built network gives NaN or infinite outputs on training inputs: "
            "a division by zero, a log of 0 or an uninitialised weight in its forward"
        ))
    if probabilities(out):
        return Finding("outputs", problem=(
            "the network's outputs are probabilities (each row in [0, 1], summing to 1: a "
            "softmax in its forward): the loss needs logits (cross_entropy applies log_softmax itself) or "
            "log-probabilities (nll_loss); drop the softmax, or end with log_softmax"
        ))
    return Finding("outputs", f"{classes} outputs per input")


def probabilities(outputs: torch.Tensor) -> bool:
    """Rows that are probability distributions: what a softmax returns (logits and log-probabilities are not)."""
    outputs = outputs.float()
    return bool((outputs >= 0).all() and (outputs <= 1).all() and
                torch.allclose(outputs.sum(1), torch.ones(len(outputs)), atol=1e-3))


def check_statistics(subject: Subject) -> Finding:
    card = data_card(subject.datamodule)
    problem = card.statistics_problem()
    return Finding("statistics", f"mean {fmt_values(card.mean)} std {fmt_values(card.std)} as declared", problem)


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
    if not (torch.isfinite(first).all() and torch.isfinite(second).all()):
        return Finding("eval determinism", problem=(
            "in eval mode the network gives NaN or infinite outputs (a division "
            "by zero, a log of 0, or weights a training step made non-finite)"
        ))
    if not torch.equal(first, second):
        return Finding("eval determinism", problem=(
            "in eval mode two passes over the same inputs differ: something "
            "random stays on (dropout called with training=True?); use nn.Dropout, which eval() turns off"
        ))
    if not torch.allclose(first[:1], alone, rtol=1e-4, atol=1e-5):
        return Finding("eval determinism", problem=(
            "in eval mode an input's output depends on the rest of its batch "
            "(batch statistics used in evaluation: BatchNorm with track_running_stats=False?); "
            "evaluation must treat each input alone"
        ))
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
        return Finding("fits one batch", problem=(
            f"after {steps} Adam steps on one batch of {len(inputs)} training "
            f"samples the model gets {accuracy:.0%} of them right: it cannot learn (inputs ignored, "
            "outputs detached, a loss that does not match the outputs?)"
        ))
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
        result = train(config, subject.recipe)
    accuracy = float(result.test_metrics["test/acc"])
    epochs = config.max_epochs
    if accuracy < needed:
        return Finding("learns", problem=(
            f"a {epochs}-epoch run ends at test/acc {accuracy:.3f}, chance is "
            f"{1 / classes:.3f} (needed {needed:.2f}): labels out of step with their inputs, or the test "
            "split read differently from the training split?"
        ))
    return Finding("learns", f"test/acc {accuracy:.3f} after {epochs} epochs (chance {1 / classes:.3f})")
