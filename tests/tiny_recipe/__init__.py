"""The engine's tests' recipe: a small MLP on tiny made-up digits (``tiny/train.pt``, ``tiny/test.pt``).

It lives with the tests, so that swapping ``project/recipe/`` leaves the engine's tests as they
are; the tests select it with ``PROJECT_RECIPE=tests.tiny_recipe`` (``tests/conftest.py``).
"""

from project.api import Option, Recipe, sizes

RECIPE = Recipe(
    name="tiny",
    module=".model:LitTiny",
    datamodule=".data:TinyDataModule",
    description="Train a small MLP on tiny made-up digits, then test the best checkpoint.",
    data_help="folder holding tiny/train.pt and tiny/test.pt (default: $DATA_DIR, else data/)",
    options={"hidden": Option([128], sizes, "hidden widths, e.g. 128 or 256,128")},
    defaults={"max_epochs": 6, "batch_size": 256, "optimizer": "sgd", "lr": 0.2, "momentum": 0.9,
              "weight_decay": 5e-4, "scheduler": "onecycle"},
    example_data=".data:write_tiny",
)
