"""A sweep on every device at once: one worker process per device (or group of devices), sharing the study.

Each worker is ``sweep.py`` again with ``--workers 1``, pinned to its devices: on GPU by
``CUDA_VISIBLE_DEVICES``, on CPU by the cores it may run on. Trials are split evenly, so the
command runs exactly ``--n-trials`` trials whatever the number of workers.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from project.config.schema import RunConfig
from project.errors import UsageError, UserError
from project.hardware.devices import OVERSUBSCRIBED, expected_world_size, resolve_accelerator
from project.reliability.processes import die_with_parent

SWEEP_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "sweep.py"


@dataclass(frozen=True)
class Worker:
    """What one worker may use: GPU indices (``CUDA_VISIBLE_DEVICES``) or CPU cores."""

    gpus: tuple[int, ...] = ()
    cores: tuple[int, ...] = ()

    @classmethod
    def current(cls) -> Worker:
        """What this process may use, as its parent pinned it."""
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        if visible and torch.cuda.is_available():
            return cls(gpus=tuple(int(i) for i in visible.split(",") if i.strip().isdigit()))
        return cls(cores=tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else ())

    def describe(self) -> str:
        if self.gpus:
            return "cuda:" + ",".join(map(str, self.gpus))
        return "cpu core" + ("s " if len(self.cores) > 1 else " ") + ",".join(map(str, self.cores))

    def enter(self) -> None:
        """Run in the worker between fork and exec: it dies with the sweep, and stays on its cores."""
        die_with_parent()
        if self.cores:
            os.sched_setaffinity(0, self.cores)

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, self.gpus))
        elif self.cores:
            env.setdefault("OMP_NUM_THREADS", str(len(self.cores)))
        return env


def devices_per_trial(config: RunConfig, params: dict[str, dict[str, Any]]) -> int:
    """The most devices one trial uses on this machine (a swept ``devices`` counts at its largest)."""
    spec = params.get("devices")
    if spec is None:
        return max(1, expected_world_size(config) // config.num_nodes)
    values = spec["choices"] if spec["type"] == "categorical" else [spec["high"]]
    return max(max(1, expected_world_size(config.replace(devices=v)) // config.num_nodes) for v in values)


def plan_workers(requested: int | str, config: RunConfig, params: dict[str, dict[str, Any]]) -> list[Worker]:
    """``auto``: one worker per group of GPUs a trial needs, one worker on CPU; a count: that many."""
    per_trial = devices_per_trial(config, params)
    if resolve_accelerator(config.accelerator) == "cuda":
        gpus = list(range(torch.cuda.device_count()))
        count = max(1, len(gpus) // per_trial) if requested == "auto" else int(requested)
        if count * per_trial > len(gpus):
            raise UsageError(f"--workers {count}: {count} worker(s) x {per_trial} GPU(s) per trial needs "
                             f"{count * per_trial} GPUs; this machine has {len(gpus)}")
        return [Worker(gpus=tuple(gpus[i * per_trial:(i + 1) * per_trial])) for i in range(count)]
    count = 1 if requested == "auto" else int(requested)
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    if count > OVERSUBSCRIBED * len(cores):  # as --devices N on CPU: past this, workers take turns more than train
        raise UsageError(f"--workers {count}: {count} trials at once on {len(cores)} CPU core(s) would take turns "
                         f"more than they train; use at most {OVERSUBSCRIBED * len(cores)}")
    if count > len(cores):
        return [Worker() for _ in range(count)]  # more workers than cores: let the kernel share them out
    share = len(cores) // count
    return [Worker(cores=tuple(cores[i * share:(i + 1) * share])) for i in range(count)]


def shares(n_trials: int, workers: int) -> list[int]:
    """``n_trials`` split as evenly as possible (a worker with none is not started)."""
    return [n_trials // workers + (i < n_trials % workers) for i in range(workers)]


def run_workers(workers: Sequence[Worker], n_trials: int, argv: Sequence[str], sampler_seed: int | None) -> None:
    """Start every worker, each with its share of the trials, and wait for all; a failed one is one line.

    A seeded sampler gets one seed per worker (seed, seed + 1, ...): with the same seed every
    worker would sample the same parameters.
    """
    procs = []
    for index, (worker, count) in enumerate(zip(workers, shares(n_trials, len(workers)), strict=True)):
        if count == 0:
            continue
        seed = [] if sampler_seed is None else ["--sampler-seed", str(sampler_seed + index)]
        command = [sys.executable, str(SWEEP_SCRIPT), *argv, *seed, "--workers", "1", "--n-trials", str(count),
                   "--worker"]
        procs.append((worker, subprocess.Popen(command, env=worker.environment(), preexec_fn=worker.enter)))
    failed = [(worker, proc.wait()) for worker, proc in procs]
    failed = [(worker, code) for worker, code in failed if code != 0]
    if failed:
        worker, code = failed[0]
        raise UserError(f"{len(failed)} of {len(procs)} workers failed (the one on {worker.describe()} exited "
                        f"with {code}; its error is above); the others' trials are in the study")
