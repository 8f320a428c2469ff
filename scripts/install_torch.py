"""Install the torch build this machine can use, before `pip install -c constraints.txt -e .`.

PyPI's torch is the CUDA build (about 5.5 GB installed with its `nvidia-*` packages). On a machine
without an NVIDIA GPU the CPU build of the same pinned version (under 1 GB, `2.14.1+cpu`, which
satisfies `torch==2.14.1`) is installed from PyTorch's CPU index where it can be reached; otherwise
one line says what is installed instead and how big. Standard library only: torch is not there yet.
"""

from __future__ import annotations

import argparse
import enum
import os
import shutil
import subprocess
import sys
import urllib.request
from importlib import metadata
from pathlib import Path

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
CUDA_BUILD_SIZE = "about 5.5 GB installed"
CPU_BUILD_SIZE = "under 1 GB"
CONSTRAINTS = Path(__file__).resolve().parent.parent / "constraints.txt"


class Build(enum.Enum):
    ALREADY_INSTALLED = enum.auto()
    CPU_FROM_CPU_INDEX = enum.auto()
    CUDA_FOR_THE_GPU = enum.auto()
    CUDA_FOR_WANT_OF_THE_CPU_INDEX = enum.auto()


def pins(constraints_text: str) -> dict[str, str]:
    """The `name==version` lines of a constraints file, by lower-case name."""
    found = {}
    for line in constraints_text.splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            found[name.strip().lower()] = version.strip()
    return found


def public_version(version: str) -> str:
    """`2.14.1+cpu` -> `2.14.1`: the local label names the build, not the release."""
    return version.split("+", 1)[0]


def choose(*, installed: str | None, pinned: str, has_nvidia_gpu: bool, cpu_index_reachable: bool) -> Build:
    if installed is not None and public_version(installed) == pinned:
        return Build.ALREADY_INSTALLED
    if has_nvidia_gpu:
        return Build.CUDA_FOR_THE_GPU
    return Build.CPU_FROM_CPU_INDEX if cpu_index_reachable else Build.CUDA_FOR_WANT_OF_THE_CPU_INDEX


def described(build: Build, pinned: str, installed: str | None) -> str:
    cuda = f"torch {pinned} from PyPI, its CUDA build ({CUDA_BUILD_SIZE})"
    return {
        Build.ALREADY_INSTALLED: f"torch {installed} is installed",
        Build.CUDA_FOR_THE_GPU: f"an NVIDIA GPU is here: {cuda}",
        Build.CPU_FROM_CPU_INDEX: f"no NVIDIA GPU here: torch {pinned}, its CPU build ({CPU_BUILD_SIZE}), "
                                  f"from {CPU_INDEX}",
        Build.CUDA_FOR_WANT_OF_THE_CPU_INDEX: f"no NVIDIA GPU here, but {CPU_INDEX} cannot be reached: {cuda}; "
                                              "it runs on a CPU too",
    }[build]


def has_nvidia_gpu() -> bool:
    return Path("/proc/driver/nvidia/version").exists() or shutil.which("nvidia-smi") is not None


def reachable(url: str, timeout: float = 5.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def installed_torch() -> str | None:
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(prog="install_torch.py", description=__doc__.splitlines()[0])
    made.add_argument("--dry-run", action="store_true", help="say what would be installed, install nothing")
    return made


def main() -> int:
    args = parser().parse_args()
    pinned = pins(CONSTRAINTS.read_text())
    if "torch" not in pinned or "torchvision" not in pinned:
        print(f"error: {CONSTRAINTS.name} pins no torch or torchvision version", file=sys.stderr)
        return 1
    gpu = os.environ.get("TORCH_BUILD") == "cuda" or has_nvidia_gpu()
    installed = installed_torch()
    build = choose(installed=installed, pinned=pinned["torch"], has_nvidia_gpu=gpu,
                   cpu_index_reachable=not gpu and reachable(f"{CPU_INDEX}/torch/"))
    print(f"torch: {described(build, pinned['torch'], installed)}", flush=True)
    if build is not Build.CPU_FROM_CPU_INDEX or args.dry_run:
        return 0
    # --no-deps: their dependencies come from PyPI with the other pins, in the next step.
    wanted = [f"torch=={pinned['torch']}+cpu", f"torchvision=={pinned['torchvision']}+cpu"]
    command = [sys.executable, "-m", "pip", "install", "--no-deps", "--index-url", CPU_INDEX, *wanted]
    return subprocess.call(command)


if __name__ == "__main__":
    sys.exit(main())
