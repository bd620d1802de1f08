#!/usr/bin/env bash
# tp10's TP = 4 job (issue 39 item 2; <= 236 s, first argument), on every GPU of the host (4
# expected; 2 run it at TP = 2). Everything under $OUT/tp10/r2/, summary.txt first.
#   A: bench_tp.py TP = P, D = 4096 and 8192 at B = 256, 192, 144, 64, 16, 1 (the large
#      batches first: the cells the short shard's stage-1 route changes), CUDA graphs, one
#      process: fused_tp (the default, seed=None), fused_tp_seed_scalar (an explicit int seed,
#      as the default passes it), shard_matmul (the bound) and tp1_fused (the scaling)
#   B: tests/test_tp_gpu.py at world size P with the defaults: the benchmark's shapes (B = 256
#      / 512 at D = 4096 / 8192 on 4 ranks, seed=None and explicit: the new stage-1 routes);
#   C: the opt-in FLASHSAMPLING_TP_STAGE1_PDL=1 (the Triton stage 1 a programmatic dependent
#      of seed=None's draw) against the default at B = 64, 16, 1, both shapes, one process,
#      then the CUDA-graph replay test (seed=None) with it;
#   D: ranks seeded apart fail the call, then the 10,000 skewed steps (B = 256, D = 8192, the
#      exchange PDL there, int seeds: passed at 15:58 with these switches), as time allows
set -u
cd "$(dirname "$0")/../.."
budget=${1:-236}
source benchmarks/jobs/device_job_lib.sh
tp_job_start tp10/r2 2

# A
tp_bench "A bench_tp TP=$GPUS D=4096/8192 B=256,192,144,64,16,1" "$(cap 120 100)" \
    4096x151936:256/192/144/64/16/1,8192x128256:256/192/144/64/16/1 \
    shard_matmul,fused_tp,fused_tp_seed_scalar,tp1_fused

# B: the benchmark's shapes through the new stage-1 routes, tokens checked
pytest_step() {  # LABEL LOG MIN LIMIT -k EXPRESSION
    timed_step "$1" "$O/$2" "$3" "$4" python3 -m pytest -v -s -rA -p no:cacheprovider \
        -m multigpu tests/test_tp_gpu.py -k "$5"
    grep -E "ranks seeded apart|passed|failed|PASSED|FAILED" "$O/$2" | tail -6 >> "$S"
}
pytest_step "B benchmark shapes (world 4)" tp_gpu_benchmark_shapes.log 30 "$(cap 60 70)" \
    "benchmarks_shapes and 4"

# C
mkdir -p "$O/stage1pdl"
timed_step "C bench_tp stage 1 PDL after the draw" "$O/stage1pdl/bench_tp.log" 20 \
    "$(cap 40 30)" python3 -m torch.distributed.run --nproc_per_node="$GPUS" \
    benchmarks/bench_tp.py --shapes 4096x151936:64/16/1,8192x128256:64/16/1 --modes graph \
    --providers fused_tp,fused_tp_stage1pdl,shard_matmul --out-dir "$O/stage1pdl"
grep -E "^D=" "$O/stage1pdl/bench_tp.log" | sed "s/^/[C] /" >> "$S"
FLASHSAMPLING_TP_STAGE1_PDL=1 pytest_step "C graph replays (stage 1 PDL)" \
    tp_gpu_graph_stage1pdl.log 15 "$(cap 25 15)" "cuda_graph_replays"

# D
pytest_step "D1 seeded apart (default)" tp_gpu_seeded_apart.log 12 "$(cap 20 0)" \
    "seeded_apart and default"
pytest_step "D2 skewed steps (default)" tp_gpu_skewed_default.log 40 "$(cap 60 0)" \
    "10000_skewed and default"
echo "total $(elapsed) s" >> "$S"
cat "$S"
