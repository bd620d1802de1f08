#!/usr/bin/env bash
# knobs8's device job (issue 35 item 2; one GPU, TOTAL_S seconds, default 145): where the
# time of off-valued knobs goes, and the A/B of the change under test, CUDA graphs. Round 1:
# no kernel change yet, the parts of the tail after stage 1 (benchmarks/probes/off_knobs_parts.py):
#   nofb  the fallback's two launches left out (their cost)
#   floor stage 1 as it is, then the plain stage 2 (what any tail after that stage 1 costs)
#   old   no merge for a per-row k tensor (dispatch.MERGE_PER_ROW_K=False)
#   nosplit  the Gluon kernel's stage 1 as one launch (B = 64)
# on off-valued knobs, plus the providers as they are now (plain / off / k50 / k50off /
# qwen3off / k50int, [B] off / mixed / all), and per-kernel times (eager profile).
# (Round 1 ran this at c7499ed. Round 2 ran the A/B of a merge in stage 2's program and of a
# persistent split stage 1, branch knobs8-merge-in-stage2 at 4324128, not landed: docs/performance.md.)
# Everything under $OUT/knobs8/, summary.txt first.
set -u
cd "$(dirname "$0")/../.."
budget=${TOTAL_S:-145}
source benchmarks/jobs/device_job_lib.sh
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
O=${OUT:-/tmp/out}/knobs8; mkdir -p "$O"
S=$O/summary.txt
{ echo "knobs8 job, $(cat COMMIT 2>/dev/null || git rev-parse HEAD 2>/dev/null)"; nvidia-smi -L; } > "$S" 2>&1
if ! python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "no CUDA GPU: nothing run" | tee -a "$S"; exit 0
fi
{ nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; } > "$O/env.txt" 2>&1
cat "$O/env.txt" >> "$S"

PARTS="nofb:truncation_kernel.launch_fallback=@no_fallback,floor:_finish_truncation=@plain_stage2,old:MERGE_PER_ROW_K=False,nosplit:_SPLIT_STAGE1=0"
ZD_KNOBS=plain,off,k50,k50off,qwen3off,k50int
bench() {  # bench LABEL LIMIT ARGS...: off_knobs_parts.py into $O/LABEL.log
    local label=$1 limit=$2 t
    shift 2
    if [ "$limit" -lt 5 ]; then echo "$label: no time left" >> "$S"; return; fi
    t=$(date +%s)
    timeout -k 5 "$limit" python3 benchmarks/probes/off_knobs_parts.py --out "$O" "$@" > "$O/$label.log" 2>&1
    echo "$label: rc=$? wall $(($(date +%s) - t)) s (limit $limit, at $(elapsed) s)" >> "$S"
}

# 1. compile everything at once (one process per kernel set)
W=$(cap 75 60)
for shape in d2048-v151936 d4096-v151936; do
    for b in 1 64; do
        bench "warm_${shape%%-*}_b$b" "$W" --warmup-only --shapes $shape --batches $b --zero-d \
            --knobs $ZD_KNOBS &
        bench "warm_parts_${shape%%-*}_b$b" "$W" --warmup-only --shapes $shape --batches $b \
            --zero-d --knobs plain,off --variants "$PARTS" &
    done
done
bench warm_perrow "$W" --warmup-only --shapes d2048-v151936 --batches 16,64 \
    --knobs plain,off,mixed,all &
wait
grep -h "drew other tokens" "$O"/warm_*.log >> "$S" || echo "token checks: no difference" >> "$S"
say "warm-up done" >> "$S"

# 2. timed (each in one process, interleaved)
bench parts_d2048 "$(cap 30 40)" --shapes d2048-v151936 --batches 1,16,64 --zero-d \
    --knobs plain,off --variants "$PARTS" --rounds 2 --rep 20 --label parts-d2048
bench now_d2048 "$(cap 25 30)" --shapes d2048-v151936 --batches 1,16,64 --zero-d \
    --knobs $ZD_KNOBS --rounds 2 --rep 20 --label now-d2048
bench parts_d4096 "$(cap 25 20)" --shapes d4096-v151936 --batches 1,16,64 --zero-d \
    --knobs plain,off --variants "$PARTS" --rounds 2 --rep 20 --label parts-d4096
bench now_perrow "$(cap 20 10)" --shapes d2048-v151936 --batches 16,64 \
    --knobs plain,off,mixed,all --rounds 2 --rep 20 --label now-perrow
# 3. each kernel's device time (eager, torch.profiler)
bench profile "$(cap 25 3)" --shapes d2048-v151936 --batches 1,16,64 --zero-d \
    --knobs plain,off,k50off --rounds 1 --rep 5 --profile --label profile
grep -h "B=" "$O/profile.log" | grep -v "{" >> "$S" 2>/dev/null
for f in "$O"/bench_off_knobs_*.csv; do echo "## $(basename "$f")"; cut -d, -f3- "$f"; done >> "$S" 2>/dev/null
grep -h "drew other tokens" "$O"/parts_*.log "$O"/now_*.log >> "$S"
echo "total $(elapsed) s" >> "$S"
cat "$S"
