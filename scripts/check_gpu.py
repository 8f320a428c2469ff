#!/usr/bin/env python
"""Show the GPUs (and CPU) PyTorch sees here: versions, devices, memory, bf16, Lightning's pick."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from project.config.tool_args import parse_check_gpu_args  # noqa: E402  (light: no torch)
from project.errors import run_cli  # noqa: E402


def main(args: argparse.Namespace) -> int:
    from project.hardware import gpu_info

    info = gpu_info.collect()
    if args.bench:
        info["bench"] = gpu_info.bench()
    print(json.dumps(info, indent=2) if args.json else gpu_info.render(info))
    return 0


if __name__ == "__main__":
    arguments = parse_check_gpu_args(__doc__)
    run_cli(lambda: main(arguments), "check_gpu.py", debug=arguments.debug)
