"""The article's MLP and its export into the article's own nn.Sequential."""

import pytest
import torch
from torch import nn
from torchvision import transforms

from project.contract import load_recipe
from project.recipe.mnist_files import MNIST_MEAN, MNIST_STD
from project.recipe.model import MLP, build_sequential, export_state_dict, hidden_sizes_of
from project.results.evaluation import load_classifier


def test_accepts_images_and_flat_vectors():
    model = MLP()
    images = torch.randn(5, 1, 28, 28)
    out_images = model(images)
    out_flat = model(images.reshape(5, 784))
    assert out_images.shape == (5, 10)
    torch.testing.assert_close(out_images, out_flat)
    # log-probabilities: each row's probabilities sum to one
    torch.testing.assert_close(out_images.exp().sum(1), torch.ones(5))


def test_hidden_layers_are_configurable():
    model = MLP(hidden=(256, 64))
    widths = [m.out_features for m in model.modules() if isinstance(m, nn.Linear)]
    assert widths == [256, 64, 10]
    with pytest.raises(ValueError):
        MLP(hidden=())
    with pytest.raises(ValueError):
        MLP(hidden=(0,))


def test_export_loads_strictly_into_the_articles_sequential_and_predicts_the_same(tmp_path):
    torch.manual_seed(0)
    model = MLP().eval()
    path = tmp_path / "model.pth"
    torch.save(export_state_dict(model), path)

    article = nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10), nn.LogSoftmax(dim=1))
    article.load_state_dict(torch.load(path, weights_only=True), strict=True)

    pixels = torch.randint(0, 256, (16, 28, 28), dtype=torch.uint8).numpy()
    to_tensor = transforms.ToTensor()
    raw = torch.stack([to_tensor(p) for p in pixels])  # the article's preprocessing only
    normalised = (raw - MNIST_MEAN) / MNIST_STD
    with torch.no_grad():
        expected = model(normalised)
        got = article(raw.reshape(16, -1))
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    assert torch.equal(got.argmax(1), expected.argmax(1))


def test_exported_deeper_model_round_trips(tmp_path):
    model = MLP(hidden=(64, 32)).eval()
    path = tmp_path / "model.pth"
    torch.save(export_state_dict(model), path)
    assert hidden_sizes_of(torch.load(path, weights_only=True)) == (64, 32)
    # takes normalised images, like the MLP
    classifier = load_classifier(load_recipe("project.recipe"), weights=str(path))
    assert isinstance(classifier.network.network, nn.Sequential)  # the article's layout, fed normalised images
    assert len(classifier.network.network) == len(build_sequential((64, 32)))
    x = torch.randn(3, 1, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(classifier(x), model(x), atol=1e-4, rtol=1e-4)
