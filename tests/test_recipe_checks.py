"""The recipe checks and the data card: every shipped recipe passes; the bugs users make in a recipe fail, each with
its own line (the broken variants are in ``tests/mutants.py``); a declared mean far from the data is refused."""

from __future__ import annotations

import logging
import re

import pytest
import torch

from helpers import event_accumulator, make_tiny_data, run_script, tiny_config, tiny_recipe, train
from project.errors import UsageError
from project.training.data_card import DataCard, shared_inputs
from project.training.recipe_checks import check_recipe


def card(**changes) -> DataCard:
    values = dict(recipe="Digits", sizes={"train": 900, "val": 100, "test": 200}, input_shape=(1, 8, 8), num_classes=3,
                  class_counts=[300, 310, 290], mean=(0.30,), std=(0.20,), pixel_range=(0.0, 1.0),
                  declared_mean=(0.30,), declared_std=(0.20,), duplicates=0)
    return DataCard(**{**values, **changes})


def test_the_card_says_what_a_run_trains_on():
    assert card().line() == ("data: 900 train / 100 val / 200 test, inputs 1x8x8, 3 classes (290-310 each), pixel "
                             "mean (0.30,) std (0.20,) (as declared), 0 test inputs also in training")
    assert "| training samples per class | 0: 300, 1: 310, 2: 290 |" in card().markdown()
    assert "3 classes (300-310 each, 1 absent)" in card(num_classes=3, class_counts=[300, 0, 310]).line()


@pytest.mark.parametrize(("declared_mean", "declared_std", "wrong"), [
    ((0.70,), (0.20,), True), ((0.38,), (0.20,), False), ((0.30,), (0.40,), True), ((0.30,), (0.25,), False),
    ((0.30,), (0.10,), True), ((0.30,), (0.15,), False), ((0.30, 0.30), (0.20, 0.20), True)])
def test_statistics_declared_far_from_the_data_are_a_problem(declared_mean, declared_std, wrong):
    problem = card(declared_mean=declared_mean, declared_std=declared_std).statistics_problem()
    assert (problem is not None) == wrong, problem
    if wrong and len(declared_mean) == 1:
        assert problem.startswith("Digits declares mean") and "set mean = (0.30,), std = (0.20,)" in problem


@pytest.mark.parametrize(("pixel_range", "wrong"), [
    ((0.0, 1.0), False), ((-0.01, 1.015), False), ((0.57, 1.57), True), ((-0.05, 0.95), True), ((0.0, 255.0), True)])
def test_inputs_outside_0_1_once_the_declared_normalisation_is_undone_are_a_problem(pixel_range, wrong):
    """Statistics measured through a normalisation other than the declared one would only echo the declaration."""
    problem = card(pixel_range=pixel_range).statistics_problem()
    assert (problem is not None) == wrong, problem
    if wrong:
        assert f"range over [{pixel_range[0]:.2f}, {pixel_range[1]:.2f}], not pixels in [0, 1]" in problem


def test_a_recipe_normalising_with_other_numbers_than_it_declares_is_refused(tmp_path, monkeypatch):
    """The MNIST recipe normalises with its own constants: declaring another mean beside them (0.70 for pixels that
    average 0.16) must not pass as 'measured as declared', or predict.py would invert every image it reads."""
    from tests.tiny_recipe.data import MEAN, STD, TinyDataModule

    def normalised_with_the_true_numbers(self, train):
        pixels, labels = self._pixels(train)
        return (pixels - MEAN) / STD, labels

    data = make_tiny_data(tmp_path / "data")
    monkeypatch.setattr(TinyDataModule, "load_tensors", normalised_with_the_true_numbers)
    assert train(tiny_config(data, tmp_path / "right", max_epochs=1)) is not None
    monkeypatch.setattr(TinyDataModule, "mean", (0.70,))
    with pytest.raises(UsageError, match=r"TinyDataModule declares mean \(0.70,\) std \(0.30,\), but with that "
                                         r"normalisation undone the training inputs range over \[0.54, 1.54\]"):
        train(tiny_config(data, tmp_path / "logs", max_epochs=1))
    assert not (tmp_path / "logs").exists()


def test_leakage_past_one_percent_of_the_test_set_is_a_problem():
    assert card(duplicates=2).leakage_problem() is None
    assert "3 test inputs (2%) also occur in the training split" in card(duplicates=3).leakage_problem()


def test_shared_inputs_are_counted_bit_for_bit():
    train_inputs = torch.rand(500, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    nearly = train_inputs[7:9].clone()
    nearly[:, 0, 0, 0] += 1e-6  # one value of each changed by a hair: not the same input
    others = torch.rand(30, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    test_inputs = torch.cat([train_inputs[100:111], nearly, others])
    assert shared_inputs(train_inputs, test_inputs) == 11


def test_the_engines_recipe_passes_every_check(tmp_path):
    config = tiny_config(make_tiny_data(tmp_path / "data"), tmp_path / "logs", max_epochs=3)
    findings = check_recipe(config, tiny_recipe())
    assert [f.check for f in findings] == ["options", "inputs", "augment", "reads", "labels", "outputs", "statistics",
                                           "leakage", "eval determinism", "fits one batch", "learns"]
    assert all(f.problem is None for f in findings), "\n".join(f.line() for f in findings)
    lines = [f.line() for f in findings]  # each check's own line, as a user reads it
    assert lines[:9] == [
        "ok    options: 1 option(s), each checking its own default",
        "ok    inputs: 1x28x28 floating-point inputs in both splits",
        "ok    augment: the recipe does not augment",
        "ok    reads: both splits held in memory, read once",
        "ok    labels: every label in [0, 10), every class in the training split",
        "ok    outputs: 10 outputs per input",
        "ok    statistics: mean (0.16,) std (0.21,) as declared",  # measured; declared 0.30 is near enough
        "ok    leakage: 0 test inputs also in training",
        "ok    eval determinism: eval mode is deterministic and per input",
    ]
    assert lines[9] == "ok    fits one batch: 100% of one batch of 32 after 150 steps"
    assert re.fullmatch(r"ok    learns: test/acc [01]\.\d{3} after 3 epochs \(chance 0\.100\)", lines[10]), lines[10]


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["tests.second_recipe", "tests.disk_recipe"])
def test_the_example_recipes_pass_every_check(recipe):
    done = run_script("check_recipe.py", "--max-epochs", "3", env={"PROJECT_RECIPE": recipe})
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1] == "all 11 checks passed"


def test_a_run_whose_recipe_declares_a_wrong_mean_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    """Normalisation and predict's polarity follow the declared mean: a wrong one would make predict.py invert every
    image; the run is refused in one line instead, naming the values to declare."""
    from tests.tiny_recipe.data import TinyDataModule

    data = make_tiny_data(tmp_path / "data")
    monkeypatch.setattr(TinyDataModule, "mean", (0.70,))
    with pytest.raises(UsageError, match=r"TinyDataModule declares mean \(0.70,\) .* set mean = \(0.16,\)"):
        train(tiny_config(data, tmp_path / "logs", max_epochs=1))
    assert not (tmp_path / "logs").exists()


def test_the_card_is_on_stderr_and_in_tensorboard(trained):
    line = next(line for line in trained["stderr"].splitlines() if line.startswith("data: "))
    assert line.startswith("data: 200 train / 40 val / 80 test, inputs 1x28x28, 10 classes")
    text = event_accumulator(trained["run"]).Tensors("run/data/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "| splits | train 200, val 40, test 80 |" in text


def test_a_failing_check_is_one_line_and_exit_status_1(tmp_path):
    empty = tmp_path / "nothing"
    empty.mkdir()
    done = run_script("check_recipe.py", "--data-dir", str(empty), "--no-learn")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[1].startswith("FAIL  data: the datamodule cannot load its data: ") and lines[-1] == \
        "1 of 1 checks failed"


# Advice that is right: each cause of statistics that do not match named as itself, not as "declare these numbers".
def checked(tmp_path, recipe=None, learn: bool = False, **settings) -> dict:
    """Each check's finding for the tests' recipe (or ``recipe``) on tiny data, by check; ``learn``: the training
    checks too."""
    config = tiny_config(make_tiny_data(tmp_path / "data"), tmp_path / "logs", **settings)
    return {f.check: f for f in check_recipe(config, recipe or tiny_recipe(), learn=learn)}


def findings_of(tmp_path, recipe=None, learn: bool = False, **settings) -> dict[str, str | None]:
    """Each check's problem (None where it passed), by check."""
    return {name: finding.problem for name, finding in checked(tmp_path, recipe, learn, **settings).items()}


@pytest.mark.parametrize(("held", "advice"), [
    (lambda pixels: pixels, "the inputs it holds are pixels in [0, 1] (mean (0.16,) std (0.21,)), not normalised: "
                            "normalise them with self.normalize"),
    (lambda pixels: ((pixels - 0.16) / 0.3 - 0.16) / 0.3, "its inputs are normalised twice"),
    (lambda pixels: pixels * 0, "TinyDataModule's training inputs are constant (pixel std (0.00,)"),
], ids=["unnormalised", "normalised-twice", "constant"])
def test_statistics_advice_names_the_cause(tmp_path, monkeypatch, held, advice):
    from tests.tiny_recipe.data import TinyDataModule

    def load_tensors(self, train):
        pixels, labels = self._pixels(train)
        return held(pixels), labels

    monkeypatch.setattr(TinyDataModule, "load_tensors", load_tensors)
    problem = findings_of(tmp_path)["statistics"]
    assert problem is not None and advice in problem and "set mean" not in problem, problem
    with pytest.raises(UsageError, match="statistics|normalis|constant"):  # and a run is refused with the same line
        train(tiny_config(tmp_path / "data", tmp_path / "run", max_epochs=1))
    assert not (tmp_path / "run").exists()


def test_the_card_tells_the_causes_apart_from_a_wrong_declaration():
    right = card(held=((0.0,), (1.0,), (-1.5, 3.5)))
    assert right.statistics_problem() is None
    wrong = card(declared_mean=(0.70,), held=((-2.0,), (1.0,), (-3.5, 1.5)))
    assert "set mean = (0.30,), std = (0.20,)" in wrong.statistics_problem()  # declared wrong: the numbers to declare
    unnormalised = card(mean=(0.36,), std=(0.04,), pixel_range=(0.3, 0.5), held=((0.30,), (0.20,), (0.0, 1.0)))
    assert "not normalised" in unnormalised.statistics_problem()
    assert "constant" in card(std=(0.0,), held=((0.0,), (0.0,), (0.0, 0.0))).statistics_problem()


@pytest.mark.parametrize(("forward", "advice"), [
    (lambda self, x: torch.softmax(self.model(x), dim=1),
     "the network's outputs are probabilities (each row in [0, 1], summing to 1: a softmax in its forward): the loss "
     "needs logits (cross_entropy applies log_softmax itself) or log-probabilities (nll_loss); drop the softmax, or "
     "end with log_softmax"),
    (lambda self, x: self.model(x) * float("nan"),
     "the freshly built network gives NaN or infinite outputs on training inputs: a division by zero, a log of 0 or "
     "an uninitialised weight in its forward"),
], ids=["softmax", "nan"])
def test_outputs_advice_names_a_softmax_and_nan(tmp_path, monkeypatch, forward, advice):
    from tests.tiny_recipe.model import LitTiny

    monkeypatch.setattr(LitTiny, "forward", forward)
    found = findings_of(tmp_path)
    assert found["outputs"] == advice, found
    assert found["eval determinism"] is None or "dropout" not in found["eval determinism"]


def test_an_option_whose_check_fails_is_a_finding_and_one_line_on_the_command_line(tmp_path, capsys):
    import dataclasses

    from helpers import parse_run_command_of
    from project.config.validators import sizes
    from project.contract import Option

    def broken(value):
        return sizes(value)[5]  # IndexError: a bug in the recipe's check

    recipe = dataclasses.replace(tiny_recipe(), options={"hidden": Option([128], broken, "widths")})
    found = findings_of(tmp_path, recipe)
    assert found["options"].startswith("--hidden: its check refuses its own default '128': the recipe's check of "
                                       "--hidden failed on [128]: IndexError: list index out of range")
    with pytest.raises(SystemExit):
        parse_run_command_of(recipe, ["--hidden", "8,16"])
    assert capsys.readouterr().err.strip() == ("train.py: error: argument --hidden: the recipe's check of --hidden "
                                               "failed on '8,16': IndexError: list index out of range "
                                               f"({__file__}:{broken.__code__.co_firstlineno + 1})")


def test_an_example_data_of_another_signature_is_one_line(tmp_path):
    import dataclasses

    from project.contract import RecipeError

    recipe = dataclasses.replace(tiny_recipe(), example_data=".model:LitTiny")  # not f(folder, train, test, seed)
    with pytest.raises(RecipeError, match=r"its example_data .model:LitTiny \(called as f\(folder, train, test, "
                                          r"seed\)\) failed: TypeError"):
        recipe.write_example_data(tmp_path)


def test_a_label_equal_to_num_classes_fails_the_labels_check_of_a_recipe_read_from_files(tmp_path):
    """Class folders read per sample: one folder too many gives label num_classes, one past the last class."""
    import shutil

    from project.api import RunConfig, load_recipe
    from tests.disk_recipe.data import write_shapes

    recipe = load_recipe("tests.disk_recipe")
    data = write_shapes(tmp_path / "data", train=60, test=15)
    extra = data / "shapes" / "train" / "zzz"  # ImageFolder numbers the folders in order: this one is class 3 of 3
    extra.mkdir()
    shutil.copy(next((data / "shapes" / "train" / "bar").iterdir()), extra / "0000.png")
    config = RunConfig.for_recipe(recipe, data_dir=str(data), logdir=str(tmp_path / "logs"), batch_size=16)
    found = {f.check: f.problem for f in check_recipe(config, recipe, learn=False)}
    assert found["labels"] is not None and "label 3, outside [0, 3)" in found["labels"], found


def test_a_datamodule_that_cannot_load_is_the_only_finding(tmp_path):
    (tmp_path / "empty").mkdir()
    (found,) = check_recipe(tiny_config(tmp_path / "empty", tmp_path / "logs"), tiny_recipe())
    assert (found.check, found.detail) == ("data", "")
    assert found.line() == f"FAIL  data: the datamodule cannot load its data: {tmp_path / 'empty'}/tiny/train.pt: " \
                           "no such file"


def tensors_replaced(train=lambda pixels, labels: (pixels, labels), test=lambda pixels, labels: (pixels, labels)):
    """A ``load_tensors`` that changes what the tests' recipe holds, per split (its pixels are in [0, 1])."""
    def load_tensors(self, is_train):
        pixels, labels = self._pixels(is_train)
        return (train if is_train else test)(self.normalize(pixels), labels)
    return load_tensors


@pytest.mark.parametrize(("load_tensors", "check", "problem"), [
    (tensors_replaced(train=lambda x, y: (x[:, :, :27], y)), "inputs",
     "the train split yields inputs of shape (1, 27, 28) where the test split and input_shape have (1, 28, 28): "
     "read the train split as the test split is read"),
    (tensors_replaced(test=lambda x, y: (x[:, :, :27], y)), "inputs",
     "the test split yields inputs of shape (1, 27, 28) where the train split and input_shape have (1, 28, 28): "
     "read the test split as the train split is read"),
    (tensors_replaced(test=lambda x, y: (x.to(torch.uint8), y)), "inputs",
     "the test split yields torch.uint8 inputs: give floating-point pixels in [0, 1] (divide 8-bit images by 255)"),
    (tensors_replaced(train=lambda x, y: (x, y.float())), "labels",
     "the train split's labels are torch.float32: give class indices as integers"),
    (tensors_replaced(test=lambda x, y: (x, y.double())), "labels",
     "the test split's labels are torch.float64: give class indices as integers"),
    (tensors_replaced(train=lambda x, y: (x, y.clamp(max=7))), "labels",
     "class(es) 8, 9 never occur in the training split of 200 samples: a model cannot learn them (num_classes 10 "
     "too large, or a split that is not shuffled)"),
    (tensors_replaced(train=lambda x, y: (x, y.clamp(max=3))), "labels",
     "class(es) 4, 5, 6, 7, 8 never occur in the training split of 200 samples: a model cannot learn them "
     "(num_classes 10 too large, or a split that is not shuffled)"),
], ids=["train-shape", "test-shape", "test-dtype", "float-labels", "test-float-labels", "absent", "six-absent"])
def test_a_data_bug_is_named_by_its_check(tmp_path, monkeypatch, load_tensors, check, problem):
    from tests.tiny_recipe.data import TinyDataModule

    monkeypatch.setattr(TinyDataModule, "load_tensors", load_tensors)
    found = checked(tmp_path)
    assert found[check].problem == problem, found[check]
    assert found[check].line() == f"FAIL  {check}: {problem}"


def in_eval_only(change):
    """A forward that behaves in training and does ``change`` to its outputs in eval mode."""
    return lambda self, x: self.model(x) if self.training else change(self.model(x))


@pytest.mark.parametrize(("forward", "check", "problem"), [
    (lambda self, x: self.model(x)[:, :9], "outputs", "the network gives outputs of shape (8, 9) for 8 inputs, but "
     "the datamodule has 10 classes: make its last layer 10 wide"),
    (lambda self, x: torch.nn.functional.dropout(self.model(x), 0.5, training=True), "eval determinism",
     "in eval mode two passes over the same inputs differ: something random stays on (dropout called with "
     "training=True?); use nn.Dropout, which eval() turns off"),
    (lambda self, x: self.model(x - x.mean(0)), "eval determinism",
     "in eval mode an input's output depends on the rest of its batch (batch statistics used in evaluation: "
     "BatchNorm with track_running_stats=False?); evaluation must treat each input alone"),
    (in_eval_only(lambda out: out.log()), "eval determinism",
     "in eval mode the network gives NaN or infinite outputs (a division by zero, a log of 0, or weights a training "
     "step made non-finite)"),
], ids=["width", "dropout", "batch-statistics", "eval-nan"])
def test_a_model_bug_is_named_by_its_check(tmp_path, monkeypatch, forward, check, problem):
    from tests.tiny_recipe.model import LitTiny

    monkeypatch.setattr(LitTiny, "forward", forward)
    found = findings_of(tmp_path)
    assert found[check] == problem, found


def test_a_model_that_ignores_its_inputs_fails_one_batch(tmp_path, monkeypatch):
    from tests.tiny_recipe.model import LitTiny

    monkeypatch.setattr(LitTiny, "forward", lambda self, x: self.model(x * 0))  # the training step calls the MLP
    found = findings_of(tmp_path, learn=True, max_epochs=1)
    assert re.fullmatch(r"after 150 Adam steps on one batch of 32 training samples the model gets \d+% of them right: "
                        r"it cannot learn \(inputs ignored, outputs detached, a loss that does not match the "
                        r"outputs\?\)", found["fits one batch"]), found["fits one batch"]


def test_a_fit_that_learns_nothing_leaves_learns_undecided_with_a_warning(tmp_path, monkeypatch):
    """Nothing learnt, nothing memorised (here: a fit given no steps, a run whose test labels are out of step): a
    recipe too slow for the check and labels that do not belong to their inputs look alike, so the check passes
    with a warning saying how to decide."""
    from project.training import recipe_checks
    from tests.tiny_recipe.data import TinyDataModule

    monkeypatch.setattr(recipe_checks, "FIT_STEPS", 0)
    monkeypatch.setattr(TinyDataModule, "load_tensors", tensors_replaced(test=lambda x, y: (x, y.roll(1))))
    found = checked(tmp_path, learn=True, max_epochs=1)
    assert found["learns"].problem is None
    assert re.fullmatch(r"a 1-epoch run ends at test/acc 0\.\d{3} \(chance 0\.100, the check asks 0\.35\), and a "
                        r"longer fit gets only \d+% of the training images it sees right: a recipe that needs more "
                        r"than the check's budget and labels that do not belong to their inputs look alike here; to "
                        r"decide: check_recipe.py --max-epochs 4, or more example images", found["learns"].warning), \
        found["learns"]
    assert found["learns"].line().startswith("warn  learns: a 1-epoch run ends at test/acc ")


def test_test_labels_out_of_step_with_their_inputs_fail_learns_naming_the_test_split(tmp_path, monkeypatch):
    from tests.tiny_recipe.data import TinyDataModule

    monkeypatch.setattr(TinyDataModule, "load_tensors", tensors_replaced(test=lambda x, y: (x, y.roll(1))))
    found = findings_of(tmp_path, learn=True, max_epochs=1)
    assert re.fullmatch(r"a 1-epoch run ends at test/acc 0\.\d{3} \(chance 0\.100, the check asks 0\.35\); a longer "
                        r"fit gets [01]\.\d\d \(chance 0\.1\d\) of the training images it did not see right but "
                        r"0\.\d\d \(chance 0\.1\d\) of the test split: the test split is read differently from the "
                        r"training split \(labels in another order, images transposed, resized or normalised "
                        r"otherwise\)", found["learns"]), found["learns"]


def test_a_check_that_raises_is_one_line_naming_what_failed_before_it(tmp_path, monkeypatch):
    from tests.tiny_recipe.model import LitTiny

    def forward(self, x):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied\n(a second line)")

    monkeypatch.setattr(LitTiny, "forward", forward)  # the training step calls the MLP: only a run learns
    found = checked(tmp_path, learn=True, max_epochs=1)
    assert found["outputs"].line() == ("FAIL  outputs: the recipe raised RuntimeError: mat1 and mat2 shapes cannot be "
                                       "multiplied")
    assert found["eval determinism"].problem == ("the recipe raised RuntimeError: mat1 and mat2 shapes cannot be "
                                                 "multiplied (after outputs failed: fix that first)")
    assert found["fits one batch"].problem == ("the recipe raised RuntimeError: mat1 and mat2 shapes cannot be "
                                               "multiplied (after outputs, eval determinism failed: fix that first)")
    assert found["learns"].problem is None
    assert not (tmp_path / "logs").exists()  # the checks' run writes in a folder of its own, removed after it

    def refused(self, x):
        raise UsageError("--hidden 0: must be a positive integer")

    monkeypatch.setattr(LitTiny, "forward", refused)  # the engine refusing what a check asked of it: the finding
    found = checked(tmp_path)
    assert (found["outputs"].detail, found["outputs"].problem) == ("", "--hidden 0: must be a positive integer")


@pytest.mark.parametrize(("default", "problem"), [
    ([128, 64], "--hidden-sizes: its check gives [128, 64] for its default but '128,64' for the same typed on the "
                "command line (--hidden-sizes 128,64)"),
    (3, "--hidden-sizes: its check gives 3 for its default but '3' for the same typed on the command line "
        "(--hidden-sizes 3)"),
])
def test_an_option_whose_check_reads_its_default_and_its_text_differently_is_a_finding(tmp_path, default, problem):
    import dataclasses

    from project.contract import Option

    recipe = dataclasses.replace(tiny_recipe(), options={"hidden_sizes": Option(default, lambda value: value, "w")})
    assert findings_of(tmp_path, recipe)["options"] == problem


@pytest.mark.parametrize(("rows", "softmax"), [
    ([[0.0, 1.0], [1.0, 0.0]], True), ([[0.25, 0.7505], [0.5, 0.5]], True), ([[0.25, 0.76], [0.5, 0.5]], False),
    ([[-0.5, 1.5], [0.5, 0.5]], False), ([[1.5, -0.5], [0.5, 0.5]], False), ([[0.2, 0.3], [0.1, 0.1]], False),
    ([[-2.3, -0.1], [-0.7, -0.7]], False),
], ids=["one-hot", "within-rounding", "off-by-a-hundredth", "negative", "above-one", "logits-in-0-1", "log-probs"])
def test_probabilities_are_rows_in_0_1_that_sum_to_1(rows, softmax):
    from project.training.recipe_checks import probabilities

    assert probabilities(torch.tensor(rows)) is softmax


def test_test_inputs_that_occur_in_training_fail_the_leakage_check(tmp_path, monkeypatch):
    from tests.tiny_recipe.data import TinyDataModule

    def load_tensors(self, train):
        pixels, labels = self._pixels(True)  # the test split read from the training file
        return self.normalize(pixels if train else pixels[:80]), labels if train else labels[:80]

    monkeypatch.setattr(TinyDataModule, "load_tensors", load_tensors)
    found = checked(tmp_path)
    assert re.fullmatch(r"FAIL  leakage: \d\d test inputs \(\d\d%\) also occur in the training split: the test "
                        r"accuracy measures memory, not generalisation; remove them from one of the splits",
                        found["leakage"].line()), found["leakage"].line()


def shapes(tmp_path, monkeypatch, augment=None):
    """The per-sample recipe read from PNG files (``tests.disk_recipe``), its ``augment`` replaced."""
    from project.api import RunConfig, load_recipe
    from tests.disk_recipe.data import ShapesDataModule, write_shapes

    if augment is not None:
        monkeypatch.setattr(ShapesDataModule, "augment", augment)
    recipe = load_recipe("tests.disk_recipe")
    config = RunConfig.for_recipe(recipe, data_dir=str(write_shapes(tmp_path / "data", train=60, test=15)),
                                  logdir=str(tmp_path / "logs"), batch_size=16)
    return {f.check: f for f in check_recipe(config, recipe, learn=False)}


def test_a_recipe_read_per_sample_gets_every_check(tmp_path, monkeypatch):
    lines = [f.line() for f in shapes(tmp_path, monkeypatch).values()]
    assert lines[:6] == ["ok    options: 1 option(s), each checking its own default",
                         "ok    inputs: 3x16x16 floating-point inputs in both splits",
                         "ok    augment: keeps shape and dtype; draws only from its generator",
                         "ok    reads: 63 samples read twice, each the same both times",  # 48 training, 15 test
                         "ok    labels: every label in [0, 3), every class in the training split",
                         "ok    outputs: 3 outputs per input"]
    assert all(line.startswith("ok") for line in lines), lines


@pytest.mark.parametrize(("augment", "problem"), [
    (lambda self, x, generator: x.flip(-1) if torch.rand(1).item() < 0.5 else x,
     "augment draws randomness outside the generator it is given (the same generator seed gave other outputs): use "
     "torch.rand(..., generator=generator), so that a resumed run sees the same samples"),
    (lambda self, x, generator: x[:, :, 1:], "augment turns a (3, 16, 16) torch.float32 input into (3, 16, 15) "
     "torch.float32: keep the shape and dtype"),
    (lambda self, x, generator: x.double(), "augment turns a (3, 16, 16) torch.float32 input into (3, 16, 16) "
     "torch.float64: keep the shape and dtype"),
], ids=["global-randomness", "shape", "dtype"])
def test_an_augment_bug_is_named_by_its_check(tmp_path, monkeypatch, augment, problem):
    assert shapes(tmp_path, monkeypatch, augment)["augment"].problem == problem


def test_the_cards_table_and_line_say_every_measurement():
    sampled = card(sizes={"train": 1200, "val": 100, "test": 2000}, class_counts=[1000, 0, 2], sampled=1000,
                   input_shape=(3, 8, 8), mean=(0.3, 0.3, 0.3), std=(0.2, 0.2, 0.2), declared_mean=(0.3,),
                   declared_std=(0.2,), duplicates=1234)
    assert sampled.markdown() == "\n".join([
        "| | |", "|---|---|", "| splits | train 1,200, val 100, test 2,000 |", "| input shape | 3 x 8 x 8 |",
        "| training samples per class | 0: 1,000, 1: 0, 2: 2 |",
        "| pixel mean (measured / declared) | (0.30, 0.30, 0.30) / (0.30,) |",
        "| pixel std (measured / declared) | (0.20, 0.20, 0.20) / (0.20,) |",
        "| test inputs also in training | 1,234 |",
        "| samples read per split | 1,000 |"])
    assert sampled.line() == ("data: 1,200 train / 100 val / 2,000 test, inputs 3x8x8, 3 classes (2-1,000 each, 1 "
                              "absent), pixel mean (0.30, 0.30, 0.30) std (0.20, 0.20, 0.20) (as declared), 1,234 test "
                              "inputs also in training; statistics of 1,000 samples a split")
    assert "| samples read per split |" not in card().markdown()
    assert "3 classes (none, 3 absent)" in card(class_counts=[0, 0, 0]).line()
    assert card(declared_mean=(0.70,)).line().endswith(
        "pixel mean (0.30,) std (0.20,) (declared (0.70,) (0.20,)), 0 test inputs also in training")
    assert card(declared_std=(0.50,)).line().endswith(
        "pixel mean (0.30,) std (0.20,) (declared (0.30,) (0.50,)), 0 test inputs also in training")


@pytest.mark.parametrize(("changes", "wrong"), [
    (dict(mean=(0.1,), declared_mean=(0.0,)), False),  # exactly the tolerance apart (0.1): near enough
    (dict(std=(0.25,), declared_std=(0.375,)), False),  # declared exactly 1.5 times the measured
    (dict(std=(0.375,), declared_std=(0.25,)), False),  # and exactly 1 / 1.5 of it
    (dict(std=(1e-6,), declared_std=(1e-6,)), False),  # the least spread that is not constant
    (dict(pixel_range=(-0.02, 1.02)), False),  # at the edges of [0, 1] within rounding
    (dict(mean=(0.3, 0.3, 0.3), std=(0.2, 0.2, 0.2)), False),  # one value declared for every channel
])
def test_statistics_at_the_edge_of_each_tolerance_pass(changes, wrong):
    assert (card(**changes).statistics_problem() is not None) == wrong


@pytest.mark.parametrize(("changes", "problem"), [
    (dict(std=(0.0,)), "Digits's training inputs are constant (pixel std (0.00,), mean (0.30,)): every input holds the "
     "same values (all-zero images, or a failed read); fix the data before declaring statistics"),
    (dict(declared_mean=(0.3, 0.3)), "Digits declares mean (0.30, 0.30) std (0.20,) for 1 channel(s): give one value "
     "per channel, (0.30,) and (0.20,)"),
    (dict(declared_std=(0.2, 0.2)), "Digits declares mean (0.30,) std (0.20, 0.20) for 1 channel(s): give one value "
     "per channel, (0.30,) and (0.20,)"),
    (dict(pixel_range=(-0.03, 1.0)), "Digits declares mean (0.30,) std (0.20,), but with that normalisation undone the "
     "training inputs range over [-0.03, 1.00], not pixels in [0, 1]: its inputs are normalised with other numbers "
     "than it declares (normalise with self.normalize, which uses the declared mean and std) or are not in [0, 1]"),
    (dict(declared_mean=(0.0,), declared_std=(1.0,), held=((0.3,), (0.2,), (0.0, 1.0))),
     "Digits declares mean (0.00,) std (1.00,), but the training split's pixels measure mean (0.30,) std (0.20,): set "
     "mean = (0.30,), std = (0.20,) in the datamodule (normalisation and predict's polarity follow them)"),
    (dict(declared_mean=(0.05,), declared_std=(1.0,), held=((0.3,), (0.2,), (-0.02, 1.02))),
     "Digits declares mean (0.05,) std (1.00,), but the inputs it holds are pixels in [0, 1] (mean (0.30,) std "
     "(0.20,)), not normalised: normalise them with self.normalize, which uses the declared mean and std"),
], ids=["constant", "means-per-channel", "stds-per-channel", "range", "declared-identity", "near-identity"])
def test_each_statistics_problem_is_said_whole(changes, problem):
    assert card(**changes).statistics_problem() == problem


def test_leakage_of_a_sampled_recipe_is_a_share_of_the_test_inputs_read():
    assert card(sizes={"train": 5000, "val": 0, "test": 4000}, sampled=1000, duplicates=10).leakage_problem() is None
    assert card(sizes={"train": 5000, "val": 0, "test": 4000}, sampled=1000, duplicates=11).leakage_problem() == (
        "11 test inputs (1%) also occur in the training split: the test accuracy measures memory, not "
        "generalisation; remove them from one of the splits")
    assert card(sizes={"train": 5000, "val": 0, "test": 500}, sampled=1000, duplicates=6).leakage_problem() == (
        "6 test inputs (1%) also occur in the training split: the test accuracy measures memory, not "
        "generalisation; remove them from one of the splits")
    assert "1 test inputs (100%)" in card(sizes={"train": 50, "val": 0, "test": 0}, duplicates=1).leakage_problem()


def test_the_card_is_in_tensorboard_as_its_table(tmp_path):
    train(tiny_config(make_tiny_data(tmp_path / "data"), tmp_path / "logs", max_epochs=1))
    (run,) = {events.parent for events in (tmp_path / "logs").rglob("events.out.tfevents.*")}
    (event,) = event_accumulator(run).Tensors("run/data/text_summary")
    text = event.tensor_proto.string_val[0].decode()
    assert event.step == 0
    assert text.startswith("| | |\n|---|---|\n| splits | train 200, val 40, test 80 |\n| input shape | 1 x 28 x 28 |\n")


def test_a_split_read_per_sample_is_read_whole_or_spread_evenly():
    from torch.utils.data import TensorDataset

    from project.training.data_card import gather

    samples = TensorDataset(torch.arange(10.0).view(10, 1), torch.arange(10))
    spread = gather(samples, 4)
    assert (spread.targets.tolist(), spread.normalised, spread.sampled) == ([0, 2, 5, 7], False, True)
    whole = gather(samples, 10)
    assert (whole.targets.tolist(), whole.sampled) == (list(range(10)), False)
    assert gather(samples, None).inputs.flatten().tolist() == [float(i) for i in range(10)]


@pytest.mark.parametrize(("changes", "problem"), [
    (dict(mean=(0.25,), std=(1.0,), pixel_range=(-1.5, 3.5), held=((-1.25,), (5.0,), (-9.0, 16.0))),
     "Digits declares mean (0.30,) std (0.20,), but its inputs are normalised twice (undone twice, they are pixels "
     "with the declared statistics): normalise once, in load_tensors with self.normalize or in the augment, not both"),
    (dict(mean=(0.25,), std=(1.0,), pixel_range=(-1.5, 5.0), held=((-1.25,), (5.0,), (-9.0, 23.5))),
     "Digits declares mean (0.30,) std (0.20,), but with that normalisation undone the training inputs range over "
     "[-1.50, 5.00], not pixels in [0, 1]: its inputs are normalised with other numbers than it declares (normalise "
     "with self.normalize, which uses the declared mean and std) or are not in [0, 1]"),
    (dict(declared_mean=(0.0,), declared_std=(2.0,), held=((0.3,), (0.2,), (0.0, 1.0))),
     "Digits declares mean (0.00,) std (2.00,), but the inputs it holds are pixels in [0, 1] (mean (0.30,) std "
     "(0.20,)), not normalised: normalise them with self.normalize, which uses the declared mean and std"),
    (dict(mean=(0.3,), std=(0.04,), pixel_range=(0.2, 0.4), held=((0.3,), (0.04,), (0.0, 1.5))),
     "Digits declares mean (0.30,) std (0.20,), but the training split's pixels measure mean (0.30,) std (0.04,): set "
     "mean = (0.30,), std = (0.04,) in the datamodule (normalisation and predict's polarity follow them)"),
    (dict(input_shape=(3, 8, 8), mean=(0.3, 0.3, 0.3), std=(0.2, 0.2, 0.2), declared_mean=(0.3, 0.3),
          held=((0.0, 0.0, 0.0), (1.0, 1.0, 1.0), (-1.5, 3.5))),
     "Digits declares mean (0.30, 0.30) std (0.20,) for 3 channel(s): give one value per channel, (0.30, 0.30, 0.30) "
     "and (0.20, 0.20, 0.20)"),
], ids=["twice", "twice-but-out-of-range", "not-the-identity", "held-beyond-pixels", "two-values-for-three-channels"])
def test_each_misapplied_normalisation_is_told_apart(changes, problem):
    """Normalised twice: pixels of mean 0.35 std 0.2 in [0, 1], normalised with the declared 0.30/0.20 twice."""
    assert card(**changes).statistics_problem() == problem


def test_the_card_and_a_leak_are_said_as_the_run_starts(caplog):
    from project.training.data_card import announce

    caplog.set_level(logging.INFO)
    announce(card(duplicates=3))
    assert [record.getMessage() for record in caplog.records] == [
        card(duplicates=3).line(), "data: warning: 3 test inputs (2%) also occur in the training split: the test "
        "accuracy measures memory, not generalisation; remove them from one of the splits"]
    caplog.clear()
    announce(card())
    assert [record.getMessage() for record in caplog.records] == [card().line()]
    caplog.clear()
    small = card(sizes={"train": 900, "val": 40, "test": 200})
    announce(small)
    assert [record.getMessage() for record in caplog.records] == [small.line(), f"data: warning: "
                                                                 f"{small.validation_problem()}"]


@pytest.mark.parametrize(("sizes", "classes", "problem"), [
    ({"train": 900, "val": 60, "test": 9}, 3, None),  # 20 a class: enough
    ({"train": 900, "val": 59, "test": 9}, 3, "the validation split holds 59 inputs for 3 classes (19.7 a class): "
     "val/acc moves in steps of 1.7%, and the best checkpoint is picked on noise; --val-size 60 would hold 20 a class"),
    ({"train": 360, "val": 40, "test": 9}, 5, "the validation split holds 40 inputs for 5 classes (8.0 a class): "
     "val/acc moves in steps of 2.5%, and the best checkpoint is picked on noise; --val-size 100 would hold 20 a "
     "class"),
    ({"train": 150, "val": 40, "test": 9}, 10, "the validation split holds 40 inputs for 10 classes (4.0 a class): "
     "val/acc moves in steps of 2.5%, and the best checkpoint is picked on noise; the 190 training inputs are too few "
     "to hold out 20 a class and train on the rest: more would"),
], ids=["enough", "one-short", "advice", "too-few-inputs"])
def test_a_validation_split_too_small_to_rank_checkpoints_is_said_with_the_val_size_that_is_not(sizes, classes,
                                                                                                problem):
    assert card(sizes=sizes, num_classes=classes, class_counts=[1] * classes).validation_problem() == problem


def test_the_checked_card_sets_up_both_splits_itself(tmp_path):
    from project.training.build import build_datamodule
    from project.training.data_card import checked_data_card

    config = tiny_config(make_tiny_data(tmp_path / "data"), tmp_path / "logs")
    checked = checked_data_card(build_datamodule(config, tiny_recipe()))
    assert (checked.sizes, checked.sampled, sum(checked.class_counts)) == ({"train": 200, "val": 40, "test": 80},
                                                                          None, 200)
