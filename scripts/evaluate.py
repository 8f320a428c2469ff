#!/usr/bin/env python
"""Measure a trained model on the MNIST test set: loss, accuracy, per-class accuracy, confusion matrix."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from project.errors import run_cli  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="evaluate.py", description=__doc__)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--ckpt", default=None, metavar="PATH|best|last",
                        help="a checkpoint, or best/last of the newest run (default: best)")
    source.add_argument("--weights", default=None, metavar="model.pth", help="an exported model.pth")
    parser.add_argument("--data-dir", default=None, help="folder holding MNIST/raw/ (default: $DATA_DIR, else data/)")
    parser.add_argument("--logdir", default="lightning_logs")
    parser.add_argument("--name", default="mnist")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--plot", default=None, metavar="PNG", help="also draw the confusion matrix to this file")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    from project import evaluation, figures
    from project.datamodule import MNISTDataModule

    classifier = evaluation.load_classifier(args.ckpt, args.weights, args.logdir, args.name)
    datamodule = MNISTDataModule(args.data_dir)
    datamodule.setup("test")
    results = evaluation.evaluate(classifier, datamodule.test_set.images, datamodule.test_set.targets)
    print(json.dumps(results, indent=2) if args.json else evaluation.render(results))
    if args.plot:
        title = f"test set, accuracy {results['test/acc']:.4f}"
        import torch

        figures.confusion_figure(torch.tensor(results["confusion_matrix"]), title).savefig(args.plot, dpi=120)
        print(f"confusion matrix drawn to {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_cli(main, "evaluate.py")
