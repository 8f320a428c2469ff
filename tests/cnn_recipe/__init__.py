"""A compute-bound recipe for the benchmark: a CNN whose step is math, not the framework's overhead.

3 x 32 x 32 inputs (``blocks/train.pt``, ``blocks/test.pt``), three stages of two 3x3 convolutions
with batch norm (widths 64, 128, 256 by default), kept channels-last, bf16-mixed at batch 512 on
a GPU. ``PROJECT_RECIPE=tests.cnn_recipe python scripts/benchmark.py --example-data 20000`` times it
against a hand-written loop of the same network; swapped in as ``project/recipe/`` it is a user's
recipe like any other.
"""

from project.api import Option, Recipe, sizes_of

RECIPE = Recipe(
    name="blocks",
    module=".model:LitBlocksCNN",
    datamodule=".data:BlocksDataModule",
    description="Train a CNN on coloured blocks (3 x 32 x 32), then test the best checkpoint.",
    data_help="folder holding blocks/train.pt and blocks/test.pt (default: $DATA_DIR, else data/)",
    options={"widths": Option([64, 128, 256], sizes_of(3, "64,128,256"),
                              "channels of the three stages, e.g. 64,128,256")},
    defaults={"max_epochs": 4, "batch_size": 512, "optimizer": "sgd", "lr": 0.1, "momentum": 0.9,
              "weight_decay": 5e-4, "scheduler": "onecycle"},
    example_data=".data:write_blocks",
)
