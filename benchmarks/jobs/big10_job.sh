#!/bin/bash
# GPU job (one H200, run by the lead) for issue 38: the cells of the 14:49 H200 sweep that
# were slower in us than at 06:29, within BUDGET seconds (first argument, default 200),
# everything written to $OUT:
#   1. benchmarks/probes/sweep_cells_ab.py on bench_sampling's own inputs: per cell (CELLS)
#      cuBLAS, the default twice, each of the day's levers set back one at a time and all at
#      once, the default on other rows; tokens checked; the rows sent to the exact fallback;
#      the default's and the all-levers-back call's kernels (torch.profiler);
#   2. the GPU tests (TESTS=1; TESTS_K picks them), with what time is left.
budget=${1:-200}
source benchmarks/jobs/device_job_lib.sh
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/big10_out}
mkdir -p "$OUT"
if ! python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "no CUDA device: nothing run"; exit 0
fi
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
cat COMMIT 2>/dev/null
say "sweep cells A/B"
ab_s=$(cap "${AB_S:-185}" "$([ "${TESTS:-0}" = 1 ] && echo 40 || echo 6)")
timeout -k 3 "$ab_s" python3 benchmarks/probes/sweep_cells_ab.py --budget $((ab_s - 3)) \
    ${CELLS:+--cells "$CELLS"} --rounds "${ROUNDS:-3}" --profile --out-dir "$OUT" \
    > "$OUT/sweep_cells_ab.txt" 2>&1
echo "A/B rc=$? (124: cut by the budget)"
grep -v Warning "$OUT/sweep_cells_ab.txt" | grep -v "^    " | tail -60
if [ "${TESTS:-0}" = 1 ] && [ "$(left)" -gt 15 ]; then
    say "GPU tests"
    timeout -k 3 "$(cap 90 3)" python3 -m pytest -q -p no:xdist -p no:cacheprovider -rA \
        tests/test_gpu_truncation.py -k "${TESTS_K:-scalar_top_p_min_p and default}" \
        > "$OUT/gpu_tests.log" 2>&1
    echo "GPU tests rc=$?"; grep -E "PASSED|FAILED|passed|failed|error" "$OUT/gpu_tests.log" | tail -12
fi
say "done"
