"""The "learns" check on recipes ``new_recipe.py`` makes from image sets that need more than the check's few epochs:
as drawn they pass (with a warning saying how to see them pass outright); with their labels shuffled, the test
split's labels shifted by one, or the test split read transposed they fail, each naming its cause."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from helpers import draw_glyphs, run_script_warm
from project.contract import load_recipe
from project.scaffold import recipe_from_images
from project.training.build import build_datamodule, build_model
from project.training.recipe_checks import Subject, check_config, check_learns

IMAGE_SETS = {  # each learnt to well above the check's bar by a longer run, not by the check's 4 epochs
    "letters": {"classes": "ABCDE", "per_class": 48, "side": 28},
    "colour": {"classes": "FJLP", "per_class": 48, "side": 20, "colour": True},
    "many": {"classes": "ABCDEFGHJKLMNPRSTUVWYZ", "per_class": 18, "side": 20, "noise_level": 15},
}

TEST_SPLIT = ("        return Files([file for index, file in enumerate(files) if (index in test) != train], "
              "self.read_pixels)")


def shuffle_labels(package: Path) -> None:
    """The example images moved among the class folders at random: no label belongs to its image."""
    examples = package / "examples"
    files = sorted(examples.rglob("*.png"))
    classes = [path.parent.name for path in files]
    random.Random(0).shuffle(classes)
    shuffled = package / "shuffled"
    for index, (path, name) in enumerate(zip(files, classes, strict=True)):
        (shuffled / name).mkdir(parents=True, exist_ok=True)
        shutil.move(path, shuffled / name / f"{index:04d}.png")
    shutil.rmtree(examples)
    shuffled.rename(examples)


def shift_test_labels(package: Path) -> None:
    """The test split's labels read one class on: (label + 1) % classes."""
    data = package / "data.py"
    data.write_text(data.read_text().replace(TEST_SPLIT, (
        "        return Files([file if train else (file[0], (file[1] + 1) % len(CLASSES)) for index, file in "
        "enumerate(files) if (index in test) != train], self.read_pixels)")))


def transpose_test_images(package: Path) -> None:
    """The test split's images read transposed, the training split's as they are."""
    data = package / "data.py"
    data.write_text(data.read_text().replace(TEST_SPLIT, (
        "        return Files([file for index, file in enumerate(files) if (index in test) != train], "
        "self.read_pixels if train else lambda path: self.read_pixels(path).transpose(-1, -2))")))


BREAKS = {"as-drawn": None, "labels-shuffled": shuffle_labels, "test-labels-shifted": shift_test_labels,
          "test-transposed": transpose_test_images}
CAUSES = {  # what each outcome's line says: None passes
    "as-drawn": None,
    "labels-shuffled": "it memorises and nothing generalises, so the labels are out of step with their inputs",
    "test-labels-shifted": "the test split's labels are shifted: a longer fit's predictions match each test label "
                           "less 1",
    "test-transposed": "the test split is read differently from the training split",
}


@pytest.fixture(scope="module")
def image_sets(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("image-sets")
    return {name: draw_glyphs(root / name, **drawn) for name, drawn in IMAGE_SETS.items()}


def made(image_sets, tmp_path, monkeypatch, image_set: str, broken: str) -> str:
    """The recipe new_recipe.py writes for ``image_set`` (its function), broken as ``broken`` says; its package
    name."""
    name = f"{image_set}_{broken.replace('-', '_')}"
    package = recipe_from_images(name, image_sets[image_set], tmp_path / "made").package
    assert TEST_SPLIT in (package / "data.py").read_text()  # the line the breaks edit is the one written
    if BREAKS[broken] is not None:
        BREAKS[broken](package)
    monkeypatch.syspath_prepend(str(tmp_path / "made"))
    return name


@pytest.mark.slow
@pytest.mark.parametrize("broken", BREAKS)
@pytest.mark.parametrize("image_set", IMAGE_SETS)
def test_learns_passes_a_slow_recipe_and_names_the_cause_of_a_broken_one(image_sets, tmp_path, monkeypatch,
                                                                         image_set, broken):
    recipe = load_recipe(made(image_sets, tmp_path, monkeypatch, image_set, broken))
    config = check_config(recipe, str(recipe.write_example_data(tmp_path / "examples")), examples=True)
    config = config.replace(logdir=str(tmp_path / "logs"))
    datamodule = build_datamodule(config, recipe)
    datamodule.setup("fit")
    datamodule.setup("test")
    finding = check_learns(Subject(datamodule, lambda: build_model(config, recipe), config, recipe))
    if CAUSES[broken] is None:
        assert finding.problem is None, finding.line()
        assert finding.warning is not None and finding.warning.endswith(  # too few epochs to pass outright here
            "the recipe learns, more slowly than the check's budget; to see it pass: check_recipe.py --max-epochs 16")
    else:
        assert finding.problem is not None and CAUSES[broken] in finding.problem, finding.line()


@pytest.mark.slow
def test_the_script_passes_a_slow_recipe_with_its_warning_and_exit_status_0(image_sets, tmp_path):
    """From the command line: new_recipe.py writes the recipe, check_recipe.py warns and exits 0."""
    made = run_script_warm("new_recipe.py", "colour_by_script", "--images", str(image_sets["colour"]), "--out",
                           str(tmp_path / "made"))
    assert made.returncode == 0, made.stderr
    done = run_script_warm("check_recipe.py", env={"PROJECT_RECIPE": "colour_by_script",
                                                   "PYTHONPATH": str(tmp_path / "made")})
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[-1] == "all 11 checks passed, 1 with a warning"
    assert lines[-2].startswith("warn  learns: a 4-epoch run ends at test/acc 0.")
