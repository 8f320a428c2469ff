"""The recipe: the part of the template that is yours to change (the engine reads only ``RECIPE``).

- ``model.py``: the plain ``nn.Module`` and the ``LightningModule`` that trains it;
- ``data.py``: the ``LightningDataModule`` (``example.py``: a small dataset in the same files, for tests);
- ``configs/*.yaml``: presets (``--config article``), ``sweep.yaml``: the search space of ``sweep.py``;
- ``tests/``: this recipe's own tests (they go where the recipe goes);
- this file: how the engine finds them, the recipe's own hyperparameters and the settings it trains best with.

The shipped recipe is the article's: an MLP on MNIST (``mnist_files.py`` reads and checks its
IDX files, ``digits.py`` makes a photo of a digit look like MNIST). Kept light: no torch here.
"""

from project.api import Option, Recipe, sizes

RECIPE = Recipe(
    name="mnist",
    module=".model:LitMNIST",
    datamodule=".data:MNISTDataModule",
    description="Train the article's MLP on MNIST with PyTorch Lightning, then test the best checkpoint.",
    data_help="folder holding MNIST/raw/ (default: $DATA_DIR, else data/)",
    options={"hidden": Option([128], sizes, "hidden widths, e.g. 128 or 256,128")},
    # The article's MLP reaches 98 % in 6 epochs this way (the article's own SGD at 0.01: configs/article.yaml).
    defaults={"max_epochs": 6, "batch_size": 256, "optimizer": "sgd", "lr": 0.2, "momentum": 0.9,
              "weight_decay": 5e-4, "scheduler": "onecycle"},
    example_data=".example:write_example_digits",
)
