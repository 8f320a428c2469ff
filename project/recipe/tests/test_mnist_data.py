"""The MNIST datamodule and its files: splits, normalisation as torchvision's, one line for any bad file."""

import random
from pathlib import Path

import numpy as np
import pytest
import torch
from torchvision import datasets, transforms

from project.errors import DataError
from project.recipe.data import MNISTDataModule
from project.recipe.example import write_example_digits, write_idx
from project.recipe.mnist_files import MNIST_MEAN, MNIST_STD, RAW_FILES, raw_folder

TRAIN_IMAGES, TRAIN_LABELS = RAW_FILES[:2]


def make_dm(data_dir, **kwargs):
    dm = MNISTDataModule(data_dir, batch_size=32, val_size=40, download=False, **kwargs)
    dm.prepare_data()
    dm.setup("fit")
    dm.setup("test")
    return dm


@pytest.mark.parametrize("per_sample", [False, True])
def test_split_lengths_shapes_and_dtypes(mnist_files, per_sample):
    dm = make_dm(mnist_files, per_sample=per_sample)
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (200, 40, 80)
    x, y = dm.on_after_batch_transfer(next(iter(dm.train_dataloader())), 0)
    assert x.min().item() == pytest.approx(-MNIST_MEAN / MNIST_STD, abs=1e-5)
    assert x.shape == (32, 1, 28, 28) and x.dtype == torch.float32
    assert y.shape == (32,) and y.dtype == torch.int64
    assert sum(len(b[1]) for b in dm.val_dataloader()) == 40
    assert sum(len(b[1]) for b in dm.test_dataloader()) == 80


def test_normalisation_matches_to_tensor_and_normalize(mnist_files):
    dm = make_dm(mnist_files)
    reference = datasets.MNIST(mnist_files, train=False, transform=transforms.Compose(
        [transforms.ToTensor(), transforms.Normalize((MNIST_MEAN,), (MNIST_STD,))]))
    for i in (0, 17, 79):
        x, y = reference[i]
        assert torch.equal(dm.test_set.inputs[i], x)
        assert int(dm.test_set.targets[i]) == y
    lowest = (0 - MNIST_MEAN) / MNIST_STD
    assert dm.test_set.inputs.min().item() == pytest.approx(lowest, abs=1e-6)


def test_in_memory_batches_equal_per_sample_ones_for_the_same_indices(mnist_files):
    memory = make_dm(mnist_files)
    classic = make_dm(mnist_files, per_sample=True)
    indices = [5, 0, 199, 42, 7]
    images, labels = memory.train_set.__getitems__(indices)
    samples = [classic.train_set[i] for i in indices]
    # the per-sample path normalises per batch, after the batch reaches the device
    classic_x, classic_y = classic.on_after_batch_transfer(
        (torch.stack([x for x, _ in samples]), torch.tensor([y for _, y in samples])), 0)
    assert torch.equal(images, classic_x)
    assert torch.equal(labels, classic_y)


def test_missing_data_gives_one_clear_message(tmp_path):
    dm = MNISTDataModule(tmp_path / "nowhere", download=False)
    with pytest.raises(DataError) as err:
        dm.prepare_data()
    message = str(err.value)
    assert str(tmp_path / "nowhere" / "MNIST" / "raw") in message
    assert all(name in message for name in RAW_FILES)
    assert "\n" not in message


def test_data_dir_resolution(monkeypatch, tmp_path):
    monkeypatch.setenv("DATA_DIR", str(tmp_path / "env"))
    assert MNISTDataModule().data_dir == tmp_path / "env"
    assert MNISTDataModule(tmp_path / "flag").data_dir == tmp_path / "flag"
    monkeypatch.delenv("DATA_DIR")
    assert str(MNISTDataModule().data_dir) == "data"


def raw(data: Path, name: str) -> Path:
    return raw_folder(data) / name

# ---------------------------------------------------------------- bad MNIST files

def _empty(data):
    raw(data, TRAIN_IMAGES).write_bytes(b"")


def _truncated(data):
    path = raw(data, TRAIN_IMAGES)
    path.write_bytes(path.read_bytes()[:-100])


def _wrong_magic(data):
    path = raw(data, TRAIN_LABELS)
    path.write_bytes(b"\x00\x00\x08\x03" + path.read_bytes()[4:])


def _count_mismatch(data):
    write_idx(raw(data, TRAIN_LABELS), np.zeros(239, dtype=np.uint8))


def _wrong_size(data):
    write_idx(raw(data, TRAIN_IMAGES), np.zeros((240, 32, 32), dtype=np.uint8))


def _directory(data):
    path = raw(data, TRAIN_IMAGES)
    path.unlink()
    path.mkdir()


def _missing(data):
    raw(data, TRAIN_LABELS).unlink()


def _link_loop(data):
    path = raw(data, TRAIN_LABELS)
    path.unlink()
    path.symlink_to(path)


def _bad_label(data):
    write_idx(raw(data, TRAIN_LABELS), np.full(240, 12, dtype=np.uint8))


BAD_FILES = {
    "empty": (_empty, f"{TRAIN_IMAGES}: empty file"),
    "truncated": (_truncated, f"{TRAIN_IMAGES}: truncated:"),
    "wrong magic": (_wrong_magic, f"{TRAIN_LABELS}: wrong magic number 0x00000803, expected 0x00000801"),
    "count mismatch": (_count_mismatch, "has 240 images but"),
    "wrong image size": (_wrong_size, "images are 32x32, expected 28x28"),
    "directory": (_directory, f"{TRAIN_IMAGES}: is a directory, not a file"),
    "missing": (_missing, "MNIST not found in"),
    "link loop": (_link_loop, f"{TRAIN_LABELS}: a symbolic link that leads nowhere"),
    "label out of range": (_bad_label, "label 12 is not a digit 0-9"),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_bad_mnist_file_gets_one_line_naming_it(tmp_path, monkeypatch, case):
    data = write_example_digits(tmp_path / "data", 240, 80)
    damage, message = BAD_FILES[case]
    damage(data)
    with pytest.raises(DataError) as err:
        make_dm(data)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert str(data) in str(err.value)


def test_unreadable_mnist_file_is_named(tmp_path, monkeypatch):
    # Tests run as root, which reads any file; so the OS's refusal is simulated where it is met.
    data = write_example_digits(tmp_path / "data", 240, 80)
    target = raw(data, TRAIN_LABELS)
    real_open = Path.open

    def refusing_open(self, *args, **kwargs):
        if self == target:
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", refusing_open)
    with pytest.raises(DataError, match=rf"{TRAIN_LABELS}: cannot read it \(permission denied\)"):
        MNISTDataModule(data, val_size=40, download=False).prepare_data()


@pytest.mark.parametrize("seed", range(200))
def test_fuzzed_idx_files_load_or_fail_clearly(tmp_path_factory, seed):
    rng = random.Random(seed)
    data = write_example_digits(tmp_path_factory.mktemp("fuzz") / "data", 60, 20)
    path = raw(data, rng.choice(RAW_FILES))
    blob = bytearray(path.read_bytes())
    action = rng.choice(["flip", "truncate", "append", "header"])
    if action == "flip":
        for _ in range(rng.randint(1, 8)):
            blob[rng.randrange(len(blob))] = rng.randrange(256)
    elif action == "truncate":
        del blob[rng.randrange(len(blob)):]
    elif action == "append":
        blob += bytes(rng.randrange(256) for _ in range(rng.randint(1, 50)))
    else:
        blob[rng.randrange(min(16, len(blob)))] = rng.randrange(256)
    path.write_bytes(bytes(blob))
    dm = MNISTDataModule(data, batch_size=8, val_size=10, download=False)
    try:
        dm.prepare_data()
        dm.setup("fit")
        dm.setup("test")
    except DataError as err:
        assert "\n" not in str(err) and str(data) in str(err)
        return
    assert len(dm.train_set) + len(dm.val_set) == 60 and len(dm.test_set) == 20
    assert int(dm.train_set.targets.max()) <= 9
