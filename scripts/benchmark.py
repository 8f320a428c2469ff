#!/usr/bin/env python
"""Epoch time of four ways to train the article's MLP, measured side by side in one process.

(a) the article's loop (fixed only to run), (b) a lean hand-written tensor loop,
(c) the template (in-memory loader), (d) the template with the per-sample torchvision loader.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from project.cli import positive_int  # noqa: E402
from project.errors import run_cli  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="benchmark.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch-size", type=positive_int, default=64)
    parser.add_argument("--epochs", type=positive_int, default=3, help="timed epochs, after one warm-up epoch")
    parser.add_argument("--accelerator", default="auto", choices=("auto", "cpu", "gpu", "cuda", "mps"))
    parser.add_argument("--precision", default="32")
    parser.add_argument("--data-dir", default=None, help="folder holding MNIST/raw/ (default: $DATA_DIR, else data/)")
    parser.add_argument("--limit", type=positive_int, default=None,
                        help="train on only this many samples (smoke tests)")
    parser.add_argument("--only", default="a,b,c,d", help="which implementations to run, e.g. b,c")
    parser.add_argument("--no-time-to-accuracy", action="store_true",
                        help="skip timing the whole default scripts/train.py command")
    parser.add_argument("--out", default="benchmark-results", help="folder for benchmark.json/.md/.png")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    from project import bench

    results = bench.run_all(args)
    if not args.no_time_to_accuracy:
        results["time_to_accuracy"] = bench.time_to_accuracy(ROOT / "scripts" / "train.py", args.data_dir)
    bench.report(results, Path(args.out))
    return 0


if __name__ == "__main__":
    run_cli(main, "benchmark.py")
