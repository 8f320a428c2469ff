"""Many experiments: saved configs that reproduce runs, extra loggers (sweeps: test_sweeps.py)."""

import csv
import importlib.util

import pytest
import torch
import yaml

from helpers import tiny_config, train
from project.config.schema import RunConfig
from project.errors import UsageError
from project.training.build import build_loggers


def test_saved_config_reproduces_the_run_bitwise(shared_tiny_data, tmp_path):
    from helpers import parse_run_config

    train(tiny_config(shared_tiny_data, tmp_path / "logs", max_epochs=2, hidden=[64, 32], seed=3,
                      optimizer="adamw", lr=0.003))
    run = tmp_path / "logs" / "tiny" / "version_0"
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["hidden"] == [64, 32] and config["seed"] == 3 and config["optimizer"] == "adamw"
    train(parse_run_config(["--config", str(run / "config.yaml")]))
    a = torch.load(run / "model.pth", weights_only=True)
    b = torch.load(tmp_path / "logs" / "tiny" / "version_1" / "model.pth", weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_csv_logger_writes_the_same_metric_names(shared_tiny_data, tmp_path):
    train(tiny_config(shared_tiny_data, tmp_path / "logs", max_epochs=1, logger="tensorboard,csv"))
    run = tmp_path / "logs" / "tiny" / "version_0"
    with open(run / "metrics.csv") as stream:
        columns = set(next(csv.reader(stream)))
    assert {"train/loss", "train/acc", "val/loss", "val/acc", "test/loss", "test/acc", "train/lr"} <= columns
    assert list(run.glob("events.out.tfevents.*"))  # both loggers share the run folder
    assert [p.name for p in (tmp_path / "logs" / "tiny").iterdir()] == ["version_0"]


@pytest.mark.parametrize("logger", ["wandb", "mlflow"])
def test_a_logger_whose_package_is_missing_gets_a_clear_message(logger):
    if importlib.util.find_spec(logger):
        pytest.skip(f"{logger} is installed here")
    with pytest.raises(UsageError) as err:
        build_loggers(RunConfig(logger=logger), None)
    assert str(err.value) == f"--logger {logger} needs the {logger} package: pip install -e '.[{logger}]'"
    with pytest.raises(UsageError, match="choose from tensorboard, csv, wandb, mlflow"):
        build_loggers(RunConfig(logger="tensorboard,papyrus"), None)


def test_loggers_that_keep_no_run_folder_alone_are_refused_in_one_line(monkeypatch):
    """A remote logger alone (W&B, MLflow) would put the checkpoints in its own folder, not the run's: refused, with
    the flag that works."""
    from lightning.pytorch.loggers import Logger

    from project.training import build

    class Remote(Logger):
        name, version = "remote", "0"

        def log_metrics(self, metrics, step=None):
            pass

        def log_hyperparams(self, params, *args, **kwargs):
            pass

    monkeypatch.setitem(build.LOGGER_BUILDERS, "remote", lambda config, version: Remote())
    with pytest.raises(UsageError, match=r"^--logger remote: the run's folder \(its checkpoints, model.pth, "
                                         r"results.json\) is where a TensorBoard or CSV logger writes, and none is "
                                         r"named; add one: --logger tensorboard,remote$"):
        build.build_loggers(RunConfig(logger="remote"), None)
    assert [type(logger).__name__ for logger in build.build_loggers(RunConfig(logger="csv,remote"), None)] == [
        "AppendingCSVLogger", "Remote"]
