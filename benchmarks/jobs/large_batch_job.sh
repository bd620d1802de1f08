#!/bin/bash
# GPU job (one Hopper GPU, run by the lead) for the stage 1 of 129-256 rows, within BUDGET
# seconds (first argument, default 200), everything written to $OUT, in this order (each
# step with a slice of the budget; benchmarks/probes/large_batch_ab.py skips points near its end):
#   1. --what dispatch: the default before and after dispatch._large_batch_gluon_rows, with
#      token checks (DISPATCH_S);
#   2. --what diagnose: T = 1 against greedy, the noise's share (DIAGNOSE_S);
#   3. the GPU pathwise tests of the Gluon stage 1 with the wide MMA, with the time left.
# (Three consumer warpgroups, once step 2 here, were slower than two and are gone.)
cd "$(dirname "$0")/../.."  # (the repository root, from anywhere)
BUDGET=${1:-200}
START=$(date +%s)
export PYTHONPATH=$PWD
OUT=${OUT:-/tmp/large_batch_out}
mkdir -p "$OUT"
left() { echo $((BUDGET - ($(date +%s) - START))); }
if ! python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "no CUDA device: nothing run"; exit 0
fi
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
step() {  # seconds, then large_batch_ab.py's arguments
    local seconds=$1; shift
    [ "$(left)" -lt 25 ] && { echo "skipped $* (budget)"; return; }
    [ "$seconds" -gt "$(( $(left) - 5 ))" ] && seconds=$(( $(left) - 5 ))
    timeout -k 3 "$seconds" python3 benchmarks/probes/large_batch_ab.py --budget $((seconds - 2)) \
        --out-dir "$OUT" "$@"
    echo "-- at $(( $(date +%s) - START )) s"
}
[ "${DISPATCH_S:-95}" -gt 0 ] && step "${DISPATCH_S:-95}" --what dispatch --rounds 3 --batches 144,160,192,224,256 \
    --shapes 4096x151936,2048x151936,8192x128256
step "${DIAGNOSE_S:-25}" --what diagnose --rounds 2 --batches "${DIAGNOSE_BATCHES:-256}" --shapes 2048x151936,4096x151936
if [ "$(left)" -gt 15 ]; then
    timeout -k 3 $(( $(left) - 4 )) python3 -m pytest -v -p no:xdist -p no:cacheprovider \
        tests/test_gpu_op.py -k "${TESTS_K:-warp_specialized_kernel_matches and wide}" > "$OUT/gpu_tests.log" 2>&1
    echo "GPU tests rc=$? (124: cut by the budget):"
    grep -cE " PASSED" "$OUT/gpu_tests.log" | sed 's/$/ passed/'
    grep -E " FAILED|Error" "$OUT/gpu_tests.log" | head -5
fi
echo "job took $(( $(date +%s) - START )) s"
