#!/usr/bin/env bash
# Issue 39 item 2 on every GPU of the host (4 expected; 2 run it at TP = 2), bench_tp.py with
# every provider of a cell timed over rounds in rotated orders (--rounds), the cell the
# median of its rounds. Everything under $OUT/tp12/<mode>/, summary.txt first.
#   --levers (<= 230 s): the PDL levers beside the default where seed=None leaves item 2
#     closest (D = 4096 B = 64 / 256 / 16 / 1, D = 8192 B = 64 / 256): fused_tp (seed=None),
#     fused_tp_stage1pdl, fused_tp_pdl, fused_tp_bothpdl, fused_tp_seed_scalar (an int seed),
#     shard_matmul (the bound) and tp1_fused (the scaling)
#   --final (<= 300 s): the committed table: both shapes at B = 1, 16, 64, 256, the default
#     against the bound, TP = 1 and the bare gather of the logits, then the world-4 tests
#     (benchmark shapes, seeded apart, the 10,000 skewed steps) as time allows
set -u
cd "$(dirname "$0")/../.."
mode=${1:---levers}
budget=${2:-230}
source benchmarks/jobs/device_job_lib.sh
tp_job_start "tp12/${mode#--}" 2
if [ "$mode" = --levers ]; then
    P=shard_matmul,fused_tp,fused_tp_stage1pdl,fused_tp_pdl,fused_tp_bothpdl,fused_tp_seed_scalar,tp1_fused
    tp_bench "A bench_tp TP=$GPUS" "$(cap 220 0)" 4096x151936:64/256/16/1,8192x128256:64/256 \
        "$P" --rounds 5
else
    # (the peers that compile nothing: a compiled peer costs 15-30 s a cell at its first call)
    P=shard_matmul,fused_tp,fused_tp_seed_scalar,tp1_fused,shard_allgather
    tp_bench "A bench_tp TP=$GPUS" "$(cap 170 100)" 4096x151936,8192x128256 "$P" --rounds 5
    tp_test "B benchmark shapes (world 4)" tp_gpu_benchmark_shapes.log 30 "$(cap 60 40)" \
        "benchmarks_shapes and 4"
    tp_test "C seeded apart (default)" tp_gpu_seeded_apart.log 12 "$(cap 20 20)" \
        "seeded_apart and default"
    tp_test "D skewed steps (default)" tp_gpu_skewed_default.log 30 "$(cap 60 0)" \
        "10000_skewed and default"
fi
echo "total $(elapsed) s" >> "$S"
cat "$S"
