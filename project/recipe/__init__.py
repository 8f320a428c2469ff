"""The recipe: the part of the template that is yours to change (the engine reads only ``RECIPE``).

- ``model.py``: the plain ``nn.Module`` and the ``LightningModule`` that trains it;
- ``data.py``: the ``LightningDataModule``;
- this file: how the engine finds them, and the recipe's own hyperparameters.

The shipped recipe is the article's: an MLP on MNIST (``mnist_files.py`` reads and checks its
IDX files, ``digits.py`` makes a photo of a digit look like MNIST). Kept light: no torch here.
"""

from project.config.validators import sizes
from project.contract import Option, Recipe

RECIPE = Recipe(
    name="mnist",
    module="project.recipe.model:LitMNIST",
    datamodule="project.recipe.data:MNISTDataModule",
    description="Train the article's MLP on MNIST with PyTorch Lightning, then test the best checkpoint.",
    data_help="folder holding MNIST/raw/ (default: $DATA_DIR, else data/)",
    options={"hidden": Option([128], sizes, "hidden widths, e.g. 128 or 256,128")},
)
