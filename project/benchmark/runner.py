"""``scripts/benchmark.py``: ways to train the recipe, timed side by side in one process; the report."""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from project.benchmark import ddp
from project.benchmark import loops as bench_loops
from project.contract import Recipe
from project.errors import UsageError, UserError
from project.hardware.devices import available_accelerator, resolve_precision
from project.results.plots import pyplot
from project.training.callbacks import quiet_lightning_info

ROOT = Path(__file__).resolve().parents[2]  # the template's folder
ROWS = {  # the references first: every row's ratios are known when it is printed
    "hand": "hand-written tensor loop",
    "hand-unfused": "hand-written tensor loop, torch.optim unfused",
    "hand-graphs": "hand-written loop, CUDA graphs",
    "hand-samples": "hand-written loop, per-sample DataLoader",
    "article": "article loop (per-sample DataLoader, its plain SGD)",
    "bare": "bare Lightning (no callbacks, logger or bar)",
    "template-k1": "template, steps per call 1",
    "template-auto": "template, steps per call auto",
    "template-graphs": "template, steps per call auto, CUDA graphs",
    "template-samples": "template, per-sample DataLoader",
    "template-compile": "template, steps per call auto, --compile",
    "bare-ddp": "bare Lightning DDP, 2 CPU processes (gloo)",
    "template-ddp": "template DDP, 2 CPU processes (gloo)",
}
GPU_ROWS = ("hand-graphs", "template-graphs")  # CUDA graphs: on a GPU only
# Run only when --only names them: what fused optimizer kernels save; minutes of compiling on a CPU; two
# processes each, launched by torchrun.
OPT_IN_ROWS = ("hand-unfused", "template-compile", *ddp.ROWS)
REFERENCES = {"vs_hand": ("hand", "vs hand-written"), "vs_hand_graphs": ("hand-graphs", "vs hand captured"),
              "vs_hand_samples": ("hand-samples", "vs hand per-sample"), "vs_bare": ("bare", "vs bare Lightning"),
              "vs_bare_ddp": ("bare-ddp", "vs bare DDP")}


def run_all(recipe: Recipe, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Every row, each printed (stdout) and written to ``out`` as soon as it is measured; Lightning's banners of
    each row's Trainer are left out."""
    quiet_lightning_info()
    device = torch.device(available_accelerator(args.accelerator))
    precision = resolve_precision(args.precision, args.accelerator)
    data = bench_loops.bench_data(recipe, args, device)
    runners: dict[str, Callable[[], dict[str, Any]]] = {
        "article": lambda: bench_loops.hand_loop("article", args, device, precision, data),
        "hand": lambda: bench_loops.hand_loop("hand", args, device, precision, data),
        "hand-unfused": lambda: bench_loops.hand_loop("unfused", args, device, precision, data),
        "hand-samples": lambda: bench_loops.hand_loop("samples", args, device, precision, data),
        "hand-graphs": lambda: bench_loops.hand_graphs(args, device, precision, data),
        "bare": lambda: bench_loops.bare_lightning(args, device, precision, data),
        "template-k1": lambda: bench_loops.template(args, data, 1),
        "template-auto": lambda: bench_loops.template(args, data, "auto"),
        "template-graphs": lambda: bench_loops.template(args, data, "auto", cuda_graphs=True),
        "template-samples": lambda: bench_loops.template(args, data, 1, per_sample=True),
        "template-compile": lambda: bench_loops.template(args, data, "auto", compile_mode="default"),
        **{row: functools.partial(ddp.measure, row, args) for row in ddp.ROWS},
    }
    missing = {}
    if data.per_sample is None:  # the recipe has no per-sample dataset: the rows that need one cannot run
        missing.update(dict.fromkeys(("article", "hand-samples", "template-samples"),
                                     "it needs the recipe's per-sample dataset, load_samples"))
    elif data.reads_samples:
        missing["template-samples"] = "the recipe reads per sample anyway: it is the template rows"
    if device.type != "cuda":
        missing.update(dict.fromkeys(GPU_ROWS, "CUDA graphs need a GPU"))
    else:
        missing.update(dict.fromkeys(ddp.ROWS, "2 CPU processes: run them with --accelerator cpu"))
    if device.type == "cuda" and (precision == "16-mixed" or data.config.optimizer != "sgd"):
        missing["hand-graphs"] = "the hand-written captured loop is plain SGD without a loss scaler"
    wanted = [k for k in ROWS if k not in missing and k not in OPT_IN_ROWS] if args.only == "all" else \
        [k.strip() for k in args.only.split(",") if k.strip()]
    unknown = next((k for k in wanted if k not in runners or k in missing), None)
    if unknown:
        why = f" ({missing[unknown]})" if unknown in missing else ""
        raise UsageError(f"--only {unknown}: choose from {', '.join(k for k in runners if k not in missing)}{why}")
    wanted = sorted(dict.fromkeys(wanted), key=list(ROWS).index)  # the references first, each row once
    results = {
        "device": str(device), "precision": precision, "batch_size": args.batch_size,
        "timed_epochs": args.epochs, "train_samples": len(data.train), "recipe": recipe.name,
        "steps_per_epoch": data.steps(1, args.batch_size), "repeats": args.repeat,
        "cpu": cpu_name(), "torch": torch.__version__, "threads": torch.get_num_threads(),
        "num_workers": data.config.num_workers,
        "references": [name for name, (key, _) in REFERENCES.items() if key in wanted], "rows": [],
    }
    with _writing(out, "make the folder", UsageError):
        out.mkdir(parents=True, exist_ok=True)
    print(_header(results), flush=True)
    measured: dict[str, list[dict[str, Any]]] = {key: [] for key in wanted}
    for repeat in range(args.repeat):  # interleaved: a noisy minute lands on every row alike
        if args.repeat > 1:
            print(f"| repeat {repeat + 1} of {args.repeat} |", flush=True)
        this_repeat: dict[str, dict[str, Any]] = {}
        for key in wanted:
            print(f"running {ROWS[key]} ...", file=sys.stderr, flush=True)
            this_repeat[key] = _measured_row(key, runners[key](), results, this_repeat)
            measured[key].append(this_repeat[key])
            print(_row(this_repeat[key], results), flush=True)
            results["rows"] = [_summary(rows) for rows in measured.values() if rows]
            _write(results, out)
        for row in this_repeat.values():  # now also to the references measured after it (the hand loop to bare)
            _add_ratios(row, this_repeat)
    results["rows"] = [_summary(rows) for rows in measured.values()]
    _write(results, out)
    if args.repeat > 1:
        print(_summary_table(results), flush=True)
    return results


def _measured_row(key: str, measured: dict[str, Any], results: dict[str, Any],
                  this_repeat: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One row of one repeat, its ratios to the references measured in the same repeat."""
    epoch = statistics.median(measured["epoch_times"])
    row = {"key": key, "implementation": ROWS[key], "epoch_s": epoch,
           "step_us": epoch / measured.get("steps_per_epoch", results["steps_per_epoch"]) * 1e6,
           "samples_per_s": results["train_samples"] / epoch,
           "data_wait": statistics.median(w / t for w, t in zip(measured["wait_times"], measured["epoch_times"],
                                                                 strict=True)),
           **measured}
    _add_ratios(row, {**this_repeat, key: row})
    return row


def _add_ratios(row: dict[str, Any], this_repeat: dict[str, dict[str, Any]]) -> None:
    """``row``'s ratio to each reference row measured in the same repeat (None where there is none)."""
    for name, (reference, _) in REFERENCES.items():
        base = this_repeat.get(reference)
        alike = (row["key"] in ddp.ROWS) == (reference in ddp.ROWS)  # a DDP step holds an all-reduce: DDP to DDP
        row[name] = row["step_us"] / base["step_us"] if base and alike else None


def _summary(repeats: list[dict[str, Any]]) -> dict[str, Any]:
    """A row over its repeats: the median of each time and ratio, each ratio's range, every repeat kept."""
    if len(repeats) == 1:
        return repeats[0]
    row = {**repeats[-1], "repeats": [{k: r[k] for k in ("epoch_s", "step_us", *REFERENCES)} for r in repeats]}
    for name in ("epoch_s", "step_us", "samples_per_s", "data_wait", "warm_up_s", "test_acc"):
        row[name] = statistics.median(r[name] for r in repeats)
    for name in REFERENCES:
        ratios = [r[name] for r in repeats if r[name] is not None]
        row[name] = statistics.median(ratios) if ratios else None
        row[f"{name}_range"] = [min(ratios), max(ratios)] if ratios else None
    return row


IMPORTS = "import torch, lightning, torchvision, torchmetrics"  # what any script of the kind must import


def own_import_seconds(env: dict[str, str]) -> tuple[float, float]:
    """Seconds of importing what ``train.py`` runs on, in a fresh interpreter (``python -X importtime``): all of
    it, and the project's own modules' share (their self time; the libraries they import are not theirs)."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", "import project.training.run"], env=env,
                          cwd=ROOT, capture_output=True, text=True, check=True)
    total = own = 0
    for line in done.stderr.splitlines():
        fields = line.removeprefix("import time:").split("|")
        if len(fields) != 3 or not fields[0].strip().isdigit():
            continue  # the header, or anything else on stderr
        total += int(fields[0])
        own += int(fields[0]) if fields[2].strip().split(".")[0] == "project" else 0
    return total / 1e6, own / 1e6


def time_to_accuracy(train_script: Path, data_dir: str | None) -> dict[str, Any]:
    """The whole default ``train.py`` command, imports included: time until it prints the test
    accuracy, and until it exits (it draws the end-of-run figures after printing); and its own time,
    the wall time less that of importing the libraries it is built on, in a fresh interpreter
    on the same machine (the faster of two)."""
    env = dict(os.environ)
    if data_dir:
        env["DATA_DIR"] = str(data_dir)
    imports = []
    for _ in range(2):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", IMPORTS], env=env, check=True)
        imports.append(time.perf_counter() - started)
    accuracy, printed_at = None, None
    with tempfile.TemporaryDirectory() as logdir:
        started = time.perf_counter()
        with subprocess.Popen([sys.executable, str(train_script), "--logdir", logdir], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as process:
            for line in process.stdout or ():
                match = re.match(r"test/acc (\d\.\d+)", line)
                if match and printed_at is None:
                    printed_at, accuracy = time.perf_counter() - started, float(match.group(1))
        wall = time.perf_counter() - started
    all_imports, project_imports = own_import_seconds(env)
    return {"command": "python scripts/train.py", "printed_s": printed_at, "wall_s": wall, "test_acc": accuracy,
            "exit_code": process.returncode, "imports_s": min(imports), "own_s": wall - min(imports),
            "train_imports_s": all_imports, "project_imports_s": project_imports}


def cpu_name() -> str:
    """The processor's model, as the kernel names it (a ratio measured on one CPU may not hold on another)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    named = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
    return named or platform.processor() or platform.machine()


def _gpu(results: dict[str, Any]) -> bool:
    return results["device"].startswith("cuda")


def _columns(results: dict[str, Any]) -> list[tuple[str, Callable[[dict[str, Any]], str]]]:
    """The table's columns: a ratio for each reference row measured, host syncs on a GPU."""
    def ratio(name: str) -> Callable[[dict[str, Any]], str]:
        def cell(r: dict[str, Any]) -> str:
            spread = r.get(f"{name}_range")
            if not r.get(name):
                return "-"
            return f"{r[name]:.2f}x ({spread[0]:.2f}-{spread[1]:.2f})" if spread else f"{r[name]:.2f}x"
        return cell

    columns: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        ("epoch time (s)", lambda r: f"{r['epoch_s']:.3f}"),
        ("µs per step", lambda r: f"{r['step_us']:,.0f}"),
        ("samples/s", lambda r: f"{r['samples_per_s']:,.0f}"),
        *((REFERENCES[name][1], ratio(name)) for name in results["references"]),
        ("waits for data", lambda r: f"{r['data_wait']:.0%}"),
        ("warm-up epoch (s)", lambda r: f"{r['warm_up_s']:.2f}"),
        ("test acc", lambda r: f"{r['test_acc']:.4f}"),
        ("steps per call", lambda r: str(r.get("steps_per_call", "-"))),
    ]
    if _gpu(results):
        columns.append(("host syncs per step",
                        lambda r: f"{r['syncs_per_step']:.2f}" if "syncs_per_step" in r else "-"))
    return columns


def _header(results: dict[str, Any]) -> str:
    timing = "CUDA events" if _gpu(results) else "the host's clock"
    columns = _columns(results)
    repeats = results["repeats"]
    over = f"; every row {repeats} times, interleaved: medians, ratios' ranges in brackets" if repeats > 1 else ""
    return "\n".join([
        f"device {results['device']} (CPU {results['cpu']}, {results['threads']} threads), precision "
        f"{results['precision']}, batch {results['batch_size']}, "
        f"{results['train_samples']} samples ({results['steps_per_epoch']} steps) per epoch, "
        f"DataLoader workers {results['num_workers']}; median of {results['timed_epochs']} timed epochs after one "
        f"warm-up epoch, timed with {timing}{over}",
        "",
        "| implementation | " + " | ".join(name for name, _ in columns) + " |",
        "|---|" + "---:|" * len(columns),
    ])


def _row(r: dict[str, Any], results: dict[str, Any]) -> str:
    return f"| {r['implementation']} | " + " | ".join(cell(r) for _, cell in _columns(results)) + " |"


def _table(results: dict[str, Any]) -> str:
    return "\n".join([_header(results), *(_row(r, results) for r in results["rows"])])


def _summary_table(results: dict[str, Any]) -> str:
    return f"\nover the {results['repeats']} repeats:\n{_table(results)}"


def _markdown(results: dict[str, Any]) -> str:
    lines = [_table(results)]
    tta = results.get("time_to_accuracy")
    if tta:
        acc = f"{tta['test_acc']:.4f}" if tta["test_acc"] is not None else "n/a"
        printed = f"{tta['printed_s']:.1f} s" if tta["printed_s"] is not None else "n/a"
        lines += ["", f"time to accuracy: `{tta['command']}` printed test acc {acc} after {printed} "
                      f"(imports, data, fit, test); the process ended after {tta['wall_s']:.1f} s, of which "
                      f"{tta['imports_s']:.1f} s import torch, Lightning, torchvision and torchmetrics: its own time "
                      f"{tta['own_s']:.1f} s. Importing what it runs on took {tta['train_imports_s']:.1f} s "
                      f"(python -X importtime), of which the project's own modules {tta['project_imports_s']:.2f} s"]
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def _writing(out: Path, what: str, error: type[UserError] = UserError) -> Iterator[None]:
    """A folder the filesystem refuses (full, read-only, /proc) is one line naming ``--out``."""
    try:
        yield
    except OSError as err:
        raise error(f"--out {out}: cannot {what} ({err.strerror})") from None


def _write(results: dict[str, Any], out: Path) -> None:
    with _writing(out, "write the results"):
        (out / "benchmark.json").write_text(json.dumps(results, indent=2))
        (out / "benchmark.md").write_text(_markdown(results))


def report(results: dict[str, Any], out: Path) -> None:
    """The files once more (with the whole command's time, if measured) and the chart."""
    _write(results, out)
    tta = results.get("time_to_accuracy")
    if tta:
        print(_markdown(results).splitlines()[-1], flush=True)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3))
    labels = [r["implementation"] for r in results["rows"]]
    ax.barh(labels[::-1], [r["epoch_s"] for r in results["rows"]][::-1], color="#4c72b0")
    ax.set_xlabel("median epoch time (s), lower is better")
    ax.set_title(f"{results['recipe']}, batch {results['batch_size']}, {results['device']}, {results['precision']}")
    fig.tight_layout()
    try:
        with _writing(out, "write the chart"):
            fig.savefig(out / "benchmark.png", dpi=120)
    finally:
        plt.close(fig)
    print(f"wrote {out / 'benchmark.json'}, {out / 'benchmark.md'}, {out / 'benchmark.png'}", file=sys.stderr)
