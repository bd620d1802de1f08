#!/bin/bash
# GPU job (one Hopper GPU, run by the lead) for issue 38 item 1 at B <= 128, the truncating
# forms (top-p alone above all), within BUDGET seconds (first argument, default 150),
# everything written to $OUT:
#   0. benchmarks/truncation_ab.py: stage-2 and mass-partial levers against the default, one
#      process, tokens checked (its VARIANTS; round 2, 12:14 UTC, timed the narrowed nucleus
#      search and the key's maximum while they were opt-ins: docs/performance.md);
#   then the GPU pathwise tests of those levers (TESTS=1, the default);
#   1. (PROFILE=1; round 1's) benchmarks/profile_calls.py: each kernel's device time in the top-p / top-k / min-p
#      calls beside the whole call (CUDA graph) and cuBLAS, D = 2048 (the shortest matmul,
#      where top-p alone is 1.09x at every B);
#   2. benchmarks/power_draw.py at 96 / 128 rows: is the H200 at its power cap there (plain
#      sampling 1.10-1.14x at D = 2048 only on the H200), and the fused calls' energy over
#      cuBLAS's (issue 38's "within 3% of the energy bound").
budget=${1:-150}
source benchmarks/device_job_lib.sh
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/topp8_out}
mkdir -p "$OUT"
if ! python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "no CUDA device: nothing run"; exit 0
fi
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
say "A/B"
timeout -k 3 "$(cap "${AB_S:-90}" 55)" python3 benchmarks/truncation_ab.py --budget "$(cap "${AB_S:-90}" 57)" \
    --batches "${AB_BATCHES:-1,16,64,128,96}" --modes "${AB_MODES:-p09,k50p09,minp}" --rounds 3 \
    --out-dir "$OUT" > "$OUT/truncation_ab.txt" 2>&1
echo "A/B rc=$?"; grep -v Warning "$OUT/truncation_ab.txt" | tail -20
if [ "${TESTS:-1}" = 1 ]; then
    say "GPU tests"
    timeout -k 3 "$(cap 35 22)" python3 -m pytest -q -p no:xdist -p no:cacheprovider -rA \
        tests/test_gpu_truncation.py -k "scalar_top_p_min_p" > "$OUT/gpu_tests.log" 2>&1
    echo "GPU tests rc=$?"; grep -E "passed|failed|error" "$OUT/gpu_tests.log" | tail -3
fi
if [ "${PROFILE:-0}" = 1 ]; then
    say "profile"
    timeout -k 3 "$(cap "${PROFILE_S:-45}" 25)" python3 benchmarks/profile_calls.py \
        --shapes 2048x151936 --batches "${PROFILE_BATCHES:-1,16,64,96,128}" \
        --modes plain,topp09,topk50,minp01,topk50_topp09 > "$OUT/profile_calls.txt" 2>&1
    echo "profile rc=$?"; cat "$OUT/profile_calls.txt"
fi
say "power"
timeout -k 3 "$(cap 200 4)" python3 benchmarks/power_draw.py --seconds 2 --logit-std 5 \
    --shapes "${POWER_SHAPES:-2048x151936}" --batches "${POWER_BATCHES:-128,96}" \
    --providers "${POWER_PROVIDERS:-matmul,fused}" --out-dir "$OUT" > "$OUT/power_draw.txt" 2>&1
echo "power rc=$?"; cat "$OUT/power_draw.txt"
say "done"
