#!/bin/bash
# GPU job (one Hopper GPU, run by the lead) for the stage 1 of 129-256 rows, within BUDGET
# seconds (first argument, default 200), everything written to $OUT:
#   1. the GPU pathwise tests of the Gluon stage 1 with its wide MMA (hopper_kernel.WIDE_MMA);
#   2. benchmarks/large_batch_ab.py --what dispatch: the default before and after
#      dispatch._large_batch_gluon_rows, token checks included (WHAT=variants: round 1's A/B);
#   3. --what diagnose with the time left (T = 1 against greedy: the noise's share).
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
if [ "${TESTS:-1}" = 1 ]; then
    timeout -k 5 "${TEST_S:-45}" python3 -m pytest -q -p no:xdist -p no:cacheprovider -rA \
        tests/test_gpu_op.py -k "warp_specialized_kernel_matches and True" > "$OUT/gpu_tests.log" 2>&1
    echo "GPU tests rc=$? at $(( $(date +%s) - START )) s:"; grep -E "passed|failed|error" "$OUT/gpu_tests.log" | tail -3
fi
WHAT=${WHAT:-dispatch}
DIAGNOSE_S=${DIAGNOSE_S:-45}
timeout -k 5 $(( $(left) - DIAGNOSE_S - 5 )) python3 benchmarks/large_batch_ab.py --what "$WHAT" \
    --budget $(( $(left) - DIAGNOSE_S - 5 )) --rounds "${ROUNDS:-4}" --out-dir "$OUT" \
    --batches "${BATCHES:-144,160,192,224,256}" ${SHAPES:+--shapes "$SHAPES"}
if [ "$(left)" -gt 30 ]; then
    timeout -k 5 $(( $(left) - 5 )) python3 benchmarks/large_batch_ab.py --what diagnose \
        --budget $(( $(left) - 6 )) --rounds 3 --out-dir "$OUT" --batches 160,256 \
        --shapes 2048x151936,4096x151936
fi
echo "job took $(( $(date +%s) - START )) s"
