"""A second recipe, to prove the engine works for any: a small CNN on coloured bars (3 x 12 x 16, 4 classes).

The tests copy the template, put this folder in place of ``project/recipe/`` and run the real
scripts on data it writes (``bars/train.pt``, ``bars/test.pt``): no engine file is edited. It
states the settings it trains best with, and its option check enforces what the CNN needs (two
channel counts), so a wrong count is one line, not a traceback.
"""

from project.api import Option, Recipe, sizes_of

RECIPE = Recipe(
    name="bars",
    module=".model:LitCNN",
    datamodule=".data:BarsDataModule",
    description="Train a small CNN on coloured bars, then test the best checkpoint.",
    data_help="folder holding bars/train.pt and bars/test.pt (default: $DATA_DIR, else data/)",
    options={"channels": Option([8, 16], sizes_of(2, "8,16"), "channels of the two convolutions, e.g. 8,16")},
    defaults={"max_epochs": 8, "batch_size": 32, "optimizer": "adamw", "lr": 0.01, "scheduler": "cosine"},
    example_data=".data:write_bars",
)
