#!/usr/bin/env python
"""Hyperparameter sweep with Optuna: each trial is a real training run; the study lives in a storage.

Running the same command again resumes the study. Trials run on every device at once (one
worker per GPU, or --workers N); processes on other machines pointed at the same PostgreSQL
--storage share the study.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from project.config.tool_args import parse_sweep_args  # noqa: E402  (light: no torch)
from project.contract import Recipe, installed_recipe  # noqa: E402
from project.errors import run_cli  # noqa: E402


def main(recipe: Recipe, args: argparse.Namespace) -> int:
    from project.sweeps import report as sweep_report
    from project.sweeps import storage as sweep_storage
    from project.sweeps import study as sweep
    from project.sweeps import workers as sweep_workers

    study, storage, objective = sweep.prepare(recipe, args)
    workers = sweep_workers.plan_workers(args.workers, objective.trial_config({}), objective.params)
    if not args.worker:
        grid = f" (grid of {sweep.grid_size(objective.params)})" if args.sampler == "grid" else ""
        print(f"study {args.study_name} in {sweep_storage.describe(args.storage)}: {len(study.trials)} trials so far;"
              f" running {args.n_trials} more{grid} on {len(workers)} worker(s) "
              f"({' | '.join(w.describe() for w in workers)})", flush=True)
    if len(workers) > 1:
        sweep_workers.run_workers(workers, args.n_trials, sys.argv[1:], args.sampler_seed)
    else:
        sweep.run_trials(study, storage, objective, args.n_trials)
    if not args.worker:
        print(sweep_report.report(study, recipe, objective.fixed, objective.folder))
    return 0


if __name__ == "__main__":
    RECIPE = installed_recipe()
    arguments = parse_sweep_args(RECIPE, __doc__)
    run_cli(lambda: main(RECIPE, arguments), "sweep.py", debug=arguments.debug)
