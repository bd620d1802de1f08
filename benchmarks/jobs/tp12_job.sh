#!/usr/bin/env bash
# Issue 39 item 2 on every GPU of the host (4 expected; 2 run it at TP = 2), bench_tp.py with
# every provider of a cell timed over rounds in rotated orders (--rounds), the cell the
# median of its rounds. Everything under $OUT/tp12/<mode>/, summary.txt first.
#   --levers (<= 230 s): the PDL levers beside the default where seed=None leaves item 2
#     closest (D = 4096 B = 64 / 256 / 16 / 1, D = 8192 B = 64 / 256): fused_tp (seed=None),
#     fused_tp_stage1pdl, fused_tp_pdl, fused_tp_bothpdl, fused_tp_seed_scalar (an int seed),
#     shard_matmul (the bound) and tp1_fused (the scaling)
#   --final (<= 300 s): the committed table: both shapes at B = 1, 16, 64, 256, the default
#     against the bound, TP = 1 and the peers that gather the logits, then the world-4 tests
#     (benchmark shapes, seeded apart, the 10,000 skewed steps) as time allows
set -u
cd "$(dirname "$0")/../.."
mode=${1:---levers}
budget=${2:-230}
source benchmarks/jobs/device_job_lib.sh
tp_job_start "tp12/${mode#--}" 2
bench() {  # LABEL DIR LIMIT SHAPES PROVIDERS ROUNDS
    mkdir -p "$O/$2"
    timed_step "$1" "$O/$2/bench_tp.log" 20 "$3" python3 -m torch.distributed.run \
        --nproc_per_node="$GPUS" benchmarks/bench_tp.py --shapes "$4" --modes graph \
        --providers "$5" --rounds "$6" --out-dir "$O/$2"
    grep -E "^D=" "$O/$2/bench_tp.log" >> "$S"
}
pytest_step() {  # LABEL LOG MIN LIMIT -k EXPRESSION
    timed_step "$1" "$O/$2" "$3" "$4" python3 -m pytest -v -s -rA -p no:cacheprovider \
        -m multigpu tests/test_tp_gpu.py -k "$5"
    grep -E "ranks seeded apart|passed|failed|PASSED|FAILED" "$O/$2" | tail -6 >> "$S"
}
if [ "$mode" = --levers ]; then
    P=shard_matmul,fused_tp,fused_tp_stage1pdl,fused_tp_pdl,fused_tp_bothpdl,fused_tp_seed_scalar,tp1_fused
    bench "A bench_tp TP=$GPUS D=4096" d4096 "$(cap 130 75)" 4096x151936:64/256/16/1 "$P" 5
    bench "B bench_tp TP=$GPUS D=8192" d8192 "$(cap 90 0)" 8192x128256:64/256 "$P" 5
else
    P=shard_matmul,fused_tp,fused_tp_seed_scalar,tp1_fused,shard_allgather,allgather_compiled
    bench "A bench_tp TP=$GPUS" both "$(cap 170 100)" 4096x151936,8192x128256 "$P" 5
    pytest_step "B benchmark shapes (world 4)" tp_gpu_benchmark_shapes.log 30 "$(cap 60 40)" \
        "benchmarks_shapes and 4"
    pytest_step "C seeded apart (default)" tp_gpu_seeded_apart.log 12 "$(cap 20 20)" \
        "seeded_apart and default"
    pytest_step "D skewed steps (default)" tp_gpu_skewed_default.log 30 "$(cap 60 0)" \
        "10000_skewed and default"
fi
echo "total $(elapsed) s" >> "$S"
cat "$S"
