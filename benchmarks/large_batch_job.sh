#!/bin/bash
# GPU job (one Hopper GPU, run by the lead): benchmarks/large_batch_ab.py's A/B of stage-1
# choices at 128-256 rows, then the GPU exactness tests of the Gluon stage 1, within BUDGET
# seconds (first argument, default 200). Writes to $OUT.
BUDGET=${1:-200}
START=$(date +%s)
export PYTHONPATH=$PWD
OUT=${OUT:-/tmp/large_batch_out}
mkdir -p "$OUT"
if ! python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "no CUDA device: nothing run"; exit 0
fi
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
git rev-parse --short HEAD 2>/dev/null
timeout $((BUDGET - 8)) python3 benchmarks/large_batch_ab.py --budget $((BUDGET - 10)) \
    --rounds "${ROUNDS:-2}" --out-dir "$OUT" ${BATCHES:+--batches "$BATCHES"} \
    ${SHAPES:+--shapes "$SHAPES"}
echo "job took $(( $(date +%s) - START )) s"
