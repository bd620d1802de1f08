#!/usr/bin/env bash
# tp10's first device job (issue 39 item 2; one H200, <= BUDGET s, first argument, default 196):
# stage 1 of the TP step on the shards people run, at 129-256 rows (and B = 64 on the
# D = 4096 TP = 4 shard), per route: today's default, the Triton persistent tiles, the Gluon
# kernel's 64-row tiles, its wide MMA on 64- and 128-row tiles, the swapped kernel; against
# cuBLAS on the same shard, tokens checked against the default's
# (benchmarks/probes/short_shard_stage1.py). A TP step's stage 1 is exactly that call.
# Shards: D = 4096 TP = 4 / 2 (37984 / 75968 rows), D = 8192 TP = 4 / 2 (32064 / 64128).
# 1. the compiles: one warm-only process per shard, in parallel (one Triton cache);
# 2. the timed run alone, shard by shard (three rounds, round-robin);
# 3. what seed=None's draw costs (benchmarks/probes/seed_draw.py), with the time left.
# Everything under $OUT/tp10/stage1/, summary.txt first.
set -u
cd "$(dirname "$0")/../.."
budget=${1:-196}
source benchmarks/jobs/device_job_lib.sh
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}/tp10/stage1
S=$O/summary.txt
mkdir -p "$O"
if ! python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "no CUDA device: nothing run" | tee "$S"; exit 0
fi
{ nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv
  python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
  cat COMMIT 2>/dev/null; } > "$O/env.txt" 2>&1
LARGE=144/160/176/192/224/256
SHARDS="4096x37984:64/$LARGE 4096x75968:$LARGE 8192x32064:$LARGE 8192x64128:$LARGE"
ONLY=default,triton64x64,gluon64rows,gluon_wide64,gluon_wide128,swap_pingpong
ONLY=$ONLY,t128x128_pps2_c2,t128x256_pps1_c4

say "1. compiles, one process per shard" | tee -a "$S"
warm_s=$(cap 110 70)
for shard in $SHARDS; do
    timeout -k 3 "$warm_s" python3 benchmarks/probes/short_shard_stage1.py --warm-only \
        --shapes "$shard" --only "$ONLY" > "$O/warm_${shard%%:*}.log" 2>&1 &
done
wait
grep -hE "compiled|failed|OTHER|disabled" "$O"/warm_*.log >> "$S"

say "2. timed" | tee -a "$S"
timed_s=$(cap 150 22)
timeout -k 3 "$timed_s" python3 benchmarks/probes/short_shard_stage1.py --rounds 3 \
    --shapes "$(echo $SHARDS | tr ' ' ',')" --only "$ONLY" --budget-s $((timed_s - 25)) \
    --out-dir "$O" > "$O/timed.log" 2>&1
echo "timed rc=$? (124: cut by the budget)" >> "$S"
grep -vE "Warning|warn" "$O/timed.log" | sed -E 's/SampleConfig\(.*//' >> "$S"

say "3. the seed's draw" | tee -a "$S"
timed_step "seed_draw" "$O/seed_draw.log" 8 "$(cap 25 2)" \
    python3 benchmarks/probes/seed_draw.py --shape 4096x37984 --batches 64,256,1
grep -vE "Warning|warn" "$O/seed_draw.log" >> "$S"
echo "total $(elapsed) s" >> "$S"
cat "$S"
