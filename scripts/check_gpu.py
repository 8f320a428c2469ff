#!/usr/bin/env python
"""Show the GPUs (and CPU) PyTorch sees here: versions, devices, memory, bf16, Lightning's pick."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from project.errors import run_cli  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(prog="check_gpu.py", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print the same facts as JSON")
    parser.add_argument("--bench", action="store_true", help="time a matmul on each device (TFLOP/s)")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    args = parser.parse_args()

    from project import gpu_info

    info = gpu_info.collect()
    if args.bench:
        info["bench"] = gpu_info.bench()
    print(json.dumps(info, indent=2) if args.json else gpu_info.render(info))
    return 0


if __name__ == "__main__":
    run_cli(main, "check_gpu.py")
