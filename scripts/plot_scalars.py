#!/usr/bin/env python
"""Draw a run's TensorBoard scalars into one PNG (for reports, or a machine without a browser)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from project.errors import UserError, run_cli  # noqa: E402

DEFAULT_TAGS = ("train/loss", "train/acc", "val/loss", "val/acc", "lr-SGD", "perf/samples_per_s")


def main() -> int:
    parser = argparse.ArgumentParser(prog="plot_scalars.py", description=__doc__)
    parser.add_argument("run", help="a run folder, e.g. lightning_logs/mnist/version_0")
    parser.add_argument("--out", default="scalars.png")
    parser.add_argument("--tags", default=",".join(DEFAULT_TAGS), help="comma-separated scalar tags")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    args = parser.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(args.run, size_guidance={"scalars": 0})
    events.Reload()
    available = set(events.Tags()["scalars"])
    tags = [t for t in args.tags.split(",") if t in available]
    if not tags:
        raise UserError(f"{args.run}: none of the tags {args.tags} are in its event files")
    columns = min(3, len(tags))
    rows = (len(tags) + columns - 1) // columns
    fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 2.8 * rows), squeeze=False)
    for ax, tag in zip(axes.flat, tags, strict=False):
        points = events.Scalars(tag)
        ax.plot([p.step for p in points], [p.value for p in points], marker="o" if len(points) < 20 else None)
        ax.set_title(tag)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(tags):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    run_cli(main, "plot_scalars.py")
