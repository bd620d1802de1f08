#!/usr/bin/env bash
# tp4's device job (issue 39; <= 225 s), on the GPUs it sees: 4 (everything) or 2 (the hf_tp
# runs, the control, the D = 4096 shard's stage-1 sweep). Everything under $OUT/tp4/r3/,
# summary.txt first.
#   4 GPUs:
#   A (parallel): hf_tp.py TP = 2, Llama-3.1-8B dims 4 layers on GPUs 0,1 | the 32B shape
#      2 layers on GPUs 2,3 (stock and fused, B = 16, 64 new tokens, destroy timed)
#   B (parallel): the teardown control with release, 25 s exit bound, on GPUs 0,1, then the
#      D = 8192 shard's stage 1 on them | the D = 4096 shard's stage 1 (short_shard_stage1.py,
#      candidates against cuBLAS) B = 64 on GPU 2, B = 256 on GPU 3
#   C: bench_tp.py TP = 4 at B = 64, 256, both shapes: shard_matmul, fused_tp, fused_tp_pdl (the
#      exchange as a programmatic dependent), fused_tp_best (stage 1 on B's fastest)
#   D: tests/test_tp_gpu.py 10,000 skewed steps at world 4
set -u
cd "$(dirname "$0")/.."
budget=${TOTAL_S:-222}
source benchmarks/device_job_lib.sh
tp_job_start tp4/r3 2

hf_tp2() {  # $1 GPUs, $2 port, $3 shape, $4 layers, $5 limit
    local t; t=$(date +%s)
    CUDA_VISIBLE_DEVICES=$1 timeout -k 5 "$5" python3 -m torch.distributed.run --nproc_per_node=2 \
        --master_port "$2" benchmarks/hf_tp.py --shape "$3" --layers "$4" --batches 16 \
        --configs fused,stock --new-tokens 64 --repeats 2 --checkpoint "/tmp/ck_tp4_$3" \
        --out-dir "$O" > "$O/hf_tp2_$3.log" 2>&1
    echo "hf_tp TP=2 $3 $4 layers (GPUs $1): rc=$? wall $(( $(date +%s)-t )) s" > "$O/hf_tp2_$3.sum"
    grep -E "^B=|barrier|destroyed|Timeout|Error" "$O/hf_tp2_$3.log" | head -8 >> "$O/hf_tp2_$3.sum"
}
stage1() {  # $1 GPU, $2 shape, $3 batches, $4 limit, $5 candidates (empty: all)
    local t; t=$(date +%s)
    CUDA_VISIBLE_DEVICES=$1 timeout -k 5 "$4" python3 benchmarks/short_shard_stage1.py \
        --shapes "$2" --batches "$3" --rounds 3 --only "${5:-}" --budget-s $(( $4 - 9 )) \
        --out-dir "$O/sweep_$2_b$3" \
        > "$O/stage1_$2_b$3.log" 2>&1
    echo "short_shard_stage1 $2 B=$3 (GPU $1): rc=$? wall $(( $(date +%s)-t )) s" > "$O/stage1_$2_b$3.sum"
    grep -vE "Warning|warn" "$O/stage1_$2_b$3.log" | tail -16 >> "$O/stage1_$2_b$3.sum"
}
control() {  # $1 GPUs, $2 limit
    local t; t=$(date +%s)
    CUDA_VISIBLE_DEVICES=$1 timeout -k 3 "$2" python3 benchmarks/teardown_control.py \
        --release --exit-s 25 > "$O/control_release.log" 2>&1
    echo "control --release (bound 25 s, GPUs $1): rc=$? wall $(( $(date +%s)-t )) s" > "$O/control.sum"
    grep -E "^control|tp_ranks: rank" "$O/control_release.log" >> "$O/control.sum"
}
B64=triton64x64_w8,triton64x64_d128,triton64x32,swapab64x64x128
B256=t128x64_pps2,gluon64rows,swap_pingpong,swap_coop
collect() { cat "$@" >> "$S" 2>/dev/null; }

if [ "$GPUS" -lt 4 ]; then
    hf_tp2 0,1 29511 llama-3.1-8b 4 "$(cap 80 105)"; collect "$O"/hf_tp2_llama-3.1-8b.sum
    hf_tp2 0,1 29512 32b 2 "$(cap 65 42)"; collect "$O"/hf_tp2_32b.sum
    control 0,1 "$(cap 40 2)"; collect "$O"/control.sum
    L=$(cap 45 2)
    if [ "$L" -gt 22 ]; then
        stage1 0 4096x37984 64,256 "$L" "$B64,$B256"; collect "$O"/stage1_4096x37984_b64,256.sum
    fi
    echo "total $(elapsed) s" >> "$S"; cat "$S"; exit 0
fi

# A
L=$(cap 75 145)
hf_tp2 0,1 29511 llama-3.1-8b 4 "$L" &
hf_tp2 2,3 29512 32b 2 "$L" &
wait
collect "$O"/hf_tp2_llama-3.1-8b.sum "$O"/hf_tp2_32b.sum

# B
L=$(cap 45 102)
END_B=$(( $(date +%s) + L ))
( control 0,1 "$(cap 35 102)"
  L2=$(( END_B - $(date +%s) ))
  if [ "$L2" -gt 18 ]; then
      stage1 0 8192x32064 64 "$L2" triton64x64_d128,swapab64x64x128 &
      stage1 1 8192x32064 256 "$L2" swap_pingpong,t128x64_pps2 &
      wait
  fi ) &
stage1 2 4096x37984 64 "$L" "$B64" &
stage1 3 4096x37984 256 "$L" "$B256" &
wait
collect "$O"/control.sum "$O"/stage1_4096x37984_b64.sum "$O"/stage1_4096x37984_b256.sum \
    "$O"/stage1_8192x32064_b64.sum "$O"/stage1_8192x32064_b256.sum

# C
t=$(date +%s)
timeout -k 5 "$(cap 60 40)" python3 -m torch.distributed.run --nproc_per_node=4 benchmarks/bench_tp.py \
    --shapes 4096x151936,8192x128256 --batches 64,256 --modes graph \
    --providers shard_matmul,fused_tp,fused_tp_pdl,fused_tp_best,tp1_fused \
    $(ls "$O"/sweep_*/short_shard_stage1_*.json 2>/dev/null | sed 's/^/--best-of /') \
    --out-dir "$O" > "$O/bench_tp4.log" 2>&1
echo "C bench_tp TP=4 B=64,256: rc=$? wall $(( $(date +%s)-t )) s" >> "$S"
grep -E "^D=|fused_tp_best D" "$O/bench_tp4.log" | head -24 >> "$S"

# D
timed_step "D test_10000_skewed_steps world 4" "$O/skewed_world4.log" 29 "$(cap 45 2)" \
    python3 -m pytest -q -s -rA -p no:cacheprovider -m multigpu tests/test_tp_gpu.py -k "10000_skewed"
grep -E "tp_ranks:|PASSED|FAILED|passed|failed|Error" "$O/skewed_world4.log" 2>/dev/null | head -8 >> "$S"
echo "total $(elapsed) s" >> "$S"
cat "$S"
