#!/bin/bash
# GPU job (one H200, run by the lead) for issue 38: the cells of the 14:49 H200 sweep that
# were slower in us than at 06:29, within BUDGET seconds (first argument, default 200),
# everything written to $OUT:
#   0. with FLAGS=1, benchmarks/probes/flag_repro.py: whether the rows sent to the fallback
#      change with what a call cannot depend on (the allocator's free memory, PDL);
#   1. (AB=1, the default) benchmarks/probes/sweep_cells_ab.py on bench_sampling's own inputs: per cell (CELLS)
#      cuBLAS, the default twice, the levers (LEVERS: default all of them) set back one at a
#      time and those of that day all at once, the default on other rows; tokens checked; the
#      rows sent to the exact fallback; with PROFILE=1 the kernels (torch.profiler);
#   2. the GPU tests (TESTS=1; TESTS_K picks them);
#   3. with REPRO=1 and what time is left, the sweep's own process again for one shape
#      (REPRO_SHAPE): compile_fused.py in 12 processes, then bench_sampling.py as
#      fi9_final_job.sh runs it, twice (is a cell's slowdown in that run one of the process?).
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
if [ "${FLAGS:-0}" = 1 ]; then
    say "fallback flags against what a call cannot depend on"
    flags_s=$(cap "${FLAGS_S:-90}" "${FLAGS_RESERVE:-6}")
    timeout -k 3 "$flags_s" python3 benchmarks/probes/flag_repro.py --budget $((flags_s - 20)) \
        ${FLAG_CELLS:+--cells "$FLAG_CELLS"} --out-dir "$OUT" > "$OUT/flag_repro.log" 2>&1
    echo "flags rc=$? (124: cut by the budget)"; grep -v Warning "$OUT/flag_repro.log" | tail -60
fi
[ "${AB:-1}" = 1 ] && { say "sweep cells A/B"
ab_s=$(cap "${AB_S:-185}" "${AB_RESERVE:-6}")
timeout -k 3 "$ab_s" python3 benchmarks/probes/sweep_cells_ab.py --budget $((ab_s - 3)) \
    ${CELLS:+--cells "$CELLS"} ${LEVERS:+--levers "$LEVERS"} --rounds "${ROUNDS:-3}" \
    $([ "${PROFILE:-1}" = 1 ] && echo --profile) --out-dir "$OUT" > "$OUT/sweep_cells_ab.txt" 2>&1
echo "A/B rc=$? (124: cut by the budget)"
grep -v Warning "$OUT/sweep_cells_ab.txt" | grep -v "^    \|fallback rows 0/0\|_warn_once" | tail -60; }
if [ "${TESTS:-0}" = 1 ] && [ "$(left)" -gt 20 ]; then
    say "GPU tests"
    timeout -k 3 "$(cap "${TESTS_S:-60}" "${TESTS_RESERVE:-3}")" python3 -m pytest -q -p no:xdist \
        -p no:cacheprovider -rA tests/test_gpu_truncation.py -k "${TESTS_K:-above_128_rows}" \
        > "$OUT/gpu_tests.log" 2>&1
    echo "GPU tests rc=$? (124: cut by the budget)"
    grep -E "PASSED|FAILED|passed|failed|error" "$OUT/gpu_tests.log" | tail -12
fi
if [ "${REPRO:-0}" = 1 ] && [ "$(left)" -gt 45 ]; then
    shape=${REPRO_SHAPE:-2048x151936}
    say "the sweep's process for $shape: compile ahead"
    for index in $(seq 0 11); do
        timeout "$(cap 45 25)" python3 benchmarks/compile_fused.py --shapes "$shape" \
            --index "$index" --count 12 --threads 2 > "/tmp/compile_fused_$index.log" 2>&1 &
    done
    wait
    for run in 1 2; do
        [ "$(left)" -lt 15 ] && { say "sweep run $run: no time left"; break; }
        say "sweep run $run"
        mkdir -p "$OUT/sweep$run"
        timeout "$(cap 40 2)" python3 benchmarks/bench_sampling.py --shapes "$shape" \
            --providers matmul,fused,fused_topk50,fused_topk50_topp09,fused_topp09,fused_minp01 \
            --timing graph --logit-std 5 --warmup-ms 10 --rep-ms 40 --out-dir "$OUT/sweep$run" \
            > "$OUT/sweep$run/log.txt" 2>&1
        echo "rc=$?"; grep -E "fused_topp09|matmul" "$OUT/sweep$run/log.txt" | grep " B=" | head -32
    done
fi
say "done"
