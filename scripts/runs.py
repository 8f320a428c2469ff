#!/usr/bin/env python
"""List the runs under a log folder, newest first: folder, state, test/acc, best checkpoint, when it started.

A run is any folder of LOGDIR/NAME a run wrote (version_N, a --run-version name, a SLURM job's job_<id>).
Its state: finished, stopped at step N (SIGTERM, Ctrl-C), killed at step N (no end recorded and no process
holding it), running, failed (with its one line), and smoke where --trainer.limit_* or max_steps cut it short.
The scripts that take "the newest run" (evaluate.py, predict.py, --resume last) take the first that is not
a smoke run.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from project.config.tool_args import parse_runs_args  # noqa: E402  (light: no torch)
from project.contract import Recipe, installed_recipe  # noqa: E402
from project.errors import one_field, run_cli, say  # noqa: E402


def main(recipe: Recipe, args: argparse.Namespace) -> int:
    from project.reliability.run_folder import runs

    found = runs(args.logdir, args.name)
    if not found:
        say(f"no runs under {Path(args.logdir, args.name)}")
        return 0
    rows = [("run", "state", "test/acc", "best checkpoint", "started")]
    for run in found:
        started = time.strftime("%Y-%m-%d %H:%M", time.localtime(run.started))
        rows.append((one_field(str(run.folder)), one_field(run.describe()),
                     f"{run.test_acc:.4f}" if run.test_acc is not None else "-",
                     one_field(run.best.name) if run.best else "-", started))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        say("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    return 0


if __name__ == "__main__":
    RECIPE = installed_recipe()
    arguments = parse_runs_args(RECIPE, __doc__)
    run_cli(lambda: main(RECIPE, arguments), "runs.py", debug=arguments.debug)
