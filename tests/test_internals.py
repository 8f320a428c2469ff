"""The private attributes of Lightning, torch and Optuna the project touches: all in ``project/internals.py``, and
each still where the installed versions keep it (an upgrade that moves one fails here, naming it)."""

import ast
import os
import re
import textwrap
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
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
    from lightning.pytorch.tuner import lr_finder
    from torchmetrics.classification import MulticlassAccuracy

    return {
        "lightning ModelCheckpoint": ModelCheckpoint(every_n_train_steps=2),
        "lightning TensorBoardLogger": TensorBoardLogger("unused"),
        "lightning CSVLogger": CSVLogger("unused"),
        "lightning lr_finder": lr_finder,
        "torchmetrics Metric": MulticlassAccuracy(num_classes=3),
        "os": os,
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


# Set by assignment as their owners document: hooks meant to be replaced, and torch's backend switches.
DOCUMENTED_SETTINGS = ("sys.excepthook", "threading.excepthook", "torch.backends.")


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def names_defined_in(trees: list[ast.Module]) -> set[str]:
    """Every private name the code defines: functions, classes, variables, arguments, import aliases, and
    attributes it sets by plain assignment (``self._x = ...``; ``self._x += ...`` only changes one)."""
    names: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.alias):
                names.add(node.asname or node.name.split(".")[0])
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(part.attr for target in targets for part in ast.walk(target)
                             if isinstance(part, ast.Attribute) and isinstance(part.ctx, ast.Store))
    return {name for name in names if private(name)}


def imported_names(tree: ast.Module, package: str) -> set[str]:
    """The names a module binds to other packages' modules and objects."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.asname or a.name.split(".")[0] for a in node.names if a.name.split(".")[0] != package)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] != package:
            names.update(a.asname or a.name for a in node.names)
    return names


def root_name(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def foreign_reaches(package: Path, allowed_in: str = "internals.py") -> list[str]:
    """``file:line: what`` for each private attribute of an object the package did not define, and each assignment
    into another package's module or class, outside ``allowed_in``."""
    trees = {path: ast.parse(path.read_text(), str(path)) for path in sorted(package.rglob("*.py"))}
    ours = names_defined_in(list(trees.values()))
    found: list[tuple[Path, int, str]] = []
    for path, tree in trees.items():
        if path.name == allowed_in:
            continue
        where = path.relative_to(package.parent)
        imported = imported_names(tree, package.name)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and private(node.attr) and node.attr not in ours:
                found.append((where, node.lineno, f".{node.attr}"))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args:
                name = node.args[1] if len(node.args) > 1 else None
                if (node.func.id in ("getattr", "setattr", "hasattr", "delattr") and isinstance(name, ast.Constant)
                        and isinstance(name.value, str) and private(name.value) and name.value not in ours):
                    found.append((where, node.lineno, f"{node.func.id}(..., {name.value!r})"))
                elif node.func.id in ("setattr", "delattr") and root_name(node.args[0]) in imported:
                    found.append((where, node.lineno, f"{ast.unparse(node)}"))
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
            for target in targets:
                if (isinstance(target, ast.Attribute) and root_name(target) in imported
                        and not ast.unparse(target).startswith(DOCUMENTED_SETTINGS)):
                    found.append((where, node.lineno, f"{ast.unparse(target)} = ..."))
    return [f"{where}:{line}: {what}" for where, line, what in sorted(found)]


def test_nothing_outside_internals_reaches_into_another_packages_objects():
    found = foreign_reaches(Path(ROOT, "project"))
    assert not found, "move these into project/internals.py (with the reason there is no public way):\n" + \
        "\n".join(found)


def test_the_check_names_the_file_and_line_of_each_kind_of_reach(tmp_path):
    package = tmp_path / "mine"
    package.mkdir()
    (package / "internals.py").write_text("import torch\nvalue = torch._foreach_add\n")
    (package / "reach.py").write_text(textwrap.dedent("""\
        import sys
        import threading
        import torch
        from lightning.pytorch.tuner import lr_finder
        from mine import internals


        class Mine:
            def __init__(self):
                self._own, (self._pair, _) = 1, (2, 3)
                self._own += 1
                self.public = internals.value

            def _helper(self, metric):
                metric._update_count += 1
                return self._own + self._pair + self._helper2() + getattr(metric, "_defaults") + metric.__dict__

            def _helper2(self):
                return torch._C
        lr_finder.tqdm = None
        setattr(lr_finder, "tqdm", None)
        torch.backends.cudnn.benchmark = True
        torch.nn.Module.forward = None
        sys.excepthook = threading.excepthook = print
        """))
    assert foreign_reaches(package) == [
        "mine/reach.py:15: ._update_count",
        "mine/reach.py:16: getattr(..., '_defaults')",
        "mine/reach.py:19: ._C",
        "mine/reach.py:20: lr_finder.tqdm = ...",
        "mine/reach.py:21: setattr(lr_finder, 'tqdm', None)",
        "mine/reach.py:23: torch.nn.Module.forward = ...",
    ]
