#!/usr/bin/env bash
# Session 13's device job (issue 35 item 2's measurement; eager calls with knob tensors):
# the knob check's verdict asserted in its own kernel (knob_check.FUSED_ASSERT: one launch)
# against the kernel + torch._assert_async (two), one GPU, BUDGET seconds (first argument,
# default 200). CUDA graphs, configurations interleaved in one process, tokens checked equal
# (bench_off_knobs.py --variants): 0-d knobs plain / off / k50off at D = 2048, B = 1 / 16 /
# 64, and [B] knobs plain / off / mixed at B = 16 / 64. Beside the warm-up, the GPU test of
# a bad knob tensor (tests/test_gpu_op.py: the assert fires and prints the knob's rule).
# Everything under $OUT/knobs13/, summary.txt first.
set -u
cd "$(dirname "$0")/../.."
budget=${1:-200}
source benchmarks/jobs/device_job_lib.sh
job_start knobs13

TWO="two:knob_check.FUSED_ASSERT=False"
bench() {  # bench LABEL LIMIT ARGS...: bench_off_knobs.py into $O/LABEL.log
    local label=$1 limit=$2
    shift 2
    timed_step "$label" "$O/$label.log" 5 "$limit" python3 benchmarks/bench_off_knobs.py --out "$O" "$@"
}

# 1. compile everything at once (a process per batch, Triton's cache shared), the GPU test
#    beside it
W=$(cap 80 95)
timed_step gpu_test "$O/gpu_test.log" 10 "$W" python3 -m pytest -q -p no:cacheprovider \
    tests/test_gpu_op.py -k "bad_knob" &
for b in 1 16 64; do
    bench "warm_b$b" "$W" --warmup-only --shapes d2048-v151936 --batches $b --zero-d \
        --knobs plain,off,k50off --variants "$TWO" --variant-plain &
done
bench warm_perrow "$W" --warmup-only --shapes d2048-v151936 --batches 16,64 \
    --knobs plain,off,mixed --variants "$TWO" --variant-plain &
wait
say "warm-up done" >> "$S"
grep -E "passed|failed|^FAILED|^ERROR|must be" "$O/gpu_test.log" | head -8 >> "$S"

# 2. timed
bench ab_zero_d "$(cap 70 45)" --shapes d2048-v151936 --batches 1,16,64 --zero-d \
    --knobs plain,off,k50off --variants "$TWO" --variant-plain --rounds 3 --rep 20 --label fused-assert
bench ab_perrow "$(cap 40 2)" --shapes d2048-v151936 --batches 16,64 \
    --knobs plain,off,mixed --variants "$TWO" --variant-plain --rounds 3 --rep 20 --label fused-assert-perrow
M=$(grep -h "drew other tokens" "$O"/*.log | sort -u)
if [ -n "$M" ]; then echo "$M" >> "$S"; else echo "token checks: no difference" >> "$S"; fi
for f in "$O"/bench_off_knobs_*.csv; do echo "## $(basename "$f")"; cut -d, -f3- "$f"; done >> "$S" 2>/dev/null
