"""How a sweep shares out its machine, in this process: how many workers and which devices or cores each gets,
how the trials are split, what each worker's process is given, and one line when one fails.
(``tests/test_sweeps.py`` runs the workers for real.)"""

from __future__ import annotations

import json
import os

import pytest

from helpers import tiny_recipe
from project.config.schema import RunConfig
from project.errors import UsageError, UserError
from project.sweeps import workers as sweep_workers
from project.sweeps.workers import Worker, devices_per_trial, plan_workers, run_workers, shares


def config(**settings) -> RunConfig:
    return RunConfig.for_recipe(tiny_recipe(), **settings)


@pytest.mark.parametrize(("settings", "params", "per_trial"), [
    ({}, {}, 1),
    ({"accelerator": "cpu", "devices": 2}, {}, 2),
    ({"accelerator": "cpu", "devices": 2, "num_nodes": 2}, {}, 2),  # devices on this machine, not in all
    ({"accelerator": "cpu", "devices": [0, 1, 2]}, {}, 3),
    ({"accelerator": "cpu"}, {"devices": {"type": "categorical", "choices": [1, 4, 2]}}, 4),
    ({"accelerator": "cpu"}, {"devices": {"type": "int", "low": 1, "high": 3}}, 3),
    ({"accelerator": "cpu", "num_nodes": 2}, {"devices": {"type": "categorical", "choices": [2]}}, 2),
    ({"accelerator": "cpu", "num_nodes": 2}, {"devices": {"type": "categorical", "choices": [1]}}, 1),
    ({"accelerator": "cpu", "devices": 3, "num_nodes": 2}, {}, 3),
])
def test_a_trial_uses_its_largest_device_count_on_this_machine(settings, params, per_trial):
    counted = devices_per_trial(config(**settings), params)
    assert counted == per_trial and type(counted) is int


def test_cpu_workers_share_the_cores_each_its_own(monkeypatch):
    monkeypatch.setattr(sweep_workers.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5, 6})
    cpu = config(accelerator="cpu")
    assert plan_workers("auto", cpu, {}) == [Worker(cores=(0, 1, 2, 3, 4, 5, 6))]
    assert plan_workers(2, cpu, {}) == [Worker(cores=(0, 1, 2)), Worker(cores=(3, 4, 5))]
    assert plan_workers(7, cpu, {}) == [Worker(cores=(i,)) for i in range(7)]
    assert plan_workers(8, cpu, {}) == [Worker()] * 8  # more workers than cores: the kernel shares them out


def test_gpu_workers_each_get_the_gpus_a_trial_needs(monkeypatch):
    monkeypatch.setattr(sweep_workers, "resolve_accelerator", lambda accelerator: {"cpu": "cuda"}[accelerator])
    monkeypatch.setattr(sweep_workers.torch.cuda, "device_count", lambda: 5)
    gpu = config(accelerator="cpu", devices=2)  # planned as if on a 5-GPU machine
    assert plan_workers("auto", gpu, {}) == [Worker(gpus=(0, 1)), Worker(gpus=(2, 3))]
    assert plan_workers(1, gpu, {}) == [Worker(gpus=(0, 1))]
    assert plan_workers("auto", config(accelerator="cpu", devices=[0]), {}) == [Worker(gpus=(i,)) for i in range(5)]
    with pytest.raises(UsageError) as refused:
        plan_workers(3, gpu, {})
    assert str(refused.value) == "--workers 3: 3 worker(s) x 2 GPU(s) per trial needs 6 GPUs; this machine has 5"
    with pytest.raises(UsageError, match=r"^--workers 1: 1 worker\(s\) x 6 GPU\(s\) per trial needs 6 GPUs;"):
        plan_workers("auto", config(accelerator="cpu", devices=[0, 1, 2, 3, 4, 5]), {})  # a trial wider than it


@pytest.mark.parametrize(("n_trials", "workers", "split"), [
    (7, 3, [3, 2, 2]), (6, 3, [2, 2, 2]), (2, 4, [1, 1, 0, 0]), (0, 2, [0, 0]), (1, 1, [1])])
def test_the_trials_are_split_as_evenly_as_they_go(n_trials, workers, split):
    assert shares(n_trials, workers) == split and sum(split) == n_trials


def test_what_each_worker_is_given_and_called(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    on_gpus, on_cores = Worker(gpus=(2, 3)), Worker(cores=(0, 1, 2))
    assert on_gpus.environment()["CUDA_VISIBLE_DEVICES"] == "2,3" and "OMP_NUM_THREADS" not in on_gpus.environment()
    assert on_cores.environment()["OMP_NUM_THREADS"] == "3"
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert on_cores.environment()["OMP_NUM_THREADS"] == "1"  # the user's own setting kept
    assert Worker().environment() == dict(os.environ)
    assert (on_gpus.describe(), on_cores.describe(), Worker(cores=(4, 5)).describe(), Worker(cores=(4,)).describe()) \
        == ("cuda:2,3", "cpu cores 0,1,2", "cpu cores 4,5", "cpu core 4")


def test_a_worker_is_pinned_to_what_its_parent_gave_it(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr(sweep_workers.os, "sched_getaffinity", lambda pid: {3, 1})
    assert Worker.current() == Worker(cores=(1, 3))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    assert Worker.current() == Worker(cores=(1, 3))  # GPUs named, but none usable: its cores
    monkeypatch.setattr(sweep_workers.torch.cuda, "is_available", lambda: True)
    assert Worker.current() == Worker(gpus=(2, 5))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert Worker.current() == Worker(cores=(1, 3))  # not pinned to GPUs by its parent


def test_the_workers_run_their_shares_with_their_seeds_and_a_failure_is_one_line(monkeypatch, tmp_path):
    """Each worker is the sweep script again: here a stand-in that writes what it was given."""
    stand_in = tmp_path / "sweep.py"
    stand_in.write_text(
        "import json, os, sys\n"
        f"out = {str(tmp_path)!r}\n"
        "name = os.path.join(out, 'worker-' + sys.argv[sys.argv.index('--n-trials') + 1] + '-' + str(os.getpid()))\n"
        "json.dump({'argv': sys.argv[1:], 'threads': os.environ.get('OMP_NUM_THREADS'),\n"
        "           'cores': sorted(os.sched_getaffinity(0))}, open(name, 'w'))\n"
        "sys.exit(3 if '--fail' in sys.argv else 0)\n")
    monkeypatch.setattr(sweep_workers, "SWEEP_SCRIPT", stand_in)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cores = sorted(os.sched_getaffinity(0))[:1]
    run_workers([Worker(cores=tuple(cores)), Worker(cores=tuple(cores)), Worker()], 5, ["--space", "s.yaml"], 10)
    given = sorted((json.loads(p.read_text()) for p in tmp_path.glob("worker-*")), key=lambda g: g["argv"])
    assert [g["argv"] for g in given] == [
        ["--space", "s.yaml", "--sampler-seed", str(seed), "--workers", "1", "--n-trials", str(count), "--worker"]
        for seed, count in ((10, 2), (11, 2), (12, 1))]
    assert [g["threads"] for g in given] == ["1", "1", None]
    assert [g["cores"] for g in given] == [cores, cores, sorted(os.sched_getaffinity(0))]  # each on its own
    for made in tmp_path.glob("worker-*"):
        made.unlink()
    run_workers([Worker(), Worker()], 1, [], None)  # the worker with no trial is not started; no seed given
    [alone] = [json.loads(p.read_text()) for p in tmp_path.glob("worker-*")]
    assert alone["argv"] == ["--workers", "1", "--n-trials", "1", "--worker"]
    with pytest.raises(UserError) as failed:
        run_workers([Worker(cores=tuple(cores)), Worker()], 2, ["--fail"], None)
    assert str(failed.value) == (f"2 of 2 workers failed (the one on cpu core {cores[0]} exited with 3; its error is "
                                 "above); the others' trials are in the study")


STAND_IN_TRAIN = """\
import json, os, sys, yaml
spec = yaml.safe_load(open(sys.argv[sys.argv.index("--config") + 1]))
version = sys.argv[sys.argv.index("--run-version") + 1]
json.dump({"spec": spec, "version": version}, open(os.environ["GIVEN"], "w"))
outcome = os.environ["OUTCOME"]
if outcome != "ok":
    sys.exit(print("a warning first", file=sys.stderr) or print(outcome, file=sys.stderr) or 2)
if not spec["fast_dev_run"]:
    run = os.path.join(spec["logdir"], spec["name"], version)
    os.makedirs(run)
    json.dump({"val/acc_best": 0.8125}, open(os.path.join(run, "results.json"), "w"))
"""


@pytest.mark.parametrize(("outcome", "fast", "expected"), [
    ("ok", False, 0.8125),
    ("ok", True, "nan"),
    ("train.py: error: the loss became non-finite at step 3", False, "NonFiniteLossError: the loss became non-finite "
                                                                       "at step 3"),
    ("train.py: error: --lr: must be positive", False, "UserError: trial trial_004 (train.py --config, 2 devices) "
                                                       "failed: --lr: must be positive"),
])
def test_a_trial_on_several_devices_is_its_own_train_py_and_reports_back(monkeypatch, tmp_path, outcome, fast,
                                                                         expected):
    """DDP starts its ranks by running the command again: such a trial is ``train.py --config`` of its settings,
    run here by a stand-in that writes what it was given."""
    import math

    from project.sweeps import study as sweep

    script = tmp_path / "train.py"
    script.write_text(STAND_IN_TRAIN)
    monkeypatch.setattr(sweep, "TRAIN_SCRIPT", script)
    monkeypatch.setenv("GIVEN", str(tmp_path / "given.json"))
    monkeypatch.setenv("OUTCOME", outcome)
    trial = config(accelerator="cpu", devices=2, logdir=str(tmp_path / "logs"), name="sweep", lr=0.3,
                   run_version="trial_004", fast_dev_run=fast)
    try:
        got: object = sweep.train_in_own_process(trial)
    except Exception as err:  # noqa: BLE001 - which one is the point
        got = f"{type(err).__name__}: {err}"
    if expected == "nan":
        assert isinstance(got, float) and math.isnan(got)
    else:
        assert got == expected
    given = json.loads((tmp_path / "given.json").read_text())
    assert given["version"] == "trial_004" and given["spec"]["fast_dev_run"] is fast
    assert {k: given["spec"][k] for k in ("lr", "devices", "name", "logdir")} == {
        "lr": 0.3, "devices": 2, "name": "sweep", "logdir": str(tmp_path / "logs")}


def test_each_parameter_is_asked_of_optuna_as_its_space_says():
    import optuna

    from project.sweeps.study import suggest

    study = optuna.create_study(direction="maximize")
    trial = study.ask()
    values = suggest(trial, {
        "optimizer": {"type": "categorical", "choices": ["sgd", "adam"]},
        "max_epochs": {"type": "int", "low": 2, "high": 8, "step": 2},
        "hidden": {"type": "int", "low": 16, "high": 256, "log": True},
        "batch_size": {"type": "int", "low": 32, "high": 64},
        "lr": {"type": "float", "low": 0.001, "high": 0.5, "log": True},
        "momentum": {"type": "float", "low": 0.5, "high": 0.9, "step": 0.1},
        "weight_decay": {"type": "float", "low": 0.0, "high": 0.01},
    })
    D = optuna.distributions
    assert trial.distributions == {
        "optimizer": D.CategoricalDistribution(["sgd", "adam"]),
        "max_epochs": D.IntDistribution(2, 8, step=2), "hidden": D.IntDistribution(16, 256, log=True),
        "batch_size": D.IntDistribution(32, 64),
        "lr": D.FloatDistribution(0.001, 0.5, log=True), "momentum": D.FloatDistribution(0.5, 0.9, step=0.1),
        "weight_decay": D.FloatDistribution(0.0, 0.01)}
    assert values == trial.params


class Trained:
    """What ``train()`` gives a trial: its best ``val/acc``."""

    def __init__(self, best_val: float) -> None:
        self.best_val = best_val


def objective_with(monkeypatch, tmp_path, outcomes: list, **fixed):
    """An ``Objective`` whose runs are stand-ins: each takes the next outcome (a score, ``"pruned"`` after two
    epochs, or an error to raise) and records what it was given."""
    import types

    from project.sweeps import study as sweep

    given = types.SimpleNamespace(trains=[], own_process=[], datamodules=0)

    def train(config, recipe, datamodule, callbacks, test):
        given.trains.append((config, recipe, datamodule, callbacks, test))
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        if outcome == "pruned":
            callbacks[0].pruned, callbacks[0].epochs = True, 2
            return Trained(0.5)
        return Trained(outcome)

    def own_process(config):
        given.own_process.append(config)
        return outcomes.pop(0)

    def build(config, recipe):
        given.datamodules += 1
        return f"data {given.datamodules}"

    monkeypatch.setattr(sweep, "train", train)
    monkeypatch.setattr(sweep, "train_in_own_process", own_process)
    monkeypatch.setattr(sweep, "build_datamodule", build)
    params = {"lr": {"type": "categorical", "choices": [0.1]}}
    base = {"logdir": str(tmp_path / "logs"), "name": "trials"}
    return sweep.Objective(tiny_recipe(), {"scheduler": "none", **fixed}, params, base, tmp_path), given


def test_a_trial_trains_its_settings_on_data_loaded_once_and_says_how_it_went(monkeypatch, tmp_path, capsys):
    import re

    import optuna

    from project.errors import NonFiniteLossError
    from project.sweeps.storage import owner

    objective, given = objective_with(monkeypatch, tmp_path, [0.75, "pruned", NonFiniteLossError("loss nan at 3"),
                                                              0.5])
    objective.trials_left = 4
    study = optuna.create_study(direction="maximize", study_name="said")
    study.optimize(objective, n_trials=4)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "PRUNED", "PRUNED", "COMPLETE"]
    assert [t.value for t in study.trials] == [0.75, None, None, 0.5]
    config, recipe, datamodule, callbacks, test = given.trains[0]
    assert (config.lr, config.scheduler, config.run_version, config.name) == (0.1, "none", "trial_000", "trials")
    assert recipe is objective.recipe and not test and type(callbacks[0]).__name__ == "PruneOnValAcc"
    assert [d for _, _, d, _, _ in given.trains] == ["data 1"] * 4 and given.datamodules == 1  # loaded once
    assert study.trials[0].user_attrs["worker"] == owner() and study.trials[0].user_attrs["devices"].startswith("cpu")
    assert study.trials[2].user_attrs["diverged"] == "loss nan at 3"
    lines = capsys.readouterr().out.splitlines()
    time_each = r"in \d+\.\d s"
    assert re.fullmatch(rf"trial 0: val/acc 0\.7500 {time_each}; about \S+( \S+)* for the 3 left at \S+( \S+)* a "
                        r"trial  \{'lr': 0\.1\}", lines[0]), lines[0]
    assert re.fullmatch(rf"trial 1: pruned after 2 epoch\(s\) {time_each}; .* for the 2 left .*", lines[1]), lines[1]
    assert lines[2] == "trial 2: diverged, pruned (loss nan at 3)"
    assert re.fullmatch(rf"trial 3: val/acc 0\.5000 {time_each}  \{{'lr': 0\.1\}}", lines[3]), lines[3]
    assert objective.trials_left == 0 and len(objective.seconds_each) == 3


def test_a_trial_on_two_devices_trains_in_its_own_process(monkeypatch, tmp_path):
    import optuna

    objective, given = objective_with(monkeypatch, tmp_path, [0.625], accelerator="cpu", devices=2)
    study = optuna.create_study(direction="maximize")
    study.optimize(objective, n_trials=1)
    assert study.trials[0].value == 0.625 and not given.trains
    assert [c.devices for c in given.own_process] == [2] and given.own_process[0].run_version == "trial_000"


def test_a_repeated_trial_says_which_it_repeats(monkeypatch, tmp_path, capsys):
    import optuna

    from project.sweeps.storage import open_storage, retry_dead_workers_trials

    storage = open_storage(str(tmp_path / "s.journal"))
    study = optuna.create_study(direction="maximize", storage=storage, study_name="again")
    left = study.ask({"lr": optuna.distributions.CategoricalDistribution([0.1])})
    left.set_user_attr("worker", "here-no-more:1:1.00")
    monkeypatch.setattr("project.sweeps.storage._alive", lambda recorded: False)
    assert retry_dead_workers_trials(study, storage) == [0]
    objective, _ = objective_with(monkeypatch, tmp_path, [0.9])
    study.optimize(objective, n_trials=1)
    assert capsys.readouterr().out.startswith("trial 1 (repeats trial 0): val/acc 0.9000 in ")


def test_a_stopped_trial_stops_the_sweep_with_what_to_do(monkeypatch, tmp_path):
    import optuna

    from project.errors import Terminated

    stop = Terminated("stopped by SIGTERM after step 12 (checkpoint saved)")
    stop.exit_code = 130
    objective, _ = objective_with(monkeypatch, tmp_path, [stop])
    study = optuna.create_study(direction="maximize")
    with pytest.raises(Terminated) as stopped:
        study.optimize(objective, n_trials=1)
    assert str(stopped.value) == ("stopped by SIGTERM during trial 0; the trials that ended are in the study: run the "
                                  "same sweep.py command again to go on with it")
    assert stopped.value.exit_code == 130


def test_a_trial_reports_each_epochs_val_acc_and_stops_when_pruned():
    import types

    import optuna
    import torch

    from project.sweeps.study import PruneOnValAcc

    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.ThresholdPruner(lower=0.5))
    trial = study.ask()
    pruning = PruneOnValAcc(trial)

    def validated(epoch, metrics, sanity=False):
        trainer = types.SimpleNamespace(sanity_checking=sanity, callback_metrics=metrics, current_epoch=epoch,
                                        should_stop=False)
        pruning.on_validation_end(trainer, None)
        return trainer.should_stop

    assert not validated(0, {"val/acc": torch.tensor(0.1)}, sanity=True)  # the sanity check: not an epoch
    assert not validated(0, {"val/loss": torch.tensor(1.0)})  # no accuracy to report
    assert not validated(0, {"val/acc": torch.tensor(0.75)}) and not pruning.pruned
    assert validated(1, {"val/acc": torch.tensor(0.25)}) and (pruning.pruned, pruning.epochs) == (True, 2)
    assert study.trials[0].intermediate_values == {0: 0.75, 1: 0.25}
