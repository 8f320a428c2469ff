"""The engine's datamodule: seeded splits and order, batches by one gather (the MNIST files: project/recipe/tests)."""

import pytest
import torch
from torch.utils.data import DistributedSampler

from project.training.tensor_data import (
    EpochBatches,
    EpochShardSampler,
    EpochShuffleSampler,
    EvalShardSampler,
    StepGroups,
    TensorPairs,
    epoch_order,
)
from tests.tiny_recipe.data import TinyDataModule


def make_dm(data_dir, **kwargs):
    dm = TinyDataModule(data_dir, batch_size=32, val_size=40, **kwargs)
    dm.prepare_data()
    dm.setup("fit")
    dm.setup("test")
    return dm


def test_seeded_split_is_reproducible_and_seed_dependent(tiny_data):
    a, b, c = make_dm(tiny_data, seed=1), make_dm(tiny_data, seed=1), make_dm(tiny_data, seed=2)
    assert torch.equal(a.val_set.targets, b.val_set.targets)
    assert torch.equal(a.val_set.inputs, b.val_set.inputs)
    assert not torch.equal(a.val_set.inputs, c.val_set.inputs)


def test_epoch_order_differs_per_epoch_and_is_reproducible_from_the_seed():
    data = range(100)
    sampler = EpochShuffleSampler(data, seed=3)
    epoch0 = list(sampler)
    assert sorted(epoch0) == list(range(100))
    sampler.resume(1, 40)
    resumed = list(sampler)  # the resumed epoch, before Lightning sets it (a loader with workers reads ahead at once)
    sampler.set_epoch(1)
    assert list(sampler) == resumed  # every iteration of the resumed epoch skips what was trained
    sampler.set_epoch(2)
    assert sorted(list(sampler)) == list(range(100))  # and the next epoch is whole again
    sampler.set_epoch(1)
    epoch1 = list(sampler)
    assert epoch1 != epoch0 and resumed == epoch1[40:]
    again = EpochShuffleSampler(data, seed=3)
    again.set_epoch(1)
    assert list(again) == epoch1
    assert list(EpochShuffleSampler(data, seed=4)) != epoch0


def test_batches_are_one_gather(tiny_data):
    dm = make_dm(tiny_data)
    loader = dm.train_dataloader()
    assert isinstance(loader.dataset, TensorPairs)
    seen = torch.cat([y for _, y in loader])
    assert len(seen) == 200
    assert torch.equal(seen.sort().values, dm.train_set.targets.sort().values)


def test_in_memory_batches_equal_per_sample_ones_for_the_same_indices(tiny_data):
    memory = make_dm(tiny_data)
    samples = make_dm(tiny_data, per_sample=True)
    assert not memory.per_sample and samples.per_sample  # a recipe with both reads from memory unless asked
    indices = [5, 0, 199, 42, 7]
    images, labels = memory.train_set.__getitems__(indices)
    picked = [samples.train_set[i] for i in indices]
    # the per-sample path normalises per batch, after the batch reaches the device
    x, y = samples.on_after_batch_transfer((torch.stack([x for x, _ in picked]), torch.stack([y for _, y in picked])),
                                           0)
    assert torch.equal(images, x) and torch.equal(labels, y)


@pytest.mark.parametrize(("size", "world"), [(10, 2), (11, 3), (5, 4)])
def test_a_ranks_shard_is_distributed_samplers_and_resumes_after_the_samples_it_trained_on(size, world):
    """The order Lightning's own DDP sampler gives (padded to a multiple of the world size), per epoch; a resume
    skips the samples done in its epoch, in every iteration of that epoch, and no later; keyed: each index with
    its epoch, for augmentation seeded by both."""
    data = list(range(size))
    for epoch in (0, 1):
        shards = []
        for rank in range(world):
            ours, torchs = EpochShardSampler(data, world, rank, seed=5), DistributedSampler(
                data, num_replicas=world, rank=rank, shuffle=True, seed=5)
            ours.set_epoch(epoch)
            torchs.set_epoch(epoch)
            shards.append(list(ours))
            assert shards[-1] == list(torchs) and len(shards[-1]) == len(ours) == -(-size // world)
            keyed = EpochShardSampler(data, world, rank, seed=5, keyed=True)
            keyed.set_epoch(epoch)
            assert list(keyed) == [(index, epoch) for index in shards[-1]]
        assert sorted({i for shard in shards for i in shard}) == data
    resumed = EpochShardSampler(data, world, 1, seed=5)
    resumed.resume(1, 1)  # Lightning iterates before it sets the epoch
    first = DistributedSampler(data, num_replicas=world, rank=1, shuffle=True, seed=5)
    first.set_epoch(1)
    assert list(resumed) == list(resumed) == list(first)[1:]
    resumed.set_epoch(2)
    first.set_epoch(2)
    assert list(resumed) == list(first)


def test_a_keyed_shuffle_pairs_each_index_with_its_epoch():
    plain, keyed = EpochShuffleSampler(range(9), seed=2), EpochShuffleSampler(range(9), seed=2, keyed=True)
    for epoch in (0, 3):
        plain.set_epoch(epoch)
        keyed.set_epoch(epoch)
        assert list(keyed) == [(index, epoch) for index in plain]
    keyed.resume(4, 5)
    assert [epoch for _, epoch in keyed] == [4] * 4


@pytest.mark.parametrize(("size", "world"), [(10, 3), (2, 4)])
def test_eval_shards_hold_each_sample_once_in_order(size, world):
    shards = [list(EvalShardSampler(list(range(size)), world, rank)) for rank in range(world)]
    assert sorted(i for shard in shards for i in shard) == list(range(size))
    assert all(shard == sorted(shard) and len(shard) == len(EvalShardSampler(list(range(size)), world, rank))
               for rank, shard in enumerate(shards))


@pytest.mark.parametrize("epoch", [0, 2])
def test_a_resume_at_an_epochs_end_goes_on_with_the_next_epochs_order(epoch):
    """A checkpoint taken at an epoch's last step resumes before Lightning moves on: the batches are the next epoch's
    order (seeded by seed + epoch + 1), all of it, counted from the checkpoint's step."""
    sampler = EpochBatches(10, 4, seed=5, device=torch.device("cpu"), position=lambda: (epoch, 99))
    sampler.resume(epoch, 10)
    assert torch.cat(list(sampler)).tolist() == epoch_order(10, 5, epoch + 1, None).tolist()
    assert sampler.epoch_start_step == 99


def test_runs_sharing_a_datamodule_each_train_as_planned_and_leave_it_as_it_was(tiny_data, tmp_path):
    """A sweep's trials share one datamodule (data loaded once): each run trains with its own batch size and steps
    per call, on the splits loaded already, and the datamodule given keeps its own settings."""
    import lightning as L

    from helpers import tiny_config, tiny_recipe, train
    from project.training.build import build_datamodule

    class SeenData(L.Callback):
        def on_train_start(self, trainer, pl_module):
            self.data = trainer.datamodule

    shared = build_datamodule(tiny_config(tiny_data, tmp_path), tiny_recipe())
    shared.setup("fit")
    loaded = shared.train_set
    splits = ("train_set", "val_set", "test_set")  # loaded once, on the datamodule given

    def settings():
        return {key: value for key, value in vars(shared).items() if key not in splits}

    before = settings()
    for batch_size, k, steps in ((16, 3, 13), (48, 1, 5)):  # 200 training samples: 13 and 5 batches an epoch
        seen = SeenData()
        result = train(tiny_config(tiny_data, tmp_path, batch_size=batch_size, steps_per_call=k, max_epochs=1,
                                   accelerator="cpu"), datamodule=shared, callbacks=[seen], test=False)
        assert (result.optimizer_steps, result.steps.k) == (steps, k)
        assert seen.data is not shared and seen.data.train_set is loaded
        assert seen.data.batch_size == batch_size
        assert type(seen.data._train_sampler) is (StepGroups if k > 1 else EpochBatches)  # as the run's stepper made
    assert settings() == before and shared.train_set is loaded


@pytest.mark.parametrize(("mean", "light_on_dark"), [((0.13,), True), ((0.39,), True), ((0.4,), None), ((0.6,), None),
                                                     ((0.61,), False), ((0.9,), False), ((0.1, 0.9, 0.9), False),
                                                     ((0.9, 0.1, 0.1), True)])
def test_the_training_images_polarity_is_read_from_their_mean_brightness(mean, light_on_dark):
    """Below 0.4 light on dark, above 0.6 dark on light, between none (no inversion); over every channel."""
    recipe = type("Declared", (TinyDataModule,), {"mean": mean, "std": (0.3,) * len(mean)})
    assert recipe.__new__(recipe).dark_background() is light_on_dark


@pytest.mark.parametrize(("mean", "border"), [((0.13,), 0.0), ((0.9,), 1.0), ((0.5,), 1.0)])
def test_a_recipes_image_reading_turns_a_file_to_its_training_images_polarity(tmp_path, mean, border):
    """Dark ink on light paper reads as light on dark for a recipe trained on light-on-dark images (its border dark),
    and as it is for one trained on dark-on-light images or of no clear polarity."""
    from PIL import Image, ImageDraw

    paper = Image.new("L", (56, 56), 255)
    ImageDraw.Draw(paper).line([(28, 8), (28, 48)], fill=0, width=6)
    paper.save(tmp_path / "ink.png")
    recipe = type("Declared", (TinyDataModule,), {"mean": mean, "std": (0.3,)})
    pixels = recipe.__new__(recipe).read_pixels(tmp_path / "ink.png")
    assert pixels.shape == (1, 28, 28)
    assert float(pixels[0, 0, 0]) == border and float(pixels[0, 14, 14]) == 1.0 - border


def test_a_fractional_test_limit_gets_test_batches_it_covers(tiny_data):
    """``limit_test_batches=0.1`` of 80 test images in batches of 1000 would cover none: the test batches shrink to
    8 images, so the limit tests a tenth (as it does for validation)."""
    from types import SimpleNamespace

    dm = make_dm(tiny_data)
    dm.eval_batch_size = 1000
    dm.trainer = SimpleNamespace(limit_test_batches=0.1, limit_val_batches=1.0, world_size=1, global_rank=0,
                                 strategy=SimpleNamespace(root_device=torch.device("cpu")))
    assert dm.test_dataloader().batch_size == 8
    assert dm.val_dataloader().batch_size == 1000
    assert [len(y) for _, y in dm.test_dataloader()] == [8] * 10  # in order, each image once
    assert torch.equal(torch.cat([y for _, y in dm.test_dataloader()]), dm.test_set.targets)


def test_class_names_are_the_recipes_or_the_indices_and_one_a_class(tmp_path):
    from project.contract import RecipeError
    from project.recipe.data import MNISTDataModule

    assert MNISTDataModule(tmp_path).class_labels() == tuple("0123456789")  # MNIST names none: its digits

    class Named(TinyDataModule):
        class_names = tuple(f"digit {d}" for d in range(10))

    assert Named(tmp_path).class_labels()[3] == "digit 3"

    class Short(TinyDataModule):
        class_names = ("a", "b")

    with pytest.raises(RecipeError, match=r"^Short: class_names names 2 classes, num_classes is 10: give one name a "
                                          r"class, in index order$"):
        Short(tmp_path)
