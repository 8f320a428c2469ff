"""``scripts/benchmark.py``: ways to train the recipe, timed side by side in one process; the report."""

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from project.benchmark import loops as bench_loops
from project.config.schema import RECIPE
from project.errors import UsageError
from project.hardware.devices import available_accelerator, resolve_precision
from project.results.figures import pyplot
from project.training.console import quiet_known_warnings

ROWS = {
    "article": "article loop (per-sample DataLoader)",
    "hand": "hand-written tensor loop",
    "bare": "bare Lightning (no callbacks, logger or bar)",
    "template-k1": "template, steps per call 1",
    "template-auto": "template, steps per call auto",
    "template-torchvision": "template, torchvision loader",
}
REFERENCE = "hand"


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    quiet_known_warnings()
    device = torch.device(available_accelerator(args.accelerator))
    precision = resolve_precision(args.precision, args.accelerator)
    data = bench_loops.bench_data(args)
    runners: dict[str, Callable[[], dict[str, Any]]] = {
        "article": lambda: bench_loops.hand_loop("article", args, device, precision, data),
        "hand": lambda: bench_loops.hand_loop("hand", args, device, precision, data),
        "bare": lambda: bench_loops.bare_lightning(args, device, precision, data),
        "template-k1": lambda: bench_loops.template(args, data, 1),
        "template-auto": lambda: bench_loops.template(args, data, "auto"),
        "template-torchvision": lambda: bench_loops.template(args, data, 1, "torchvision"),
    }
    if data.per_sample is None:  # the recipe has no per-sample dataset: the rows that need one cannot run
        for key in ("article", "template-torchvision"):
            runners.pop(key)
    wanted = [k for k in ROWS if k in runners] if args.only == "all" else \
        [k.strip() for k in args.only.split(",") if k.strip()]
    unknown = [k for k in wanted if k not in runners]
    if unknown:
        why = " (it needs the recipe's per-sample dataset, load_samples)" if unknown[0] in ROWS else ""
        raise UsageError(f"--only {unknown[0]}: choose from {', '.join(runners)}{why}")
    rows = []
    for key in wanted:
        print(f"running {ROWS[key]} ...", file=sys.stderr, flush=True)
        measured = runners[key]()
        epoch = statistics.median(measured["epoch_times"])
        rows.append({"key": key, "implementation": ROWS[key], "epoch_s": epoch,
                     "samples_per_s": len(data.train) / epoch, **measured})
    reference = next((r["epoch_s"] for r in rows if r["key"] == REFERENCE), None)
    for row in rows:
        row["vs_hand"] = row["epoch_s"] / reference if reference else None
    return {
        "device": str(device), "precision": precision, "batch_size": args.batch_size,
        "timed_epochs": args.epochs, "train_samples": len(data.train), "recipe": RECIPE.name,
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
    gpu = results["device"].startswith("cuda")
    lines = [
        f"device {results['device']}, precision {results['precision']}, batch {results['batch_size']}, "
        f"{results['train_samples']} samples/epoch, median of {results['timed_epochs']} epochs after a warm-up",
        "",
        "| implementation | epoch time (s) | samples/s | vs hand-written | test acc | steps per call |"
        + (" host syncs per step |" if gpu else ""),
        "|---|---:|---:|---:|---:|---:|" + ("---:|" if gpu else ""),
    ]
    for r in results["rows"]:
        ratio = f"{r['vs_hand']:.2f}x" if r["vs_hand"] else "-"
        syncs = f" {r['syncs_per_step']:.2f} |" if gpu and "syncs_per_step" in r else (" - |" if gpu else "")
        lines.append(f"| {r['implementation']} | {r['epoch_s']:.3f} | {r['samples_per_s']:,.0f} | {ratio} | "
                     f"{r['test_acc']:.4f} | {r.get('steps_per_call', '-')} |{syncs}")
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
    labels = [r["implementation"] for r in results["rows"]]
    ax.barh(labels[::-1], [r["epoch_s"] for r in results["rows"]][::-1], color="#4c72b0")
    ax.set_xlabel("median epoch time (s), lower is better")
    ax.set_title(f"{results['recipe']}, batch {results['batch_size']}, {results['device']}, {results['precision']}")
    fig.tight_layout()
    fig.savefig(out / "benchmark.png", dpi=120)
    plt.close(fig)
    print(f"wrote {out / 'benchmark.json'}, {out / 'benchmark.md'}, {out / 'benchmark.png'}")
