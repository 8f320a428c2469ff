"""Helpers shared by the tests: tiny MNIST files in real IDX format, script runs, summary parsing."""

from __future__ import annotations

import os
import random
import re
import socket
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TRAIN = str(ROOT / "scripts" / "train.py")
RAW_NAMES = {
    (True, "images"): "train-images-idx3-ubyte",
    (True, "labels"): "train-labels-idx1-ubyte",
    (False, "images"): "t10k-images-idx3-ubyte",
    (False, "labels"): "t10k-labels-idx1-ubyte",
}
# Small, fast settings for runs on tiny data.
TINY = ("--batch-size", "32", "--log-every-n-steps", "2", "--val-size", "40")
TINY_SETTINGS = {"batch_size": 32, "log_every_n_steps": 2, "val_size": 40}
# Runs the fault tests interrupt: 640 training images in batches of 32 are 20 steps per epoch on one
# process, 10 per rank on two; last.ckpt every 3 steps, so most kills land mid-epoch.
CHECKPOINTED = (*TINY, "--checkpoint-every-n-steps", "3", "--accelerator", "cpu")
TWO_RANKS = ("--devices", "2", "--max-epochs", "4")


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


def run_script(script: str, *args: str, timeout: float = 300, env: dict | None = None,
               cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``scripts/<script>`` in a fresh interpreter, as a user would."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / script), *args],
        capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd or ROOT,
    )


def tiny_run(data_dir: Path, logdir: Path, *extra: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return run_script("train.py", "--data-dir", str(data_dir), "--logdir", str(logdir), *TINY, *extra,
                      timeout=timeout)


def tiny_config(data_dir: Path, logdir: Path, **settings: Any) -> Any:
    """A ``RunConfig`` for an in-process ``train()`` on tiny data (no progress bar)."""
    from project.config.schema import RunConfig

    trainer = {"enable_progress_bar": False, **settings.pop("trainer", {})}
    return RunConfig(data_dir=str(data_dir), logdir=str(logdir), **{**TINY_SETTINGS, **settings}, trainer=trainer)


def summary_value(output: str, key: str) -> str:
    match = re.search(rf"^{re.escape(key)}\s+(\S+)", output, re.MULTILINE)
    assert match, f"{key!r} missing from:\n{output}"
    return match.group(1)


def event_accumulator(run_dir: Path) -> Any:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    events.Reload()
    return events


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def one_line_error(stderr: str, prog: str = "train.py") -> str:
    """The single error line a script printed; fails if there is a traceback or more than one line."""
    lines = stderr.strip().splitlines()
    assert "Traceback" not in stderr, stderr
    assert lines and lines[-1].startswith(f"{prog}: error: "), stderr
    return lines[-1]


def write_transformed_digits(data_dir: Path, out: Path, count: int = 200, seed: int = 0) -> dict[str, int]:
    """Real MNIST test digits as a user's scans would look: PNG/JPEG, grayscale/RGB/RGBA, either
    polarity, other sizes, padded and off-centre. Returns file name -> true label."""
    from PIL import Image
    from torchvision import datasets

    rng = random.Random(seed)
    test = datasets.MNIST(data_dir, train=False)
    out.mkdir(parents=True, exist_ok=True)
    labels = {}
    for index in range(count):
        digit = Image.fromarray(test.data[index].numpy(), mode="L")
        dark_on_light = rng.random() < 0.5
        if dark_on_light:
            digit = Image.eval(digit, lambda v: 255 - v)
        side = rng.randint(40, 160)
        digit = digit.resize((side, side), Image.Resampling.BICUBIC)
        canvas_w, canvas_h = side + rng.randint(0, 120), side + rng.randint(0, 120)
        canvas = Image.new("L", (canvas_w, canvas_h), 255 if dark_on_light else 0)
        canvas.paste(digit, (rng.randint(0, canvas_w - side), rng.randint(0, canvas_h - side)))
        kind = rng.choice(["png-gray", "png-rgb", "png-rgba", "jpeg"])
        name = f"digit{index:03d}"
        if kind == "png-gray":
            canvas.save(out / f"{name}.png")
        elif kind == "png-rgb":
            canvas.convert("RGB").save(out / f"{name}.png")
        elif kind == "png-rgba":
            rgba = canvas.convert("RGBA")
            ink = canvas if not dark_on_light else Image.eval(canvas, lambda v: 255 - v)
            rgba.putalpha(ink)  # paper transparent, strokes opaque
            rgba.save(out / f"{name}.png")
        else:
            canvas.convert("RGB").save(out / f"{name}.jpg", quality=90)
        labels[next(out.glob(f"{name}.*")).name] = int(test.targets[index])
    return labels


def newest_last_checkpoint(logdir: Path) -> dict:
    """The ``last.ckpt`` of the newest ``version_N`` run under ``logdir/mnist``."""
    import torch

    newest = max((logdir / "mnist").iterdir(), key=lambda p: int(p.name.split("_")[1]))
    return torch.load(newest / "checkpoints" / "last.ckpt", weights_only=True)


def assert_same_training_state(a: dict, b: dict) -> None:
    """Two checkpoints hold bitwise the same training: step, weights, optimizer, schedule, data position."""
    import torch

    assert a["global_step"] == b["global_step"] and a["epoch"] == b["epoch"]
    for key in a["state_dict"]:
        assert torch.equal(a["state_dict"][key], b["state_dict"][key]), key
    for state_a, state_b in zip(a["optimizer_states"][0]["state"].values(),
                                b["optimizer_states"][0]["state"].values(), strict=True):
        for name in state_a:
            assert torch.equal(state_a[name], state_b[name]), name
    assert a["lr_schedulers"] == b["lr_schedulers"]
    assert a["MNISTDataModule"] == b["MNISTDataModule"]  # the same place in the epoch's data order


def fill_file_system(path: Path) -> None:
    """Write zeros to ``path`` until its file system is full: a real ENOSPC for every write after it."""
    with open(path, "wb") as stream:
        try:
            while True:
                stream.write(b"\0" * 65536)
                stream.flush()
        except OSError:
            pass
