"""Broken forms of a recipe the checks used to miss or advise wrongly on, each caught with its own cause: on the
tests' in-memory recipe (``tests/tiny_recipe``) and the recipe read from PNG class folders (``tests/disk_recipe``)."""

from __future__ import annotations

import pytest
import torch
from test_recipe_checks import card, findings_of, tensors_replaced
from torch.utils.data import Dataset

from helpers import make_tiny_data, tiny_config, tiny_recipe, train
from project.contract import load_recipe
from project.errors import UsageError
from project.training.recipe_checks import check_config, check_recipe
from project.training.tensor_data import split_indices


def with_nan_pixel(pixels, labels):
    pixels = pixels.clone()
    pixels[3, 0, 5, 5] = float("nan")
    return pixels, labels


@pytest.mark.parametrize(("replaced", "check", "problem"), [
    (tensors_replaced(train=with_nan_pixel), "statistics",
     "TinyDataModule's training inputs hold NaN or infinite pixels (mean (nan,)): a failed read or a division by "
     "zero in the data; fix the data, no statistics can be declared for them"),
    (tensors_replaced(train=lambda x, y: (x, torch.nn.functional.one_hot(y, 10))), "labels",
     "the train split's labels have shape (200, 10): give one class index per sample (one-hot labels? "
     "labels.argmax(1) are their indices)"),
    (tensors_replaced(train=lambda x, y: (x[:, :, :27], y), test=lambda x, y: (x[:, :, :27], y)), "inputs",
     "both splits yield inputs of shape (1, 27, 28), but input_shape is (1, 28, 28): set input_shape = (1, 27, 28), "
     "or read the images at (1, 28, 28)"),
    (tensors_replaced(train=lambda x, y: (x[:, :, :27], y), test=lambda x, y: (x[:, :, :26], y)), "inputs",
     "the train split yields inputs of shape (1, 27, 28), the test split (1, 26, 28), and input_shape is "
     "(1, 28, 28): read both splits at one size, and declare it"),
], ids=["nan-pixel", "one-hot-labels", "both-splits-another-shape", "each-split-its-own-shape"])
def test_broken_data_is_named_by_its_cause(tmp_path, monkeypatch, replaced, check, problem):
    from tests.tiny_recipe.data import TinyDataModule

    monkeypatch.setattr(TinyDataModule, "load_tensors", replaced)
    assert findings_of(tmp_path)[check] == problem


def test_a_batch_size_written_into_forward_is_named(tmp_path, monkeypatch):
    from tests.tiny_recipe.model import LitTiny

    monkeypatch.setattr(LitTiny, "forward", lambda self, x: self.model.layers(x.reshape(32, -1)))
    assert findings_of(tmp_path)["outputs"] == (
        "the network runs on a batch of 32 (the batch size) but not of 8 (mat1 and mat2 shapes cannot be multiplied "
        "(32x196 and 784x128)): its forward assumes the batch size; take it from the input (x.flatten(1) or "
        "x.reshape(x.shape[0], -1), not x.reshape(32, -1))")


def test_a_network_wider_than_the_classes_is_told_the_classes_width(tmp_path, monkeypatch):
    from tests.tiny_recipe import model

    monkeypatch.setattr(model, "CLASSES", 12)  # the network and its metrics built for 12 classes; the data has 10
    assert findings_of(tmp_path)["outputs"] == ("the network gives outputs of shape (8, 12) for 8 inputs, but the "
                                                "datamodule has 10 classes: make its last layer 10 wide")


def test_colour_statistics_declared_as_one_channels_are_compared_channel_by_channel():
    problem = card(mean=(0.30, 0.15, 0.70), std=(0.20, 0.20, 0.20), declared_mean=(0.30,),
                   declared_std=(0.20,)).statistics_problem()
    assert problem is not None and "set mean = (0.30, 0.15, 0.70), std = (0.20, 0.20, 0.20)" in problem
    assert card(mean=(0.30, 0.32, 0.28), std=(0.20, 0.20, 0.20), declared_mean=(0.30,),
                declared_std=(0.20,)).statistics_problem() is None  # one value for channels that share it


def test_real_data_of_another_shape_than_the_example_is_one_line_before_anything_is_written(tmp_path, monkeypatch):
    from tests.tiny_recipe.data import TinyDataModule

    monkeypatch.setattr(TinyDataModule, "load_tensors",
                        tensors_replaced(train=lambda x, y: (x[:, :, :27], y), test=lambda x, y: (x[:, :, :27], y)))
    with pytest.raises(UsageError, match=r"^TinyDataModule: both splits yield inputs of shape \(1, 27, 28\), but "
                                         r"input_shape is \(1, 28, 28\): set input_shape = \(1, 27, 28\)"):
        train(tiny_config(make_tiny_data(tmp_path / "data"), tmp_path / "logs", max_epochs=1))
    assert not (tmp_path / "logs").exists()


def test_a_class_the_validation_share_took_whole_is_named_as_such(tmp_path, monkeypatch):
    from tests.tiny_recipe.data import TinyDataModule

    def one_nine_in_the_validation_share(pixels, labels):
        nines = (labels == 9).nonzero().flatten()
        kept = torch.ones(len(labels), dtype=torch.bool)
        kept[nines[1:]] = False  # one sample of class 9 left
        pixels, labels = pixels[kept], labels[kept].clone()
        _, val = split_indices(len(labels), 40, 0)  # where the run's split puts its validation samples
        at = int((labels == 9).nonzero()[0])
        pixels[[at, val[0]]], labels[[at, val[0]]] = pixels[[val[0], at]], labels[[val[0], at]]
        return pixels, labels

    monkeypatch.setattr(TinyDataModule, "load_tensors", tensors_replaced(train=one_nine_in_the_validation_share))
    assert findings_of(tmp_path)["labels"] == (
        "class(es) 9 occur in the validation split but never in the training split of 174 samples: the validation "
        "share took all of its samples; give the class more samples, or hold out fewer (--val-size)")


def test_a_validation_split_that_is_the_test_split_is_named(tmp_path, monkeypatch):
    from tests.tiny_recipe.data import TinyDataModule

    setup = TinyDataModule.setup

    def validating_on_the_test_set(self, stage=None):
        setup(self, stage)
        if self.test_set is None:
            setup(self, "test")
        self.val_set = self.test_set

    monkeypatch.setattr(TinyDataModule, "setup", validating_on_the_test_set)
    assert findings_of(tmp_path)["leakage"] == (
        "80 validation inputs (100%) also occur in the test split: the best checkpoint is chosen on the test set, and "
        "test/acc overstates what the model does on unseen data; hold the validation split out of the training data")


class Reread(Dataset):
    """The disk recipe's split, each read of a sample changed by ``change(index, sample, read)``."""

    def __init__(self, split, change) -> None:
        self.split, self.change, self.reads = split, change, 0

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, index):
        self.reads += 1
        return self.change(index, self.split[index], self.reads)


def a_label_drawn_anew(index, sample, read):  # a tenth of the labels drawn at random at each read
    pixels, label = sample
    return pixels, (read * 7 + index) % 3 if index % 10 == 0 else label


def a_random_brightness(index, sample, read):
    pixels, label = sample
    return pixels * (0.5 + 0.5 * torch.rand(1).item()), label


def float_labels(index, sample, read):
    pixels, label = sample
    return pixels, float(label) + 0.5


def test_float_labels_read_per_sample_are_named_not_truncated(tmp_path, monkeypatch):
    found = disk_recipe_checked(tmp_path, monkeypatch, "train", float_labels)
    assert found["reads"].problem is None
    assert found["labels"].problem == "the train split's labels are torch.float32: give class indices as integers"


def disk_recipe_checked(tmp_path, monkeypatch, split, change) -> dict:
    """The checks of the disk recipe whose ``split`` is read through ``Reread(..., change)``."""
    from tests.disk_recipe.data import ShapesDataModule

    recipe = load_recipe("tests.disk_recipe")
    load_samples = ShapesDataModule.load_samples

    def read_otherwise(self, train):
        read = load_samples(self, train)
        return Reread(read, change) if train == (split == "train") else read

    monkeypatch.setattr(ShapesDataModule, "load_samples", read_otherwise)
    config = check_config(recipe, str(recipe.write_example_data(tmp_path / "data")), examples=True)
    return {f.check: f for f in check_recipe(config, recipe, learn=False)}


@pytest.mark.parametrize(("split", "change", "problem"), [
    ("train", a_label_drawn_anew, "the train split gives sample 12 the label 0, then 1: labels drawn at random as a "
                                  "sample is read; label noise, if wanted, is drawn once, with the data"),
    ("test", a_random_brightness, "the test split gives other pixels for sample 0 each time it is read: random "
                                  "transforms in its reading; the test split is read the same way each time"),
    ("train", a_random_brightness, "the train split gives other pixels for sample 0 each time it is read: random "
                                   "transforms in its reading; move them to augment, which draws from the generator "
                                   "it is given (a resume then sees the same samples)"),
], ids=["train-labels-drawn-at-each-read", "test-random-transforms", "train-random-transforms"])
def test_a_split_read_otherwise_at_each_read_is_named(tmp_path, monkeypatch, split, change, problem):
    assert disk_recipe_checked(tmp_path, monkeypatch, split, change)["reads"].problem == problem


def test_a_training_split_mostly_one_class_passes_the_training_checks(tmp_path, monkeypatch):
    """94 % of the training images in one class: no "it cannot learn" for a recipe that learns."""
    from tests.tiny_recipe.data import TinyDataModule

    def mostly_zeros(pixels, labels):
        kept = torch.cat([(labels == 0).nonzero().flatten()] +
                         [(labels == c).nonzero().flatten()[:3] for c in range(1, 10)])
        return pixels[kept], labels[kept]

    monkeypatch.setattr(TinyDataModule, "load_tensors", tensors_replaced(train=mostly_zeros))
    config = tiny_config(make_tiny_data(tmp_path / "data", n_train=4000), tmp_path / "logs", max_epochs=3,
                         val_size=0.05)
    found = {f.check: f for f in check_recipe(config, tiny_recipe())}
    assert [f.check for f in found.values() if f.problem is not None] == [], [f.line() for f in found.values()]
    assert found["learns"].warning is None
