#!/usr/bin/env bash
# tp4 round 2 (issue 39; 4 GPUs, CUDA_VISIBLE_DEVICES=0,1,2,3, <= 225 s). Everything under
# $OUT/tp4/r2/, summary.txt first.
#   A (parallel): hf_tp.py TP = 2 Llama-3.1-8B dims, 4 layers, on GPUs 0,1 | stage 1 on a TP = 4
#     shard of D = 4096 (short_shard_stage1.py, candidates against cuBLAS) B = 64 on GPU 2,
#     B = 256 on GPU 3
#   B (parallel): hf_tp.py TP = 2 32B shape, 2 layers, on GPUs 0,1 | teardown control with
#     release, 25 s exit bound, on GPUs 2,3, then the D = 8192 shard's stage 1 (few candidates)
#   C: tests/test_tp_gpu.py::test_10000_skewed_steps_agree_on_every_rank at world 4 (the
#     exchange kernel now launched with PDL: its first GPU run)
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
O=${OUT:-/tmp/out}/tp4/r2; mkdir -p "$O"
TOTAL=${TOTAL_S:-222}
T0=$(date +%s)
left() { echo $(( TOTAL - ($(date +%s) - T0) )); }
cap() { local l=$(( $(left) - ${2:-0} )); [ "$l" -gt "$1" ] && l=$1; echo "$l"; }
S=$O/summary.txt
GPUS=$(python3 -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
if [ "$GPUS" -lt 4 ]; then echo "needs 4 CUDA GPUs (found $GPUS): nothing run" | tee "$S"; exit 0; fi
{ nvidia-smi -L; nvidia-smi --query-gpu=power.limit,clocks.max.sm --format=csv
  python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"
  cat COMMIT 2>/dev/null; } > "$O/env.txt" 2>&1

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
        --shapes "$2" --batches "$3" --rounds 3 --only "${5:-}" --out-dir "$O" \
        > "$O/stage1_$2_b$3.log" 2>&1
    echo "short_shard_stage1 $2 B=$3 (GPU $1): rc=$? wall $(( $(date +%s)-t )) s" > "$O/stage1_$2_b$3.sum"
    grep -vE "Warning|warn" "$O/stage1_$2_b$3.log" | tail -24 >> "$O/stage1_$2_b$3.sum"
}

# A
L=$(cap 92 130)
hf_tp2 0,1 29511 llama-3.1-8b 4 "$L" &
stage1 2 4096x37984 64 "$L" &
stage1 3 4096x37984 256 "$L" &
wait
cat "$O"/hf_tp2_llama-3.1-8b.sum "$O"/stage1_4096x37984_b64.sum "$O"/stage1_4096x37984_b256.sum >> "$S" 2>/dev/null

# B: the control first on GPUs 2,3, then the D = 8192 shard's stage 1 on them, few candidates
L=$(cap 68 62)
hf_tp2 0,1 29512 32b 2 "$L" &
( t=$(date +%s)
  CUDA_VISIBLE_DEVICES=2,3 timeout -k 3 "$(cap 45 62)" python3 benchmarks/teardown_control.py \
      --release --exit-s 25 > "$O/control_release.log" 2>&1
  echo "control --release (bound 25 s, GPUs 2,3): rc=$? wall $(( $(date +%s)-t )) s" > "$O/control.sum"
  grep -E "^control|tp_ranks: rank" "$O/control_release.log" >> "$O/control.sum"
  L2=$(cap 60 64)
  if [ "$L2" -gt 20 ]; then
      stage1 2 8192x32064 64 "$L2" default,gluon64x128,triton64x64_d128,swapab64x64x128 &
      stage1 3 8192x32064 256 "$L2" default,swap_pingpong,t128x64_pps2,gluon64rows &
      wait
  fi ) &
wait
cat "$O"/hf_tp2_32b.sum "$O"/control.sum "$O"/stage1_8192x32064_b*.sum >> "$S" 2>/dev/null

# C
L=$(cap 62 3)
if [ "$L" -gt 30 ]; then
    t=$(date +%s)
    timeout -k 3 "$L" python3 -m pytest -q -s -rA -p no:cacheprovider -m multigpu \
        tests/test_tp_gpu.py -k "10000_skewed" > "$O/skewed_world4.log" 2>&1
    echo "C test_10000_skewed_steps world 4: rc=$? wall $(( $(date +%s)-t )) s" >> "$S"
    grep -E "tp_ranks:|PASSED|FAILED|passed|failed|Error" "$O/skewed_world4.log" | head -8 >> "$S"
else
    echo "C skewed world 4: no time left ($L s)" >> "$S"
fi
echo "total $(( $(date +%s)-T0 )) s" >> "$S"
cat "$S"
