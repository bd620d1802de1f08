#!/usr/bin/env bash
# tp6's device job (issue 39 item 2; <= 200 s), on every GPU of the host (4 expected).
# Everything under $OUT/tp6/r1/, summary.txt first.
#   A: bench_tp.py TP = P, D = 4096 B = 1, 16, 64, 256 and D = 8192 B = 64, 256, CUDA graphs, in one process:
#      fused_tp_assert (the exchange's verdict by an assert kernel after it: the old path),
#      fused_tp (the exchange failing a bad call in its own kernel: one launch fewer),
#      fused_tp_pdl (that, launched as a programmatic dependent that stage 1 signals as its
#      programs start), shard_matmul and tp1_fused (the bound and the scaling)
#   B: tests/test_tp_gpu.py at world size P: the 10,000 skewed steps (default), ranks
#      seeded apart failing the call (default, PDL), a missing rank's timeout
#   C: the 10,000 skewed steps with the PDL exchange, if time is left
set -u
cd "$(dirname "$0")/../.."
budget=${TOTAL_S:-196}
source benchmarks/jobs/device_job_lib.sh
tp_job_start tp6/r1 2

# A
tp_bench "A bench_tp TP=$GPUS D=4096 B=1,16,64,256, D=8192 B=64,256" "$(cap 95 90)" \
    4096x151936,8192x128256:64/256 shard_matmul,fused_tp_assert,fused_tp,fused_tp_pdl,tp1_fused \
    --batches 1,16,64,256

# B
timed_step "B tests (skewed default, seeded apart default / PDL, missing rank)" \
    "$O/tp_gpu_tests.log" 30 "$(cap 75 0)" python3 -m pytest -v -s -rA -p no:cacheprovider -m multigpu tests/test_tp_gpu.py \
    -k "(10000_skewed and default) or (seeded_apart and not assert) or missing_rank_fails_the_symm"
grep -E "passed|failed|PASSED|FAILED|Error" "$O/tp_gpu_tests.log" | tail -12 >> "$S"

# C
timed_step "C skewed steps, PDL exchange" "$O/tp_gpu_skewed_pdl.log" 45 "$(cap 60 0)" \
    python3 -m pytest -v -s -rA -p no:cacheprovider -m multigpu tests/test_tp_gpu.py \
    -k "10000_skewed and pdl"
grep -E "passed|failed|PASSED|FAILED" "$O/tp_gpu_skewed_pdl.log" | tail -4 >> "$S"
echo "total $(elapsed) s" >> "$S"
cat "$S"
