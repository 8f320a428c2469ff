"""Many experiments: config files, Optuna sweeps on a real SQLite study, and extra loggers."""

import csv
import importlib.util
import subprocess
import sys

import optuna
import pytest
import torch
import yaml
from test_train_script import tiny_run

from conftest import ROOT, run_script
from project.cli import parse_args

SWEEP = str(ROOT / "scripts" / "sweep.py")


def test_command_line_overrides_the_config_file(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("max_epochs: 3\nbatch-size: 128\nhidden: [256, 128]\ndeterministic: true\n")
    args = parse_args(["--config", str(config), "--max-epochs", "4"])
    assert (args.max_epochs, args.batch_size, args.hidden, args.deterministic) == (4, 128, [256, 128], True)


@pytest.mark.parametrize(("text", "message"), [
    ("bogus: 1\n", "unknown key 'bogus'"),
    ("batch_size: -3\n", "--batch-size: must be a positive integer"),
    ("deterministic: maybe\n", "deterministic must be true or false"),
    ("- just\n- a list\n", "expected a mapping"),
])
def test_bad_config_files_are_refused_naming_the_file(tmp_path, text, message):
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    done = run_script("train.py", "--config", str(config))
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr
    if "unknown key" in message:
        assert str(config) in done.stderr


@pytest.mark.parametrize("preset", ["article", "fast", "gpu-ddp"])
def test_presets_parse(preset):
    args = parse_args(["--config", str(ROOT / "configs" / f"{preset}.yaml")])
    if preset == "article":
        assert (args.lr, args.batch_size, args.max_epochs, args.scheduler) == (0.01, 64, 10, "none")
    if preset == "fast":  # the preset is the default recipe, flag for flag
        assert {**vars(args), "config": None} == vars(parse_args([]))
    if preset == "gpu-ddp":
        assert (args.devices, args.precision, args.strategy) == (2, "16-mixed", "ddp")


@pytest.mark.slow
def test_saved_config_reproduces_the_run_bitwise(tiny_mnist, tmp_path):
    first = tiny_run(tiny_mnist, tmp_path / "logs", "--max-epochs", "2", "--hidden", "64,32", "--seed", "3",
                     "--optimizer", "adamw", "--lr", "0.003")
    assert first.returncode == 0, first.stderr
    run = tmp_path / "logs" / "mnist" / "version_0"
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["hidden"] == [64, 32] and config["seed"] == 3 and config["optimizer"] == "adamw"
    again = run_script("train.py", "--config", str(run / "config.yaml"), "--data-dir", str(tiny_mnist))
    assert again.returncode == 0, again.stderr
    a = torch.load(run / "model.pth", weights_only=True)
    b = torch.load(tmp_path / "logs" / "mnist" / "version_1" / "model.pth", weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_csv_logger_writes_the_same_metric_names(tiny_mnist, tmp_path):
    done = tiny_run(tiny_mnist, tmp_path / "logs", "--max-epochs", "1", "--logger", "tensorboard,csv")
    assert done.returncode == 0, done.stderr
    run = tmp_path / "logs" / "mnist" / "version_0"
    with open(run / "metrics.csv") as stream:
        columns = set(next(csv.reader(stream)))
    assert {"train/loss", "train/acc", "val/loss", "val/acc", "test/loss", "test/acc", "lr-SGD"} <= columns
    assert list(run.glob("events.out.tfevents.*"))  # both loggers share the run folder
    assert [p.name for p in (tmp_path / "logs" / "mnist").iterdir()] == ["version_0"]


@pytest.mark.parametrize("logger", ["wandb", "mlflow"])
def test_a_logger_whose_package_is_missing_gets_a_clear_message(tiny_mnist, tmp_path, logger):
    if importlib.util.find_spec(logger):
        pytest.skip(f"{logger} is installed here")
    done = tiny_run(tiny_mnist, tmp_path / "logs", "--logger", logger)
    assert done.returncode == 2
    assert f"--logger {logger} needs the {logger} package: pip install -e '.[{logger}]'" in done.stderr


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
    first = subprocess.run(sweep(space, storage, tiny_mnist, logdir, 4, "--sampler-seed", "0"),
                           capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    study = optuna.load_study(study_name="mnist-sweep", storage=storage)
    before = {t.number: (t.params, t.state, t.value) for t in study.trials}
    assert len(before) == 4

    again = subprocess.run(sweep(space, storage, tiny_mnist, logdir, 2), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "4 trials so far; running 2 more" in again.stdout
    study = optuna.load_study(study_name="mnist-sweep", storage=storage)
    assert len(study.trials) == 6
    assert {t.number: (t.params, t.state, t.value) for t in study.trials if t.number < 4} == before

    workers = [subprocess.Popen(sweep(space, storage, tiny_mnist, logdir, 3), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [w.communicate(timeout=300) for w in workers]
    assert [w.returncode for w in workers] == [0, 0], outputs
    study = optuna.load_study(study_name="mnist-sweep", storage=storage)
    numbers = [t.number for t in study.trials]
    assert len(numbers) == 12 and sorted(numbers) == list(range(12))
    assert any(t.state == optuna.trial.TrialState.PRUNED for t in study.trials)  # lr 1e-7 never learns

    folder = logdir / "sweeps" / "mnist-sweep"
    best = yaml.safe_load((folder / "best.yaml").read_text())
    assert best["lr"] == 0.2 and best["scheduler"] == "none"
    assert (folder / "history.png").stat().st_size > 5000
    assert len(list((folder / "trials").iterdir())) == 12  # every trial logged to TensorBoard
    assert "| trial | val/acc |" in outputs[0][0] + outputs[1][0]
    trained = run_script("train.py", "--config", str(folder / "best.yaml"), "--data-dir", str(tiny_mnist),
                         "--logdir", str(tmp_path / "best-run"), "--val-size", "40")
    assert trained.returncode == 0, trained.stderr


@pytest.mark.parametrize(("space", "message"), [
    ("params:\n  lr: {type: float, low: 1, high: 0.1}\n", "params.lr: 'low' (1) must be below 'high' (0.1)"),
    ("params:\n  speed: {type: float, low: 0, high: 1}\n", "params.speed: not a train.py flag"),
    ("params:\n  lr: {type: gaussian}\n", "params.lr: needs 'type: float'"),
    ("params:\n  optimizer: {type: categorical, choices: []}\n", "params.optimizer: 'choices' must be a non-empty"),
    ("params:\n  lr: {type: float, low: 0, high: 1, log: true}\n", "params.lr: a log scale needs 'low' > 0"),
    ("searchspace: {}\n", "unknown top-level key 'searchspace'"),
    ("fixed:\n  colour: red\nparams:\n  lr: {type: float, low: 0.1, high: 1}\n", "fixed.colour: not a train.py flag"),
])
def test_bad_search_spaces_name_the_key(tmp_path, space, message):
    path = tmp_path / "space.yaml"
    path.write_text(space)
    done = run_script("sweep.py", "--space", str(path), "--storage", f"sqlite:///{tmp_path / 's.db'}")
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and str(path) in done.stderr and "Traceback" not in done.stderr
