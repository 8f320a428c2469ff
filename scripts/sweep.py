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

from project.cli import positive_int  # noqa: E402
from project.errors import run_cli  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sweep.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--space", default="configs/sweep.yaml", help="search space (YAML)")
    parser.add_argument("--n-trials", type=positive_int, default=20, help="trials this process runs")
    parser.add_argument("--storage", default="sqlite:///sweeps.db", help="any SQLAlchemy URL")
    parser.add_argument("--study-name", default="mnist-sweep")
    parser.add_argument("--pruner", default="median", choices=("median", "halving", "none"))
    parser.add_argument("--sampler-seed", type=int, default=None, help="seed Optuna's TPE sampler")
    parser.add_argument("--data-dir", default=None, help="folder holding MNIST/raw/ (default: $DATA_DIR, else data/)")
    parser.add_argument("--logdir", default="lightning_logs", help="trials log to LOGDIR/sweeps/STUDY/trials/")
    parser.add_argument("--val-size", type=positive_int, default=5000)
    parser.add_argument("--accelerator", default="auto", choices=("auto", "cpu", "gpu", "cuda", "mps"))
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    from project import sweep

    fixed, params = sweep.load_space(args.space)
    sweep.quiet()
    import optuna

    pruners = {"median": lambda: optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=1),
               "halving": optuna.pruners.SuccessiveHalvingPruner, "none": optuna.pruners.NopPruner}
    study = optuna.create_study(
        study_name=args.study_name, storage=sweep.storage_for(args.storage), direction="maximize",
        load_if_exists=True, pruner=pruners[args.pruner](), sampler=optuna.samplers.TPESampler(seed=args.sampler_seed),
    )
    folder = Path(args.logdir) / "sweeps" / args.study_name
    base = {"data_dir": args.data_dir, "val_size": args.val_size, "accelerator": args.accelerator,
            "logdir": str(folder), "name": "trials"}
    print(f"study {args.study_name} in {args.storage}: {len(study.trials)} trials so far; running {args.n_trials} more",
          flush=True)
    study.optimize(sweep.Objective(fixed, params, base, folder), n_trials=args.n_trials)
    print(sweep.report(study, fixed, folder))
    return 0


if __name__ == "__main__":
    run_cli(main, "sweep.py")
