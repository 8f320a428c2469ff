"""The datamodule: splits, normalisation, batches by one gather, seeded order, clear data errors."""

import pytest
import torch
from torchvision import datasets, transforms

from project.errors import DataError
from project.recipe.data import MNISTDataModule
from project.recipe.mnist_files import MNIST_MEAN, MNIST_STD, RAW_FILES
from project.training.samplers import EpochShuffleSampler
from project.training.tensor_data import TensorPairs


def make_dm(data_dir, **kwargs):
    dm = MNISTDataModule(data_dir, batch_size=32, val_size=40, **kwargs)
    dm.prepare_data()
    dm.setup("fit")
    dm.setup("test")
    return dm


@pytest.mark.parametrize("loader", ["memory", "torchvision"])
def test_split_lengths_shapes_and_dtypes(tiny_mnist, loader):
    dm = make_dm(tiny_mnist, loader=loader)
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (200, 40, 80)
    x, y = dm.on_after_batch_transfer(next(iter(dm.train_dataloader())), 0)
    assert x.min().item() == pytest.approx(-MNIST_MEAN / MNIST_STD, abs=1e-5)
    assert x.shape == (32, 1, 28, 28) and x.dtype == torch.float32
    assert y.shape == (32,) and y.dtype == torch.int64
    assert sum(len(b[1]) for b in dm.val_dataloader()) == 40
    assert sum(len(b[1]) for b in dm.test_dataloader()) == 80


def test_normalisation_matches_to_tensor_and_normalize(tiny_mnist):
    dm = make_dm(tiny_mnist)
    reference = datasets.MNIST(tiny_mnist, train=False, transform=transforms.Compose(
        [transforms.ToTensor(), transforms.Normalize((MNIST_MEAN,), (MNIST_STD,))]))
    for i in (0, 17, 79):
        x, y = reference[i]
        assert torch.equal(dm.test_set.inputs[i], x)
        assert int(dm.test_set.targets[i]) == y
    lowest = (0 - MNIST_MEAN) / MNIST_STD
    assert dm.test_set.inputs.min().item() == pytest.approx(lowest, abs=1e-6)


def test_in_memory_batches_equal_torchvision_samples_for_the_same_indices(tiny_mnist):
    memory = make_dm(tiny_mnist, loader="memory")
    classic = make_dm(tiny_mnist, loader="torchvision")
    indices = [5, 0, 199, 42, 7]
    images, labels = memory.train_set.__getitems__(indices)
    samples = [classic.train_set[i] for i in indices]
    # the classic path normalises per batch, after the batch reaches the device
    classic_x, classic_y = classic.on_after_batch_transfer(
        (torch.stack([x for x, _ in samples]), torch.tensor([y for _, y in samples])), 0)
    assert torch.equal(images, classic_x)
    assert torch.equal(labels, classic_y)


def test_seeded_split_is_reproducible_and_seed_dependent(tiny_mnist):
    a, b, c = make_dm(tiny_mnist, seed=1), make_dm(tiny_mnist, seed=1), make_dm(tiny_mnist, seed=2)
    assert torch.equal(a.val_set.targets, b.val_set.targets)
    assert torch.equal(a.val_set.inputs, b.val_set.inputs)
    assert not torch.equal(a.val_set.inputs, c.val_set.inputs)


def test_epoch_order_differs_per_epoch_and_is_reproducible_from_the_seed():
    data = range(100)
    sampler = EpochShuffleSampler(data, seed=3)
    epoch0 = list(sampler)
    sampler.resume(0, 40)
    assert list(sampler) == epoch0[40:]  # a resumed epoch continues where it stopped, once
    assert list(sampler) == epoch0
    assert sorted(epoch0) == list(range(100))
    sampler.set_epoch(1)
    epoch1 = list(sampler)
    assert epoch1 != epoch0
    again = EpochShuffleSampler(data, seed=3)
    again.set_epoch(1)
    assert list(again) == epoch1
    assert list(EpochShuffleSampler(data, seed=4)) != epoch0


def test_batches_are_one_gather(tiny_mnist):
    dm = make_dm(tiny_mnist)
    loader = dm.train_dataloader()
    assert isinstance(loader.dataset, TensorPairs)
    seen = torch.cat([y for _, y in loader])
    assert len(seen) == 200
    assert torch.equal(seen.sort().values, dm.train_set.targets.sort().values)


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
