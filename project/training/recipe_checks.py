"""Checks that catch a broken recipe rather than a broken engine (``scripts/check_recipe.py``).

Each checks one of the classic bugs of a recipe's own data and model and fails with one line that names the bug
and its fix: inputs and augmentation, labels and classes, the output width, statistics, leakage, evaluation that
is random or depends on the batch, and a model that does not learn (one batch, then a short real run).
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from project.config.schema import RunConfig
from project.config.validators import flag_value
from project.contract import Recipe, RecipeError
from project.errors import DataError, UserError, first_line
from project.training.data_card import data_card, fmt_values, gather, shape_problem, unaugmented
from project.training.tensor_data import TensorDataModule, TensorPairs


@dataclass
class Finding:
    """One check's outcome: ``problem`` is None when it passed, else the one line naming the bug and the fix; a
    ``warning`` passes, saying what the check could not decide and how to decide it."""

    check: str
    detail: str = ""  # what a passing check found
    problem: str | None = None
    warning: str | None = None

    def line(self) -> str:
        status = "FAIL" if self.problem is not None else "warn" if self.warning is not None else "ok  "
        return f"{status}  {self.check}: {self.problem or self.warning or self.detail}"


@dataclass
class Subject:
    """The recipe under check: its datamodule on the given data, and a way to build a fresh model."""

    datamodule: TensorDataModule
    new_model: Callable[[], Any]
    config: RunConfig
    recipe: Recipe
    found: list[Finding] = field(default_factory=list)


CHECK_EPOCHS = 4  # the training checks' run, at most: the recipe's own max_epochs where that is fewer
EXAMPLE_VAL_SIZE = 0.2
EXAMPLE_BATCH = 32


def check_config(recipe: Recipe, data_dir: str, examples: bool, max_epochs: int | None = None) -> RunConfig:
    """The checks' run: a few epochs; on the recipe's (small) example data, a share of it for validation whatever the
    recipe holds out of its real data, and batches small enough for an epoch of several steps."""
    from project.config.schema import settings_of

    defaults = settings_of(recipe)
    example = {"val_size": EXAMPLE_VAL_SIZE, "batch_size": min(defaults["batch_size"].default, EXAMPLE_BATCH)} \
        if examples else {}
    return RunConfig.for_recipe(recipe, data_dir=data_dir,
                                max_epochs=max_epochs or min(defaults["max_epochs"].default, CHECK_EPOCHS), **example)


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
    checks: list[Callable[[Subject], Finding]] = [check_options, check_inputs, check_augment, check_reads, check_labels,
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
    splits = {name: gather(getattr(datamodule, f"{name}_set"), 16).inputs for name in ("train", "test")}
    problem = shape_problem(shape, tuple(splits["train"].shape[1:]), tuple(splits["test"].shape[1:]))
    if problem is not None:
        return Finding("inputs", problem=problem)
    for name, inputs in splits.items():
        if not inputs.is_floating_point():
            return Finding("inputs", problem=(
                f"the {name} split yields {inputs.dtype} inputs: give floating-point pixels in [0, 1] (divide "
                "8-bit images by 255)"
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


def check_reads(subject: Subject, count: int = 64) -> Finding:
    """A sample read twice is the same sample: randomness in reading (a label drawn anew, a random transform) makes
    every epoch, every resume and every evaluation see other data. Held in memory, a split is read once."""
    datamodule = subject.datamodule
    read = 0
    for name in ("train", "test"):
        split = unaugmented(getattr(datamodule, f"{name}_set"))
        if isinstance(split, TensorPairs):
            continue
        for index in range(min(count, len(split))):
            (pixels, label), (again, label_again) = split[index], split[index]
            read += 1
            if not torch.equal(torch.as_tensor(label), torch.as_tensor(label_again)):
                return Finding("reads", problem=(
                    f"the {name} split gives sample {index} the label {torch.as_tensor(label).tolist()}, then "
                    f"{torch.as_tensor(label_again).tolist()}: labels drawn at random as a sample is read; label "
                    "noise, if wanted, is drawn once, with the data"
                ))
            if not torch.equal(torch.as_tensor(pixels), torch.as_tensor(again)):
                fix = ("move them to augment, which draws from the generator it is given (a resume then sees the "
                       "same samples)") if name == "train" else "the test split is read the same way each time"
                return Finding("reads", problem=(
                    f"the {name} split gives other pixels for sample {index} each time it is read: random "
                    f"transforms in its reading; {fix}"
                ))
    if not read:
        return Finding("reads", "both splits held in memory, read once")
    return Finding("reads", f"{read} samples read twice, each the same both times")


def check_options(subject: Subject) -> Finding:
    """Each of the recipe's options checks its own default, as a value and as the flag's text: a check that fails
    there fails every ``train.py --OPTION`` too."""
    recipe = subject.recipe
    for name, option in recipe.options.items():
        flag = f"--{name.replace('_', '-')}"
        text = flag_value(option.default)
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
        if targets.dim() != 1:
            return Finding("labels", problem=(
                f"the {name.split('_')[0]} split's labels have shape {tuple(targets.shape)}: give one class index "
                f"per sample (one-hot labels? labels.argmax(1) are their indices)"
            ))
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
    held_for_validation = sorted(set(absent) & set(gather(datamodule.val_set, None).targets.tolist()))
    if held_for_validation:
        return Finding("labels", problem=(
            f"class(es) {', '.join(map(str, held_for_validation[:5]))} occur in the validation split but never in "
            f"the training split of {len(targets):,} samples: the validation share took all of its samples; give the "
            "class more samples, or hold out fewer (--val-size)"
        ))
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
    try:
        with torch.no_grad():
            out = model(inputs)
    except RuntimeError as err:
        batch, _ = _samples(subject.datamodule, subject.config.batch_size)
        if len(batch) == len(inputs) or not _runs(model, batch):
            raise
        return Finding("outputs", problem=(
            f"the network runs on a batch of {len(batch)} (the batch size) but not of {len(inputs)} "
            f"({first_line(err)}): its forward assumes the batch size; take it from the input "
            f"(x.flatten(1) or x.reshape(x.shape[0], -1), not x.reshape({len(batch)}, -1))"
        ))
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


def _runs(model: Any, inputs: torch.Tensor) -> bool:
    try:
        with torch.no_grad():
            model(inputs)
    except RuntimeError:
        return False
    return True


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
    """A short real run: the test accuracy must be clearly above chance. Below it, a longer fit on most of the
    training split tells the causes apart: labels that do not belong to their inputs are memorised but nothing
    generalises, a test split read otherwise is learnt everywhere but there, and a recipe that is only slow
    learns both, so it passes with a warning."""
    from project.training.run import train

    classes = subject.datamodule.num_classes
    needed = min(1 / classes + 0.25, (1 + 1 / classes) / 2)
    with tempfile.TemporaryDirectory(prefix="recipe-check-") as logs:
        config = subject.config.replace(logdir=logs, accelerator="cpu", devices=1, steps_per_call=1,
                                        trainer={**subject.config.trainer, "enable_progress_bar": False})
        result = train(config, subject.recipe)
    accuracy = float(result.test_metrics["test/acc"])
    epochs = config.max_epochs
    ran = (f"a {epochs}-epoch run ends at test/acc {accuracy:.3f} (chance {1 / classes:.3f}, the check asks "
           f"{needed:.2f})")
    if accuracy >= needed:
        return Finding("learns", f"test/acc {accuracy:.3f} after {epochs} epochs (chance {1 / classes:.3f})")
    fit = longer_fit(subject, FIT_SAMPLES, FIT_STEPS)
    # one shift of the classes' many is the best by chance alone: three spreads above chance, not two
    if fit.shift and fit.shifted.above_chance(sigmas=3) and fit.shifted.clearly_above(fit.test, floor=0):
        return Finding("learns", problem=(
            f"{ran}; the test split's labels are shifted: a longer fit's predictions match each test label less "
            f"{fit.shift} (mod {classes}) in {fit.shifted} of them, the labels as read in {fit.test.accuracy:.2f}: "
            "the test split numbers its classes from another start than the training split (an off-by-one?)"
        ))
    if fit.held.above_chance() and (not fit.test.above_chance() or fit.held.clearly_above(fit.test)):
        below = " (below chance: its labels shifted or permuted)" if fit.test.below_chance() else ""
        return Finding("learns", problem=(
            f"{ran}; a longer fit gets {fit.held} of the training images it did not see right but {fit.test} of "
            f"the test split{below}: the test split is read differently from the training split (labels in "
            "another order, images transposed, resized or normalised otherwise)"
        ))
    if fit.held.above_chance():
        return Finding("learns", warning=(
            f"{ran}, but a longer fit gets {fit.held} of the training images it did not see right and {fit.test} of "
            f"the test split: the recipe learns, more slowly than the check's budget; to see it pass: "
            f"check_recipe.py --max-epochs {4 * epochs}"
        ))
    if fit.seen >= MEMORISED:
        return Finding("learns", problem=(
            f"{ran}; a longer fit gets {fit.seen:.0%} of the {fit.seen_count} training images it sees right but "
            f"{fit.held} of {fit.held.count} others of the same split: it memorises and nothing generalises, so "
            "the labels are out of step with their inputs (shuffled, shifted, or read in another order than the "
            "images)"
        ))
    return Finding("learns", warning=(
        f"{ran}, and a longer fit gets only {fit.seen:.0%} of the training images it sees right: a recipe that needs "
        "more than the check's budget and labels that do not belong to their inputs look alike here; to decide: "
        f"check_recipe.py --max-epochs {4 * epochs}, or more example images"
    ))


FIT_SAMPLES = 2048  # of each split, at most: enough to tell 0.1 from chance, few enough to fit in seconds
FIT_STEPS = 600
MEMORISED = 0.9  # of the training images a fit sees, got right: it has learnt them by heart


@dataclass(frozen=True)
class Score:
    """An accuracy on ``count`` samples, beside ``chance``: what always guessing the split's commonest class gets."""

    accuracy: float
    chance: float
    count: int

    def _spread(self, sigmas: float = 2) -> float:
        return sigmas * math.sqrt(self.chance * (1 - self.chance) / max(self.count, 1))

    def above_chance(self, sigmas: float = 2) -> bool:
        return self.accuracy > self.chance + self._spread(sigmas)

    def below_chance(self) -> bool:
        return self.accuracy < self.chance - self._spread()

    def clearly_above(self, other: Score, floor: float = 0.1) -> bool:
        """Higher by more than chance makes likely, and by ``floor``: two splits read alike do not differ by a tenth
        (the same split scored two ways needs no floor)."""
        spread = math.hypot(self._spread(), other._spread())
        return self.accuracy - other.accuracy > max(spread, floor)

    def __str__(self) -> str:
        return f"{self.accuracy:.2f} (chance {self.chance:.2f})"


@dataclass(frozen=True)
class Fit:
    """Fits of fresh models, each on three quarters of the training split: how much of what they saw they get
    right, how much of the quarter each did not see, and of the test split."""

    seen: float
    seen_count: int
    held: Score
    test: Score
    shift: int  # the k that test labels less k match the predictions best (0: read as the training split is)
    shifted: Score  # the test split's accuracy against its labels less ``shift``


def longer_fit(subject: Subject, samples: int, steps: int, folds: int = 4) -> Fit:
    """Each quarter of the training split held out in turn (every training sample is scored once, by a model that
    did not see it): Adam on the inputs as the network sees them, no augmentation, until a model has what it sees by
    heart or ``steps`` are done."""
    datamodule = subject.datamodule
    train_inputs, train_targets = _as_seen(datamodule, datamodule.train_set, samples)
    test_inputs, test_targets = _as_seen(datamodule, datamodule.test_set, samples)
    quarters = torch.randperm(len(train_targets), generator=torch.Generator().manual_seed(0)).chunk(folds)
    classes = datamodule.num_classes
    seen_right = held_right = 0.0
    test_right = torch.zeros(classes)  # by the shift k of the labels they are compared with: label - k
    for fold, held in enumerate(quarters):
        seen = torch.cat([quarter for other, quarter in enumerate(quarters) if other != fold])
        torch.manual_seed(fold)
        module = _fitted(subject.new_model(), train_inputs[seen], train_targets[seen], steps)
        seen_right += _accuracy(module, train_inputs[seen], train_targets[seen]) / folds
        held_right += _accuracy(module, train_inputs[held], train_targets[held]) * len(held)
        predicted = _predicted(module, test_inputs)
        test_right += torch.stack([(predicted == (test_targets - k) % classes).float().mean()
                                   for k in range(classes)]) / folds
    shift = int(test_right.argmax())
    return Fit(seen_right, len(train_targets) - len(quarters[0]),
               Score(held_right / len(train_targets), _commonest(train_targets), len(train_targets)),
               Score(float(test_right[0]), _commonest(test_targets), len(test_targets)), shift,
               Score(float(test_right[shift]), _commonest(test_targets), len(test_targets)))


def _fitted(module: Any, inputs: torch.Tensor, targets: torch.Tensor, steps: int, batch: int = 32) -> Any:
    optimizer = torch.optim.Adam(module.parameters(), lr=3e-3)
    done = 0
    while done < steps and _accuracy(module, inputs, targets) < 0.98:
        module.train()
        for picked in torch.randperm(len(targets), generator=torch.Generator().manual_seed(done)).split(batch)[
                :steps - done]:
            optimizer.zero_grad(set_to_none=True)
            module.loss(module(inputs[picked]), targets[picked]).backward()
            optimizer.step()
            done += 1
    return module


def _as_seen(datamodule: TensorDataModule, split: Any, samples: int) -> tuple[torch.Tensor, torch.Tensor]:
    gathered = gather(split, samples)
    inputs = gathered.inputs.float().reshape(len(gathered.inputs), *datamodule.input_shape)
    if len(inputs) > samples:
        picked = torch.randperm(len(inputs), generator=torch.Generator().manual_seed(0))[:samples]
        inputs, targets = inputs[picked], gathered.targets[picked]
    else:
        targets = gathered.targets
    return (inputs if gathered.normalised else datamodule.normalize(inputs)), targets.long()


def _predicted(module: Any, inputs: torch.Tensor) -> torch.Tensor:
    module.eval()
    with torch.no_grad():
        return torch.cat([module(chunk).argmax(1) for chunk in inputs.split(256)])


def _accuracy(module: Any, inputs: torch.Tensor, targets: torch.Tensor) -> float:
    return float((_predicted(module, inputs) == targets).float().mean()) if len(targets) else 0.0


def _commonest(targets: torch.Tensor) -> float:
    return float(torch.bincount(targets).max()) / len(targets) if len(targets) else 0.0
