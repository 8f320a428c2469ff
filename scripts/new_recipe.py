#!/usr/bin/env python
"""Write a new recipe package: from a folder of images (one folder a class, any sizes, grey or colour), or as a
copy of another recipe (--from).

From images, the package reads its data file by file, declares the mean and std measured on its training images,
trains a small CNN sized to them, and keeps a few resized copies as its example data. Then:
PROJECT_RECIPE=NAME .venv/bin/python scripts/train.py (and check_recipe.py, evaluate.py, predict.py).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from project.config.tool_args import parse_new_recipe_args  # noqa: E402  (light: no torch)
from project.errors import run_cli, say  # noqa: E402


def main(args: argparse.Namespace) -> int:
    from project.scaffold import recipe_from_images, recipe_from_package

    out = Path(args.out)
    if args.images:
        made = recipe_from_images(args.name, Path(args.images), out)
        folder = made.folder
        assert folder is not None
        say(f"recipe {args.name} written to {made.package}: {len(folder.classes)} classes "
            f"({', '.join(folder.classes)}), inputs {folder.channels}x{folder.side}x{folder.side}, mean {made.mean} "
            f"std {made.std} (measured), {made.examples} example images")
    else:
        made = recipe_from_package(args.name, args.from_package, out)
        say(f"recipe {args.name} written to {made.package}, a copy of {args.from_package}")
    here = "" if out.resolve() == ROOT else f"PYTHONPATH={out.resolve()} "  # the scripts find packages in ROOT
    say(f"next: {here}PROJECT_RECIPE={args.name} .venv/bin/python scripts/check_recipe.py")
    data = f" --data-dir {shlex.quote(str(made.folder.root))}" if made.folder is not None else ""  # named nowhere else
    say(f"next: {here}PROJECT_RECIPE={args.name} .venv/bin/python scripts/train.py{data}")
    return 0


if __name__ == "__main__":
    arguments = parse_new_recipe_args(__doc__)
    run_cli(lambda: main(arguments), "new_recipe.py", debug=arguments.debug)
