"""The recipe checks and the data card: every shipped recipe passes; the bugs users make in a recipe fail, each with
its own line (the broken variants are in ``tests/mutants.py``); a declared mean far from the data is refused."""

from __future__ import annotations

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
    assert [f.check for f in findings] == ["options", "inputs", "augment", "labels", "outputs", "statistics", "leakage",
                                           "eval determinism", "fits one batch", "learns"]
    assert all(f.problem is None for f in findings), "\n".join(f.line() for f in findings)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["tests.second_recipe", "tests.disk_recipe"])
def test_the_example_recipes_pass_every_check(recipe):
    done = run_script("check_recipe.py", "--max-epochs", "3", env={"PROJECT_RECIPE": recipe})
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1] == "all 10 checks passed"


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
def findings_of(tmp_path, **replaced) -> dict[str, str | None]:
    """The recipe checks (without the training ones) of the tests' recipe, its classes' methods replaced."""
    config = tiny_config(make_tiny_data(tmp_path / "data"), tmp_path / "logs")
    return {f.check: f.problem for f in check_recipe(config, tiny_recipe(), learn=False)}


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
    (lambda self, x: torch.softmax(self.model(x), dim=1), "the network's outputs are probabilities"),
    (lambda self, x: self.model(x) * float("nan"), "gives NaN or infinite outputs"),
], ids=["softmax", "nan"])
def test_outputs_advice_names_a_softmax_and_nan(tmp_path, monkeypatch, forward, advice):
    from tests.tiny_recipe.model import LitTiny

    monkeypatch.setattr(LitTiny, "forward", forward)
    found = findings_of(tmp_path)
    assert found["outputs"] is not None and advice in found["outputs"], found
    assert found["eval determinism"] is None or "dropout" not in found["eval determinism"]


def test_an_option_whose_check_fails_is_a_finding_and_one_line_on_the_command_line(tmp_path, capsys):
    import dataclasses

    from helpers import parse_run_command_of
    from project.config.validators import sizes
    from project.contract import Option

    def broken(value):
        return sizes(value)[5]  # IndexError: a bug in the recipe's check

    recipe = dataclasses.replace(tiny_recipe(), options={"hidden": Option([128], broken, "widths")})
    config = tiny_config(make_tiny_data(tmp_path / "data"), tmp_path / "logs")
    found = {f.check: f.problem for f in check_recipe(config, recipe, learn=False)}
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
