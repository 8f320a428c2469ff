#!/usr/bin/env python
"""Classify image files (PNG, JPEG, ...; any size), each read as the recipe reads images.

Prints PATH<TAB>CLASS<TAB>PROBABILITY per image; a file that cannot be used gets one line on
stderr and the others are still classified (exit code 1 if any failed).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from project.config.tool_args import parse_predict_args  # noqa: E402  (light: no torch)
from project.contract import Recipe, installed_recipe  # noqa: E402
from project.errors import run_cli  # noqa: E402


def main(recipe: Recipe, args: argparse.Namespace) -> int:
    from project.results.evaluation import load_classifier
    from project.results.prediction import classify_files, render_row

    classifier = load_classifier(recipe, args.ckpt, args.weights, args.logdir, args.name)
    print(f"predict.py: using {classifier.describe()}", file=sys.stderr)
    results, failures = [], 0
    for path, outcome in classify_files(recipe, classifier, args.inputs, args.topk):
        if isinstance(outcome, str):
            failures += 1
            print(f"predict.py: {path}: {outcome}", file=sys.stderr)
        else:
            results.append(outcome)
            if not args.json:
                print(render_row(outcome), flush=True)
    if args.json:
        print(json.dumps({"model": classifier.source, "results": results, "failed": failures}, indent=2))
    return 1 if failures else 0


if __name__ == "__main__":
    RECIPE = installed_recipe()
    arguments = parse_predict_args(RECIPE, __doc__)
    run_cli(lambda: main(RECIPE, arguments), "predict.py", debug=arguments.debug)
