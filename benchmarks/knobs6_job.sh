#!/usr/bin/env bash
# knobs6's device job (issue 35 item 2; one GPU, <= 270 s): a per-row k tensor's rows take
# stage 2's merged candidates on the device (dispatch.MERGE_PER_ROW_K), A/B against the old
# path (every such row on the per-tile candidates: MERGE_PER_ROW_K=False) in one process,
# interleaved, CUDA graphs. Everything under $OUT/knobs6/, summary.txt first.
#   1. (parallel) the kernels compiled by --warmup-only runs, one per shape / batch / knob
#      form, whose token checks compare every variant with the default (same seed: old and
#      new must draw the same tokens), and the GPU exactness tests of per-row knobs and of
#      greedy rows whose maximum a merged group hides
#   2. D = 2048, 0-d knobs as generate passes them, B = 1 / 16 / 64: plain, off, k50 (top_k
#      alone as a tensor), k50off (generate's default top-k 50 with the off knobs), qwen3off;
#      k50int (top_k=50 as a Python int); each also @old, and at B <= 16 @m4 / @m5 (4 / 5
#      candidates per 64-wide tile instead of 6) and @keep16 (16 merged candidates a group,
#      k <= 64 merged: 1024 lanes, as a Python k <= 64); k50 not at B <= 16 (time)
#   3. the same at D = 4096
#   4. D = 2048, [B] knobs as continuous batching passes them (off, mixed, all), B = 16 / 64,
#      then (time permitting) B = 256
#   5. (time permitting) each kernel's time at D = 2048, B = 1 (eager profile)
set -u
cd "$(dirname "$0")/.."
budget=${TOTAL_S:-262}
source benchmarks/device_job_lib.sh
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
O=${OUT:-/tmp/out}/knobs6; mkdir -p "$O"
S=$O/summary.txt
{ echo "knobs6 job, $(cat COMMIT 2>/dev/null || git rev-parse HEAD 2>/dev/null)"; nvidia-smi -L; } > "$S" 2>&1
if ! python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "no CUDA GPU: nothing run" | tee -a "$S"; exit 0
fi
{ nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; } > "$O/env.txt" 2>&1
cat "$O/env.txt" >> "$S"

OLD="old:MERGE_PER_ROW_K=False"
NARROW="m4:_TENSOR_K_CANDIDATES_NARROW=4,m5:_TENSOR_K_CANDIDATES_NARROW=5"
KEEP16="keep16:MERGE_KEEP=16;MERGE_ROUTE_K_MAX=64"
ZD_KNOBS=plain,off,k50,k50off,qwen3off,k50int
ZD_FEW=plain,off,k50off,qwen3off,k50int  # (the run with four variants)
bench() {  # bench LABEL LIMIT ARGS...: bench_off_knobs.py into $O/LABEL.log
    local label=$1 limit=$2 t
    shift 2
    t=$(date +%s)
    timeout -k 5 "$limit" python3 benchmarks/bench_off_knobs.py --out "$O" "$@" > "$O/$label.log" 2>&1
    echo "$label: rc=$? wall $(($(date +%s) - t)) s (limit $limit, at $(elapsed) s)" >> "$S"
}

# 1. compile everything at once (16 cores), and the GPU tests beside it
W=$(cap 105 150)
# (B = 1 and 16 take the same kernels; so may D = 2048 and 4096: one process per variant)
bench warm_d2048_b1 "$W" --warmup-only --shapes d2048-v151936 --batches 1 --zero-d \
    --knobs $ZD_KNOBS &
for variant in "$OLD" ${NARROW//,/ } "$KEEP16"; do
    bench "warm_d2048_b1_${variant%%:*}" "$W" --warmup-only --shapes d2048-v151936 --batches 1 \
        --zero-d --knobs plain,off,k50off --variants "$variant" &
done
bench warm_d4096_b1 "$W" --warmup-only --shapes d4096-v151936 --batches 1,16 --zero-d \
    --knobs $ZD_KNOBS --variants "$OLD" &
for shape in d2048-v151936 d4096-v151936; do
    bench "warm_${shape%%-*}_b64" "$W" --warmup-only --shapes $shape --batches 64 --zero-d \
        --knobs $ZD_KNOBS --variants "$OLD" &
done
for b in 16 64 256; do
    bench "warm_perrow_b$b" "$W" --warmup-only --shapes d2048-v151936 --batches $b \
        --knobs plain,off,mixed,all --variants "$OLD" &
done
t=$(date +%s)
timeout -k 5 "$W" python3 -m pytest -q -p no:xdist -m gpu -x tests/test_gpu_truncation.py \
    -k "greedy_rows_whose_maximum or off_valued_knobs_draw_the_plain_tokens and 16 or split_stage1_follows and 16 or matches_reference_pathwise and bf16-logits-37-4096" \
    > "$O/gpu_tests.log" 2>&1
echo "gpu tests: rc=$? wall $(($(date +%s) - t)) s" >> "$S"
wait
tail -3 "$O/gpu_tests.log" >> "$S"
grep -h "drew other tokens" "$O"/warm_*.log >> "$S" || echo "token checks: no difference (every variant = default, off = plain, k50off = k50)" >> "$S"
say "warm-up done" >> "$S"

# 2-4. timed, A/B in one process each
bench ab_d2048_0d "$(cap 70 90)" --shapes d2048-v151936 --batches 1,16 --zero-d \
    --knobs $ZD_FEW --variants "$OLD,$NARROW,$KEEP16" --rounds 2 --rep 20 --label ab-d2048-0d
bench ab_d2048_0d_b64 "$(cap 30 65)" --shapes d2048-v151936 --batches 64 --zero-d \
    --knobs $ZD_KNOBS --variants "$OLD" --rounds 2 --rep 20 --label ab-d2048-0d-b64
bench ab_d4096_0d "$(cap 60 25)" --shapes d4096-v151936 --batches 1,16,64 --zero-d \
    --knobs $ZD_KNOBS --variants "$OLD" --rounds 2 --rep 20 --label ab-d4096-0d
bench ab_d2048_perrow "$(cap 40 2)" --shapes d2048-v151936 --batches 16,64 \
    --knobs plain,off,mixed,all --variants "$OLD" --rounds 2 --rep 20 --label ab-d2048-perrow
L=$(cap 25 3)
[ "$L" -ge 12 ] && bench ab_d2048_perrow_b256 "$L" --shapes d2048-v151936 --batches 256 \
    --knobs plain,off,mixed --variants "$OLD" --rounds 1 --rep 20 --label ab-d2048-perrow-b256
# 5. where the time goes at B = 1 (eager, torch.profiler), if time is left
L=$(cap 30 3)
[ "$L" -ge 15 ] && bench profile_d2048_b1 "$L" --shapes d2048-v151936 --batches 1 --zero-d \
    --knobs plain,off,k50off,k50int --variants "$OLD" --rounds 1 --rep 5 --profile --label profile
grep -h "B=1 " "$O/profile_d2048_b1.log" >> "$S" 2>/dev/null
for f in "$O"/bench_off_knobs_*.csv; do echo "## $(basename "$f")"; cut -d, -f3- "$f"; done >> "$S" 2>/dev/null
grep -h "drew other tokens" "$O"/ab_*.log >> "$S"
echo "total $(elapsed) s" >> "$S"
cat "$S"
