"""What Lightning sets at run time, read through one typed function each: each returns what it promises or says, in
one line, what it found instead."""

from __future__ import annotations

from types import SimpleNamespace

import hypothesis.strategies as st
import lightning as L
import pytest
import torch
from hypothesis import given, settings
from torch.utils.data import Dataset, random_split

from helpers import tiny_recipe
from project.training.classifier import one_optimizer
from project.training.steps_per_call import lightnings_own_steps, stepper_of
from project.training.tensor_data import TensorPairs, sample_count, set_up, split_indices, tensor_datamodule


@settings(max_examples=50, deadline=None)
@given(n=st.integers(2, 500), share=st.floats(0.01, 0.99), seed=st.integers(0, 2**31))
def test_the_split_is_torchs_random_split_with_that_seed(n, share, seed):
    """Checkpoints of earlier runs resume on the same split: the indices are random_split's, as they always were."""
    val_size = min(n - 1, max(1, round(n * share)))
    train, val = random_split(range(n), [n - val_size, val_size], torch.Generator().manual_seed(seed))
    assert split_indices(n, val_size, seed) == (list(train.indices), list(val.indices))


class NoLength(Dataset):
    def __getitem__(self, index):
        return index


def test_a_split_without_a_length_or_not_set_up_is_one_line():
    assert sample_count(TensorPairs(torch.zeros(3, 2), torch.zeros(3))) == 3
    with pytest.raises(TypeError, match="^NoLength has no length: a split must define __len__$"):
        sample_count(NoLength())
    with pytest.raises(RuntimeError, match=r"^setup\(\) must run before its splits are read$"):
        set_up(None)
    split = NoLength()
    assert set_up(split) is split


def test_the_runs_datamodule_stepper_and_optimizer_are_what_the_engine_needs(tmp_path):
    datamodule = tiny_recipe().datamodule_class()(tmp_path)
    assert tensor_datamodule(SimpleNamespace(datamodule=datamodule)) is datamodule
    with pytest.raises(TypeError, match="^the run's datamodule is a LightningDataModule, not a TensorDataModule$"):
        tensor_datamodule(SimpleNamespace(datamodule=L.LightningDataModule()))
    with pytest.raises(TypeError, match="^the run's datamodule is a NoneType"):
        tensor_datamodule(SimpleNamespace())

    module = L.LightningModule()
    with pytest.raises(TypeError, match="^LightningModule has no Stepper: the engine's callbacks need a "
                                        "ClassifierModule$"):
        stepper_of(module)
    module.stepper = lightnings_own_steps()
    assert stepper_of(module) is module.stepper


def test_one_optimizer_refuses_a_module_with_several():
    class Two(L.LightningModule):
        def optimizers(self, use_pl_optimizer=True):
            return [object(), object()]

    class One(L.LightningModule):
        def optimizers(self, use_pl_optimizer=True):
            return "the optimizer"

    assert one_optimizer(One()) == "the optimizer"
    with pytest.raises(TypeError, match="^Two has 2 optimizers; the engine steps one$"):
        one_optimizer(Two())
