#!/usr/bin/env bash
# On a machine with a CUDA GPU: the `gpu` tests, then the benchmark at batch 64 and 1024 (a few minutes).
# Offline, MNIST comes from ../shared/data (or DATA_DIR) instead of a download.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
if [ -z "${DATA_DIR:-}" ] && [ -d ../shared/data/MNIST/raw ]; then
    DATA_DIR="$(cd ../shared/data && pwd)"
    export DATA_DIR
fi
OUT_DIR=${OUT:-benchmark-results}
"$PY" scripts/check_gpu.py --bench
"$PY" -m pytest -m gpu -v -p no:cacheprovider tests/test_gpu.py
"$PY" scripts/benchmark.py --accelerator gpu --batch-size 64 --epochs 2 --only hand,bare,template-k1,template-auto \
    --no-time-to-accuracy --out "$OUT_DIR/gpu-64"
"$PY" scripts/benchmark.py --accelerator gpu --batch-size 1024 --epochs 3 --precision 16-mixed \
    --only hand,template-k1,template-auto --no-time-to-accuracy --out "$OUT_DIR/gpu-1024-16mixed"
