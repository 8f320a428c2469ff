#!/usr/bin/env python
"""Hyperparameter sweep with Optuna: each trial is a real training run; the study lives in a database.

Running the same command again resumes the study; several processes (or machines, with a
PostgreSQL URL) pointed at one --storage share its trials.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from project.cli import parse_sweep_args  # noqa: E402  (light: no torch)
from project.errors import run_cli  # noqa: E402


def main(args: argparse.Namespace) -> int:
    from project import sweep, sweep_report

    study, objective = sweep.prepare(args)
    print(f"study {args.study_name} in {args.storage}: {len(study.trials)} trials so far; running {args.n_trials} more"
          + (f" (grid of {sweep.grid_size(objective.params)})" if args.sampler == "grid" else ""), flush=True)
    study.optimize(objective, n_trials=args.n_trials)
    print(sweep_report.report(study, objective.fixed, objective.folder))
    return 0


if __name__ == "__main__":
    arguments = parse_sweep_args(__doc__)
    run_cli(lambda: main(arguments), "sweep.py", debug=arguments.debug)
