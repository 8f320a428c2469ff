"""The private attributes of Lightning, torch and Optuna the project touches: all in ``project/internals.py``, and
each still where the installed versions keep it (an upgrade that moves one fails here, naming it)."""

import re
from pathlib import Path

import lightning as L
import optuna
import pytest
import torch

from helpers import ROOT
from project import internals


def owners() -> dict[str, object]:
    """A real object of each kind ``internals.TOUCHED`` names."""
    from lightning.pytorch.strategies import launchers
    from lightning.pytorch.trainer.connectors.accelerator_connector import _AcceleratorConnector
    from torch.utils.tensorboard import SummaryWriter

    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    study = optuna.create_study()
    study.optimize(lambda trial: trial.suggest_float("x", 0, 1), n_trials=1)
    return {
        "lightning _TrainingEpochLoop": trainer.fit_loop.epoch_loop,
        "lightning _ManualOptimization": trainer.fit_loop.epoch_loop.manual_optimization,
        "lightning _FitLoop": trainer.fit_loop,
        "lightning Trainer": trainer,
        "lightning _AcceleratorConnector": _AcceleratorConnector,
        "lightning checkpoint loops": trainer.fit_loop.state_dict(),
        "torch SummaryWriter": SummaryWriter,
        "torch LRScheduler": torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0),
        "torch GradScaler": torch.amp.GradScaler("cpu"),
        "torch": torch,
        "optuna FrozenTrial": study.trials[0],
        "lightning launchers": launchers,
    }


@pytest.fixture(scope="module")
def installed() -> dict[str, object]:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    return owners()


@pytest.mark.parametrize(("where", "attribute"), internals.TOUCHED, ids=[a for _, a in internals.TOUCHED])
def test_each_private_attribute_is_still_where_the_installed_version_keeps_it(installed, where, attribute):
    owner = installed[where]
    found = attribute in owner if isinstance(owner, dict) else hasattr(owner, attribute)
    assert found, f"{where} has no {attribute!r} in this version: project/internals.py needs another way to it"


def test_every_kind_touched_has_a_real_object_checked(installed):
    assert {where for where, _ in internals.TOUCHED} == set(installed)


def test_no_other_module_touches_them():
    # An attribute by its name; a checkpoint's key as a string (its parts are public attributes).
    names = [re.escape(f'"{a}"') if "." in a else rf"\b{re.escape(a)}\b" for _, a in internals.TOUCHED]
    pattern = re.compile("(" + "|".join(names) + ")")
    elsewhere = [f"{path.relative_to(ROOT)}: {match.group(1)}" for path in Path(ROOT, "project").rglob("*.py")
                 if path.name != "internals.py" for match in pattern.finditer(path.read_text())]
    assert elsewhere == []
