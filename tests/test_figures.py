"""The pictures and the evaluation's own lines, drawn in this process: where a misclassified input lands in its
grid and how it is shown, how a model is described, where its test set is read, the confusion figure's file."""

from __future__ import annotations

import torch

from project.results import evaluation, figures, plots


def box(mask: torch.Tensor) -> tuple[int, int, int, int]:
    """(left, top, right, bottom) of the True pixels of an (H, W) mask, right and bottom exclusive."""
    rows, cols = mask.any(dim=1).nonzero().flatten(), mask.any(dim=0).nonzero().flatten()
    return int(cols[0]), int(rows[0]), int(cols[-1]) + 1, int(rows[-1]) + 1


def mistakes(images: torch.Tensor, columns: int = 8) -> torch.Tensor:
    count = len(images)
    return figures.mistakes_image(images, torch.arange(count) % 10, (torch.arange(count) + 1) % 10,
                                  torch.full((count,), 0.5), columns=columns)


def blue(height: int, width: int, count: int = 1) -> torch.Tensor:
    images = torch.zeros(count, 3, height, width)
    images[:, 2] = 1.0
    return images


def test_a_small_input_is_enlarged_by_a_whole_factor_and_centred_under_its_labels():
    """28 x 28 is drawn at 56 x 56 (twice), 7 x 7 at 56 x 56 (eight times), 60 x 60 as it is."""
    for size, shown in ((28, 56), (7, 56), (56, 56), (60, 60)):
        picture = mistakes(blue(size, size), columns=1)
        height, width = picture.shape[1:]
        left, top, right, bottom = box((picture[2] == 1) & (picture[0] == 0) & (picture[1] == 0))
        assert (right - left, bottom - top) == (shown, shown), size
        assert (left, height - bottom) == ((width - shown) // 2, 2), size  # centred across, 2 px from the bottom


def test_an_input_is_enlarged_without_blur():
    half = blue(28, 28)
    half[:, 2, :, 14:] = 0.0  # its right half black
    picture = mistakes(half, columns=1)
    left, _, right, _ = box((picture[2] == 1) & (picture[0] == 0))
    assert right - left == 28  # 14 columns, each drawn twice
    assert not ((picture[2] > 0) & (picture[2] < 1) & (picture[0] == 0) & (picture[1] == 0)).any()  # none blended


def test_grey_inputs_are_dark_ink_on_white_and_colour_inputs_as_they_are():
    grey = mistakes(torch.full((1, 1, 28, 28), 0.25), columns=1)
    colour = mistakes(torch.tensor([0.8, 0.4, 0.2]).view(1, 3, 1, 1).expand(1, 3, 28, 28).clone(), columns=1)
    height, width = grey.shape[1:]
    centre = (slice(None), height - 2 - 28, width // 2)  # the middle of the tile
    assert (grey[centre] * 255).round().tolist() == [191.0] * 3  # 1 - 0.25, as a byte
    assert (colour[centre] * 255).round().tolist() == [204.0, 102.0, 51.0]


def test_the_grid_has_as_many_columns_as_asked_and_the_rows_it_needs():
    one_row, two_rows = mistakes(blue(28, 28, 8)), mistakes(blue(28, 28, 9))
    assert one_row.shape[2] == two_rows.shape[2] and two_rows.shape[1] == 2 * one_row.shape[1]
    assert mistakes(blue(28, 28, 16)).shape == two_rows.shape
    four = mistakes(blue(28, 28, 8), columns=4)
    assert (four.shape[1], 2 * four.shape[2]) == (two_rows.shape[1], one_row.shape[2])
    assert mistakes(blue(28, 28, 0)).shape[1] == one_row.shape[1]  # nothing to show: one empty row


def test_each_mistake_is_labelled_with_its_prediction_in_red_and_its_truth_in_black():
    picture = mistakes(blue(28, 28), columns=1)
    red = (picture[0] > 0.5) & (picture[1] < 0.3) & (picture[2] < 0.3)
    black = picture.max(dim=0).values < 0.3
    _, red_top, _, red_bottom = box(red)
    _, black_top, _, black_bottom = box(black)
    assert red_bottom <= black_top + 2 and black_bottom < picture.shape[1] - 2 - 56  # two lines above the tile
    wider = figures.mistakes_image(blue(28, 28), torch.tensor([7]), torch.tensor([3]), torch.tensor([1.0]), 1)
    assert int(red.sum()) < int(((wider[0] > 0.5) & (wider[1] < 0.3) & (wider[2] < 0.3)).sum())  # "100%" > "50%"


class Logits(torch.nn.Module):
    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return inputs


def test_a_model_is_described_by_its_file_how_it_was_chosen_and_its_precision():
    chosen = evaluation.Classifier(Logits(), "runs/v0/best.ckpt", chosen="the best checkpoint of the newest run",
                                   precision="bf16-mixed")
    assert chosen.describe() == ("runs/v0/best.ckpt, the best checkpoint of the newest run; computed in bf16-mixed, "
                                 "as the run tested")
    assert evaluation.Classifier(Logits(), "model.pth").describe() == "model.pth"
    assert evaluation.Classifier(Logits(), "model.pth", precision="16").describe() == \
        "model.pth; computed in 16-mixed, as the run tested"


def test_the_test_set_is_read_where_asked_else_where_the_run_trained():
    recorded = evaluation.Classifier(Logits(), "a.ckpt", data_dir="/data/of/the/run")
    assert evaluation.test_data_dir(recorded, None) == "/data/of/the/run"
    assert evaluation.test_data_dir(recorded, "/asked") == "/asked"
    assert evaluation.test_data_dir(evaluation.Classifier(Logits(), "model.pth"), None) is None


def test_the_confusion_figure_is_written_with_the_accuracy_in_its_title(tmp_path, monkeypatch):
    drawn = []

    def confusion_figure(matrix, title, names):
        drawn.append((matrix.tolist(), title, names))
        return original(matrix, title, names)

    original = plots.confusion_figure
    monkeypatch.setattr(plots, "confusion_figure", confusion_figure)
    evaluation.plot_confusion({"test/acc": 0.98765, "confusion_matrix": [[3, 1], [0, 4]], "classes": ["a", "b"]},
                              str(tmp_path / "cm.png"))
    assert drawn == [([[3, 1], [0, 4]], "test set, accuracy 0.9877", ["a", "b"])]  # each class by its name
    assert (tmp_path / "cm.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_pictures_name_each_class_as_the_recipe_names_it():
    """With names, the confusion matrix and the mistakes carry them; with the indices as names, nothing changes."""
    matrix = torch.tensor([[5, 1], [2, 7]])
    digits = figures.confusion_image(matrix, "test set")
    assert torch.equal(figures.confusion_image(matrix, "test set", ["0", "1"]), digits)
    named = figures.confusion_image(matrix, "test set", ["circle", "triangle"])
    assert named.shape[2] > digits.shape[2]  # the columns widen to their names
    images, predicted, true, confidence = torch.rand(2, 1, 8, 8), torch.tensor([1, 0]), torch.tensor([0, 1]), \
        torch.tensor([0.9, 0.8])
    plain = figures.mistakes_image(images, predicted, true, confidence)
    assert torch.equal(figures.mistakes_image(images, predicted, true, confidence, names=["0", "1"]), plain)
    assert not torch.equal(figures.mistakes_image(images, predicted, true, confidence, names=["cat", "dog"]), plain)
    ax = plots.confusion_figure(matrix, "test set", ["circle", "triangle"]).axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == [t.get_text() for t in ax.get_yticklabels()] == [
        "circle", "triangle"]


def test_a_runs_tensorboard_pictures_name_the_recipes_classes(shared_tiny_data, tmp_path, monkeypatch):
    """The real run's callbacks hand the datamodule's names to the validation and test confusion matrices and the
    worst mistakes."""
    from helpers import tiny_config, train
    from tests.tiny_recipe.data import TinyDataModule

    names = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
    monkeypatch.setattr(TinyDataModule, "class_names", names)
    drawn = []
    confusion, mistakes = figures.confusion_image, figures.mistakes_image
    monkeypatch.setattr(figures, "confusion_image", lambda matrix, title, given=None: drawn.append(
        (title, given)) or confusion(matrix, title, given))
    monkeypatch.setattr(figures, "mistakes_image", lambda *args, names=None, **kwargs: drawn.append(
        ("worst", names)) or mistakes(*args, names=names, **kwargs))
    train(tiny_config(shared_tiny_data, tmp_path / "logs", max_epochs=1, lr=1e-6))  # barely trained: mistakes
    assert [title for title, _ in drawn] == ["validation, epoch 1", "test set", "worst"]
    assert all(tuple(given) == names for _, given in drawn)
