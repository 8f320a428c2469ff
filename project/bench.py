"""The four training implementations that ``scripts/benchmark.py`` compares, and its report."""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Subset
from torchvision import datasets, transforms

from project import EVAL_BATCH_SIZE
from project.config import RunConfig
from project.console import quiet_known_warnings
from project.datamodule import normalize, split_indices
from project.devices import resolve_accelerator, resolve_precision
from project.figures import pyplot
from project.idx_files import ensure_mnist, resolve_data_dir
from project.model import build_sequential

NAMES = {
    "a": "article loop (DataLoader + ToTensor)",
    "b": "hand-written tensor loop",
    "c": "template, in-memory loader",
    "d": "template, torchvision loader",
}
ARTICLE_LR = 0.01


class EpochTimer:
    """Times an epoch with CUDA events on a GPU, with the wall clock elsewhere."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def __enter__(self) -> EpochTimer:
        if self.cuda:
            self._start, self._end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.cuda:
            self._end.record()
            self._end.synchronize()
            self.seconds = self._start.elapsed_time(self._end) / 1000
        else:
            self.seconds = time.perf_counter() - self._t0


def _autocast(device: torch.device, precision: str) -> Any:
    if precision.endswith("-mixed"):
        dtype = torch.bfloat16 if precision.startswith("bf16") else torch.float16
        return torch.autocast(device.type, dtype=dtype)
    return torch.autocast(device.type, enabled=False)


def _train_split(data_dir: Path, limit: int | None) -> list[int]:
    """The template's seeded train split, so every implementation sees the same samples."""
    defaults = RunConfig()
    train, _ = split_indices(len(datasets.MNIST(data_dir, train=True)), defaults.val_size, defaults.seed)
    return train[:limit] if limit else train


def _evaluate(model: nn.Module, images: torch.Tensor, targets: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        correct = sum(
            int((model(x.reshape(len(x), -1)).argmax(1) == y).sum())
            for x, y in zip(images.split(EVAL_BATCH_SIZE), targets.split(EVAL_BATCH_SIZE), strict=True)
        )
    model.train()
    return correct / len(targets)


def _hand_loops(
    kind: str, args: argparse.Namespace, device: torch.device, precision: str, train_idx: list[int],
    data_dir: Path,
) -> tuple[list[float], float]:
    torch.manual_seed(0)
    model = build_sequential((128,)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=ARTICLE_LR)
    criterion = nn.NLLLoss()
    test = datasets.MNIST(data_dir, train=False)
    if kind == "a":
        train_data = Subset(datasets.MNIST(data_dir, train=True, transform=transforms.ToTensor()), train_idx)
        loader: Iterable = DataLoader(train_data, batch_size=args.batch_size, shuffle=True)
        test_x = test.data.unsqueeze(1).float().div(255).to(device)

        def batches() -> Iterable:
            return loader
    else:
        full = datasets.MNIST(data_dir, train=True)
        index = torch.tensor(train_idx)
        images, labels = normalize(full.data[index]).to(device), full.targets[index].to(device)
        test_x = normalize(test.data).to(device)

        def batches() -> Iterable:
            order = torch.randperm(len(labels), device=device)
            return ((images[i], labels[i]) for i in order.split(args.batch_size))

    times = []
    for _ in range(args.epochs + 1):
        with EpochTimer(device) as timer:
            for inputs, targets in batches():
                inputs = inputs.to(device, non_blocking=True).reshape(len(inputs), -1)
                targets = targets.to(device, non_blocking=True)
                with _autocast(device, precision):
                    loss = criterion(model(inputs).float(), targets)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
        times.append(timer.seconds)
    return times[1:], _evaluate(model, test_x, test.targets.to(device))


def _template(kind: str, args: argparse.Namespace, limit: int | None, data_dir: Path) -> tuple[list[float], float]:
    from project.run import train

    with tempfile.TemporaryDirectory() as logdir:
        config = RunConfig(
            accelerator=args.accelerator, precision=args.precision, data_dir=str(data_dir), logdir=logdir,
            name="bench", max_epochs=args.epochs + 1, batch_size=args.batch_size,
            loader="memory" if kind == "c" else "torchvision",
            # the article's recipe, as in (a) and (b)
            optimizer="sgd", lr=ARTICLE_LR, momentum=0.0, weight_decay=0.0, scheduler="none",
            trainer={"enable_progress_bar": False, **({"limit_train_batches": limit // args.batch_size}
                                                       if limit else {})},
        )
        result = train(config)
    return result.epoch_times[1:], float(result.test_metrics["test/acc"])


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    quiet_known_warnings()
    data_dir = resolve_data_dir(args.data_dir)
    ensure_mnist(data_dir, download=True)
    accelerator = resolve_accelerator(args.accelerator)
    device = torch.device(accelerator)
    precision = resolve_precision(args.precision, accelerator)
    train_idx = _train_split(data_dir, args.limit)
    rows = []
    runners: dict[str, Callable[[], tuple[list[float], float]]] = {
        "a": lambda: _hand_loops("a", args, device, precision, train_idx, data_dir),
        "b": lambda: _hand_loops("b", args, device, precision, train_idx, data_dir),
        "c": lambda: _template("c", args, args.limit, data_dir),
        "d": lambda: _template("d", args, args.limit, data_dir),
    }
    for key in [k.strip() for k in args.only.split(",") if k.strip()]:
        print(f"running ({key}) {NAMES[key]} ...", file=sys.stderr, flush=True)
        times, accuracy = runners[key]()
        epoch = statistics.median(times)
        rows.append({
            "key": key, "implementation": NAMES[key], "epoch_s": epoch,
            "samples_per_s": len(train_idx) / epoch, "test_acc": accuracy, "epoch_times": times,
        })
    reference = next((r["epoch_s"] for r in rows if r["key"] == "b"), None)
    for row in rows:
        row["ratio_to_b"] = row["epoch_s"] / reference if reference else None
    return {
        "device": str(device), "precision": precision, "batch_size": args.batch_size,
        "timed_epochs": args.epochs, "train_samples": len(train_idx),
        "torch": torch.__version__, "threads": torch.get_num_threads(), "rows": rows,
    }


def time_to_accuracy(train_script: Path, data_dir: str | None) -> dict[str, Any]:
    """The whole default ``train.py`` command, imports included: time until it prints the test
    accuracy, and until it exits (it draws the end-of-run figures after printing)."""
    env = dict(os.environ)
    if data_dir:
        env["DATA_DIR"] = str(data_dir)
    accuracy, printed_at = None, None
    with tempfile.TemporaryDirectory() as logdir:
        started = time.perf_counter()
        with subprocess.Popen([sys.executable, str(train_script), "--logdir", logdir], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as process:
            for line in process.stdout:
                match = re.match(r"test/acc (\d\.\d+)", line)
                if match and printed_at is None:
                    printed_at, accuracy = time.perf_counter() - started, float(match.group(1))
        wall = time.perf_counter() - started
    return {"command": "python scripts/train.py", "printed_s": printed_at, "wall_s": wall, "test_acc": accuracy,
            "exit_code": process.returncode}


def _markdown(results: dict[str, Any]) -> str:
    lines = [
        f"device {results['device']}, precision {results['precision']}, batch {results['batch_size']}, "
        f"{results['train_samples']} samples/epoch, median of {results['timed_epochs']} epochs after a warm-up",
        "",
        "| implementation | epoch time (s) | samples/s | ratio to (b) | test acc |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in results["rows"]:
        ratio = f"{r['ratio_to_b']:.2f}x" if r["ratio_to_b"] else "-"
        lines.append(f"| ({r['key']}) {r['implementation']} | {r['epoch_s']:.3f} | {r['samples_per_s']:,.0f} | "
                     f"{ratio} | {r['test_acc']:.4f} |")
    tta = results.get("time_to_accuracy")
    if tta:
        acc = f"{tta['test_acc']:.4f}" if tta["test_acc"] is not None else "n/a"
        printed = f"{tta['printed_s']:.1f} s" if tta["printed_s"] is not None else "n/a"
        lines += ["", f"time to accuracy: `{tta['command']}` printed test acc {acc} after {printed} "
                      f"(imports, data, fit, test); the process ended after {tta['wall_s']:.1f} s"]
    return "\n".join(lines) + "\n"


def report(results: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    markdown = _markdown(results)
    print(markdown)
    (out / "benchmark.json").write_text(json.dumps(results, indent=2))
    (out / "benchmark.md").write_text(markdown)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3))
    labels = [f"({r['key']}) {r['implementation']}" for r in results["rows"]]
    ax.barh(labels[::-1], [r["epoch_s"] for r in results["rows"]][::-1], color="#4c72b0")
    ax.set_xlabel("median epoch time (s), lower is better")
    ax.set_title(f"MNIST MLP, batch {results['batch_size']}, {results['device']}, {results['precision']}")
    fig.tight_layout()
    fig.savefig(out / "benchmark.png", dpi=120)
    plt.close(fig)
    print(f"wrote {out / 'benchmark.json'}, {out / 'benchmark.md'}, {out / 'benchmark.png'}")
