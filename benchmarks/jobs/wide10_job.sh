#!/bin/bash
# GPU job (one Hopper GPU, run by the lead) for issue 38 items 1 and 2 at 129-192 rows, within
# BUDGET seconds (first argument, default 195), everything written to $OUT:
#   1. large_batch_ab.py --what truncating: bench_sampling's four truncating calls (bf16-rounded
#      logits) at D = 8192 / 4096, B = 144 / 160 / 192 (the cells where FlashInfer 0.7.2 won):
#      the default (wide 64-row Gluon tiles) against the swapped kernel's top-m epilogue
#      (packed / whole keys; ping-pong, on 128-entry tiles, cooperative), top-k 50 also on the
#      narrow 64-row, the wide 128-row Gluon tiles and the Triton tiles;
#   2. large_batch_ab.py --what swapped: plain sampling and greedy in the swapped kernel at
#      144 / 160 / 192 rows: ping-pong, on 128-entry tiles, cooperative, the other staging;
#   3. large_batch_profile.py --what truncating at D = 8192, B = 144: some of 1.'s calls
#      kernel by kernel (stage 1 / merge / stage 2) with the rows sent to the fallback.
# Environment overrides: TRUNC_S, TRUNC_SHAPES, TRUNC_BATCHES, PROFILE_S, PROFILE_SHAPE,
# PROFILE_BATCH, PROFILE_PROVIDERS, SWAPPED_S, SWAPPED_SHAPES, SWAPPED_BATCHES.
budget=${1:-195}
source benchmarks/jobs/device_job_lib.sh
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/wide10_out}
mkdir -p "$OUT"
if ! python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "no CUDA device: nothing run"; exit 0
fi
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
cat COMMIT 2>/dev/null
ab() {  # seconds, reserve, then large_batch_ab.py's arguments
    local seconds; seconds=$(cap "$1" "$2"); shift 2
    [ "$seconds" -lt 20 ] && { echo "skipped $* (budget)"; return; }
    timeout -k 3 "$seconds" python3 benchmarks/probes/large_batch_ab.py --budget $((seconds - 2)) \
        --out-dir "$OUT" "$@" 2>&1 | grep -v Warning
}
say "truncating A/B"
ab "${TRUNC_S:-95}" 85 --what truncating --rounds 2 --batches "${TRUNC_BATCHES:-144,160,192}" \
    --shapes "${TRUNC_SHAPES:-8192x128256,4096x151936}"
say "swapped A/B"
ab "${SWAPPED_S:-60}" 30 --what swapped --rounds 2 --batches "${SWAPPED_BATCHES:-144,160,192}" \
    --shapes "${SWAPPED_SHAPES:-2048x151936,4096x151936,8192x128256}"
say "profile"
seconds=$(cap "${PROFILE_S:-30}" 2)
if [ "$seconds" -ge 10 ]; then
    timeout -k 3 "$seconds" python3 benchmarks/probes/large_batch_profile.py --what truncating \
        --shape "${PROFILE_SHAPE:-8192x128256}" --batch "${PROFILE_BATCH:-144}" --calls 5 \
        --providers "${PROFILE_PROVIDERS:-matmul,k50_default,k50_swapwhole,k50_swapwide,p09_default,p09_swapwide}" \
        --out-dir "$OUT" > "$OUT/profile.log" 2>&1
    echo "profile rc=$?"; grep -v Warning "$OUT/profile.log" | head -60
fi
say "done"
