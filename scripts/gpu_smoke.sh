#!/usr/bin/env bash
# The whole GPU check in one command, for the first machine with a CUDA GPU (a few minutes):
#   1. the environment (below) and check_gpu.py --bench;
#   2. every test marked `gpu` (pytest -m gpu over the whole suite, 4 workers), with a JUnit report;
#   3. the default recipe on the GPU (scripts/train.py) and with --precision 16-mixed;
#   4. the benchmark at batch 64 and 256 (fp32) and 1024 (bf16-mixed): the hand-written loop, eager and captured
#      (the bound), against the template with and without CUDA graphs; the default command's own time;
#   5. a compute-bound CNN (tests.cnn_recipe, batch 512 bf16-mixed) against its hand-written loop, with --compile;
#      data on disk (tests.disk_recipe, PNG files, 4 workers) against a hand-written DataLoader on the same files.
# Each step runs even if one before it failed, under a time limit; a table at the end says which passed,
# and the exit code is the number that failed (a step past its limit fails with exit 124). Eight files go to
# $OUT (where a remote runner collects them) or benchmark-results/: gpu-check.log (everything printed),
# gpu-tests.xml, and each benchmark's .md. Offline, MNIST comes from DATA_DIR or ../shared/data.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT:-benchmark-results}
WORK=$(mktemp -d)  # runs and benchmark folders: many files, of which the reports are copied out
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/gpu-check.log"
: >"$LOG"
if [ -z "${DATA_DIR:-}" ] && [ -d ../shared/data/MNIST/raw ]; then
    DATA_DIR="$(cd ../shared/data && pwd)"
    export DATA_DIR
fi
# The interpreter: $PY, else .venv, else a python3 that already holds the dependencies (a GPU image's own
# CUDA build of PyTorch is kept, not replaced by a download), else a new .venv made as the README says.
NEEDS="import torch, torchvision, lightning, torchmetrics, tensorboard, matplotlib, psutil, yaml, optuna, pytest, xdist"
if [ -z "${PY:-}" ]; then
    if [ -x .venv/bin/python ]; then
        PY=.venv/bin/python
    elif python3 -c "$NEEDS" 2>/dev/null; then
        PY=python3
        export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
    else
        python3 -m venv .venv && .venv/bin/pip install -q -U pip && .venv/bin/pip install -q -e ".[dev]" || exit 99
        PY=.venv/bin/python
    fi
fi

declare -a NAMES RESULTS
step() {  # step NAME LIMIT_S COMMAND...: run it (killed after LIMIT_S), log its output, remember how it ended
    local name=$1 limit=$2 started=$SECONDS
    shift 2
    echo "=== $name: $*" | tee -a "$LOG"
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$LOG"
    local status=${PIPESTATUS[0]}
    NAMES+=("$name")
    RESULTS+=("$([ "$status" -eq 0 ] && echo passed || echo "FAILED (exit $status)") in $((SECONDS - started)) s")
}

step check-gpu 120 "$PY" scripts/check_gpu.py --bench
step gpu-tests 240 "$PY" -m pytest -m gpu -n 4 -v -p no:cacheprovider -rs --junitxml="$OUT_DIR/gpu-tests.xml" tests
step train-default 180 "$PY" scripts/train.py --accelerator gpu --logdir "$WORK/runs"
step train-16-mixed 180 "$PY" scripts/train.py --accelerator gpu --precision 16-mixed --logdir "$WORK/runs"
BENCH_ROWS=hand,hand-graphs,bare,template-k1,template-auto,template-graphs
step benchmark-64 240 "$PY" scripts/benchmark.py --accelerator gpu --batch-size 64 --epochs 2 \
    --only "$BENCH_ROWS" --out "$WORK/gpu-64"
step benchmark-256 180 "$PY" scripts/benchmark.py --accelerator gpu --batch-size 256 --epochs 3 \
    --only "$BENCH_ROWS" --out "$WORK/gpu-256"
step benchmark-1024 180 "$PY" scripts/benchmark.py --accelerator gpu --batch-size 1024 --epochs 3 \
    --precision bf16-mixed --only "$BENCH_ROWS" --out "$WORK/gpu-1024"
step own-time 180 "$PY" scripts/benchmark.py --accelerator gpu --only hand --epochs 1 --time-to-accuracy \
    --out "$WORK/gpu-own"
step benchmark-cnn 300 env PROJECT_RECIPE=tests.cnn_recipe "$PY" scripts/benchmark.py --accelerator gpu \
    --example-data 50000 --batch-size 512 --precision bf16-mixed --epochs 3 \
    --only hand,bare,template-k1,template-auto,template-graphs,template-compile --out "$WORK/gpu-cnn"
step benchmark-disk 240 env PROJECT_RECIPE=tests.disk_recipe "$PY" scripts/benchmark.py --accelerator gpu \
    --example-data 20000 --batch-size 256 --num-workers 4 --epochs 2 --only hand,hand-samples,template-k1 \
    --out "$WORK/gpu-disk"
for size in 64 256 1024 own cnn disk; do
    cp "$WORK/gpu-$size/benchmark.md" "$OUT_DIR/benchmark-$size.md" 2>/dev/null
done

failed=0
{
    echo
    echo "=== GPU check: $(date -u +%FT%TZ), $("$PY" -c 'import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA GPU")')"
    for i in "${!NAMES[@]}"; do
        printf '%-16s %s\n' "${NAMES[$i]}" "${RESULTS[$i]}"
    done
    grep "^test/acc\|passed\|failed" "$LOG" | grep -v "^===" | tail -n 8
} | tee -a "$LOG"
for result in "${RESULTS[@]}"; do
    case "$result" in FAILED*) failed=$((failed + 1)) ;; esac
done
exit "$failed"
