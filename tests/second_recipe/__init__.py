"""A second recipe, to prove the engine works for any: a small CNN on coloured bars (3 x 12 x 16, 4 classes).

The tests copy the template, put this folder in place of ``project/recipe/`` and run the real
scripts on data they make (``bars/train.pt``, ``bars/test.pt``): no engine file is edited.
"""

from project.config.validators import sizes
from project.contract import Option, Recipe

RECIPE = Recipe(
    name="bars",
    module="project.recipe.model:LitCNN",
    datamodule="project.recipe.data:BarsDataModule",
    description="Train a small CNN on coloured bars, then test the best checkpoint.",
    data_help="folder holding bars/train.pt and bars/test.pt (default: $DATA_DIR, else data/)",
    options={"channels": Option([8, 16], sizes, "channels of the two convolutions, e.g. 8,16")},
)
