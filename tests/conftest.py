"""Fixtures: the tests' recipe and its tiny data, runs trained once and shared, real services.

The engine's tests train ``tests/tiny_recipe``, never ``project/recipe/``: a user who swaps the
recipe keeps them green. Set before anything imports the engine, and inherited by every script
the tests start. The installed recipe's own tests are in ``project/recipe/tests/``; the recipe
conformance tests (``test_recipe_conformance.py``) run on the recipe ``PROJECT_RECIPE`` named when pytest
started, else the installed one.
"""

from __future__ import annotations

import json
import os

# The recipe a user named (else the installed one) is the one the conformance tests check; the workers
# inherit it from the first process, which saw the user's PROJECT_RECIPE.
os.environ.setdefault("RECIPE_UNDER_TEST", os.environ.get("PROJECT_RECIPE", "project.recipe"))
os.environ["PROJECT_RECIPE"] = "tests.tiny_recipe"
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import (
    CHECKPOINTED,
    HANG_S,
    TWO_RANKS,
    make_bars,
    make_tiny_data,
    newest_last_checkpoint,
    run_in,
    run_script,
    swapped_template,
    tiny_run,
)
from services import Postgres, Slurm, postgres_server, slurm_cluster

# The suite's workers and the scripts they start share two cores: one thread per process, not two
# each spinning against the others (tiny batches gain nothing from more).
os.environ.setdefault("OMP_NUM_THREADS", "1")

# The short run the after-training tests share. Two hidden units cannot separate ten
# classes: mistakes for the worst-mistakes figure to show.
SHORT = ("--max-epochs", "2", "--hidden", "2", "--lr", "0.05", "--scheduler", "none")


def pytest_configure(config: pytest.Config) -> None:
    from project.training.callbacks import QUIET_WARNINGS  # the run's own filters, not a copy of them

    config.pluginmanager.register(NameFailuresAsTheyHappen(config))
    for message in QUIET_WARNINGS:
        config.addinivalue_line("filterwarnings", f"ignore:{message}")


class NameFailuresAsTheyHappen:
    """A failing test is named the moment it fails (under xdist too), not only in the summary: a run cut short
    (a laptop's lid, a CI limit) still says what failed."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if report.failed and reporter is not None:
            reporter.ensure_newline()
            reporter.write_line(f"FAILED {report.nodeid} ({report.when})", red=True)


# srun's test compares with the uninterrupted 2-rank run: one worker holds both, and trains that run once; the
# PostgreSQL server is started once, for the sweeps' storages and the tests that use it directly.
SHARES_A_WORKER_WITH = {"slurm": "uninterrupted_ddp", "postgres": "storage"}


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under ``pytest -n`` (xdist, ``--dist loadgroup``), the tests of one shared run go to one worker, so each
    session-wide run is trained once; slow tests are handed out first, so the quick ones fill the gaps at the end."""
    for item in items:
        for fixture in ("trained", "slurm", "uninterrupted_ddp", "storage", "postgres", "second_recipe"):
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.xdist_group(SHARES_A_WORKER_WITH.get(fixture, fixture)))
                break
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def credentials_of_this_test_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The credentials a script's parser was given are masked in all its process prints after (errors.redact): in
    the tests' one process, each test starts with none, so that one test's password masks nothing in another's."""
    from project import errors

    monkeypatch.setattr(errors, "_GIVEN", {})


@pytest.fixture(autouse=True)
def lightning_keeps_its_level() -> Iterator[None]:
    """A sweep's prepare() quiets Lightning for its whole process: in the tests' one process, the tests after one
    that swept must still hear Lightning (whatever order pytest, xdist or mutmut runs them in)."""
    import logging

    loggers = {name: logging.getLogger(name).level for name in ("lightning.pytorch", "lightning.fabric")}
    yield
    for name, level in loggers.items():
        logging.getLogger(name).setLevel(level)  # setLevel, which also clears the loggers' caches


@pytest.fixture
def tiny_data(tmp_path: Path) -> Path:
    return make_tiny_data(tmp_path / "data")


@pytest.fixture(scope="session")
def shared_tiny_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny data that tests only read (never damage)."""
    return make_tiny_data(tmp_path_factory.mktemp("shared") / "data")


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    """A real PostgreSQL server on loopback for the session (its tests share one xdist worker)."""
    with postgres_server() as server:
        yield server


@pytest.fixture(scope="session")
def slurm() -> Iterator[Slurm]:
    """A real one-node SLURM cluster for the session (its tests share one xdist worker)."""
    with slurm_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="session")
def trained(shared_tiny_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One ``train.py`` process on tiny data (2 epochs, with a portable export), shared by the tests that read runs."""
    root = tmp_path_factory.mktemp("trained")
    done = tiny_run(shared_tiny_data, root / "logs", *SHORT, "--export-pt2", str(root / "model.pt2"))
    assert done.returncode == 0, done.stdout + done.stderr
    run = root / "logs" / "tiny" / "version_0"
    return {"data": shared_tiny_data, "logs": root / "logs", "run": run, "output": done.stdout,
            "stderr": done.stderr, "results": json.loads((run / "results.json").read_text()),
            "pt2": root / "model.pt2"}


@pytest.fixture(scope="session")
def uninterrupted_ddp(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One 2-rank run, never interrupted: what every interrupted DDP run must end equal to, and what the DDP
    output tests read. 83 test images, so the ranks' test shards differ in size."""
    root = tmp_path_factory.mktemp("ddp")
    data = make_tiny_data(root / "data", n_train=680, n_test=83, wrong_labels=0.1)  # metrics below 1: they can tell
    # faulty_train.py with no fault is train.py that says which process left its process group open at exit
    done = run_script("../tests/faulty_train.py", "--data-dir", str(data), "--logdir", str(root / "logs"),
                      *CHECKPOINTED, *TWO_RANKS, timeout=HANG_S)
    assert done.returncode == 0, done.stdout + done.stderr
    return {"data": data, "logs": root / "logs", "output": done.stdout, "stderr": done.stderr,
            "last": newest_last_checkpoint(root / "logs")}


# The second recipe's runs: 320 training images of 3 x 12 x 16 in batches of 32 are 10 steps per epoch.
BARS = ("--batch-size", "32", "--max-epochs", "4", "--log-every-n-steps", "2",
        "--checkpoint-every-n-steps", "3", "--accelerator", "cpu")


@pytest.fixture(scope="session")
def second_recipe(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The template with ``tests/second_recipe`` (a CNN on coloured bars) swapped in for the MNIST recipe, its
    data, and one run of it with steps per call 1 and a portable export, which the other runs compare with."""
    root = tmp_path_factory.mktemp("second_recipe")
    template, data, logs = swapped_template(root / "template"), make_bars(root / "data"), root / "logs"
    done = run_in(template, "train.py", "--data-dir", str(data), "--logdir", str(logs), *BARS,
                  "--steps-per-call", "1", "--export-pt2", str(root / "model.pt2"))
    assert done.returncode == 0, done.stdout + done.stderr
    run = logs / "bars" / "version_0"
    return {"template": template, "data": data, "root": root, "run": run, "output": done.stdout,
            "results": json.loads((run / "results.json").read_text()), "pt2": root / "model.pt2"}
