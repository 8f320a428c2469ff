"""Many experiments: saved configs that reproduce runs, Optuna sweeps on a real SQLite study, extra loggers."""

import csv
import importlib.util
import json
import subprocess
import sys

import optuna
import pytest
import torch
import yaml

from helpers import ROOT, tiny_config
from project.build import build_loggers
from project.config import RunConfig
from project.errors import UsageError
from project.run import train
from project.sweep import Objective, grid, load_space, open_study

SWEEP = str(ROOT / "scripts" / "sweep.py")


def test_saved_config_reproduces_the_run_bitwise(shared_tiny_mnist, tmp_path):
    from project.cli import parse_run_config

    train(tiny_config(shared_tiny_mnist, tmp_path / "logs", max_epochs=2, hidden=[64, 32], seed=3,
                      optimizer="adamw", lr=0.003))
    run = tmp_path / "logs" / "mnist" / "version_0"
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["hidden"] == [64, 32] and config["seed"] == 3 and config["optimizer"] == "adamw"
    train(parse_run_config(["--config", str(run / "config.yaml")]))
    a = torch.load(run / "model.pth", weights_only=True)
    b = torch.load(tmp_path / "logs" / "mnist" / "version_1" / "model.pth", weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_csv_logger_writes_the_same_metric_names(shared_tiny_mnist, tmp_path):
    train(tiny_config(shared_tiny_mnist, tmp_path / "logs", max_epochs=1, logger="tensorboard,csv"))
    run = tmp_path / "logs" / "mnist" / "version_0"
    with open(run / "metrics.csv") as stream:
        columns = set(next(csv.reader(stream)))
    assert {"train/loss", "train/acc", "val/loss", "val/acc", "test/loss", "test/acc", "lr-SGD"} <= columns
    assert list(run.glob("events.out.tfevents.*"))  # both loggers share the run folder
    assert [p.name for p in (tmp_path / "logs" / "mnist").iterdir()] == ["version_0"]


@pytest.mark.parametrize("logger", ["wandb", "mlflow"])
def test_a_logger_whose_package_is_missing_gets_a_clear_message(logger):
    if importlib.util.find_spec(logger):
        pytest.skip(f"{logger} is installed here")
    with pytest.raises(UsageError) as err:
        build_loggers(RunConfig(logger=logger))
    assert str(err.value) == f"--logger {logger} needs the {logger} package: pip install -e '.[{logger}]'"
    with pytest.raises(UsageError, match="choose from tensorboard, csv, wandb, mlflow"):
        build_loggers(RunConfig(logger="tensorboard,papyrus"))


# ---------------------------------------------------------------- sweeps

SPACE = """
fixed:
  scheduler: none
  batch_size: 32
params:
  lr: {type: categorical, choices: [0.2, 1.0e-7]}
  max_epochs: {type: int, low: 2, high: 3}
"""


def sweep(space, storage, data, logdir, trials, *extra):
    return [sys.executable, SWEEP, "--space", str(space), "--storage", storage, "--data-dir", str(data),
            "--logdir", str(logdir), "--val-size", "40", "--n-trials", str(trials), *extra]


@pytest.mark.slow
def test_sweep_resumes_shares_storage_prunes_and_reports(tiny_mnist, tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    logdir = tmp_path / "logs"
    # The first 4 trials in this process (the objective sweep.py runs), the rest by sweep.py itself.
    fixed, params = load_space(space)
    folder = logdir / "sweeps" / "mnist-sweep"
    base = {"data_dir": str(tiny_mnist), "val_size": 40, "logdir": str(folder), "name": "trials",
            "trainer": {"enable_progress_bar": False}}
    open_study("mnist-sweep", storage, "median", 0).optimize(Objective(fixed, params, base, folder), n_trials=4)
    study = optuna.load_study(study_name="mnist-sweep", storage=storage)
    before = {t.number: (t.params, t.state, t.value) for t in study.trials}
    assert len(before) == 4

    # Two more processes on the same storage: each resumes the study, and they share it.
    workers = [subprocess.Popen(sweep(space, storage, tiny_mnist, logdir, 2), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [w.communicate(timeout=300) for w in workers]
    assert [w.returncode for w in workers] == [0, 0], outputs
    assert all("trials so far; running 2 more" in out for out, _ in outputs)
    assert any("4 trials so far" in out for out, _ in outputs)
    study = optuna.load_study(study_name="mnist-sweep", storage=storage)
    numbers = [t.number for t in study.trials]
    assert len(numbers) == 8 and sorted(numbers) == list(range(8))
    assert {t.number: (t.params, t.state, t.value) for t in study.trials if t.number < 4} == before
    assert any(t.state == optuna.trial.TrialState.PRUNED for t in study.trials)  # lr 1e-7 never learns

    folder = logdir / "sweeps" / "mnist-sweep"
    best = yaml.safe_load((folder / "best.yaml").read_text())
    assert best["lr"] == 0.2 and best["scheduler"] == "none"
    assert (folder / "history.png").stat().st_size > 5000
    assert len(list((folder / "trials").iterdir())) == 8  # every trial logged to TensorBoard
    assert "| trial | val/acc |" in outputs[0][0] + outputs[1][0]
    from project.cli import parse_run_config

    best_run = train(parse_run_config(["--config", str(folder / "best.yaml"), "--data-dir", str(tiny_mnist),
                                       "--logdir", str(tmp_path / "best-run"), "--val-size", "40"]))
    assert best_run.config.lr == 0.2 and best_run.test_metrics["test/acc"] > 0


SPACES = [
    ("params:\n  lr: {type: float, low: 1, high: 0.1}\n", "params.lr: 'low' (1) must be below 'high' (0.1)"),
    ("params:\n  speed: {type: float, low: 0, high: 1}\n", "params.speed: not a train.py flag"),
    ("params:\n  lr: {type: gaussian}\n", "params.lr: needs 'type: float'"),
    ("params:\n  optimizer: {type: categorical, choices: []}\n", "params.optimizer: 'choices' must be a non-empty"),
    ("params:\n  lr: {type: float, low: 0, high: 1, log: true}\n", "params.lr: a log scale needs 'low' > 0"),
    ("searchspace: {}\n", "unknown top-level key 'searchspace'"),
    ("fixed:\n  colour: red\nparams:\n  lr: {type: float, low: 0.1, high: 1}\n", "fixed.colour: not a train.py flag"),
    ("fixed:\n  batch_size: 0\nparams:\n  lr: {type: float, low: 0.1, high: 1}\n",
     "fixed: batch_size: must be a positive integer"),
]


@pytest.mark.parametrize(("space", "message"), SPACES)
def test_bad_search_spaces_name_the_key(tmp_path, space, message):
    path = tmp_path / "space.yaml"
    path.write_text(space)
    with pytest.raises(UsageError) as err:
        load_space(path)
    assert message in str(err.value) and str(path) in str(err.value)


@pytest.mark.slow
def test_a_grid_sweep_over_device_counts_runs_each_combination_once(tiny_mnist, tmp_path):
    """Trials on 2 devices run as their own train.py (DDP re-runs that command, not the sweep)."""
    space = tmp_path / "space.yaml"
    space.write_text("fixed:\n  scheduler: none\n  batch_size: 32\n  max_epochs: 1\n  accelerator: cpu\n"
                     "params:\n  devices: {type: int, low: 1, high: 2}\n"
                     "  momentum: {type: categorical, choices: [0.9]}\n")
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    done = subprocess.run(sweep(space, storage, tiny_mnist, tmp_path / "logs", 10, "--sampler", "grid"),
                          capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 trials so far; running 10 more (grid of 2)" in done.stdout
    study = optuna.load_study(study_name="mnist-sweep", storage=storage)
    combinations = sorted((t.params["devices"], t.params["momentum"]) for t in study.trials)
    assert combinations == [(1, 0.9), (2, 0.9)]  # each once, then the grid stops
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    trials = tmp_path / "logs" / "sweeps" / "mnist-sweep" / "trials"
    for trial in study.trials:
        results = json.loads((trials / f"trial_{trial.number:03d}" / "results.json").read_text()) \
            if trial.params["devices"] == 2 else None
        if results is not None:
            assert results["world_size"] == 2 and results["val/acc_best"] == pytest.approx(trial.value)
    assert sorted(p.name for p in trials.iterdir()) == [f"trial_{n:03d}" for n in range(2)]
    assert "Traceback" not in done.stderr and "Warning" not in done.stderr


def test_grid_values_come_from_choices_or_steps():
    params = {"optimizer": {"type": "categorical", "choices": ["sgd", "adamw"]},
              "max_epochs": {"type": "int", "low": 2, "high": 6, "step": 2},
              "lr": {"type": "float", "low": 0.1, "high": 0.3, "step": 0.1}}
    values = grid(params)
    assert values["optimizer"] == ["sgd", "adamw"] and values["max_epochs"] == [2, 4, 6]
    assert values["lr"] == pytest.approx([0.1, 0.2, 0.3])
    with pytest.raises(UsageError, match="params.momentum needs 'choices' or a 'step' to be a grid"):
        grid({"momentum": {"type": "float", "low": 0.8, "high": 0.99}})


def test_fast_dev_run_smoke_tests_a_sweep(tiny_mnist, tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text("fixed:\n  fast_dev_run: true\nparams:\n  lr: {type: categorical, choices: [0.2, 0.05]}\n")
    fixed, params = load_space(path)
    assert fixed == {"fast_dev_run": True}
    folder = tmp_path / "logs" / "sweeps" / "smoke"
    base = {"data_dir": str(tiny_mnist), "val_size": 40, "logdir": str(folder), "name": "trials",
            "trainer": {"enable_progress_bar": False}}
    study = open_study("smoke", f"sqlite:///{tmp_path / 'study.db'}", "none", 0, "grid", params)
    study.optimize(Objective(fixed, params, base, folder), n_trials=5)
    assert sorted(t.params["lr"] for t in study.trials) == [0.05, 0.2]  # the grid, once each
    assert all(t.state == optuna.trial.TrialState.COMPLETE and 0 <= t.value <= 1 for t in study.trials)
