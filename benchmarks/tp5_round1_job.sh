#!/usr/bin/env bash
# tp5's device job, round 1 (issue 39; <= 200 s), on 4 GPUs. Everything under $OUT/tp5/r1/,
# summary.txt first.
#   A (parallel, one GPU each): short_shard_stage1.py on the TP = 4 shards, every candidate
#      (the new B <= 64 ones: wider / persistent tiles against wave quantization):
#      D = 4096 B = 64 (GPU 0), D = 4096 B = 256 (GPU 1), D = 8192 B = 64 (2), B = 256 (3)
#   B: bench_tp.py TP = 4, B = 1, 16, 64, 256, both shapes, CUDA graphs: shard_matmul,
#      fused_tp, fused_tp_best (A's sweeps), tp1_fused, the peers (shard_allgather,
#      allgather_fi2, allgather_compiled) -- issue 39 item 6's CSV
#   C: hf_tp.py TP = 4, Llama-3.1-8B dims 4 layers, B = 16 (stock and fused) -- item 5
set -u
cd "$(dirname "$0")/.."
budget=${TOTAL_S:-196}
source benchmarks/device_job_lib.sh
tp_job_start tp5/r1 4

stage1() {  # $1 GPU, $2 shape, $3 batches, $4 limit
    local t; t=$(date +%s)
    CUDA_VISIBLE_DEVICES=$1 timeout -k 5 "$4" python3 benchmarks/short_shard_stage1.py \
        --shapes "$2" --batches "$3" --rounds 3 --budget-s $(( $4 - 9 )) \
        --out-dir "$O/sweep_$2_b$3" > "$O/stage1_$2_b$3.log" 2>&1
    echo "short_shard_stage1 $2 B=$3 (GPU $1): rc=$? wall $(( $(date +%s)-t )) s" > "$O/stage1_$2_b$3.sum"
    grep -vE "Warning|warn" "$O/stage1_$2_b$3.log" | tail -16 >> "$O/stage1_$2_b$3.sum"
}

# A
L=$(cap 40 150)
stage1 0 4096x37984 64 "$L" &
stage1 1 4096x37984 256 "$L" &
stage1 2 8192x32064 64 "$L" &
stage1 3 8192x32064 256 "$L" &
wait
cat "$O"/stage1_4096x37984_b64.sum "$O"/stage1_4096x37984_b256.sum \
    "$O"/stage1_8192x32064_b64.sum "$O"/stage1_8192x32064_b256.sum >> "$S" 2>/dev/null

# B
t=$(date +%s)
timeout -k 5 "$(cap 95 60)" python3 -m torch.distributed.run --nproc_per_node=4 benchmarks/bench_tp.py \
    --shapes 4096x151936,8192x128256 --batches 1,16,64,256 --modes graph \
    --providers shard_matmul,fused_tp,fused_tp_best,tp1_fused,shard_allgather,allgather_fi2,allgather_compiled \
    $(ls "$O"/sweep_*/short_shard_stage1_*.json 2>/dev/null | sed 's/^/--best-of /') \
    --out-dir "$O" > "$O/bench_tp4.log" 2>&1
echo "B bench_tp TP=4 B=1,16,64,256: rc=$? wall $(( $(date +%s)-t )) s" >> "$S"
grep -E "^D=|fused_tp_best D" "$O/bench_tp4.log" | sort -u | head -64 >> "$S"

# C
timed_step "C hf_tp TP=4 llama-3.1-8b 4 layers" "$O/hf_tp4_llama-3.1-8b.log" 41 "$(cap 80 2)" \
    python3 -m torch.distributed.run --nproc_per_node=4 --master_port 29521 \
    benchmarks/hf_tp.py --shape llama-3.1-8b --layers 4 --batches 16 \
    --configs fused,stock --new-tokens 64 --repeats 2 --checkpoint /tmp/ck_tp5_llama --out-dir "$O"
grep -E "^B=|barrier|destroyed|Timeout|Error" "$O/hf_tp4_llama-3.1-8b.log" 2>/dev/null | head -8 >> "$S"
echo "total $(elapsed) s" >> "$S"
cat "$S"
