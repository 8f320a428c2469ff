#!/usr/bin/env bash
# The figures docs/figures.md quotes, measured again on this machine with the pinned versions (constraints.txt):
# the default run's output, and the benchmark at batch 64 and 256. Needs MNIST (DATA_DIR or data/).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
{
    echo "# Figures"
    echo
    echo "Measured by \`make figures\` ($(date -u +%F), $(nproc) CPU cores ($(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $("$PY" -c 'import platform, torch, lightning; print(f"Python {platform.python_version()}, torch {torch.__version__}, Lightning {lightning.__version__}")'))."
    echo
    echo "## The default run: \`scripts/train.py\`"
    echo
    echo '```'
    "$PY" scripts/train.py --logdir "$WORK/runs" 2> "$WORK/progress" > "$WORK/summary"
    grep '^epoch ' "$WORK/progress" | tail -n 1  # the last of the epoch lines (stderr, not a terminal)
    sed "s|$WORK/runs|lightning_logs|g" "$WORK/summary"
    echo '```'
    for batch in 64 256; do
        echo
        echo "## The benchmark at batch $batch: \`scripts/benchmark.py --batch-size $batch --repeat 3\`"
        echo
        "$PY" scripts/benchmark.py --batch-size "$batch" --repeat 3 --out "$WORK/bench-$batch" 2>/dev/null \
            | sed -n '/^over the/,$p' | tail -n +2  # the medians over the repeats
    done
} > docs/figures.md
echo "wrote docs/figures.md"
