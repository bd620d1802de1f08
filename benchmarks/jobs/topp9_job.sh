#!/bin/bash
# GPU job (one Hopper GPU, run by the lead) for issue 38 item 1 at B <= 128, the truncating
# forms, within BUDGET seconds (first argument, default 200), everything written to $OUT:
#   1. benchmarks/probes/truncation_ab.py: the defaults against the levers they replaced and
#      the ones not taken yet (AB_VARIANTS; its VARIANTS), one process, tokens checked
#      against the default's, top-p / top-k + top-p / min-p / top-k 50 at D = 2048;
#   2. benchmarks/power_draw.py at 96 / 128 rows with CUDA-graph replays (eager truncating
#      calls are host-bound there): cuBLAS, the noise-free fused_greedy and the truncating
#      calls under sustained load: power, SM clock, energy per call (issue 38's "within 3% of
#      the measured energy bound" where the card is power-capped);
#   3. the GPU tests of the levers (TESTS=1, the default), with what time is left.
budget=${1:-200}
source benchmarks/jobs/device_job_lib.sh
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/topp9_out}
mkdir -p "$OUT"
if ! python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "no CUDA device: nothing run"; exit 0
fi
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
cat COMMIT 2>/dev/null
say "A/B"
timeout -k 3 "$(cap "${AB_S:-95}" 70)" python3 benchmarks/probes/truncation_ab.py \
    --budget "$(cap "${AB_S:-95}" 72)" --batches "${AB_BATCHES:-1,32,24,64,128,96,16,48}" \
    --modes "${AB_MODES:-p09,k50p09,minp,k50}" ${AB_VARIANTS:+--variants "$AB_VARIANTS"} \
    --rounds 3 --out-dir "$OUT" > "$OUT/truncation_ab.txt" 2>&1
echo "A/B rc=$?"; grep -v Warning "$OUT/truncation_ab.txt" | tail -20
say "power"
timeout -k 3 "$(cap "${POWER_S:-60}" 12)" python3 benchmarks/power_draw.py --seconds 2 --logit-std 5 \
    --graph-calls 20 --shapes "${POWER_SHAPES:-2048x151936}" --batches "${POWER_BATCHES:-128,96}" \
    --providers "${POWER_PROVIDERS:-matmul,fused_greedy,fused,fused_topk50,fused_topk50_topp09,fused_topp09,fused_minp01}" \
    --out-dir "$OUT" > "$OUT/power_draw.txt" 2>&1
echo "power rc=$?"; cat "$OUT/power_draw.txt"
if [ "${TESTS:-1}" = 1 ] && [ "$(left)" -gt 15 ]; then
    say "GPU tests"
    timeout -k 3 "$(cap 90 3)" python3 -m pytest -q -p no:xdist -p no:cacheprovider -rA \
        tests/test_gpu_truncation.py -k "${TESTS_K:-mass_partials_levers or (scalar_top_p_min_p and default)}" \
        > "$OUT/gpu_tests.log" 2>&1
    echo "GPU tests rc=$?"; grep -E "PASSED|FAILED|passed|failed|error" "$OUT/gpu_tests.log" | tail -12
fi
say "done"
