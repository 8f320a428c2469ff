#!/usr/bin/env python
"""Epoch time of several ways to train the recipe, measured side by side in one process.

Rows: the article's loop (fixed only to run), a lean hand-written tensor loop (and, on a GPU, the same
loop captured as a CUDA graph: the bound), bare Lightning (Lightning's own per-step floor), the template
with 1 and with auto steps per call (and, on a GPU, with CUDA graphs), and the template with the
per-sample torchvision loader; ratios are to the hand-written loops. Each row is printed and written as
soon as it is measured.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from project.config.tool_args import parse_benchmark_args  # noqa: E402  (light: no torch)
from project.contract import Recipe, installed_recipe  # noqa: E402
from project.errors import UsageError, run_cli  # noqa: E402


def main(recipe: Recipe, args: argparse.Namespace) -> int:
    import tempfile

    from project.benchmark import runner as bench
    with tempfile.TemporaryDirectory(prefix="benchmark-data-") as scratch:
        if args.example_data:
            if recipe.example_data is None:
                raise UsageError(f"--example-data: the recipe {recipe.package} names no example_data")
            args.val_size = 0.2 if args.val_size is None else args.val_size  # the example is small
            args.data_dir = str(recipe.write_example_data(Path(scratch), args.example_data,
                                                          max(args.example_data // 4, 1)))
        results = bench.run_all(recipe, args, Path(args.out))
        if args.time_to_accuracy:
            results["time_to_accuracy"] = bench.time_to_accuracy(Path(__file__).with_name("train.py"),
                                                                 args.data_dir)
    bench.report(results, Path(args.out))
    return 0


if __name__ == "__main__":
    RECIPE = installed_recipe()
    arguments = parse_benchmark_args(RECIPE, __doc__)
    run_cli(lambda: main(RECIPE, arguments), "benchmark.py", debug=arguments.debug)
