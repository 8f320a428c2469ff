"""A recipe whose data is a folder of image files, read sample by sample: the common case of data on disk.

``shapes/train/<class>/*.png`` and ``shapes/test/<class>/*.png`` (torchvision's ``ImageFolder``
layout), read by DataLoader workers, with a seeded random flip for training. The engine's tests
select it with ``PROJECT_RECIPE=tests.disk_recipe``; swapped in as ``project/recipe/`` it is a
user's recipe like any other.
"""

from project.api import Option, Recipe, sizes_of

RECIPE = Recipe(
    name="shapes",
    module=".model:LitShapes",
    datamodule=".data:ShapesDataModule",
    description="Train a small CNN on a folder of shape images, then test the best checkpoint.",
    data_help="folder holding shapes/train/CLASS/*.png and shapes/test/CLASS/*.png (default: $DATA_DIR, else data/)",
    options={"channels": Option([8, 16], sizes_of(2, "8,16"), "channels of the two convolutions, e.g. 8,16")},
    defaults={"max_epochs": 4, "batch_size": 32, "optimizer": "adamw", "lr": 0.01, "scheduler": "cosine",
              "num_workers": 2},
    example_data=".data:write_shapes",
)
