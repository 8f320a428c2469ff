"""Shared fixtures: tiny MNIST files written as real IDX, and the real data when present."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
RAW_NAMES = {
    (True, "images"): "train-images-idx3-ubyte",
    (True, "labels"): "train-labels-idx1-ubyte",
    (False, "images"): "t10k-images-idx3-ubyte",
    (False, "labels"): "t10k-labels-idx1-ubyte",
}


def write_idx(path: Path, array: np.ndarray) -> None:
    """Write ``uint8`` data in the IDX format MNIST uses (magic 0x0803 images, 0x0801 labels)."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + array.tobytes())


def make_tiny_mnist(root: Path, n_train: int = 240, n_test: int = 80, seed: int = 0) -> Path:
    """Learnable fake digits: class k lights up a band of rows, plus noise."""
    rng = np.random.default_rng(seed)
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for train, n in ((True, n_train), (False, n_test)):
        labels = rng.integers(0, 10, size=n).astype(np.uint8)
        images = rng.integers(0, 60, size=(n, 28, 28)).astype(np.uint8)
        for i, k in enumerate(labels):
            images[i, 2 + 2 * k : 4 + 2 * k, 4:24] = 255
        write_idx(raw / RAW_NAMES[(train, "images")], images)
        write_idx(raw / RAW_NAMES[(train, "labels")], labels)
    return root


@pytest.fixture
def tiny_mnist(tmp_path: Path) -> Path:
    return make_tiny_mnist(tmp_path / "data")


@pytest.fixture
def real_data_dir() -> Path:
    data_dir = os.environ.get("DATA_DIR")
    if not data_dir or not all((Path(data_dir) / "MNIST" / "raw" / n).is_file() for n in RAW_NAMES.values()):
        pytest.skip("real MNIST not available (set DATA_DIR to a folder holding MNIST/raw/)")
    return Path(data_dir).resolve()


def run_script(script: str, *args: str, timeout: float = 300, env: dict | None = None,
               cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``scripts/<script>`` in a fresh interpreter, as a user would."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / script), *args],
        capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd or ROOT,
    )
