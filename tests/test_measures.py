"""What a run and evaluate.py measure, each against a reference computed another way: the confusion matrices count
each validation and test sample once, the test loss is a mean over samples (not over batches), and the precision
a run trains in is the one --help promises."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from helpers import make_tiny_data, tiny_config, train
from project.hardware.devices import resolve_precision


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return make_tiny_data(tmp_path / "data")


def test_each_confusion_matrix_counts_its_split_once(data, tmp_path, monkeypatch):
    from project.results import figures

    drawn: list[tuple[str, int]] = []
    real = figures.confusion_image

    def counted(confusion, title, names):
        drawn.append((title, int(confusion.sum())))
        return real(confusion, title, names)

    monkeypatch.setattr(figures, "confusion_image", counted)
    train(tiny_config(data, tmp_path, max_epochs=3, steps_per_call=1))
    assert drawn == [("validation, epoch 1", 40), ("validation, epoch 2", 40), ("validation, epoch 3", 40),
                     ("test set", 80)]  # --val-size 40 (the sanity check's batches drawn into none), 80 test images


def test_evaluates_test_loss_is_the_mean_over_samples_whatever_the_batches():
    from project.results.evaluation import Classifier, evaluate

    generator = torch.Generator().manual_seed(0)
    network = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
    inputs, targets = torch.randn(90, 1, 4, 4, generator=generator), torch.randint(0, 3, (90,), generator=generator)
    classifier = Classifier(network.eval(), "net")
    with torch.no_grad():
        reference = nn.functional.cross_entropy(network(inputs), targets).item()  # one mean over the 90 samples
    for batch_size in (90, 40, 7):  # one batch; 40 + 40 + 10; a small last batch of 6
        measured = evaluate(classifier, inputs, targets, 3, batch_size=batch_size)["test/loss"]
        assert measured == pytest.approx(reference, rel=1e-6), batch_size


@pytest.mark.parametrize(("given", "trained"), [
    ("16", "bf16-mixed"), ("16-mixed", "bf16-mixed"), ("bf16", "bf16-mixed"), ("32", "32-true"), ("64", "64-true"),
    ("16-true", "16-true")])
def test_the_precision_a_cpu_run_trains_in_is_the_one_help_promises(given, trained):
    """--help: "16-mixed on CPU uses bf16-mixed"; the short names are Lightning's own (16 is 16-mixed)."""
    assert resolve_precision(given, "cpu") == trained


def test_a_cpu_run_asked_for_16_records_and_trains_in_bf16_mixed(data, tmp_path):
    result = train(tiny_config(data, tmp_path, max_epochs=1, precision="16", accelerator="cpu"), test=False)
    assert result.config.precision == "bf16-mixed" and "precision bf16-mixed" in result.summary()
