#!/usr/bin/env bash
# On a machine with a CUDA GPU: the `gpu` tests, then a short GPU benchmark (about 3 minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
"$PY" scripts/check_gpu.py --bench
"$PY" -m pytest -m gpu -v -p no:cacheprovider tests/test_gpu.py
"$PY" scripts/benchmark.py --accelerator gpu --batch-size 64 --epochs 2 --only b,c,d --no-time-to-accuracy \
    --out "${OUT:-benchmark-results}/gpu-64"
"$PY" scripts/benchmark.py --accelerator gpu --batch-size 1024 --epochs 3 --precision 16-mixed --only b,c \
    --no-time-to-accuracy --out "${OUT:-benchmark-results}/gpu-1024-16mixed"
