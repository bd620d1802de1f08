#!/usr/bin/env bash
# tp10's TP = 4 job (issue 39 item 2; <= 236 s, first argument), on every GPU of the host (4
# expected; 2 run it at TP = 2). Everything under $OUT/tp10/r2/, summary.txt first.
#   A: bench_tp.py TP = P, D = 4096 and 8192 at B = 256, 192, 144, 64, 16, 1 (the large
#      batches first: the cells the short shard's stage-1 route changes), CUDA graphs, one
#      process: fused_tp (the default, seed=None), fused_tp_seed_scalar (an explicit int seed,
#      as the default passes it), shard_matmul (the bound) and tp1_fused (the scaling)
#   B: tests/test_tp_gpu.py at world size P with the defaults: the 10,000 skewed steps
#      (B = 256, D = 8192, the exchange PDL there, int seeds), ranks seeded apart fail the call,
#      then the benchmark's shapes (B = 256 / 512 at D = 4096 / 8192 on 4 ranks, seed=None and
#      explicit) with what time is left
set -u
cd "$(dirname "$0")/../.."
budget=${1:-236}
source benchmarks/jobs/device_job_lib.sh
tp_job_start tp10/r2 2

# A
tp_bench "A bench_tp TP=$GPUS D=4096/8192 B=256,192,144,64,16,1" "$(cap 130 75)" \
    4096x151936:256/192/144/64/16/1,8192x128256:256/192/144/64/16/1 \
    shard_matmul,fused_tp,fused_tp_seed_scalar,tp1_fused

# B
pytest_step() {  # LABEL LOG MIN LIMIT -k EXPRESSION
    timed_step "$1" "$O/$2" "$3" "$4" python3 -m pytest -v -s -rA -p no:cacheprovider \
        -m multigpu tests/test_tp_gpu.py -k "$5"
    grep -E "ranks seeded apart|passed|failed|PASSED|FAILED" "$O/$2" | tail -6 >> "$S"
}
pytest_step "B1 skewed steps (default)" tp_gpu_skewed_default.log 40 "$(cap 75 30)" \
    "10000_skewed and default"
pytest_step "B2 seeded apart (default)" tp_gpu_seeded_apart.log 15 "$(cap 30 0)" \
    "seeded_apart and default"
pytest_step "B3 benchmark shapes (world 4)" tp_gpu_benchmark_shapes.log 30 "$(cap 60 0)" \
    "benchmarks_shapes and 4"
echo "total $(elapsed) s" >> "$S"
cat "$S"
