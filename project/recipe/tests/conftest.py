"""Fixtures of the MNIST recipe's own tests: its example files, the real data when present, the default run.

These tests go where the recipe goes: a recipe swapped in brings its own ``tests/`` (or none). They
run this recipe whatever ``PROJECT_RECIPE`` the engine's tests set.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from project.recipe.example import write_example_digits
from project.recipe.mnist_files import RAW_FILES, raw_folder
from tests import helpers
from tests.helpers import HANG_S

THIS_RECIPE = {"PROJECT_RECIPE": "project.recipe"}


@pytest.fixture(autouse=True)
def this_recipe(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name, value in THIS_RECIPE.items():
        monkeypatch.setenv(name, value)
    yield


def run_script(script: str, *args: str, timeout: float = HANG_S) -> subprocess.CompletedProcess:
    """``scripts/<script>`` in a fresh interpreter, on this recipe."""
    return helpers.run_script(script, *args, timeout=timeout, env=THIS_RECIPE)


@pytest.fixture
def mnist_files(tmp_path: Path) -> Path:
    """A data folder holding the recipe's example digits as the four MNIST files (240 train, 80 test)."""
    return write_example_digits(tmp_path / "data", 240, 80)


@pytest.fixture(scope="session")
def real_data_dir() -> Path:
    data_dir = os.environ.get("DATA_DIR")
    if not data_dir or not all((raw_folder(Path(data_dir)) / name).is_file() for name in RAW_FILES):
        pytest.skip("real MNIST not available (set DATA_DIR to a folder holding MNIST/raw/)")
    return Path(data_dir).resolve()


@pytest.fixture(scope="session")
def default_run(real_data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The default recipe, exactly as ``python scripts/train.py`` runs it, on real MNIST."""
    logdir = tmp_path_factory.mktemp("default") / "logs"
    done = run_script("train.py", "--data-dir", str(real_data_dir), "--logdir", str(logdir))
    assert done.returncode == 0, done.stdout + done.stderr
    return {"logs": logdir, "output": done.stdout, "stderr": done.stderr}
