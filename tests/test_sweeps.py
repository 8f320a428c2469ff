"""Optuna sweeps on real storages: a journal file shared by processes on one machine, a real PostgreSQL
server for several; parallel workers pinned to their devices; a killed worker's trial failed and retried."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import optuna
import pytest
import yaml

from helpers import HANG_S, ROOT, tiny_recipe, train
from project.errors import UsageError, UserError
from project.sweeps.storage import open_storage
from project.sweeps.study import Objective, grid, load_space, open_study, prepare

SWEEP = str(ROOT / "scripts" / "sweep.py")
TrialState = optuna.trial.TrialState

SPACE = """
fixed:
  scheduler: none
  batch_size: 32
params:
  lr: {type: categorical, choices: [0.2, 1.0e-7]}
  max_epochs: {type: int, low: 2, high: 3}
"""
QUICK = ("fixed:\n  scheduler: none\n  batch_size: 32\n  max_epochs: 1\n"
         "params:\n  lr: {type: float, low: 0.01, high: 0.3}\n")


def sweep(space, storage, data, logdir, trials, *extra):
    return [sys.executable, SWEEP, "--space", str(space), "--storage", storage, "--data-dir", str(data),
            "--logdir", str(logdir), "--val-size", "40", "--n-trials", str(trials), *extra]


def write_space(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return path


@pytest.fixture(params=["journal", "postgres"])
def storage(request, tmp_path) -> str:
    """A new, empty storage of each kind: a journal file, or a fresh database on the real PostgreSQL server."""
    if request.param == "journal":
        return str(tmp_path / "study.journal")
    return request.getfixturevalue("postgres").new_database()


def load(storage: str, name: str = "tiny-sweep") -> optuna.Study:
    return optuna.load_study(study_name=name, storage=open_storage(storage))


@pytest.mark.slow
def test_sweep_resumes_shares_storage_prunes_and_reports(tiny_data, tmp_path):
    space = write_space(tmp_path, SPACE)
    storage = str(tmp_path / "study.journal")
    logdir = tmp_path / "logs"
    # The first 4 trials in this process (the objective sweep.py runs), the rest by sweep.py itself.
    fixed, params = load_space(space, tiny_recipe())
    folder = logdir / "sweeps" / "tiny-sweep"
    base = {"data_dir": str(tiny_data), "val_size": 40, "logdir": str(folder), "name": "trials",
            "trainer": {"enable_progress_bar": False}}
    objective = Objective(tiny_recipe(), fixed, params, base, folder)
    open_study("tiny-sweep", storage, "median", 0).optimize(objective, n_trials=4)
    before = {t.number: (t.params, t.state, t.value) for t in load(storage).trials}
    assert len(before) == 4

    # Two more processes on the same storage: each resumes the study, and they share it.
    workers = [subprocess.Popen(sweep(space, storage, tiny_data, logdir, 2), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [w.communicate(timeout=HANG_S) for w in workers]
    assert [w.returncode for w in workers] == [0, 0], outputs
    assert all("trials so far; running 2 more on 1 worker(s)" in out for out, _ in outputs)
    assert any("4 trials so far" in out for out, _ in outputs)
    study = load(storage)
    assert sorted(t.number for t in study.trials) == list(range(8))
    assert {t.number: (t.params, t.state, t.value) for t in study.trials if t.number < 4} == before
    assert any(t.state == TrialState.PRUNED for t in study.trials)  # lr 1e-7 never learns

    best = yaml.safe_load((folder / "best.yaml").read_text())
    assert best["lr"] == 0.2 and best["scheduler"] == "none"
    assert (folder / "history.png").stat().st_size > 5000
    assert (folder / "importance.png").stat().st_size > 5000  # two params, eight trials: importances exist
    assert "| trial | val/acc |" in (folder / "best_trials.md").read_text()
    assert len(list((folder / "trials").iterdir())) == 8  # every trial logged to TensorBoard
    assert "| trial | val/acc |" in outputs[0][0] + outputs[1][0]
    from helpers import parse_run_config

    best_run = train(parse_run_config(["--config", str(folder / "best.yaml"), "--data-dir", str(tiny_data),
                                       "--logdir", str(tmp_path / "best-run"), "--val-size", "40"]))
    assert best_run.config.lr == 0.2 and best_run.test_metrics["test/acc"] > 0.5


@pytest.mark.slow
def test_processes_started_together_share_a_new_study(storage, tiny_data, tmp_path):
    """Two workers at the same moment on a storage with no study (nor tables) yet: both join, and no
    trial is lost or run twice. Then the same command resumes the study (on PostgreSQL)."""
    space = write_space(tmp_path, QUICK)
    command = sweep(space, storage, tiny_data, tmp_path / "logs", 3, "--sampler", "random", "--heartbeat", "5")
    procs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=HANG_S) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert not any(err.strip() for _, err in outputs), outputs  # no traceback, no warning
    trials = load(storage).trials
    assert [t.number for t in trials] == list(range(6))
    assert len({t._trial_id for t in trials}) == 6 and all(t.state == TrialState.COMPLETE for t in trials)
    owners = collections.Counter(t.user_attrs["worker"] for t in trials)
    assert sorted(owners.values()) == [3, 3], owners  # each process ran its own three
    folders = tmp_path / "logs" / "sweeps" / "tiny-sweep" / "trials"
    assert sorted(p.name for p in folders.iterdir()) == [f"trial_{n:03d}" for n in range(6)]
    printed = sorted(line.split(":")[0] for out, _ in outputs for line in out.splitlines() if line.startswith("trial "))
    assert printed == [f"trial {n}" for n in range(6)]  # each trial reported once, by the worker that ran it

    if storage.startswith("postgresql"):  # a journal's study resuming: test_sweep_resumes_shares_storage_...
        again = subprocess.run(sweep(space, storage, tiny_data, tmp_path / "logs", 1), capture_output=True,
                               text=True, timeout=HANG_S)
        assert again.returncode == 0 and "6 trials so far; running 1 more" in again.stdout, again.stderr
        assert len(load(storage).trials) == 7


def wait_for_training_trial(storage: str, proc: subprocess.Popen, timeout: float = HANG_S) -> optuna.trial.FrozenTrial:
    """The first trial once it has reported two epochs' val/acc: mid-training, not starting up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            running = load(storage).get_trials(states=(TrialState.RUNNING,))
        except KeyError:  # the study does not exist yet
            running = []
        if running and len(running[0].intermediate_values) >= 2:
            return running[0]
        time.sleep(0.05)
    raise AssertionError("no trial started")


@pytest.mark.slow
def test_a_killed_workers_trial_is_failed_and_retried(storage, tiny_data, tmp_path):
    """kill -9 mid-trial leaves the trial RUNNING; the next worker fails it (journal: its process is gone;
    PostgreSQL: its heartbeat stopped) and runs it again with the same parameters."""
    # 40 epochs of 50 steps: about 4 s of training, killed after its second epoch.
    space = write_space(tmp_path, "fixed:\n  scheduler: none\n  batch_size: 4\n  max_epochs: 40\n"
                                  "  steps_per_call: 1\nparams:\n  lr: {type: categorical, choices: [0.1]}\n")
    command = sweep(space, storage, tiny_data, tmp_path / "logs", 1, "--heartbeat", "1")
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed = wait_for_training_trial(storage, first)
    first.kill()
    first.communicate()
    left = load(storage).trials
    assert [t.state for t in left] == [TrialState.RUNNING] and len(left[0].intermediate_values) < 40  # stays so
    assert not (tmp_path / "logs" / "sweeps" / "tiny-sweep" / "trials" / "trial_000" / "results.json").exists()

    second = subprocess.run(command, capture_output=True, text=True, timeout=HANG_S)
    assert second.returncode == 0, second.stdout + second.stderr
    trials = load(storage).trials
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE]
    assert trials[1].system_attrs["failed_trial"] == killed.number == 0 and trials[1].params == trials[0].params
    assert "trial 1 (repeats trial 0): val/acc" in second.stdout
    if "journal" in storage:
        assert "trial 0: its worker died; failed, and enqueued again" in second.stdout


@pytest.mark.slow
def test_workers_run_trials_in_parallel_each_on_its_own_cores(tiny_data, tmp_path):
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs two CPU cores")
    space = write_space(tmp_path, QUICK.replace("max_epochs: 1", "max_epochs: 6"))
    storage = str(tmp_path / "study.journal")
    done = subprocess.run(sweep(space, storage, tiny_data, tmp_path / "logs", 4, "--workers", "2", "--sampler",
                                "random", "--sampler-seed", "0"), capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stdout + done.stderr
    half = len(cores) // 2
    pinned = [",".join(map(str, cores[:half])), ",".join(map(str, cores[half:2 * half]))]
    assert "0 trials so far; running 4 more on 2 worker(s) (cpu core" in done.stdout
    trials = load(storage).trials
    assert len(trials) == 4 and all(t.state == TrialState.COMPLETE for t in trials)
    by_worker = collections.defaultdict(list)
    for trial in trials:
        by_worker[trial.user_attrs["worker"]].append(trial)
    assert sorted(len(v) for v in by_worker.values()) == [2, 2]  # the trials are shared out evenly
    assert len({t.params["lr"] for t in trials}) == 4  # a seeded sampler: one seed per worker, not one for all
    devices = sorted({t.user_attrs["devices"].split(" ")[-1] for t in trials})
    assert devices == sorted(pinned)  # each worker on its own cores, none on the other's
    assert all(f":{os.getpid()}:" not in owner for owner in by_worker)
    # At the same time, not one after the other: both worker processes existed before any trial ended
    # (the owner records each process's start time).
    started = [float(owner.rsplit(":", 1)[1]) for owner in by_worker]
    assert max(started) < min(t.datetime_complete.timestamp() for t in trials)
    assert "| trial | val/acc |" in done.stdout and "Traceback" not in done.stderr


def sweep_args(monkeypatch, *argv: str):
    from project.config.tool_args import parse_sweep_args

    monkeypatch.setattr(sys, "argv", ["sweep.py", *argv])
    return parse_sweep_args(tiny_recipe(), None)


MISTAKES = [
    (["--data-dir", "{empty}"], "no such file"),
    (["--space", "{tmp}/nowhere.yaml"], "nowhere.yaml: cannot read it (No such file or directory)"),
    (["--space", "{tmp}/broken.yaml"], "broken.yaml: not valid YAML"),
    (["--storage", "postgresql://postgres:secret@127.0.0.1:1/optuna"],
     "--storage postgresql://postgres:***@127.0.0.1:1/optuna: cannot open it (connection failed"),
    (["--storage", "sqlite:///{tmp}/s.db"], "SQLite locks the whole file and fails under parallel workers"),
    (["--storage", "{tmp}"], "is a directory, not a file; give a journal file's path (or a database URL)"),
    (["--storage", "{tmp}/fifo.journal"], "not a regular file (a pipe or a device); give a journal file's path"),
    (["--storage", "host=127.0.0.1 port=1 password='secret' dbname=x"],
     "a libpq connection string, not a journal file's path; give PostgreSQL as a URL: postgresql://"),
    (["--storage", "{tmp}/no/such/folder/s.journal"], "its folder does not exist"),
]


def test_a_flag_given_to_sweep_py_wins_over_fixed_and_fixed_over_a_flag_left_out(monkeypatch, shared_tiny_data,
                                                                                  tmp_path):
    """The order docs/experiments.md gives: the recipe's defaults, then ``fixed``, then the flags given, then the
    trial's ``params``."""
    import shutil

    other_data = tmp_path / "other"
    shutil.copytree(shared_tiny_data, other_data)
    space = write_space(tmp_path, f"fixed:\n  val_size: 100\n  accelerator: cpu\n  data_dir: {other_data}\n"
                                  "  max_epochs: 1\nparams:\n  lr: {type: float, low: 0.01, high: 0.3}\n")
    common = ("--space", str(space), "--logdir", str(tmp_path / "logs"))
    _, _, objective = prepare(tiny_recipe(), sweep_args(monkeypatch, *common, "--study-name", "left-out"))
    config = objective.trial_config({"lr": 0.05})
    assert (config.val_size, config.accelerator, config.data_dir, config.lr) == (100, "cpu", str(other_data), 0.05)
    given = sweep_args(monkeypatch, *common, "--study-name", "given", "--val-size", "40", "--accelerator", "auto",
                       "--data-dir", str(shared_tiny_data))
    _, _, objective = prepare(tiny_recipe(), given)
    config = objective.trial_config({"lr": 0.05, "val_size": 0.25})
    assert (config.accelerator, config.data_dir) == ("auto", str(shared_tiny_data))
    assert config.val_size == 0.25 and objective.trial_config({}).val_size == 40  # params last of all


def test_the_sampler_seed_and_heartbeat_flags_reach_the_study_and_its_storage(monkeypatch, shared_tiny_data,
                                                                               tmp_path):
    from project.sweeps import study as sweep

    opened = []
    real_open = sweep.open_storage
    monkeypatch.setattr(sweep, "open_storage", lambda spec, *rest: opened.append(rest) or real_open(spec, *rest))
    space = write_space(tmp_path, QUICK)

    def first_lrs(journal: str, *flags: str) -> list[float]:
        args = sweep_args(monkeypatch, "--space", str(space), "--storage", str(tmp_path / journal), "--data-dir",
                          str(shared_tiny_data), "--logdir", str(tmp_path / journal), *flags)
        study, _, objective = prepare(tiny_recipe(), args)
        return [sweep.suggest(study.ask(), objective.params)["lr"] for _ in range(3)]

    assert first_lrs("a", "--sampler-seed", "5", "--heartbeat", "7") == first_lrs("b", "--sampler-seed", "5") != \
        first_lrs("c", "--sampler-seed", "6")
    assert opened == [(7,), (60,), (60,)]


@pytest.mark.parametrize(("argv", "message"), MISTAKES)
def test_mistakes_are_reported_before_any_trial(monkeypatch, shared_tiny_data, tmp_path, argv, message):
    monkeypatch.chdir(tmp_path)  # where a storage string taken for a file's name would create it
    (tmp_path / "empty").mkdir()
    write_space(tmp_path, QUICK)
    (tmp_path / "broken.yaml").write_text("params: [unclosed\n")
    os.mkfifo(tmp_path / "fifo.journal")  # a read of it would block for good
    journal = str(tmp_path / "study.journal")
    open_study("tiny-sweep", journal, "median", 0)  # an existing study must come out of it unchanged
    argv = [a.format(empty=tmp_path / "empty", tmp=tmp_path) for a in argv]
    args = sweep_args(monkeypatch, "--space", str(tmp_path / "space.yaml"), "--storage", journal, "--data-dir",
                      str(shared_tiny_data), "--logdir", str(tmp_path / "logs"), *argv)
    with pytest.raises(UserError) as err:
        prepare(tiny_recipe(), args)
    assert message in str(err.value) and "\n" not in str(err.value) and "secret" not in str(err.value)
    assert load(journal).trials == []
    assert not (tmp_path / "logs").exists()
    assert not [path for path in tmp_path.rglob("*") if "secret" in path.name]  # no file named by a credential


def test_a_bad_storage_is_one_line_and_exit_code_2(shared_tiny_data, tmp_path):
    space = write_space(tmp_path, QUICK)
    done = subprocess.run(sweep(space, f"sqlite:///{tmp_path}/s.db", shared_tiny_data, tmp_path / "logs", 1),
                          capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == UsageError.exit_code and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("sweep.py: error: --storage sqlite:///")
    assert not (tmp_path / "s.db").exists()


def test_trials_share_no_steps_per_call_plan(shared_tiny_data, tmp_path):
    """A trial with K = 1 after one with K = 4 on the same in-memory data (this crashed mid-study)."""
    path = write_space(tmp_path, "fixed:\n  max_epochs: 1\n  batch_size: 32\n"
                                 "params:\n  steps_per_call: {type: categorical, choices: [4, 1]}\n")
    fixed, params = load_space(path, tiny_recipe())
    folder = tmp_path / "logs"
    base = {"data_dir": str(shared_tiny_data), "val_size": 40, "logdir": str(folder), "name": "trials",
            "trainer": {"enable_progress_bar": False}}
    study = open_study("plan", str(tmp_path / "s.journal"), "none", 0, "grid", params)
    study.optimize(Objective(tiny_recipe(), fixed, params, base, folder), n_trials=2)
    assert sorted(t.params["steps_per_call"] for t in study.trials) == [1, 4]
    assert all(t.state == TrialState.COMPLETE for t in study.trials)
    values = [t.value for t in sorted(study.trials, key=lambda t: t.params["steps_per_call"])]
    assert values[0] == values[1]  # K never changes what is trained


SPACES = [
    ("params:\n  lr: {type: float, low: 1, high: 0.1}\n", "params.lr: 'low' (1) must be below 'high' (0.1)"),
    ("params:\n  lr: {type: float, low: 0.5, high: 0.5}\n", "params.lr: 'low' (0.5) must be below 'high' (0.5)"),
    ("params:\n  speed: {type: float, low: 0, high: 1}\n", "params.speed: not a train.py flag"),
    ("params:\n  lr: {type: gaussian}\n", "params.lr: needs 'type: float', 'type: int' or 'type: categorical'"),
    ("params:\n  optimizer: {type: categorical, choices: []}\n",
     "params.optimizer: 'choices' must be a non-empty list"),
    ("params:\n  lr: {type: float, low: 0, high: 1, log: true}\n", "params.lr: a log scale needs 'low' > 0"),
    ("params:\n  lr: {type: float, low: 0.1, high: 1, colour: red, size: 2}\n",
     "params.lr: unknown setting 'colour'"),
    ("searchspace: {}\n", "unknown top-level key 'searchspace' (expected 'params' and 'fixed')"),
    ("[1, 2]\n", "expected a mapping with 'params' (and optionally 'fixed')"),
    ("params: {}\n", "'params' must map flag names to search specs (and 'fixed' to values)"),
    ("fixed: [1]\nparams:\n  lr: {type: float, low: 0.1, high: 1}\n",
     "'params' must map flag names to search specs (and 'fixed' to values)"),
    ("fixed:\n  colour: red\nparams:\n  lr: {type: float, low: 0.1, high: 1}\n", "fixed.colour: not a train.py flag"),
    ("fixed:\n  batch_size: 0\nparams:\n  lr: {type: float, low: 0.1, high: 1}\n",
     "fixed: batch_size: must be a positive integer, got 0"),
    # What slipped through before, to fail trial by trial: each value checked as its flag checks it.
    ("params:\n  lr: {type: float, low: -1, high: 1}\n",
     "params.lr: -1 is not a value --lr takes (must be a positive number, got -1)"),
    ("params:\n  batch_size: {type: int, low: 0, high: 8}\n",
     "params.batch_size: 0 is not a value --batch-size takes (must be a positive integer, got 0)"),
    ("params:\n  lr: {type: categorical, choices: [abc]}\n",
     "params.lr: 'abc' is not a value --lr takes (not a valid float: 'abc')"),
    ("params:\n  max_epochs: {type: int, low: 1.5, high: 3}\n",
     "params.max_epochs: 'low' must be one of the whole numbers a type: int range takes, got 1.5"),
    ("params:\n  max_epochs: {type: int, low: 1, high: 4, step: 1.5}\n",
     "params.max_epochs: 'step' must be one of the whole numbers a type: int range takes, got 1.5"),
    ("params:\n  lr: {type: float, low: 0.01, high: 1, log: true, step: 0.01}\n",
     "params.lr: a log scale takes no 'step' (Optuna samples it continuously)"),
    ("params:\n  lr: {type: float, low: 0.01, high: 1, step: 0}\n", "params.lr: 'step' must be above 0, got 0"),
    ("params:\n  lr: {type: float, low: 0.01, high: .inf}\n",
     "params.lr: 'high' must be one of the finite numbers a type: float range takes, got inf"),
    ("fixed:\n  resume: last\nparams:\n  lr: {type: float, low: 0.01, high: 1}\n",
     "fixed.resume: set by the sweep for each trial (its own run folder, a new run); leave it out of the space"),
]


@pytest.mark.parametrize(("space", "message"), SPACES)
def test_bad_search_spaces_name_the_key(tmp_path, space, message):
    path = tmp_path / "space.yaml"
    path.write_text(space)
    with pytest.raises(UsageError) as err:
        load_space(path, tiny_recipe())
    assert str(err.value) == f"{path}: {message}"


@pytest.mark.slow
def test_a_grid_sweep_over_device_counts_runs_each_combination_once(tiny_data, tmp_path):
    """Trials on 2 devices run as their own train.py (DDP re-runs that command, not the sweep)."""
    space = write_space(tmp_path, "fixed:\n  scheduler: none\n  batch_size: 32\n  max_epochs: 1\n  accelerator: cpu\n"
                                  "params:\n  devices: {type: int, low: 1, high: 2}\n"
                                  "  momentum: {type: categorical, choices: [0.9]}\n")
    storage = str(tmp_path / "study.journal")
    done = subprocess.run(sweep(space, storage, tiny_data, tmp_path / "logs", 10, "--sampler", "grid"),
                          capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 trials so far; running 10 more (grid of 2) on 1 worker(s)" in done.stdout
    study = load(storage)
    combinations = sorted((t.params["devices"], t.params["momentum"]) for t in study.trials)
    assert combinations == [(1, 0.9), (2, 0.9)]  # each once, then the grid stops
    assert all(t.state == TrialState.COMPLETE for t in study.trials)
    trials = tmp_path / "logs" / "sweeps" / "tiny-sweep" / "trials"
    for trial in study.trials:
        if trial.params["devices"] == 2:
            results = json.loads((trials / f"trial_{trial.number:03d}" / "results.json").read_text())
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


def test_fast_dev_run_smoke_tests_a_sweep(tiny_data, tmp_path):
    path = write_space(tmp_path, "fixed:\n  fast_dev_run: true\n"
                                 "params:\n  lr: {type: categorical, choices: [0.2, 0.05]}\n")
    fixed, params = load_space(path, tiny_recipe())
    assert fixed == {"fast_dev_run": True}
    folder = tmp_path / "logs" / "sweeps" / "smoke"
    base = {"data_dir": str(tiny_data), "val_size": 40, "logdir": str(folder), "name": "trials",
            "trainer": {"enable_progress_bar": False}}
    study = open_study("smoke", str(tmp_path / "study.journal"), "none", 0, "grid", params)
    study.optimize(Objective(tiny_recipe(), fixed, params, base, folder), n_trials=5)
    assert sorted(t.params["lr"] for t in study.trials) == [0.05, 0.2]  # the grid, once each
    assert all(t.state == TrialState.COMPLETE and 0 <= t.value <= 1 for t in study.trials)


@pytest.mark.parametrize(("name", "kind"), [("median", optuna.pruners.MedianPruner),
                                            ("halving", optuna.pruners.SuccessiveHalvingPruner),
                                            ("none", optuna.pruners.NopPruner)])
def test_each_pruner_flag_opens_a_study_with_that_pruner(tmp_path, name, kind):
    study = open_study(f"pruned-{name}", str(tmp_path / "sweeps.journal"), name, 0)
    assert type(study.pruner) is kind


def test_a_study_keeps_its_space_and_its_trials_folder(monkeypatch, shared_tiny_data, tmp_path):
    """A second space on a study, a damaged journal, and a new journal whose study name meets the old one's trials
    in the same --logdir: each one line before any trial."""
    space = write_space(tmp_path, QUICK)
    journal = tmp_path / "study.journal"
    common = ("--storage", str(journal), "--data-dir", str(shared_tiny_data), "--logdir", str(tmp_path / "logs"),
              "--val-size", "40")
    study, _, objective = prepare(tiny_recipe(), sweep_args(monkeypatch, "--space", str(space), *common))
    study.optimize(objective, n_trials=1)
    other = tmp_path / "other.yaml"
    other.write_text("fixed:\n  max_epochs: 1\nparams:\n  momentum: {type: float, low: 0.5, high: 0.9}\n")
    with pytest.raises(UsageError) as refused:
        prepare(tiny_recipe(), sweep_args(monkeypatch, "--space", str(other), *common))
    assert str(refused.value) == ("--study-name tiny-sweep: its trials searched lr; this space searches momentum: "
                                  "choose another --study-name for another space")
    with pytest.raises(UsageError) as refused:
        elsewhere = sweep_args(monkeypatch, "--space", str(space), *common[2:], "--storage",
                               str(tmp_path / "new.journal"))
        prepare(tiny_recipe(), elsewhere)
    trials = tmp_path / "logs" / "sweeps" / "tiny-sweep" / "trials"
    assert str(refused.value) == (f"--study-name tiny-sweep: {trials} holds the trials of another study of this name "
                                  f"(trial_000, ...), not in {tmp_path / 'new.journal'}: choose another --study-name "
                                  "or --logdir")
    lines = journal.read_text().splitlines(keepends=True)
    journal.write_text("".join([*lines[:2], "garbage{{\n", *lines[2:]]))  # a line something else wrote
    with pytest.raises(UsageError) as refused:
        prepare(tiny_recipe(), sweep_args(monkeypatch, "--space", str(space), *common))
    assert str(refused.value).startswith(f"--storage {journal}: cannot read the study from it (")
    assert str(refused.value).endswith("); use another journal file, or repair this one")
    assert objective.base["trainer"] == {"enable_progress_bar": False}  # a trial draws no bar


def test_a_grid_sweep_is_seeded_and_walks_its_space(monkeypatch, shared_tiny_data, tmp_path):
    space = write_space(tmp_path, "params:\n  lr: {type: categorical, choices: [0.1, 0.2, 0.3]}\n"
                                  "  max_epochs: {type: int, low: 1, high: 2}\n")
    orders = []
    for journal in ("a.journal", "b.journal"):
        args = sweep_args(monkeypatch, "--space", str(space), "--storage", str(tmp_path / journal), "--data-dir",
                          str(shared_tiny_data), "--logdir", str(tmp_path / "logs"), "--sampler", "grid",
                          "--sampler-seed", "3")
        study, _, _ = prepare(tiny_recipe(), args)
        asked = [study.ask() for _ in range(6)]
        orders.append([(t.suggest_categorical("lr", [0.1, 0.2, 0.3]), t.suggest_int("max_epochs", 1, 2))
                       for t in asked])
    assert orders[0] == orders[1] and sorted(orders[0]) == [(lr, e) for lr in (0.1, 0.2, 0.3) for e in (1, 2)]


def test_a_storage_that_stops_answering_mid_sweep_is_one_line(monkeypatch, tmp_path):
    from sqlalchemy.exc import OperationalError

    from project.sweeps import study as sweep

    study = open_study("lost", str(tmp_path / "s.journal"), "none", 0)

    def lost(*args, **kwargs):
        raise OperationalError("SELECT", {}, Exception("server closed the connection unexpectedly"))

    monkeypatch.setattr(study, "optimize", lost)
    with pytest.raises(UserError, match="the study's storage stopped answering .*run the same command again"):
        sweep.run_trials(study, open_storage(str(tmp_path / "s.journal")), types.SimpleNamespace(), 1)


def test_the_default_storage_is_a_journal_file_under_the_log_folder(monkeypatch, shared_tiny_data, tmp_path):
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    assert sweep_args(monkeypatch).storage == str(Path("lightning_logs") / "sweeps" / "sweeps.journal")
    logdir = tmp_path / "logs"
    args = sweep_args(monkeypatch, "--space", str(write_space(tmp_path, QUICK)), "--data-dir", str(shared_tiny_data),
                      "--logdir", str(logdir), "--val-size", "40")
    assert args.storage == str(logdir / "sweeps" / "sweeps.journal")
    study, storage, _ = prepare(tiny_recipe(), args)  # its folder made for it
    assert isinstance(storage, JournalStorage) and isinstance(storage._backend, JournalFileBackend)
    assert (logdir / "sweeps" / "sweeps.journal").is_file() and study.study_name == "tiny-sweep"


@pytest.mark.parametrize("seconds, said", [(0, "0 s"), (59.4, "59 s"), (59.6, "1 min 0 s"), (250, "4 min 10 s"),
                                           (3599, "59 min 59 s"), (3600, "1 h 0 min"), (3900, "1 h 5 min"),
                                           (90061, "25 h 1 min")])
def test_durations_are_said_as_a_reader_needs_them(seconds, said):
    from project.sweeps.report import in_words

    assert in_words(seconds) == said


def test_the_rest_of_a_workers_trials_is_estimated_from_those_it_ran():
    from project.sweeps.study import time_left

    assert time_left([100.0, 200.0], 3) == 450.0
    assert time_left([30.0], 0) == 0.0


def test_each_trial_says_how_long_the_rest_will_take_and_the_report_the_time_per_trial(
        monkeypatch, shared_tiny_data, tmp_path, capsys):
    from project.sweeps import study as sweep
    from project.sweeps.report import in_words, report

    args = sweep_args(monkeypatch, "--space", str(write_space(tmp_path, QUICK)), "--data-dir", str(shared_tiny_data),
                      "--logdir", str(tmp_path / "logs"), "--val-size", "40", "--sampler-seed", "0")
    study, storage, objective = prepare(tiny_recipe(), args)
    sweep.run_trials(study, storage, objective, 3)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("trial ")]
    assert len(lines) == 3 and len(objective.seconds_each) == 3
    for ran, line in enumerate(lines, 1):
        seconds = objective.seconds_each[:ran]
        rest = (f"; about {in_words(sweep.time_left(seconds, 3 - ran))} for the {3 - ran} left at "
                f"{in_words(sum(seconds) / ran)} a trial  " if ran < 3 else "  ")
        assert f" in {seconds[-1]:.1f} s{rest}{{'lr': " in line, line
    text = report(study, tiny_recipe(), objective.fixed, objective.folder)
    each = [t.duration.total_seconds() for t in study.trials]
    assert f"time per trial {in_words(sum(each) / 3)} on average (3 ended; pruned ones are shorter)" in text


def an_exited_process() -> int:
    """The PID of a process that has ended (not reused within a test)."""
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(ended.stdout)


def made_trial(seconds: float, state, lr: float, optimizer: str, value: float | None = None):
    """A trial as a study records it, its duration given."""
    import datetime

    start = datetime.datetime(2026, 1, 1, 12, 0, 0)
    return optuna.trial.FrozenTrial(
        number=0, trial_id=0, state=state, value=value, params={"lr": lr, "optimizer": optimizer},
        distributions={"lr": optuna.distributions.FloatDistribution(1e-4, 1.0),
                       "optimizer": optuna.distributions.CategoricalDistribution(["sgd", "adam"])},
        datetime_start=start, datetime_complete=start + datetime.timedelta(seconds=seconds),
        user_attrs={}, system_attrs={}, intermediate_values={})


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")  # as the sweep's quiet() does
def test_the_report_is_its_best_trials_whole_and_best_yaml_the_best_trials_config(tmp_path):
    """Trials made by hand: the report's every line, best.yaml and best_trials.md, against values written out."""
    from project.sweeps.report import report

    study = optuna.create_study(direction="maximize", study_name="made")
    for seconds, lr, optimizer, value in [(30, 0.123456, "sgd", 0.91), (60, 0.05, "adam", 0.97), (40, 0.2, "sgd", 0.93),
                                          (50, 0.3, "sgd", 0.92), (20, 0.01, "adam", 0.95), (70, 0.4, "sgd", 0.90)]:
        study.add_trial(made_trial(seconds, TrialState.COMPLETE, lr, optimizer, value))
    study.add_trial(made_trial(10, TrialState.PRUNED, 0.6, "sgd"))
    study.add_trial(made_trial(500, TrialState.FAIL, 0.7, "adam"))  # no time of its own in the average
    folder = tmp_path / "report"
    text = report(study, tiny_recipe(), {"scheduler": "none", "max_epochs": 2}, folder)
    assert text.splitlines()[:12] == [
        "study made: 8 trials (6 complete, 1 pruned, 1 fail)",
        "time per trial 40 s on average (7 ended; pruned ones are shorter)",  # (30+60+40+50+20+70+10) / 7
        "",
        "| trial | val/acc | lr | optimizer |",
        "|---:|---:|---|---|",
        "| 1 | 0.9700 | 0.05 | adam |",
        "| 4 | 0.9500 | 0.01 | adam |",
        "| 2 | 0.9300 | 0.2 | sgd |",
        "| 3 | 0.9200 | 0.3 | sgd |",
        "| 0 | 0.9100 | 0.1235 | sgd |",  # five best, floats to four figures
        "",
        f"best config  {folder / 'best.yaml'}  (train.py --config {folder / 'best.yaml'})",
    ]
    assert text.splitlines()[12:] == [f"history plot  {folder / 'history.png'}",
                                      f"importance plot  {folder / 'importance.png'}"]
    assert (folder / "best_trials.md").read_text() == text + "\n"
    from PIL import Image

    for plot in ("history", "importance"):
        with Image.open(folder / f"{plot}.png") as drawn:
            assert drawn.size == (880, 495)  # 8 x 4.5 inches at 110 dpi
    best = (folder / "best.yaml").read_text()
    assert best.startswith("# best of study made: trial 1, val/acc 0.9700\n")
    config = yaml.safe_load(best)
    assert (config["lr"], config["optimizer"], config["scheduler"], config["max_epochs"]) == (0.05, "adam", "none", 2)
    assert config["batch_size"] == tiny_recipe().defaults["batch_size"]  # what neither set: the recipe's
    assert not {"data_dir", "logdir", "name"} & set(config)  # the machine's own, not the trial's


def test_a_report_before_any_trial_completed_says_so(tmp_path):
    from project.sweeps.report import report

    study = optuna.create_study(direction="maximize", study_name="early")
    study.add_trial(made_trial(12, TrialState.PRUNED, 0.6, "sgd"))
    assert report(study, tiny_recipe(), {}, tmp_path / "deeper" / "report") == (
        "study early: 1 trials (1 pruned)\ntime per trial 12 s on average (1 ended; pruned ones are shorter)\n"
        "no trial completed yet")
    assert (tmp_path / "deeper" / "report").is_dir() and not (tmp_path / "deeper" / "report" / "best.yaml").exists()


def test_a_journal_trial_whose_worker_died_is_failed_and_run_again_once_and_no_other(tmp_path):
    """Trials left running, each by another kind of worker: only those this machine's dead processes left are
    failed, each enqueued again with its parameters and the number of the trial it repeats."""
    import socket

    import psutil

    from project.sweeps.storage import owner, retried_from, retry_dead_workers_trials

    dead_pid = an_exited_process()
    here = socket.gethostname()
    storage = open_storage(str(tmp_path / "s.journal"))
    study = optuna.create_study(study_name="left", storage=storage, direction="maximize")
    workers = {
        "mine, alive": owner(),
        "exited": f"{here}:{dead_pid}:12345.00",
        "its PID reused": f"{here}:{os.getpid()}:{psutil.Process().create_time() - 60:.2f}",
        "another machine's": f"not-{here}:{dead_pid}:12345.00",
        "unreadable": f"{here}:not-a-pid:1.00",
        "another live process": f"{here}:{os.getppid()}:{psutil.Process(os.getppid()).create_time():.2f}",
        "unrecorded": None,
    }
    numbers = {}
    for name, worker in workers.items():
        trial = study.ask({"lr": optuna.distributions.FloatDistribution(0.01, 1.0)})
        if worker is not None:
            trial.set_user_attr("worker", worker)
        numbers[name] = trial.number
    lrs = {t.number: t.params["lr"] for t in study.trials}
    failed = retry_dead_workers_trials(study, storage)
    assert failed == [numbers["exited"], numbers["its PID reused"], numbers["unreadable"]]
    states = {t.number: t.state for t in study.trials}
    assert {n for n, s in states.items() if s == TrialState.FAIL} == set(failed)
    assert {n for n, s in states.items() if s == TrialState.RUNNING} == set(numbers.values()) - set(failed)
    waiting = [t for t in study.get_trials(deepcopy=True) if t.state == TrialState.WAITING]
    assert [(retried_from(t), t.params["lr"]) for t in waiting] == [(n, lrs[n]) for n in failed]
    assert retry_dead_workers_trials(study, storage) == []  # failed once: not again
    assert retry_dead_workers_trials(study, optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'r.db'}")) == []


@pytest.mark.parametrize("content", [b"", b"no newline at all", b"one\ntwo\n", b"one\ntwo\ncut",
                                     b"x" * 70000 + b"\n" + b"y" * 70000,  # its last newline two reads back
                                     b"\n" + b"z" * 65536, b"a\n" * 40000 + b"cut"])
def test_a_journals_complete_records_end_at_its_last_newline(tmp_path, content):
    from project.sweeps.storage import _end_of_last_record

    path = tmp_path / "j"
    path.write_bytes(content)
    with open(path, "rb") as journal:
        end = _end_of_last_record(journal)
        assert end == content.rfind(b"\n") + 1 and journal.tell() == end


def test_a_trial_runs_again_at_most_twice_after_its_worker_died(tmp_path):
    import socket

    from project.sweeps.storage import retried_from, retry_dead_workers_trials

    dead = f"{socket.gethostname()}:{an_exited_process()}:12345.00"
    storage = open_storage(str(tmp_path / "s.journal"))
    study = optuna.create_study(study_name="again", storage=storage, direction="maximize")
    waiting_after_each = []
    for run in range(3):  # the first run and the two it gets again, each left by a worker that died
        trial = study.ask({"lr": optuna.distributions.FloatDistribution(0.01, 1.0)})
        trial.set_user_attr("worker", dead)
        assert trial.number == run and retry_dead_workers_trials(study, storage) == [run]
        waiting_after_each.append(len(study.get_trials(states=(TrialState.WAITING,))))
    assert waiting_after_each == [1, 1, 0]
    assert [retried_from(t) for t in study.get_trials(deepcopy=True)] == [None, 0, 0]
    assert len({t.params["lr"] for t in study.trials}) == 1


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")
def test_a_database_storage_sends_heartbeats_and_retries_a_dead_workers_trial_twice(tmp_path):
    from project.sweeps.storage import RETRIES, _rdb

    storage = _rdb(f"sqlite:///{tmp_path / 'h.db'}", 30, shown="sqlite:///h.db")  # any RDB URL: SQLite is here
    assert (storage.heartbeat_interval, storage.grace_period) == (30, 60)
    study = optuna.create_study(study_name="beats", storage=storage, direction="maximize")
    retry = storage.get_heartbeat_stale_trial_callback()  # what a trial whose heartbeats stopped gets
    enqueued = []
    for _ in range(RETRIES + 1):
        trial = study.ask({"lr": optuna.distributions.FloatDistribution(0.01, 1.0)})
        study.tell(trial, state=TrialState.FAIL)
        retry(study, study.trials[trial.number])
        enqueued.append(len(study.get_trials(states=(TrialState.WAITING,))))
    assert enqueued == [1, 1, 0]


@pytest.mark.parametrize(("errors", "slept", "said"), [
    (["(psycopg.errors.UniqueViolation) duplicate key value violates unique constraint"], [0.2], None),
    (["relation \"studies\" already exists"] * 3, [0.2, 0.4, 0.6], None),
    (["relation \"studies\" already exists"] * 4, [0.2, 0.4, 0.6],
     "--storage postgresql://u:***@h/db: cannot open it (relation \"studies\" already exists)"),
    (["(psycopg.OperationalError) connection refused\nmore"], [],
     "--storage postgresql://u:***@h/db: cannot open it (connection refused)"),
])
def test_workers_racing_to_make_a_new_databases_tables_try_again(monkeypatch, errors, slept, said):
    """The loser of the race to create the tables tries again after 0.2, 0.4, 0.6 s; any other failure, or a fourth,
    is one line naming the URL without its password."""
    from project.sweeps import storage as storages

    left, waits, made = list(errors), [], []

    def rdb_storage(url, **options):
        if left:
            raise RuntimeError(left.pop(0))
        made.append((url, options))
        return "opened"

    monkeypatch.setattr(storages, "RDBStorage", rdb_storage)
    monkeypatch.setattr(storages.time, "sleep", waits.append)
    if said is None:
        assert storages._rdb("postgresql+psycopg://u:pw@h/db", 5, shown="postgresql://u:pw@h/db") == "opened"
        assert made[0][0] == "postgresql+psycopg://u:pw@h/db" and made[0][1]["heartbeat_interval"] == 5
    else:
        with pytest.raises(UsageError) as refused:
            storages._rdb("postgresql+psycopg://u:pw@h/db", 5, shown="postgresql://u:pw@h/db")
        assert str(refused.value) == said
    assert waits == pytest.approx(slept)


def test_a_grid_steps_from_low_to_high_inclusive_by_one_unless_told():
    assert grid({"max_epochs": {"type": "int", "low": 2, "high": 5}}) == {"max_epochs": [2, 3, 4, 5]}
    assert grid({"x": {"type": "int", "low": -2, "high": 2, "step": 2}}) == {"x": [-2, 0, 2]}
    assert grid({"x": {"type": "int", "low": 1, "high": 6, "step": 2}}) == {"x": [1, 3, 5]}  # high not on a step
    assert grid({"x": {"type": "float", "low": 0.5, "high": 1.5, "step": 0.5}}) == {"x": [0.5, 1.0, 1.5]}


def test_a_study_resumed_with_another_space_names_both(tmp_path):
    from project.sweeps.study import check_same_space

    study = open_study("two", str(tmp_path / "s.journal"), "none", 0)
    study.ask({"lr": optuna.distributions.FloatDistribution(0.01, 1.0),
               "momentum": optuna.distributions.FloatDistribution(0.5, 0.99)})
    check_same_space(study, {"momentum": {}, "lr": {}}, "two")  # the same space, in any order
    with pytest.raises(UsageError) as refused:
        check_same_space(study, {"lr": {}, "batch_size": {}}, "two")
    assert str(refused.value) == ("--study-name two: its trials searched lr, momentum; this space searches "
                                  "batch_size, lr: choose another --study-name for another space")


def test_a_worker_recovers_dead_workers_trials_before_its_own_and_after_each(monkeypatch, tmp_path, capsys):
    from project.sweeps import study as sweep

    storage = open_storage(str(tmp_path / "s.journal"))
    study = optuna.create_study(study_name="recovering", storage=storage, direction="maximize")
    asked = []
    monkeypatch.setattr(sweep, "retry_dead_workers_trials", lambda s, st: asked.append(st) or [7 + len(asked)])

    def objective(trial):
        return trial.suggest_float("lr", 0.01, 1.0)

    sweep.run_trials(study, storage, objective, 2)
    assert asked == [storage] * 3  # before the first trial, then after each
    assert capsys.readouterr().out.splitlines() == [
        f"trial {n}: its worker died; failed, and enqueued again" for n in (8, 9, 10)]


def test_a_lost_storage_says_what_it_answered(monkeypatch, tmp_path):
    from sqlalchemy.exc import OperationalError

    from project.sweeps import study as sweep

    study = open_study("lost", str(tmp_path / "s.journal"), "none", 0)
    monkeypatch.setattr(study, "optimize", lambda *a, **k: (_ for _ in ()).throw(
        OperationalError("SELECT", {}, Exception("server closed the connection"))))
    with pytest.raises(UserError) as refused:
        sweep.run_trials(study, open_storage(str(tmp_path / "s.journal")), types.SimpleNamespace(), 1)
    assert str(refused.value).startswith("the study's storage stopped answering ((builtins.Exception) server closed")
    assert str(refused.value).endswith("; the trials that ended are in it: run the same command again once it is back")


def test_the_time_left_is_unknown_before_any_trial_ended():
    import math

    from project.sweeps.study import time_left

    assert math.isnan(time_left([], 3))


@pytest.mark.parametrize(("spec", "opened"), [
    ("postgresql://u:pw@h/db", ("postgresql+psycopg://u:pw@h/db", 60, "postgresql://u:pw@h/db")),
    ("postgresql+psycopg2://u:pw@h/db", ("postgresql+psycopg2://u:pw@h/db", 60, "postgresql+psycopg2://u:pw@h/db")),
    ("mysql://u:pw@h/db", ("mysql://u:pw@h/db", 60, "mysql://u:pw@h/db")),
    ("postgresql://u:p+w://x@h/db", ("postgresql+psycopg://u:p+w://x@h/db", 60, "postgresql://u:p+w://x@h/db")),
])
def test_a_database_url_is_opened_with_the_driver_it_names_or_ours(monkeypatch, spec, opened):
    from project.sweeps import storage as storages

    made = []
    monkeypatch.setattr(storages, "_rdb", lambda url, heartbeat, shown: made.append((url, heartbeat, shown)) or "db")
    assert storages.open_storage(spec) == "db" and made == [opened]
    assert storages.open_storage(spec, heartbeat=5) == "db" and made[-1][1] == 5


def test_a_database_without_its_driver_and_sqlite_under_any_driver_are_one_line(monkeypatch):
    import builtins

    from project.sweeps import storage as storages

    with pytest.raises(UsageError) as refused:
        storages.open_storage("sqlite+pysqlite:///s.db")
    assert str(refused.value) == ("--storage sqlite+pysqlite:///s.db: SQLite locks the whole file and fails under "
                                  "parallel workers; use a journal file (--storage sweeps.journal) on one machine, "
                                  "PostgreSQL on several")
    real_import = builtins.__import__
    monkeypatch.setattr(builtins, "__import__", lambda name, *a, **k: (_ for _ in ()).throw(ImportError(name))
                        if name == "psycopg" else real_import(name, *a, **k))
    with pytest.raises(UsageError) as refused:
        storages.open_storage("postgresql://u:pw@h/db")
    assert str(refused.value) == "--storage postgresql://...: needs the psycopg driver: pip install -e '.[postgres]'"


def test_a_cut_record_is_set_aside_whole_and_named(monkeypatch, tmp_path, capsys):
    from project.sweeps import storage as storages

    journal = tmp_path / "s.journal"
    journal.write_bytes(b'{"op": 1}\n{"op": 2}\n{"op": 3, "cut')
    monkeypatch.setattr(storages.time, "strftime", lambda fmt: {"%Y%m%d-%H%M%S": "20260102-030405"}[fmt])
    aside = storages.set_aside_a_cut_record(journal)
    assert aside == tmp_path / f"s.journal.cut-20260102-030405-{os.getpid()}"
    assert aside.read_bytes() == b'{"op": 3, "cut' and journal.read_bytes() == b'{"op": 1}\n{"op": 2}\n'
    assert capsys.readouterr().err == (
        f"sweep.py: {journal}: its last record was cut short (a kill or a full disk mid-write); set aside in {aside} "
        "(14 bytes), the study goes on from the complete records\n")
    assert storages.set_aside_a_cut_record(journal) is None  # whole now: nothing to do, nothing said
    assert storages.set_aside_a_cut_record(tmp_path / "new.journal") is None
    assert capsys.readouterr().err == "" and sorted(p.name for p in tmp_path.iterdir()) == [
        "s.journal", aside.name]


def test_a_journal_that_cannot_be_used_says_why(tmp_path):
    with pytest.raises(UsageError) as refused:
        open_storage(str(tmp_path / "no" / "s.journal"))
    assert str(refused.value) == (f"--storage {tmp_path / 'no' / 's.journal'}: its folder does not exist; give a "
                                  "journal file's path (or a database URL)")
    (tmp_path / "op.journal").write_text('{"op_code": 99}\n')
    with pytest.raises(UsageError) as refused:
        open_storage(str(tmp_path / "op.journal"))
    assert str(refused.value) == (f"--storage {tmp_path / 'op.journal'}: cannot read the study from it (Should not "
                                  "reach.); use another journal file, or repair this one")  # Optuna's own words
    for lines in ('{"a": 1}', "[1, 2]"):  # another program's records, whatever Optuna raises for them
        foreign = tmp_path / "other.journal"
        foreign.write_text(lines + "\n")
        with pytest.raises(UsageError) as refused:
            open_storage(str(foreign))
        assert str(refused.value).startswith(f"--storage {foreign}: cannot read the study from it (")
        assert str(refused.value).endswith("); use another journal file, or repair this one")


@pytest.mark.parametrize("sampler", ["tpe", "random", "grid"])
def test_a_seeded_sampler_samples_the_same_trials_again(tmp_path, sampler):
    params = {"lr": {"type": "float", "low": 0.1, "high": 0.9, "step": 0.1},
              "optimizer": {"type": "categorical", "choices": ["sgd", "adam", "adamw"]}}

    def sampled(seed, journal):
        from project.sweeps.study import suggest

        study = open_study("seeded", str(tmp_path / journal), "none", seed, sampler, params)
        return [suggest(study.ask(), params) for _ in range(4)]

    assert sampled(7, "a.journal") == sampled(7, "b.journal") != sampled(8, "c.journal")


@pytest.mark.parametrize(("pruner", "kind"), [("median", "MedianPruner"), ("halving", "SuccessiveHalvingPruner"),
                                              ("none", "NopPruner")])
def test_the_median_pruner_waits_for_two_trials_and_an_epoch(tmp_path, pruner, kind):
    study = open_study("pruned", str(tmp_path / "p.journal"), pruner, 0)
    assert type(study.pruner).__name__ == kind
    if pruner == "median":
        for value in (0.9, 0.8):  # two trials that ended: the pruner may judge the third
            trial = study.ask()
            trial.report(value, step=0)
            trial.report(value, step=1)
            study.tell(trial, value)
        weak = study.ask()
        weak.report(0.1, step=0)
        assert not weak.should_prune()  # its first epoch is a warm-up
        weak.report(0.1, step=1)
        assert weak.should_prune()


def test_a_space_takes_flag_names_as_written_and_trainer_arguments(tmp_path):
    stepped = write_space(tmp_path, "params:\n  lr: {type: float, low: 0.1, high: 0.5, step: 0.1, log: false}\n")
    assert load_space(stepped, tiny_recipe())[1]["lr"]["step"] == 0.1  # a step on a linear scale is fine
    path = write_space(tmp_path, "fixed:\n  max-epochs: 2\n  trainer: {limit_train_batches: 2}\n"
                                 "params:\n  batch-size: {type: int, low: 16, high: 32}\n")
    fixed, params = load_space(path, tiny_recipe())
    assert fixed == {"max-epochs": 2, "trainer": {"limit_train_batches": 2}}
    assert params == {"batch-size": {"type": "int", "low": 16, "high": 32}}



def test_a_dead_workers_trial_another_worker_failed_first_is_left_to_it(tmp_path, monkeypatch):
    import socket

    from project import internals
    from project.sweeps.storage import retry_dead_workers_trials

    storage = open_storage(str(tmp_path / "s.journal"))
    study = optuna.create_study(study_name="raced", storage=storage, direction="maximize")
    for _ in range(2):
        study.ask({"lr": optuna.distributions.FloatDistribution(0.01, 1.0)}).set_user_attr(
            "worker", f"{socket.gethostname()}:{an_exited_process()}:12345.00")
    real = storage.set_trial_state_values

    def first_taken(trial_id, state, values=None):
        if trial_id == internals.trial_id(study.trials[0]):
            raise optuna.exceptions.UpdateFinishedTrialError("failed by another worker")
        return real(trial_id, state, values)

    monkeypatch.setattr(storage, "set_trial_state_values", first_taken)
    assert retry_dead_workers_trials(study, storage) == [1]  # the race lost on trial 0; trial 1 still failed
