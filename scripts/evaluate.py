#!/usr/bin/env python
"""Measure a trained model on the recipe's test set, or on a folder of class folders of image files: loss, accuracy,
per-class accuracy, confusion matrix."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from project.config.tool_args import parse_evaluate_args  # noqa: E402  (light: no torch)
from project.contract import Recipe, installed_recipe  # noqa: E402
from project.errors import run_cli  # noqa: E402


def main(recipe: Recipe, args: argparse.Namespace) -> int:
    from project.results import evaluation

    classifier = evaluation.load_classifier(recipe, args.ckpt, args.weights, args.logdir, args.name)
    print(f"evaluate.py: using {classifier.describe()}", file=sys.stderr)
    failures: list[tuple[Path, str]] = []
    if args.images:
        results, failures = evaluation.evaluate_folder(recipe, classifier, Path(args.images))
        for path, reason in failures:
            print(f"evaluate.py: {path}: {reason} (left out)", file=sys.stderr)
    else:
        data_dir = evaluation.test_data_dir(classifier, args.data_dir)
        if data_dir != args.data_dir:
            print(f"evaluate.py: test set from {data_dir}, the data its run trained on", file=sys.stderr)
        results = evaluation.evaluate_test_set(recipe, classifier, data_dir)
    print(json.dumps(results, indent=2) if args.json else evaluation.render(results))
    if args.plot:
        evaluation.plot_confusion(results, args.plot)
        print(f"confusion matrix drawn to {args.plot}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    RECIPE = installed_recipe()
    arguments = parse_evaluate_args(RECIPE, __doc__)
    run_cli(lambda: main(RECIPE, arguments), "evaluate.py", debug=arguments.debug)
