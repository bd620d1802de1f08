#!/bin/bash
# GPU job (one Hopper GPU, run by the lead) for issue 38 item 1 at 129-256 rows, within BUDGET
# seconds (first argument, default 170), everything written to $OUT:
#   1. large_batch_ab.py --what noise: plain sampling and greedy with this tree's kernels
#      against the baseline's (BASELINE, default _baseline/flashsampling_baseline: a copy of
#      main's package put beside the job), default choice and wide Gluon tiles;
#   2. large_batch_ab.py --what rounding: top-k 50 / top-p 0.9 on bf16 logits, the top-m
#      search on whole keys (the default now at 4 candidates a tile) against the packed one,
#      and above 128 rows the old choice against the wide 64-row Gluon tiles;
#   3. the GPU tests of the kernels changed (the swapped kernel's tokens, the Gluon stage 1's
#      pathwise match);
#   4. power_draw.py at 256 rows, with what time is left: cuBLAS, the fused op and its
#      noise-free greedy under sustained load (power, SM clock, energy per call: the energy
#      bound).
budget=${1:-170}
for lib in benchmarks/jobs/device_job_lib.sh benchmarks/device_job_lib.sh; do
    [ -f "$lib" ] && source "$lib" && break
done
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/big9_out}
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
BASELINE=${BASELINE:-_baseline/flashsampling_baseline}
if [ -d "$BASELINE" ]; then
    say "noise: this tree against $BASELINE"
    ab "${NOISE_S:-55}" 110 --what noise --baseline "$BASELINE" --rounds 2 \
        --batches "${NOISE_BATCHES:-96,144,256}" --shapes "${NOISE_SHAPES:-2048x151936,4096x151936}"
fi
say "rounding A/B"
ab "${ROUNDING_S:-40}" 70 --what rounding --rounds 2 --batches "${ROUNDING_BATCHES:-96,144}" \
    --shapes "${ROUNDING_SHAPES:-4096x151936,2048x151936}"
if [ "${TESTS:-1}" = 1 ] && [ "$(left)" -gt 15 ]; then
    say "GPU tests"
    timeout -k 3 "$(cap 35 33)" python3 -m pytest -q -p no:xdist -p no:cacheprovider -rA \
        tests/test_gpu_op.py -k "${TESTS_K:-(swapped_kernel_draws and (129 or 150)) or (warp_specialized_kernel_matches and 64-wide and (ns4 or seed or b144))}" \
        > "$OUT/gpu_tests.log" 2>&1
    echo "GPU tests rc=$? (124: cut by the budget)"
    grep -E "passed|failed|PASSED|FAILED|Error" "$OUT/gpu_tests.log" | tail -15
fi
say "power"
timeout -k 3 "$(cap "${POWER_S:-35}" 2)" python3 benchmarks/power_draw.py --seconds 2 --logit-std 5 \
    --shapes "${POWER_SHAPES:-2048x151936,4096x151936}" --batches "${POWER_BATCHES:-256}" \
    --providers matmul,fused_greedy,fused --out-dir "$OUT" > "$OUT/power_draw.txt" 2>&1
echo "power rc=$?"; grep -v Warning "$OUT/power_draw.txt" | tail -16
say "done"
