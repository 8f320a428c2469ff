"""A new recipe package from a folder of images (one folder a class), or as a copy of another recipe.

The package reads its data file by file with the function ``predict.py`` reads an image with, so training,
evaluation and prediction see the same pixels; it declares the mean and std measured here on its training
images, and keeps a few resized copies of them for its ``example_data`` (``check_recipe.py`` and the
conformance tests run on those).
"""

from __future__ import annotations

import importlib.util
import keyword
import math
import os
import re
import shutil
import signal
import statistics
import string
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
from PIL import Image

from project.errors import ImageError, Terminated, UsageError
from project.results.image_files import with_image
from project.training.data_card import VAL_PER_CLASS

SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")
GREY_MODES = ("1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "I;16N", "F")
TEST_SHARE = 0.2  # held out for testing where the folder has no train/ and test/
EXAMPLES_IN_ALL = 160  # enough for the conformance runs' few epochs of batches of 32
ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")


@dataclass(frozen=True)
class ImageFolder:
    """What the images are: their classes, files, channels and the side they are resized to."""

    root: Path
    classes: tuple[str, ...]
    channels: int
    side: int

    @property
    def stages(self) -> int:
        """Convolution blocks, each halving the side: about down to 4 x 4."""
        return max(1, min(4, int(math.log2(self.side)) - 2))


def images_in(folder: Path) -> list[Path]:
    return [path for path in sorted(folder.iterdir()) if path.suffix.lower() in SUFFIXES] if folder.is_dir() else []


def survey(root: Path) -> ImageFolder:
    """The folder's classes, the side its images are resized to and their channels, or one line saying why it
    cannot be a recipe's data."""
    if not root.is_dir():
        raise UsageError(f"--images {root}: no such folder")
    split = (root / "train").is_dir() and (root / "test").is_dir()
    base = root / "train" if split else root
    classes = tuple(sorted(p.name for p in base.iterdir() if p.is_dir() and not p.name.startswith(".")))
    unprintable = next((name for name in classes if not name.isprintable()), None)
    if unprintable is not None:
        raise UsageError(f"--images {root}: class folder {unprintable!r}: its name holds a control character (a "
                         "newline, a tab); rename the folder, its name is the class's")
    if len(classes) < 2:
        raise UsageError(f"--images {root}: needs a folder of images for each class (at least 2), found "
                         f"{len(classes)}")
    files = {name: images_in(base / name) for name in classes}
    few = next((name for name in classes if len(files[name]) < (1 if split else 2)), None)
    if few is not None and (base / few).resolve() in (base.resolve(), *base.resolve().parents):
        raise UsageError(f"--images {root}: class folder {base / few} is a link to {(base / few).resolve()}, "
                         "which holds the class folders themselves (a loop); make it a folder of that class's images")
    if few is not None:
        raise UsageError(f"--images {root}: class folder {base / few} holds too few images "
                         f"({', '.join(SUFFIXES)}) to train and test on")
    missing = next((name for name in classes if split and not images_in(root / "test" / name)), None)
    if missing is not None:
        raise UsageError(f"--images {root}: {root / 'test' / missing}: no test images of class {missing!r}")
    modes, sides = [], []
    for path in (path for name in classes for path in files[name]):
        mode, size = read_header(path)
        modes.append(mode)
        sides.append(min(size))
    side = max(16, min(64, int(statistics.median(sides)) // 4 * 4))
    channels = 1 if all(mode in GREY_MODES for mode in modes) else 3
    return ImageFolder(root.resolve(), classes, channels, side)


def read_header(path: Path) -> tuple[str, tuple[int, int]]:
    try:
        return with_image(path, lambda image: (image.mode, image.size))
    except ImageError as err:
        raise UsageError(f"--images: {path}: {err}") from None


def training_set(package: Path, root: Path) -> Any:
    """The training set as the written recipe's own ``data.py`` splits and reads it (one rule, in the recipe):
    ``files`` and ``read``."""
    spec = importlib.util.spec_from_file_location(f"_new_recipe_{package.name}_data", package / "data.py")
    assert spec is not None and spec.loader is not None
    data = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(data)
    return data.ImageFolders(data_dir=root).load_samples(train=True)


def measured_statistics(folder: ImageFolder, train: Any) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std of the training images' pixels, read as the recipe reads them."""
    total = torch.zeros(folder.channels, dtype=torch.float64)
    squares = torch.zeros(folder.channels, dtype=torch.float64)
    count = 0
    for path, _ in train.files:
        pixels = train.read(path).double().flatten(1)
        total += pixels.sum(1)
        squares += pixels.square().sum(1)
        count += pixels.shape[1]
    mean = total / count
    std = (squares / count - mean.square()).clamp_min(0).sqrt()
    if float(std.min()) < 1e-3:
        raise UsageError(f"--images {folder.root}: every training image is one flat colour: nothing to learn from")
    return tuple(round(float(v), 4) for v in mean), tuple(round(float(v), 4) for v in std)


def validation_share(train_images: int, classes: int) -> float:
    """The share of the training images held out for validation: a tenth, or enough for ``VAL_PER_CLASS`` a class
    on average (the data card warns below that), at most half; rounded up to a hundredth."""
    wanted = max(0.1, VAL_PER_CLASS * classes / max(1, train_images))
    return min(0.5, math.ceil(wanted * 100) / 100)


def write_examples(folder: ImageFolder, train: Any, into: Path) -> int:
    """Resized copies of a few training images of each class, in class folders under ``into``."""
    per_class = max(40, math.ceil(EXAMPLES_IN_ALL / len(folder.classes)))
    mode = "L" if folder.channels == 1 else "RGB"
    written = 0
    for label, name in enumerate(folder.classes):
        (into / name).mkdir(parents=True)
        for index, (path, _) in enumerate([file for file in train.files if file[1] == label][:per_class]):
            pixels = train.read(path)
            array = (pixels * 255).round().to(torch.uint8).permute(1, 2, 0).squeeze(-1).numpy()
            Image.fromarray(array, mode).save(into / name / f"{index:04d}.png")
            written += 1
    return written


def checked_name(name: str, out: Path) -> Path:
    """``out/name``, for a new recipe package: one plain package name that hides no module, in a folder."""
    if not name.isidentifier() or keyword.iskeyword(name) or name != name.lower():
        raise UsageError(f"{name!r}: a recipe's name is its package's: lower case letters, digits and _, not "
                         "starting with a digit")
    try:
        found = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        found = None
    if found is not None:  # the scripts put the template's folder first on sys.path: the package would hide it
        where = found.origin or next(iter(found.submodule_search_locations or []), "")
        raise UsageError(f"{name!r}: a module of that name exists already ({where}), and a recipe package of that "
                         "name would hide it from every script; choose another name")
    if name in ignored_folders():
        raise UsageError(f"{name!r}: the template's .gitignore leaves {name}/ out of git, so the recipe would never "
                         "be committed; choose another name")
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: not a folder")
    package = out / name
    if package.exists() or package.is_symlink():
        raise UsageError(f"{package}: exists already; choose another name or --out folder")
    return package


def ignored_folders() -> set[str]:
    """The folder names the template's ``.gitignore`` leaves out (``data/``, ``__pycache__/``, ...)."""
    try:
        lines = (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return set()
    return {line.strip().rstrip("/") for line in lines
            if line.strip().endswith("/") and not any(c in line for c in "*?[!#")}


@contextmanager
def stops_raise() -> Iterator[None]:
    """SIGTERM and SIGHUP (a scheduler, ``timeout``, a closed terminal) raise, as Ctrl-C does, so that the cleanup
    of what was written half runs; outside the main thread signals are not this code's to take."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(number: int, frame: Any) -> None:
        raise Terminated(f"stopped by {signal.Signals(number).name}: nothing was written")

    previous = {number: signal.signal(number, stop) for number in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def written_whole(package: Path, write: Callable[[Path], T]) -> T:
    """``write(folder)`` into a hidden folder beside ``package``, then moved to ``package`` in one rename: stopped
    at any point (an error, Ctrl-C, SIGTERM), there is no package and no hidden folder left; only a SIGKILL
    leaves the hidden folder (``.NAME.partial-*``, which nothing imports)."""
    try:
        package.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{package.name}.partial-", dir=package.parent))
        umask = os.umask(0)
        os.umask(umask)
        staging.chmod(0o777 & ~umask)  # a folder as mkdir makes it, not mkdtemp's owner-only one
    except OSError as err:
        raise UsageError(f"--out {package.parent}: cannot write there ({err.strerror or err})") from None
    try:
        with stops_raise():
            made = write(staging)
            try:
                staging.rename(package)
            except OSError as err:
                raise UsageError(f"{package}: cannot be made ({err.strerror or err}); choose another name or "
                                 "--out folder") from None
        return made
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@dataclass(frozen=True)
class NewRecipe:
    package: Path
    folder: ImageFolder | None
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    examples: int = 0


def recipe_from_images(name: str, images: Path, out: Path) -> NewRecipe:
    """The package ``out/name`` for the images in ``images``."""
    package = checked_name(name, out)
    folder = survey(images)
    channels = [16, 32, 64, 64][: folder.stages]
    values = {
        "name": name, "source_name": folder.root.name, "classes": repr(folder.classes), "count": len(folder.classes),
        "channels": folder.channels, "side": folder.side,
        "mode": "grey" if folder.channels == 1 else "RGB", "stages": folder.stages, "widths": repr(channels),
        "widths_example": ",".join(map(str, channels)), "test_share": TEST_SHARE,
    }

    def write(into: Path) -> tuple[tuple[float, ...], tuple[float, ...], int]:
        write_templates(into, {**values, "mean": "(0.5,)", "std": "(0.25,)", "val_share": 0.1})  # measured next
        train = training_set(into, folder.root)
        mean, std = measured_statistics(folder, train)
        share = validation_share(len(train.files), len(folder.classes))
        write_templates(into, {**values, "mean": repr(mean), "std": repr(std), "val_share": share})
        return mean, std, write_examples(folder, train, into / "examples")

    mean, std, examples = written_whole(package, write)
    return NewRecipe(package, folder, mean, std, examples)


def write_templates(package: Path, values: dict[str, object]) -> None:
    for file, template in TEMPLATES.items():
        (package / file).write_text(string.Template(template).substitute(values))


def recipe_from_package(name: str, source: str, out: Path) -> NewRecipe:
    """A copy of the recipe package ``source`` (dotted, e.g. ``tests.second_recipe``) as ``out/name``."""
    package = checked_name(name, out)
    try:
        spec = importlib.util.find_spec(source)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise UsageError(f"--from {source}: no such package (give it dotted, as PROJECT_RECIPE names it)")
    original = Path(next(iter(spec.submodule_search_locations)))

    def write(into: Path) -> None:
        shutil.copytree(original, into, ignore=shutil.ignore_patterns("__pycache__", "tests"), dirs_exist_ok=True)
        init = into / "__init__.py"
        text = init.read_text()
        renamed, count = re.subn(r"""(\bname\s*=\s*)(["'])[^"']*\2""", rf'\g<1>"{name}"', text, count=1)
        if not count:
            raise UsageError(f"--from {source}: its __init__.py names no Recipe(name=...) to rename")
        init.write_text(renamed)

    written_whole(package, write)
    return NewRecipe(package, None)


INIT = '''"""Recipe $name: a small CNN on $count classes of images (first made from a folder named $source_name), read
file by file.

Written by scripts/new_recipe.py; yours to change. Its data folder (--data-dir, or DATA_DIR) holds one
folder of images a class (or train/ and test/, each holding them); $test_share of each class is held out
for testing where there is no test/. It names no folder of this machine: it trains wherever it is copied.
"""

from project.api import Option, Recipe, sizes_of

RECIPE = Recipe(
    name="$name",
    module=".model:LitNet",
    datamodule=".data:ImageFolders",
    description="Train a small CNN on $count classes of images, then test the best checkpoint.",
    data_help="folder holding one folder of images a class, or train/ and test/ holding them",
    options={"channels": Option($widths, sizes_of($stages, "$widths_example"),
                                "channels of the $stages convolution blocks, e.g. $widths_example")},
    defaults={"max_epochs": 10, "batch_size": 32, "optimizer": "adamw", "lr": 0.003,
              "scheduler": "cosine", "num_workers": 2},
    example_data=".data:write_examples",
)
'''

DATA = '''"""The images: one folder a class, each file read as predict.py reads an image ($side x $side, $mode, in
[0, 1]) and normalised by the mean and std measured on the training images."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.data import Dataset

from project.api import DataError, ImageError, TensorDataModule

CLASSES = $classes
SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")
TEST_SHARE = $test_share  # of each class, held out for testing where the folder has no train/ and test/
EXAMPLES = Path(__file__).parent / "examples"


def class_files(folder: Path) -> list[tuple[Path, int]]:
    """(file, class) for each image of each class folder, in a fixed order."""
    return [(path, label) for label, name in enumerate(CLASSES)
            for path in sorted((folder / name).iterdir()) if path.suffix.lower() in SUFFIXES]


def held_out(files: list[tuple[Path, int]]) -> set[int]:
    """TEST_SHARE of each class, by a fixed seed: the same test set whatever the run's --seed."""
    generator = torch.Generator().manual_seed(0)
    test: set[int] = set()
    for label in range(len(CLASSES)):
        mine = [index for index, (_, of) in enumerate(files) if of == label]
        order = torch.randperm(len(mine), generator=generator).tolist()
        test.update(mine[i] for i in order[: round(TEST_SHARE * len(mine))])
    return test


class Files(Dataset):
    def __init__(self, files: list[tuple[Path, int]], read: Callable[[Path], torch.Tensor]) -> None:
        self.files, self.read = files, read

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.files[index]
        try:
            return self.read(path), label
        except ImageError as err:
            raise DataError(f"{path}: {err}") from None


class ImageFolders(TensorDataModule):
    input_shape = ($channels, $side, $side)
    num_classes = len(CLASSES)
    class_names = tuple(CLASSES)  # the class folders' names, sorted: what evaluate.py and predict.py print
    mean = $mean
    std = $std
    default_val_size = $val_share  # of the training images: a tenth, or enough to rank checkpoints by

    def dark_background(self) -> None:
        """Pictures, not ink on paper: no image is inverted to the training images' polarity."""
        return None

    def split_on_disk(self) -> bool:
        return (self.data_dir / "train").is_dir() and (self.data_dir / "test").is_dir()

    def prepare_data(self) -> None:
        folders = [self.data_dir / "train", self.data_dir / "test"] if self.split_on_disk() else [self.data_dir]
        for folder in folders:
            if not folder.is_dir():
                raise DataError(f"{folder}: no such folder")
            missing = [name for name in CLASSES if not (folder / name).is_dir()]
            if missing:
                raise DataError(f"{folder}: no folder for class {missing[0]!r} (the recipe's classes: "
                                f"{', '.join(CLASSES)})")

    def load_samples(self, train: bool) -> Dataset:
        if self.split_on_disk():
            return Files(class_files(self.data_dir / ("train" if train else "test")), self.read_pixels)
        files = class_files(self.data_dir)
        test = held_out(files)
        return Files([file for index, file in enumerate(files) if (index in test) != train], self.read_pixels)


def write_examples(root: Path, train: int = 320, test: int = 80, seed: int = 0) -> Path:
    """The training images kept in examples/ (resized copies), one folder a class: what there is of them, whatever
    count is asked for; TEST_SHARE of them are its test set."""
    shutil.copytree(EXAMPLES, Path(root), dirs_exist_ok=True)
    return Path(root)
'''

MODEL = '''"""A small CNN for $side x $side inputs: $stages blocks of convolution, ReLU and 2 x 2 max-pooling, each
channel's largest value (a feature found anywhere in the image), and a linear layer to the classes' logits."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from project.api import ClassifierModule

from .data import CLASSES

IN_CHANNELS = $channels


class Net(nn.Module):
    def __init__(self, channels: Sequence[int] = $widths) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = IN_CHANNELS
        for out in channels:
            layers += [nn.Conv2d(width, out, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
            width = out
        self.features = nn.Sequential(*layers, nn.AdaptiveMaxPool2d(1), nn.Flatten(1))
        self.head = nn.Linear(width, len(CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class LitNet(ClassifierModule):
    def __init__(self, channels: Sequence[int] = $widths, **training: Any) -> None:
        super().__init__(Net(channels), num_classes=len(CLASSES), **training)
        self.save_hyperparameters({"channels": [int(c) for c in channels]}, logger=False)
'''

TEMPLATES = {"__init__.py": INIT, "data.py": DATA, "model.py": MODEL}
