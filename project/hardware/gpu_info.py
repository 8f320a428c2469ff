"""What accelerators this machine has, and how fast they multiply matrices (``scripts/check_gpu.py``)."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import torch

from project import internals
from project.hardware.devices import mps_available, resolve_accelerator


def auto_accelerator() -> str:
    """Ask Lightning itself what ``accelerator="auto"`` resolves to here."""
    try:
        return internals.auto_accelerator()
    except Exception:  # noqa: BLE001 - private API; fall back to the same rule, stated by us
        return resolve_accelerator("auto")


def cuda_device(index: int) -> dict[str, Any]:
    props = torch.cuda.get_device_properties(index)
    free, total = torch.cuda.mem_get_info(index)
    return {
        "index": index,
        "device": f"cuda:{index}",
        "name": props.name,
        "compute_capability": f"{props.major}.{props.minor}",
        "total_memory_gib": round(props.total_memory / 2**30, 2),
        "multiprocessors": props.multi_processor_count,
        "free_memory_gib": round(free / 2**30, 2),
        "used_memory_gib": round((total - free) / 2**30, 2),
        "bf16": bool(torch.cuda.is_bf16_supported()) if index == torch.cuda.current_device() else props.major >= 8,
    }


def collect() -> dict[str, Any]:
    cuda = torch.cuda.is_available()
    return {
        "torch": torch.__version__,
        "cuda_build": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "cuda_available": cuda,
        "device_count": torch.cuda.device_count() if cuda else 0,
        "devices": [cuda_device(i) for i in range(torch.cuda.device_count())] if cuda else [],
        "mps_available": mps_available(),
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "lightning_auto_accelerator": auto_accelerator(),
    }


def matmul_tflops(device: torch.device, dtype: torch.dtype, size: int, seconds: float = 0.5) -> float:
    """Achieved TFLOP/s of square matmuls, timed with synchronisation on an accelerator."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    torch.mm(a, b)
    sync()
    runs, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        torch.mm(a, b)
        runs += 1
        if device.type == "cuda" and runs % 10:
            continue
        sync()
    sync()
    elapsed = time.perf_counter() - started
    return 2 * size**3 * runs / elapsed / 1e12


def bench() -> list[dict[str, Any]]:
    rows = [{"device": "cpu", "dtype": "float32", "tflops": matmul_tflops(torch.device("cpu"), torch.float32, 1024)}]
    for index in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        device = torch.device("cuda", index)
        dtypes = [torch.float32, torch.float16]
        if torch.cuda.get_device_properties(index).major >= 8:
            dtypes.append(torch.bfloat16)
        for dtype in dtypes:
            rows.append({"device": str(device), "dtype": str(dtype).removeprefix("torch."),
                         "tflops": matmul_tflops(device, dtype, 8192)})
    return rows


def render(info: dict[str, Any]) -> str:
    lines = [
        f"torch {info['torch']}   CUDA build {info['cuda_build'] or 'none (CPU-only torch)'}"
        + (f"   cuDNN {info['cudnn']}" if info["cudnn"] else ""),
        f"torch.cuda.is_available(): {info['cuda_available']}   device_count(): {info['device_count']}",
    ]
    if not info["cuda_available"]:
        lines.append("No CUDA GPU is visible: training runs on the CPU"
                     + (" (or an Apple GPU with --accelerator mps)." if info["mps_available"] else "."))
    if info["devices"]:
        header = ("index", "name", "capability", "memory GiB", "free GiB", "used GiB", "SMs", "bf16")
        rows = [(str(d["index"]), d["name"], d["compute_capability"], f"{d['total_memory_gib']:.1f}",
                 f"{d['free_memory_gib']:.1f}", f"{d['used_memory_gib']:.1f}", str(d["multiprocessors"]),
                 "yes" if d["bf16"] else "no") for d in info["devices"]]
        lines += ["", *_table(header, rows)]
    lines += [
        "",
        f"MPS (Apple GPU) available: {info['mps_available']}",
        f"CPU cores: {info['cpu_cores']}   torch threads: {info['torch_threads']}",
        f"Lightning accelerator='auto' picks: {info['lightning_auto_accelerator']}",
    ]
    if "bench" in info:
        lines += ["", *_table(("device", "dtype", "TFLOP/s"),
                              [(r["device"], r["dtype"], f"{r['tflops']:.3f}") for r in info["bench"]])]
    return "\n".join(lines)


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows, strict=True)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*header), fmt.format(*("-" * w for w in widths)), *(fmt.format(*r) for r in rows)]
