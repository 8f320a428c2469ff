"""Which hardware a run asks for, checked against what this machine has; how its steps run there (``StepMode``:
the device-side steps of ``project/hardware/device_step.py``, loaded only for a run that takes them); device memory
helpers."""

from __future__ import annotations

import os
import resource
import threading
from enum import Enum

import torch
from lightning.pytorch.utilities import rank_zero_info

from project.config.schema import RunConfig, full_precision
from project.errors import UsageError


def mps_available() -> bool:
    return bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()


def resolve_accelerator(accelerator: str) -> str:
    """What ``auto`` means on this machine (``cuda``, ``mps`` or ``cpu``); ``gpu`` means ``cuda``."""
    if accelerator in ("gpu", "cuda"):
        return "cuda"
    if accelerator != "auto":
        return accelerator
    if torch.cuda.is_available():
        return "cuda"
    if mps_available():
        return "mps"
    return "cpu"


def resolve_precision(precision: str, accelerator: str) -> str:
    """Lightning's precision string for this run; fp16 autocast does not exist on CPU, bf16 does."""
    precision = full_precision(precision)
    if resolve_accelerator(accelerator) == "cpu" and precision == "16-mixed":
        rank_zero_info("note: fp16 mixed precision is not available on CPU; using bf16-mixed")
        return "bf16-mixed"
    return precision


def _what_is_here() -> str:
    if mps_available():
        return "an Apple GPU (use --accelerator mps) and the CPU"
    return "only the CPU"


def resolve_hardware(config: RunConfig) -> RunConfig:
    """The config with its precision resolved for this machine, or a one-line refusal of what it cannot serve."""
    validate_hardware(config)
    return config.replace(precision=resolve_precision(config.precision, config.accelerator))


def available_accelerator(requested: str) -> str:
    """``resolve_accelerator``, refusing in one line an accelerator this machine does not have."""
    accelerator = resolve_accelerator(requested)
    if accelerator == "cuda" and not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise UsageError(
            f"--accelerator {requested}: no CUDA GPU is visible (torch {torch.__version__}, {build}); "
            f"this machine has {_what_is_here()}. Use --accelerator cpu, or see scripts/check_gpu.py"
        )
    if accelerator == "mps" and not mps_available():
        raise UsageError(f"--accelerator mps: no Apple GPU (MPS) here; this machine has {_what_is_here()}")
    return accelerator


def validate_hardware(config: RunConfig) -> None:
    """Refuse, in one line, a request this machine cannot serve."""
    accelerator = available_accelerator(config.accelerator)
    devices = config.devices
    if accelerator == "cuda":
        count = torch.cuda.device_count()
        if isinstance(devices, int) and devices > count:
            raise UsageError(f"--devices {devices}: only {count} CUDA GPU(s) visible (indices 0..{count - 1})")
        if isinstance(devices, list):
            missing = [i for i in devices if i >= count]
            if missing:
                raise UsageError(
                    f"--devices: GPU index {missing[0]} does not exist; {count} visible (indices 0..{count - 1})"
                )
    elif isinstance(devices, list):
        raise UsageError(
            f"--devices {','.join(map(str, devices))}: device indices select GPUs; on {accelerator} give a "
            "process count instead, e.g. --devices 2"
        )
    elif devices == -1:
        raise UsageError(f"--devices -1 means every GPU; on {accelerator} give a process count instead, e.g. "
                         "--devices 2")
    elif accelerator == "cpu" and isinstance(devices, int) and devices > OVERSUBSCRIBED * cores() and \
            not config.oversubscribe:
        raise UsageError(f"--devices {devices}: {devices} training processes on {cores()} CPU core(s) would take "
                         f"turns more than they train; use at most {OVERSUBSCRIBED * cores()}, or add --oversubscribe")
    if config.gpu_memory_fraction is not None and accelerator != "cuda":
        raise UsageError(
            f"--gpu-memory-fraction limits CUDA memory per process; this run uses {accelerator}, which it cannot limit"
        )
    _validate_strategy(config.strategy, expected_world_size(config))
    if config.strategy.startswith("fsdp") and accelerator != "cuda":
        raise UsageError(f"--strategy {config.strategy} shards the model over GPUs; it needs --accelerator gpu")
    if config.num_nodes > 1 and not launched_by_cluster_tool():
        raise UsageError(
            f"--num-nodes {config.num_nodes}: start one copy per machine with torchrun (--nnodes, --node-rank, "
            "--master-addr) or srun under SLURM; see the README's multi-node section"
        )


OVERSUBSCRIBED = 2  # CPU processes per core beyond which a run is refused unless asked for (--oversubscribe)


def cores() -> int:
    """The CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def expected_world_size(config: RunConfig) -> int:
    """How many processes the Trainer will start for ``config`` (Lightning's rule for ``devices``)."""
    devices = config.devices
    if isinstance(devices, list):
        count = len(devices)
    elif devices in (-1, "auto"):
        accelerator = resolve_accelerator(config.accelerator)
        every = torch.cuda.device_count() if accelerator == "cuda" else (os.cpu_count() or 1)
        count = every if devices == -1 or accelerator == "cuda" else 1
    else:
        count = int(devices)
    return count * config.num_nodes


def launched_by_cluster_tool() -> bool:
    """True under torchrun/torchelastic, SLURM, or an explicit MASTER_ADDR/NODE_RANK setup."""
    env = os.environ
    return any(key in env for key in ("TORCHELASTIC_RUN_ID", "SLURM_NTASKS", "NODE_RANK", "GROUP_RANK")) or (
        "MASTER_ADDR" in env and "WORLD_SIZE" in env
    )


# Lightning strategies that need a package the template does not install, by a word of their names.
STRATEGY_PACKAGES = {"deepspeed": "deepspeed", "xla": "torch_xla", "tpu": "torch_xla"}


def _validate_strategy(strategy: str, world_size: int) -> None:
    import importlib.util

    from lightning.pytorch.strategies import StrategyRegistry

    if strategy in ("dp", "dataparallel"):
        raise UsageError(
            f"--strategy {strategy}: Lightning 2 removed DataParallel; use --strategy ddp (one process per device)"
        )
    known = set(StrategyRegistry.available_strategies()) | {"auto", "ddp", "ddp_spawn", "fsdp"}
    if strategy not in known:
        raise UsageError(
            f"--strategy {strategy!r} is not a Lightning strategy; common ones: auto, ddp, ddp_spawn, "
            "ddp_find_unused_parameters_false, fsdp (all: lightning.pytorch.strategies.StrategyRegistry)"
        )
    package = next((needed for word, needed in STRATEGY_PACKAGES.items() if word in strategy), None)
    if package is not None and importlib.util.find_spec(package) is None:
        raise UsageError(f"--strategy {strategy} needs the {package} package, which is not installed here: "
                         f"pip install {package}, or choose another strategy")
    if strategy.startswith("single_") and world_size > 1:
        raise UsageError(f"--strategy {strategy} trains in one process on one device, and this run asks for "
                         f"{world_size}: give --devices 1, or drop --strategy")


class StepMode(Enum):
    """How a group's optimizer steps run."""

    GRAPHS = "graphs"  # each step a DeviceStep replayed from one CUDA graph capture
    DEVICE = "device"  # the same DeviceStep, uncaptured (--cuda-graphs on a CPU: their arithmetic, checked)
    OFF = "off"  # torch.optim's own eager steps


def capture_plan(config: RunConfig, accelerator: str, steps_per_call: int, why_one: str | None = None) -> \
        tuple[StepMode, str]:
    """The step mode and why. ``--cuda-graphs`` asked for where it cannot be: refused in one line."""
    asked = config.cuda_graphs
    if asked is False:
        return StepMode.OFF, "--no-cuda-graphs"
    reason = None
    if steps_per_call < 2:
        reason = why_one or f"--steps-per-call {steps_per_call}: a graph replays the steps of a group"
    elif config.compile:
        reason = "--compile makes its own graphs"
    elif config.detect_anomaly:
        reason = "--detect-anomaly checks every backward on the host"
    elif config.optimizer != "sgd" and config.scheduler == "onecycle":
        reason = f"one-cycle cycles {config.optimizer}'s beta1, a Python number in torch's optimizer"
    if reason is not None:
        if asked is True:
            raise UsageError(f"--cuda-graphs: not possible here ({reason}); drop it or use --no-cuda-graphs")
        return StepMode.OFF, reason
    if accelerator == "cuda":
        return StepMode.GRAPHS, "each optimizer step replayed from one capture"
    if asked is True:
        return StepMode.DEVICE, f"no GPU here: --cuda-graphs checks their arithmetic on {accelerator}"
    return StepMode.OFF, f"{accelerator}: CUDA graphs need a GPU"


def peak_memory_mb(device: torch.device) -> float:
    """Peak allocated memory on a CUDA device, else this process's peak resident set."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def warm_up_cuda(accelerator: str) -> None:
    """Start the CUDA context and load cuBLAS on a helper thread, while the run reads its data and builds its
    objects on this one (a few tenths of a second a GPU run would otherwise wait for at its first step)."""
    if resolve_accelerator(accelerator) != "cuda" or torch.cuda.is_initialized():
        return

    def warm() -> None:
        square = torch.ones(64, 64, device="cuda")
        torch.mm(square, square)

    threading.Thread(target=warm, name="cuda-warm-up", daemon=True).start()


def release_cuda_cache() -> None:
    """Hand cached, unused CUDA blocks back to the driver (other processes can use them)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
