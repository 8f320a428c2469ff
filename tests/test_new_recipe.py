"""`scripts/new_recipe.py`: a folder of class folders of images becomes a recipe that passes its checks and trains
at once; its data is read as predict.py reads an image, so the two agree; mistakes are one line."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings
from PIL import Image

from helpers import SHAPES, draw_shapes, run_script_warm
from project.errors import UsageError
from project.results.image_files import read_resized
from project.scaffold import recipe_from_images, recipe_from_package, survey


def written_data_module(package: Path):
    spec = importlib.util.spec_from_file_location(f"_{package.name}_data_under_test", package / "data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_images_become_a_recipe_that_travels_trains_and_predicts_as_it_evaluates(tmp_path):
    images = draw_shapes(tmp_path / "pictures")
    made = run_script_warm("new_recipe.py", "shapes3", "--images", str(images), "--out", str(tmp_path / "made"))
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith(f"recipe shapes3 written to {tmp_path / 'made' / 'shapes3'}: 3 classes (circle, "
                                  "square, triangle), inputs 3x40x40")
    assert (f"next: PYTHONPATH={tmp_path / 'made'} PROJECT_RECIPE=shapes3 .venv/bin/python scripts/train.py "
            f"--data-dir {images}") in made.stdout
    # It travels: no file it wrote names a folder of this machine; moved, it trains on a copy of the images.
    written = [path for path in (tmp_path / "made").rglob("*")
               if path.is_file() and path.suffix != ".png" and "__pycache__" not in path.parts]
    assert len(written) >= 3 and not [path for path in written if str(tmp_path) in path.read_text()]
    (tmp_path / "elsewhere").mkdir()
    shutil.move(tmp_path / "made" / "shapes3", tmp_path / "elsewhere" / "shapes3")
    images = shutil.move(images, tmp_path / "copied")
    env = {"PROJECT_RECIPE": "shapes3", "PYTHONPATH": str(tmp_path / "elsewhere")}
    checked = run_script_warm("check_recipe.py", env=env)
    assert checked.returncode == 0 and "all 11 checks passed" in checked.stdout, checked.stdout + checked.stderr
    logs = tmp_path / "logs"
    trained = run_script_warm("train.py", "--max-epochs", "2", "--logdir", str(logs), "--data-dir", str(images),
                              env=env)
    assert trained.returncode == 0, trained.stderr
    results = json.loads(next(logs.glob("shapes3/version_0/results.json")).read_text())
    assert results["test/acc"] > 0.6  # three classes: chance is a third
    evaluated = run_script_warm("evaluate.py", "--logdir", str(logs), "--json", "--data-dir", str(images), env=env)
    assert evaluated.returncode == 0, evaluated.stderr
    evaluation = json.loads(evaluated.stdout)
    assert evaluation["classes"] == ["circle", "square", "triangle"]  # the class folders' names, in index order
    test_files = written_data_module(tmp_path / "elsewhere" / "shapes3").ImageFolders(
        data_dir=images).load_samples(False).files
    assert evaluation["samples"] == len(test_files) == 36  # a fifth of each class held out
    predicted = run_script_warm("predict.py", "--logdir", str(logs), "--json", *[str(path) for path, _ in test_files],
                                env=env)
    assert predicted.returncode == 0, predicted.stderr
    rows = json.loads(predicted.stdout)["results"]
    confusion = torch.zeros(3, 3, dtype=torch.long)
    for row, (_, label) in zip(rows, test_files, strict=True):
        confusion[label, row["class"]] += 1
        assert row["name"] == evaluation["classes"][row["class"]]  # the index kept beside the name
    table = run_script_warm("predict.py", "--logdir", str(logs), str(test_files[0][0]), env=env)
    assert table.stdout.split("\t")[1] == rows[0]["name"]  # a row names its class
    # The held-out files laid out as class folders: evaluate.py --images measures them as predict.py reads them.
    for path, label in test_files:
        (tmp_path / "held" / evaluation["classes"][label]).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, tmp_path / "held" / evaluation["classes"][label] / path.name)
    folder = run_script_warm("evaluate.py", "--logdir", str(logs), "--json", "--images", str(tmp_path / "held"),
                             env=env)
    assert folder.returncode == 0, folder.stderr
    measured = json.loads(folder.stdout)
    assert measured["confusion_matrix"] == confusion.tolist() and measured["samples"] == len(test_files)
    assert measured["test/acc"] == pytest.approx(float(confusion.diagonal().sum()) / len(test_files))
    assert confusion.tolist() == evaluation["confusion_matrix"]  # file by file, the same pixels


def test_the_declared_statistics_are_the_training_images_as_the_recipe_reads_them(tmp_path):
    images = draw_shapes(tmp_path / "pictures", per_class=10)
    made = recipe_from_images("measured", images, tmp_path)
    data = written_data_module(made.package)
    train = data.ImageFolders(data_dir=images).load_samples(True).files
    assert len(train) == 24 and {label for _, label in train} == {0, 1, 2}  # 2 of each 10 held out for testing
    pixels = torch.stack([read_resized(path, (3, 40, 40)) for path, _ in train]).double()
    assert made.mean == pytest.approx(tuple(pixels.mean((0, 2, 3)).tolist()), abs=1e-4)
    assert made.std == pytest.approx(tuple(pixels.std((0, 2, 3), unbiased=False).tolist()), abs=1e-4)
    assert data.ImageFolders.mean == made.mean and data.ImageFolders.input_shape == (3, 40, 40)
    assert sorted(p.parent.name for p in (made.package / "examples").rglob("*.png")) == sorted(
        name for name in SHAPES for _ in range(8))  # every training image, at most a class's share


@pytest.mark.parametrize("modes, channels", [(("L",), 1), (("L", "RGB"), 3), (("P",), 3)])
def test_grey_images_make_a_one_channel_recipe_and_any_colour_three(tmp_path, modes, channels):
    assert survey(draw_shapes(tmp_path / "pictures", per_class=3, modes=modes)).channels == channels


def test_a_split_on_disk_is_used_as_it_is(tmp_path):
    draw_shapes(tmp_path / "pictures" / "train", per_class=6)
    draw_shapes(tmp_path / "pictures" / "test", per_class=2, seed=1)
    made = recipe_from_images("split", tmp_path / "pictures", tmp_path)
    module = written_data_module(made.package).ImageFolders(data_dir=tmp_path / "pictures")
    assert len(module.load_samples(True)) == 18 and len(module.load_samples(False)) == 6


@pytest.mark.parametrize("split", [False, True], ids=["classes", "train-test"])
def test_hidden_folders_of_images_are_passed_over_not_made_classes(tmp_path, split):
    """A notebook's checkpoints or a file manager's thumbnails sit beside the class folders, full of images."""
    root = tmp_path / "pictures"
    bases = [root / "train", root / "test"] if split else [root]
    for base in bases:
        draw_shapes(base, per_class=4)
        for hidden in (".ipynb_checkpoints", ".thumbnails"):
            shutil.copytree(base / "circle", base / hidden)
    assert survey(root).classes == SHAPES
    made = recipe_from_images("seen", root, tmp_path)
    data = written_data_module(made.package)
    assert data.CLASSES == SHAPES
    files = data.ImageFolders(data_dir=root).load_samples(True).files
    assert not [path for path, _ in files if path.parent.name.startswith(".")]
    assert sorted({path.parent.name for path, _ in files}) == list(SHAPES)
    assert sorted(p.name for p in (made.package / "examples").iterdir()) == list(SHAPES)


def one_class(root: Path) -> None:
    draw_shapes(root, 2)
    for name in SHAPES[1:]:
        shutil.rmtree(root / name)


def an_empty_class(root: Path) -> None:
    draw_shapes(root, 2)
    for path in (root / "square").iterdir():
        path.unlink()


def a_broken_image(root: Path) -> None:
    draw_shapes(root, 2)
    (root / "circle" / "000.png").write_text("text")


def flat_colours(root: Path) -> None:
    for folder in (root / "a", root / "b"):
        folder.mkdir(parents=True)
        for index in range(2):
            Image.new("L", (20, 20), 9).save(folder / f"{index}.png")


MISTAKES = [
    (one_class, "needs a folder of images for each class \\(at least 2\\), found 1"),
    (an_empty_class, "square holds too few images"),
    (a_broken_image, "circle/000.png: not an image file"),
    (flat_colours, "every training image is one flat colour"),
]


@pytest.mark.parametrize("make, message", MISTAKES, ids=[make.__name__ for make, _ in MISTAKES])
def test_a_folder_that_cannot_be_a_recipes_data_is_one_line_and_leaves_nothing(tmp_path, make, message):
    make(tmp_path / "pictures")
    with pytest.raises(UsageError, match=message):
        recipe_from_images("mistaken", tmp_path / "pictures", tmp_path / "out")
    assert not (tmp_path / "out" / "mistaken").exists()


@pytest.mark.parametrize("name, message", [("My-Recipe", "lower case letters"), ("json", "exists already"),
                                           ("class", "lower case letters"), ("taken", "exists already")])
def test_a_name_that_cannot_be_a_package_is_refused(tmp_path, name, message):
    (tmp_path / "taken").mkdir()
    with pytest.raises(UsageError, match=message):
        recipe_from_images(name, tmp_path / "nowhere", tmp_path)


def test_the_script_says_a_mistake_in_one_line(tmp_path):
    done = run_script_warm("new_recipe.py", "fine", "--images", str(tmp_path / "nowhere"), "--out", str(tmp_path))
    assert done.returncode == 2 and done.stderr == f"new_recipe.py: error: --images {tmp_path / 'nowhere'}: no such " \
                                                   "folder\n"


def test_another_recipe_is_copied_under_the_new_name(tmp_path, monkeypatch):
    made = recipe_from_package("bars2", "tests.second_recipe", tmp_path)
    assert not (made.package / "__pycache__").exists()
    monkeypatch.syspath_prepend(str(tmp_path))
    from project.contract import load_recipe

    recipe = load_recipe("bars2")
    assert recipe.name == "bars2" and recipe.module_class().__name__ == "LitCNN"
    with pytest.raises(UsageError, match="--from tests.nothing_here: no such package"):
        recipe_from_package("bars3", "tests.nothing_here", tmp_path)
    (tmp_path / "unnamed").mkdir()
    (tmp_path / "unnamed" / "__init__.py").write_text("RECIPE = None\n")
    with pytest.raises(UsageError, match="--from unnamed: its __init__.py names no Recipe"):
        recipe_from_package("bars4", "unnamed", tmp_path / "out")
    assert not (tmp_path / "out" / "bars4").exists()  # not left behind with another recipe's name
    sys.modules.pop("bars2", None)


@settings(max_examples=200, deadline=None)
@given(train_images=st.integers(1, 20_000), classes=st.integers(2, 60))
def test_the_scaffolds_validation_share_holds_enough_a_class_to_rank_checkpoints(train_images, classes):
    from project.scaffold import validation_share
    from project.training.data_card import VAL_PER_CLASS

    share = validation_share(train_images, classes)
    assert 0.1 <= share <= 0.5 and share == round(share, 2)
    held = round(share * train_images)  # as TensorDataModule.validation_count takes a share
    if VAL_PER_CLASS * classes <= train_images // 2:
        assert held >= VAL_PER_CLASS * classes  # the data card's warning is not said of the scaffold's own split
    else:
        assert share == 0.5  # as many as can be held out and still train
    assert validation_share(400, 5) == 0.25 and validation_share(10_000, 5) == 0.1
