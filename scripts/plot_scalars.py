#!/usr/bin/env python
"""Draw a run's TensorBoard scalars into one PNG (for reports, or a machine without a browser)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from project.config.tool_args import parse_plot_scalars_args  # noqa: E402  (light: no torch)
from project.errors import run_cli  # noqa: E402

DEFAULT_TAGS = ("train/loss", "train/acc", "val/loss", "val/acc", "train/lr", "train/samples_per_s")


def main(args: argparse.Namespace) -> int:
    from project.results.plots import scalars_figure

    scalars_figure(args.run, args.tags.split(",")).savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    arguments = parse_plot_scalars_args(__doc__, DEFAULT_TAGS)
    run_cli(lambda: main(arguments), "plot_scalars.py", debug=arguments.debug)
