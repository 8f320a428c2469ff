"""The benchmark's DDP rows: bare Lightning and the template, each as 2 CPU processes (gloo) under ``torchrun``.

``scripts/benchmark.py`` launches ``python -m torch.distributed.run --nproc-per-node 2 -m project.benchmark.ddp``
once per row; both ranks train on the same samples as every other row (each rank on its half, as DDP shards), and
rank 0 writes what it measured to a JSON file the benchmark reads back. Per step means per optimizer step of a
rank: each step's time includes the all-reduce of its gradients.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from project.benchmark.loops import BareModule, BenchData, DataWait, bare_loader, bench_data, evaluate
from project.errors import UserError, first_line

PROCESSES = 2
ROWS = ("bare-ddp", "template-ddp")
ROOT = Path(__file__).resolve().parents[2]  # the template's folder: where the rows' processes start
# A line of Python's report of an exception ("RuntimeError: ...", "torch.distributed.DistNetworkError: ..."); torchrun's
# own ChildFailedError only says that a rank failed.
EXCEPTION_LINE = re.compile(r"^(?!.*ChildFailedError)[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b(: .*)?$")


def measure(row: str, args: argparse.Namespace, root: Path = ROOT) -> dict[str, Any]:
    """Run ``row`` under ``torchrun`` (from this interpreter, on loopback) and read back rank 0's measurement; a
    rank that fails is one line, its own reason (``torchrun``'s report of it is many)."""
    with tempfile.TemporaryDirectory(prefix="benchmark-ddp-") as scratch:
        out = Path(scratch) / "row.json"
        settings = {**vars(args), "logdir": str(Path(scratch) / "logs")}
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
               "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}  # each rank one core of its own
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                               f"--nproc-per-node={PROCESSES}", "-m", "project.benchmark.ddp", row,
                               json.dumps(settings), str(out)],
                              cwd=root, env=env, capture_output=True, text=True)
        if done.returncode != 0 or not out.exists():
            reasons = sorted(Path(scratch).glob(f"{out.stem}.error-rank*"))
            reason = reasons[0].read_text() if reasons else torchrun_failure(done.stderr)
            raise UserError(f"the {row} row failed (exit code {done.returncode}): {first_line(reason)}")
        return json.loads(out.read_text())


def torchrun_failure(stderr: str) -> str:
    """Why a row failed where no rank wrote its reason (a rank killed, or one that exited without an exception), from
    ``torchrun``'s stderr: the rank it names as the root cause and its exit code, and the last exception a process
    printed; ``torchrun``'s report itself is a page that ends with a rule of '='."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    cause = next((i for i, line in enumerate(lines) if line.startswith("Root Cause")), len(lines))
    fields: dict[str, str] = {}
    for line in lines[cause + 1:]:
        key, colon, value = line.partition(":")
        if colon and key.strip() in ("rank", "exitcode"):
            fields.setdefault(key.strip(), re.sub(r"\s*\(pid: \d+\)\s*", " ", value).split(" (local_rank")[0].strip())
    exception = next((line for line in reversed(lines[:cause]) if EXCEPTION_LINE.match(line)), None)
    said = [f"rank {fields['rank']} ended with exit code {fields['exitcode']}"] if len(fields) == 2 else []
    said += [exception] if exception else []
    if not said:
        return next((line for line in reversed(lines) if line.strip("=-")), "no output")
    return ": ".join(said)


def _rank_steps(samples: int, batch_size: int) -> int:
    """Optimizer steps per epoch of one rank: its half of the samples (DDP pads the shorter half)."""
    return math.ceil(math.ceil(samples / PROCESSES) / batch_size)


def _run(row: str, args: argparse.Namespace) -> dict[str, Any] | None:
    """The row on this rank; what rank 0 measured (None on the others)."""
    from project.contract import installed_recipe
    from project.training.callbacks import quiet_lightning_info

    quiet_lightning_info()
    data = bench_data(installed_recipe(), args, torch.device("cpu"))
    steps = _rank_steps(len(data.train), args.batch_size)
    wait = DataWait()
    measured = (_bare if row == "bare-ddp" else _template)(data, args, steps, wait)
    if measured is None:
        return None
    return {**measured, "warm_up_s": measured["epoch_times"][0], "epoch_times": measured["epoch_times"][1:],
            "wait_times": wait.epoch_waits[1:], "steps_per_epoch": steps, "processes": PROCESSES}


def _bare(data: BenchData, args: argparse.Namespace, steps: int, wait: DataWait) -> dict[str, Any] | None:
    import lightning as L

    from project.hardware.devices import resolve_precision
    from project.training.callbacks import EpochStats

    cpu, stats = torch.device("cpu"), EpochStats()
    total = steps * (args.epochs + 1)
    module = BareModule(*data.network(), lambda net: data.optimizer(net, total, cpu))
    precision: Any = resolve_precision(args.precision, "cpu")
    trainer = L.Trainer(accelerator="cpu", devices=PROCESSES, strategy="ddp", precision=precision,
                        max_epochs=args.epochs + 1,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[stats, wait], limit_val_batches=0)
    trainer.fit(module, train_dataloaders=bare_loader(data.train, args.batch_size))
    if not trainer.is_global_zero:
        return None
    return {"epoch_times": stats.epoch_times, "test_acc": evaluate(module.net, data.test, cpu)}


def _template(data: BenchData, args: argparse.Namespace, steps: int, wait: DataWait) -> dict[str, Any] | None:
    from project.training.run import train

    config = data.config.replace(logdir=args.logdir, name="bench", max_epochs=args.epochs + 1, devices=PROCESSES,
                                 strategy="ddp", accelerator="cpu", trainer={"enable_progress_bar": False})
    result = train(config, data.recipe, datamodule=data.datamodule(), callbacks=[wait])
    if not result.is_global_zero:
        return None
    return {"epoch_times": result.epoch_times, "test_acc": float(result.test_metrics["test/acc"]),
            "steps_per_call": result.steps.k}


def main() -> None:
    row, settings, out = sys.argv[1:4]
    try:
        if row not in ROWS:
            raise UserError(f"no row {row!r} (rows: {', '.join(ROWS)})")
        measured = _run(row, argparse.Namespace(**json.loads(settings)))
    except Exception as err:  # the reason, for measure() to print in one line; the traceback stays on stderr
        Path(out).with_name(f"{Path(out).stem}.error-rank{os.environ.get('RANK', '0')}").write_text(
            str(err) if isinstance(err, UserError) else f"{type(err).__name__}: {err}")
        raise
    if measured is not None:
        Path(out).write_text(json.dumps(measured))


if __name__ == "__main__":
    main()
