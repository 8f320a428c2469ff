#!/usr/bin/env python
"""Check the installed recipe (PROJECT_RECIPE, else project/recipe) for the classic recipe bugs.

Labels outside [0, num_classes) or a class the training split lacks, a network whose output width is not
num_classes, inputs of another shape or dtype than input_shape, an augment that changes them or draws randomness
outside its generator, declared mean/std that the training split's pixels do not have, test inputs that also
occur in training, evaluation that is random or depends on the batch, and a model that cannot fit one batch or
ends a short run near chance (a longer fit then names the cause, or warns that the recipe only learns slowly).
One line per check; exit status 1 if any failed, 0 with warnings. Runs on the recipe's example data unless
--data-dir names its real data.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from project.config.tool_args import parse_check_recipe_args  # noqa: E402  (light: no torch)
from project.contract import Recipe, installed_recipe  # noqa: E402
from project.errors import run_cli, say  # noqa: E402


def main(recipe: Recipe, args: argparse.Namespace) -> int:
    import tempfile

    from project.training.callbacks import quiet_lightning_info
    from project.training.recipe_checks import check_config, check_recipe

    quiet_lightning_info()  # the checks' findings, not the banners of the Trainers they run

    with tempfile.TemporaryDirectory(prefix="recipe-data-") as scratch:
        data_dir = args.data_dir or str(recipe.write_example_data(Path(scratch)))
        config = check_config(recipe, data_dir, examples=not args.data_dir, max_epochs=args.max_epochs)
        say(f"recipe {recipe.package} on " + (data_dir if args.data_dir else
                                               f"its example data (batch {config.batch_size})"))
        findings = check_recipe(config, recipe, learn=not args.no_learn)
        for finding in findings:
            say(finding.line())
    failed = sum(finding.problem is not None for finding in findings)
    warned = sum(finding.warning is not None for finding in findings)
    say(f"{failed} of {len(findings)} checks failed" if failed else
        f"all {len(findings)} checks passed" + (f", {warned} with a warning" if warned else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    RECIPE = installed_recipe()
    arguments = parse_check_recipe_args(__doc__)
    run_cli(lambda: main(RECIPE, arguments), "check_recipe.py", debug=arguments.debug)
