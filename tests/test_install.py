"""Installing keeps the torch build the machine has: the constraints accept a CPU build of the pinned torch, and
`make` installs the CPU build where there is no NVIDIA GPU, or says in one line what it installs instead."""

import base64
import hashlib
import importlib.util
import json
import subprocess
import sys
import venv
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from helpers import HANG_S, ROOT

spec = importlib.util.spec_from_file_location("install_torch", ROOT / "scripts" / "install_torch.py")
assert spec is not None and spec.loader is not None
install_torch = importlib.util.module_from_spec(spec)
sys.modules["install_torch"] = install_torch  # its dataclasses look their module up
spec.loader.exec_module(install_torch)
Build = install_torch.Build

PINS = install_torch.pins((ROOT / "constraints.txt").read_text())
CUDA_ONLY = ("nvidia-", "cuda-", "triton")


def test_the_pins_are_read_from_the_constraints_file():
    assert install_torch.pins("# a comment\ntorch==2.14.1\nTorchVision == 0.29.1  # why\nnumpy>=2\n") == {
        "torch": "2.14.1", "torchvision": "0.29.1"}
    assert PINS["torch"] == metadata.version("torch").split("+")[0]


@pytest.mark.parametrize("installed, gpu, reachable, build", [
    ("2.14.1+cpu", False, True, Build.ALREADY_INSTALLED),
    ("2.14.1", True, False, Build.ALREADY_INSTALLED),
    ("2.13.0+cpu", False, True, Build.CPU_FROM_CPU_INDEX),
    (None, False, True, Build.CPU_FROM_CPU_INDEX),
    (None, True, True, Build.CUDA_FOR_THE_GPU),
    ("2.13.0", True, False, Build.CUDA_FOR_THE_GPU),
    (None, False, False, Build.CUDA_FOR_WANT_OF_THE_CPU_INDEX),
])
def test_the_build_is_chosen_by_the_gpu_and_the_index(installed, gpu, reachable, build):
    assert install_torch.choose(installed=installed, pinned="2.14.1", has_nvidia_gpu=gpu,
                                cpu_index_reachable=reachable) is build


def test_a_cuda_build_is_said_with_its_size_and_why():
    said = install_torch.described(Build.CUDA_FOR_WANT_OF_THE_CPU_INDEX, "2.14.1", None)
    assert "torch 2.14.1 from PyPI, its CUDA build (about 5.5 GB installed)" in said
    assert "cannot be reached" in said and "\n" not in said
    assert "cannot be reached" not in install_torch.described(Build.CUDA_FOR_THE_GPU, "2.14.1", None)


def test_the_installer_says_in_one_line_what_it_installs():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "install_torch.py"), "--dry-run"],
                          capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"torch: torch {metadata.version('torch')} is installed"]


def test_make_installs_the_torch_build_before_the_project():
    makefile = (ROOT / "Makefile").read_text()
    install = makefile.split("INSTALL = ", 1)[1].split("\n", 1)[0]
    assert install.index("scripts/install_torch.py") < install.index("$(PIP) -e")
    for target, extras in (("$(VENV)/.installed:", "$(INSTALL) ."), ("$(VENV)/.installed-dev:", '$(INSTALL) ".[dev]"')):
        assert extras in makefile.split(target, 1)[1].split("\n\n", 1)[0]


def cpu_torch_wheel(folder: Path) -> Path:
    """A stand-in for PyTorch's CPU wheel of the pinned version: the installed torch's requirements, less the
    CUDA packages the CPU build does not have (its files are not needed to resolve an install)."""
    version = f"{PINS['torch']}+cpu"
    requires = [r for r in metadata.requires("torch") or []
                if not r.lower().startswith(CUDA_ONLY) and "extra ==" not in r]
    info = f"torch-{version}.dist-info"
    files = {
        "torch/__init__.py": f'__version__ = "{version}"\n',
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: torch\nVersion: " + version + "\n"
                            + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()},"
              f"{len(text.encode())}" for name, text in files.items()] + [f"{info}/RECORD,,"]
    wheel = folder / f"torch-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
        archive.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return wheel


@pytest.mark.slow
def test_the_constraints_accept_a_cpu_build_of_the_pinned_torch(tmp_path):
    venv.create(tmp_path / "venv", with_pip=True)
    pip = [str(tmp_path / "venv" / "bin" / "python"), "-m", "pip"]
    subprocess.run([*pip, "install", "--quiet", "--no-deps", "--no-index", str(cpu_torch_wheel(tmp_path))],
                   check=True, timeout=HANG_S)
    report = tmp_path / "report.json"
    done = subprocess.run([*pip, "install", "--dry-run", "--quiet", "--report", str(report),
                           "-c", str(ROOT / "constraints.txt"), "-e", str(ROOT)],
                          capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stderr[-2000:]
    names = {item["metadata"]["name"].lower(): item["metadata"]["version"]
             for item in json.loads(report.read_text())["install"]}
    assert "torchvision" in names and "lightning" in names  # the resolve reached the project's dependencies
    assert "torch" not in names  # the CPU build stays
    assert [n for n in names if n.startswith(CUDA_ONLY)] == []
