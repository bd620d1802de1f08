#!/usr/bin/env bash
# tp7's device job (issue 39 item 2; <= 200 s), on every GPU of the host (4 expected).
# Everything under $OUT/tp7/r1/, summary.txt first.
#   A: bench_tp.py TP = P, D = 4096 and 8192 at B = 256, 64, 16, 1 (B = 256 first: the cells
#      the PDL rule touches), CUDA graphs, in one process: fused_tp (the default: the exchange
#      never PDL), fused_tp_auto (FLASHSAMPLING_TP_EXCHANGE_PDL=auto: PDL where stage 1 runs
#      on a persistent grid), fused_tp_seed (an explicit int seed, made a 0-d tensor per call)
#      against fused_tp_seed_scalar (passed to the kernels as it is, one launch fewer),
#      shard_matmul and tp1_fused (bound and scaling)
#   B: tests/test_tp_gpu.py at world size P: ranks seeded apart fail the call (every variant)
#   C: the 10,000 skewed steps with both opt-ins at a shape whose exchange is PDL by the rule
#      (B = 256, D = 8192, int seeds)
set -u
cd "$(dirname "$0")/../.."
budget=${TOTAL_S:-196}
source benchmarks/jobs/device_job_lib.sh
tp_job_start tp7/r1 2

# A
tp_bench "A bench_tp TP=$GPUS D=4096/8192 B=256,64,16,1" "$(cap 100 95)" \
    4096x151936:256/64/16/1,8192x128256:256/64/16/1 \
    shard_matmul,fused_tp,fused_tp_auto,fused_tp_seed,fused_tp_seed_scalar,tp1_fused

# B
timed_step "B tests (seeded apart: default / assert / pdl)" "$O/tp_gpu_seeded_apart.log" 30 \
    "$(cap 90 0)" python3 -m pytest -v -s -rA -p no:cacheprovider -m multigpu tests/test_tp_gpu.py \
    -k "seeded_apart"
grep -E "ranks seeded apart|passed|failed|PASSED|FAILED" "$O/tp_gpu_seeded_apart.log" | tail -12 >> "$S"

# C
timed_step "C skewed steps, PDL=auto + scalar seeds at B = 256 D = 8192" \
    "$O/tp_gpu_skewed_auto.log" 35 "$(cap 90 0)" \
    python3 -m pytest -v -s -rA -p no:cacheprovider -m multigpu tests/test_tp_gpu.py \
    -k "10000_skewed and auto"
grep -E "passed|failed|PASSED|FAILED" "$O/tp_gpu_skewed_auto.log" | tail -4 >> "$S"
echo "total $(elapsed) s" >> "$S"
cat "$S"
