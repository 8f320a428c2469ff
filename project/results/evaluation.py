"""Load a trained model from a checkpoint or ``model.pth`` and measure it on the recipe's test set."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix

from project import EVAL_BATCH_SIZE
from project.config.schema import full_precision, settings_of
from project.contract import Recipe, class_labels
from project.errors import CheckpointError, ImageError, UsageError, first_line, terminal_safe
from project.reliability.checkpointing import check_trained_by, read_checkpoint, read_weights
from project.reliability.run_folder import RunFolder, checkpoint_of
from project.results.image_files import files_in

TRUE_DTYPES = {"64-true": torch.float64, "bf16-true": torch.bfloat16, "16-true": torch.float16}


class Classifier(nn.Module):
    """Log-probabilities for inputs as training gave them (normalised), whichever file the network came from.

    ``log_softmax`` of the network's outputs: log-probabilities for a network that returns logits,
    and unchanged for one that already returns log-probabilities.
    """

    def __init__(self, network: nn.Module, source: str, chosen: str = "", precision: str = "32-true",
                 data_dir: str | None = None) -> None:
        super().__init__()
        self.data_dir = data_dir  # the data its run trained on, where the run recorded it
        self.precision = full_precision(precision)  # the run's: evaluation computes as its test did
        self.network = network.to(TRUE_DTYPES.get(self.precision, torch.float32))
        self.source = source
        self.chosen = chosen  # how the default picked it ("the best checkpoint of the newest run, ..."), if it did

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        dtype = TRUE_DTYPES.get(self.precision, torch.float32)
        # On the CPU, 16-mixed trains and tests as bf16-mixed (the summary says so): the same here.
        mixed = torch.autocast("cpu", dtype=torch.bfloat16) if self.precision.endswith("-mixed") else \
            contextlib.nullcontext()
        with mixed:
            return torch.log_softmax(self.network(inputs.to(dtype)).float(), dim=1)

    def describe(self) -> str:
        """Which model, and how it was chosen and computed (for the scripts' ``using ...`` line)."""
        chosen = f", {self.chosen}" if self.chosen else ""
        computed = f"; computed in {self.precision}, as the run tested" if self.precision != "32-true" else ""
        return f"{self.source}{chosen}{computed}"


def load_classifier(recipe: Recipe, ckpt: str | None = None, weights: str | None = None,
                    logdir: str = "lightning_logs", name: str | None = None) -> Classifier:
    """From ``--weights model.pth``, or ``--ckpt PATH|best|last`` (default: ``best``) of the recipe's runs."""
    module_class = recipe.module_class()
    if weights:
        network = module_class.network_from_weights(read_weights(weights), str(weights))
        recorded = RunFolder(Path(weights).parent).saved_config.get("data_dir")  # model.pth in its run's folder
        return Classifier(network.eval(), source=str(weights), data_dir=recorded if isinstance(recorded, str) else None)
    path, run = checkpoint_of(ckpt or "best", logdir, name or recipe.name, "--ckpt")
    state = read_checkpoint(path)
    check_trained_by(state, path, recipe)
    settings = checked_hyper_parameters(state, path, recipe)
    module = module_class(**settings)
    try:
        module.load_state_dict(state["state_dict"], strict=True)
    except RuntimeError:
        raise CheckpointError(f"{path}: its weights do not fit this recipe's {module_class.__name__}") from None
    chosen = f"the {ckpt or 'best'} checkpoint of the newest run, {run.folder} ({run.describe()})" if run else ""
    trained_with = state.get("run_record", {}).get("config", {})
    return Classifier(module.model.eval(), source=str(path), chosen=chosen,
                      precision=trained_with.get("precision", "32-true"), data_dir=trained_with.get("data_dir"))


def checked_hyper_parameters(state: dict[str, Any], path: Path, recipe: Recipe) -> dict[str, Any]:
    """What a checkpoint says of its model, checked as the flags it stands for are (a file can say anything), and
    then against its own weights, on the meta device: settings that would build a model of another size are
    refused before a byte of it is allocated."""
    saved = state["hyper_parameters"]
    if not isinstance(saved, dict):
        raise CheckpointError(f"{path}: its hyper_parameters are a {type(saved).__name__}, not settings by name")
    known = settings_of(recipe)
    settings = {}
    for name, value in saved.items():
        if name not in known:
            settings[name] = value  # the module's own (num_classes, ...): its constructor says what it takes
            continue
        try:
            settings[name] = known[name].check(value)
        except ValueError as err:
            raise CheckpointError(f"{path}: its hyper_parameters' {name} {value!r}: {err}") from None
    module_class = recipe.module_class()
    try:
        with torch.device("meta"):
            shapes = {key: tuple(tensor.shape) for key, tensor in module_class(**settings).state_dict().items()}
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{path}: its hyper_parameters do not build this recipe's {module_class.__name__} "
                              f"({first_line(err)})") from None
    weights = state["state_dict"]
    wrong = next((key for key, shape in shapes.items() if key in weights and tuple(weights[key].shape) != shape), None)
    if wrong is not None or set(shapes) != set(weights):
        options = ", ".join(f"{name} {settings[name]!r}" for name in recipe.options if name in settings)
        raise CheckpointError(f"{path}: its hyper_parameters ({options or 'its settings'}) build a "
                              f"{module_class.__name__} its weights do not fit"
                              + (f" ({wrong}: {shapes[wrong]} here, {tuple(weights[wrong].shape)} saved)"
                                 if wrong else ""))
    return settings


def test_data_dir(classifier: Classifier, given: str | None) -> str | None:
    """Where the test set is read: ``--data-dir``, else the data the classifier's run trained on (as its run
    recorded it), else ``$DATA_DIR`` or the recipe's default. A ``DATA_DIR`` exported for another recipe's data
    does not override what the run recorded."""
    return given or classifier.data_dir


def recipe_data(recipe: Recipe, data_dir: str | None = None) -> Any:
    """The recipe's datamodule with its defaults: its test set, its image reading."""
    return recipe.datamodule_class()(data_dir)


@torch.no_grad()
def evaluate(classifier: Classifier, inputs: torch.Tensor, targets: torch.Tensor, num_classes: int,
             batch_size: int = EVAL_BATCH_SIZE, names: Sequence[str] = ()) -> dict[str, Any]:
    """Test loss (cross-entropy), accuracy, per-class accuracy and confusion matrix, all through torchmetrics;
    ``names``: the classes' (default: their indices), in index order."""
    loss = MeanMetric()
    accuracy = MulticlassAccuracy(num_classes=num_classes, average="micro")
    per_class = MulticlassAccuracy(num_classes=num_classes, average=None)
    confusion = MulticlassConfusionMatrix(num_classes=num_classes)
    for x, y in zip(inputs.split(batch_size), targets.split(batch_size), strict=True):
        log_probs = classifier(x)
        loss.update(nn.functional.nll_loss(log_probs, y), weight=len(y))
        for metric in (accuracy, per_class, confusion):
            metric.update(log_probs, y)
    return {
        "source": classifier.source,
        "samples": len(targets),
        "test/loss": float(loss.compute()),
        "test/acc": float(accuracy.compute()),
        "classes": class_labels(names, num_classes),
        "per_class_acc": [float(v) for v in per_class.compute()],
        "confusion_matrix": confusion.compute().tolist(),
    }


def render(results: dict[str, Any]) -> str:
    names = [terminal_safe(name) for name in results["classes"]]
    width, label = max(5, *(len(name) for name in names)), max(4, *(len(name) for name in names))
    lines = [
        f"model     {results['source']}",
        f"test set  {results['samples']} samples",
        f"test/acc  {results['test/acc']:.4f}",
        f"test/loss {results['test/loss']:.4f}",
        "",
        "per-class accuracy",
        "  " + "  ".join(f"{name:>{width}}" for name in names),
        "  " + "  ".join(f"{v:>{width}.3f}" for v in results["per_class_acc"]),
        "",
        "confusion matrix (rows: true class, columns: predicted)",
        f"{'true':<{label}} " + "".join(f"{name:>{width + 1}}" for name in names),
    ]
    for name, counts in zip(names, results["confusion_matrix"], strict=True):
        lines.append(f"{name:>{label}} " + "".join(f"{v:>{width + 1}}" for v in counts))
    return "\n".join(lines)


def evaluate_test_set(recipe: Recipe, classifier: Classifier, data_dir: str | None = None) -> dict[str, Any]:
    """``evaluate`` on the recipe's test set, normalised as in training (read sample by sample where the recipe
    reads its data that way)."""
    datamodule = recipe_data(recipe, data_dir)
    datamodule.setup("test")
    test = datamodule.test_set
    if datamodule.per_sample:
        batches = [datamodule.on_after_batch_transfer(batch, 0) for batch in datamodule.test_dataloader()]
        inputs, targets = torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches])
        return evaluate(classifier, inputs, targets, datamodule.num_classes, names=datamodule.class_labels())
    return evaluate(classifier, test.inputs, test.targets, datamodule.num_classes, names=datamodule.class_labels())


def evaluate_folder(recipe: Recipe, classifier: Classifier, folder: Path) -> tuple[dict[str, Any],
                                                                                  list[tuple[Path, str]]]:
    """``evaluate`` on a folder of class folders (each named as one of the recipe's classes), each file read as
    ``predict.py`` reads it; and the files that could not be read, with why (left out of the numbers)."""
    datamodule = recipe_data(recipe)
    names = datamodule.class_labels()
    if not folder.is_dir():
        raise UsageError(f"--images {folder}: no such folder")
    classes = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    unknown = [p.name for p in classes if p.name not in names]
    if unknown or not classes:
        raise UsageError(f"--images {folder}: " + (f"{unknown[0]!r} is not one of the recipe's classes" if unknown
                         else "no class folders in it") + f" (its classes: {', '.join(names)}); name each folder "
                         "as its class")
    inputs, targets, failures = [], [], []
    for class_folder in classes:
        for path in files_in(class_folder):
            try:
                inputs.append(datamodule.read_image(path))
            except ImageError as err:
                failures.append((path, str(err)))
                continue
            targets.append(names.index(class_folder.name))
    if not inputs:
        raise UsageError(f"--images {folder}: none of its files could be read as an image")
    results = evaluate(classifier, torch.stack(inputs), torch.tensor(targets), datamodule.num_classes, names=names)
    return results, failures


def plot_confusion(results: dict[str, Any], path: str) -> None:
    from project.results.plots import confusion_figure

    title = f"test set, accuracy {results['test/acc']:.4f}"
    confusion_figure(torch.tensor(results["confusion_matrix"]), title, results["classes"]).savefig(path, dpi=120)
