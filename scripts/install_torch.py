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
    CUDA_AS_ASKED = enum.auto()  # TORCH_BUILD=cuda, whatever is installed and whatever the machine has
    CPU_AS_ASKED = enum.auto()  # TORCH_BUILD=cpu
    CPU_INDEX_UNREACHABLE = enum.auto()  # TORCH_BUILD=cpu, and the CPU index cannot be reached: nothing installed


class Wanted(enum.Enum):
    """``TORCH_BUILD``: ``auto`` (unset: the machine decides), ``cuda`` or ``cpu``."""

    AUTO = "auto"
    CUDA = "cuda"
    CPU = "cpu"


def wanted_build(value: str | None) -> Wanted:
    """``TORCH_BUILD`` as given, or ValueError saying what it may be (a value no one reads would be a lie)."""
    if value is None or value == "":
        return Wanted.AUTO
    try:
        return Wanted(value)
    except ValueError:
        raise ValueError(f"TORCH_BUILD={value!r}: must be one of {', '.join(w.value for w in Wanted)} (or unset)") \
            from None


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


def is_cpu_build(version: str) -> bool:
    return version.endswith("+cpu")


def choose(*, installed: str | None, pinned: str, has_nvidia_gpu: bool, cpu_index_reachable: bool,
           wanted: Wanted = Wanted.AUTO) -> Build:
    pinned_installed = installed is not None and public_version(installed) == pinned
    if wanted is Wanted.CUDA:
        return Build.ALREADY_INSTALLED if pinned_installed and not is_cpu_build(str(installed)) \
            else Build.CUDA_AS_ASKED
    if wanted is Wanted.CPU:
        if pinned_installed and is_cpu_build(str(installed)):
            return Build.ALREADY_INSTALLED
        return Build.CPU_AS_ASKED if cpu_index_reachable else Build.CPU_INDEX_UNREACHABLE
    if pinned_installed:
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
        Build.CUDA_AS_ASKED: f"TORCH_BUILD=cuda: {cuda}" + (f", in place of {installed}" if installed else ""),
        Build.CPU_AS_ASKED: f"TORCH_BUILD=cpu: torch {pinned}, its CPU build ({CPU_BUILD_SIZE}), from {CPU_INDEX}"
                            + (f", in place of {installed}" if installed else ""),
        Build.CPU_INDEX_UNREACHABLE: f"TORCH_BUILD=cpu, but {CPU_INDEX} cannot be reached: nothing installed; unset "
                                     "TORCH_BUILD to take the CUDA build from PyPI (it runs on a CPU too)",
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


def read_pins(path: Path) -> dict[str, str]:
    """The pins of ``path``, or ValueError saying in one line why they cannot be read."""
    try:
        pinned = pins(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ValueError(f"{path}: cannot read it ({err.strerror or err})") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text") from None
    if "torch" not in pinned or "torchvision" not in pinned:
        raise ValueError(f"{path.name} pins no torch or torchvision version")
    return pinned


def main() -> int:
    args = parser().parse_args()
    try:
        pinned = read_pins(CONSTRAINTS)
        wanted = wanted_build(os.environ.get("TORCH_BUILD"))
    except ValueError as err:
        print(f"install_torch.py: error: {err}", file=sys.stderr)
        return 2
    gpu = wanted is Wanted.AUTO and has_nvidia_gpu()
    installed = installed_torch()
    build = choose(installed=installed, pinned=pinned["torch"], has_nvidia_gpu=gpu, wanted=wanted,
                   cpu_index_reachable=wanted is not Wanted.CUDA and not gpu and reachable(f"{CPU_INDEX}/torch/"))
    print(f"torch: {described(build, pinned['torch'], installed)}", flush=True)
    if build is Build.CPU_INDEX_UNREACHABLE:
        return 1
    if args.dry_run or build not in (Build.CPU_FROM_CPU_INDEX, Build.CPU_AS_ASKED, Build.CUDA_AS_ASKED):
        return 0
    # --no-deps: their dependencies come from PyPI with the other pins, in the next step. A build of the pinned
    # version already there satisfies pip: the other build replaces it only when forced.
    replace = ["--force-reinstall"] if installed is not None else []
    if build is Build.CUDA_AS_ASKED:
        command = [sys.executable, "-m", "pip", "install", "--no-deps", *replace, f"torch=={pinned['torch']}",
                   f"torchvision=={pinned['torchvision']}"]
    else:
        command = [sys.executable, "-m", "pip", "install", "--no-deps", *replace, "--index-url", CPU_INDEX,
                   f"torch=={pinned['torch']}+cpu", f"torchvision=={pinned['torchvision']}+cpu"]
    return subprocess.call(command)


if __name__ == "__main__":
    sys.exit(main())
