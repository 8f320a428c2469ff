#!/usr/bin/env python
"""Classify image files of handwritten digits (PNG, JPEG, ...; any size, either polarity).

Prints PATH<TAB>DIGIT<TAB>PROBABILITY per image; a file that cannot be used gets one line on
stderr and the others are still classified (exit code 1 if any failed).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from project.cli import positive_int  # noqa: E402
from project.errors import run_cli  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="predict.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("inputs", nargs="+", metavar="IMAGE|DIR")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--ckpt", default=None, metavar="PATH|best|last",
                        help="a checkpoint, or best/last of the newest run (default: best)")
    source.add_argument("--weights", default=None, metavar="model.pth", help="an exported model.pth")
    parser.add_argument("--logdir", default="lightning_logs")
    parser.add_argument("--name", default="mnist")
    parser.add_argument("--topk", type=positive_int, default=1, help="show the K most likely digits")
    parser.add_argument("--json", action="store_true", help="one JSON document with every result")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    import torch

    from project.evaluation import load_classifier
    from project.images import ImageError, image_files, load_digit

    classifier = load_classifier(args.ckpt, args.weights, args.logdir, args.name)
    results, failures = [], 0
    for path in image_files(args.inputs):
        try:
            image = load_digit(path)
        except ImageError as err:
            failures += 1
            print(f"predict.py: {path}: {err}", file=sys.stderr)
            continue
        with torch.no_grad():
            probs = classifier(image.unsqueeze(0))[0].exp()
        top = probs.topk(min(args.topk, 10))
        ranked = [(int(d), float(p)) for p, d in zip(top.values, top.indices, strict=True)]
        results.append({"path": str(path), "digit": ranked[0][0], "probability": ranked[0][1], "topk": ranked})
        if not args.json:
            extra = "".join(f"\t{d}:{p:.4f}" for d, p in ranked[1:])
            print(f"{path}\t{ranked[0][0]}\t{ranked[0][1]:.4f}{extra}", flush=True)
    if args.json:
        print(json.dumps({"model": classifier.source, "results": results, "failed": failures}, indent=2))
    return 1 if failures else 0


if __name__ == "__main__":
    run_cli(main, "predict.py")
