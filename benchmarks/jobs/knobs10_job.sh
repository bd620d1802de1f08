#!/usr/bin/env bash
# knobs10's device job (issue 35 item 2: what off-valued per-row knobs cost over plain
# sampling), round 3, as it runs on main: one GPU, BUDGET seconds (first argument, default
# 175). CUDA graphs, configurations interleaved in one process, tokens checked equal
# (benchmarks/probes/off_knobs_parts.py, bench_off_knobs.py's variants):
#   gsplit  dispatch.GLUON_SPLIT_PDL = True (the Gluon kernel's split stage 1, B = 64 here,
#           with its halves as programmatic dependents), 3 rounds: 0-d knobs plain / off /
#           k50off / qwen3off at D = 2048 and 4096, [B] knobs off / mixed / all at D = 2048
#   parts   on the default: nofb (the fallback left out) and floor (stage 1, then the plain
#           stage 2; its truncated tokens differ by design), 0-d knobs, D = 2048, B = 1 / 16 /
#           64
# Beside the warm-up, tests/test_gpu_truncation.py's split test with GLUON_SPLIT_PDL (B = 64,
# 100) and the default's off-valued knobs (the uncapped small-batch tiles at B = 1, 16).
# Everything under $OUT/knobs10/, summary.txt first. Rounds 1 and 2 ran this job's earlier
# forms (branch knobs10-levers at 9afd0d2, d5f89f5: docs/performance.md, "(knobs10)").
set -u
cd "$(dirname "$0")/../.."
budget=${1:-175}
source benchmarks/jobs/device_job_lib.sh
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
O=${OUT:-/tmp/out}/knobs10; mkdir -p "$O"
S=$O/summary.txt
{ echo "knobs10 job, $(cat COMMIT 2>/dev/null || git rev-parse HEAD 2>/dev/null)"; nvidia-smi -L; } > "$S" 2>&1
if ! python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "no CUDA GPU: nothing run" | tee -a "$S"; exit 0
fi
{ nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; } > "$O/env.txt" 2>&1
cat "$O/env.txt" >> "$S"

GSPLIT="gsplit:GLUON_SPLIT_PDL=True"
PARTS="nofb:truncation_kernel.launch_fallback=@no_fallback,floor:_finish_truncation=@plain_stage2"
ZD_KNOBS=plain,off,k50off,qwen3off
bench() {  # bench LABEL LIMIT ARGS...: off_knobs_parts.py into $O/LABEL.log
    local label=$1 limit=$2 t
    shift 2
    if [ "$limit" -lt 5 ]; then echo "$label: no time left" >> "$S"; return; fi
    t=$(date +%s)
    timeout -k 5 "$limit" python3 benchmarks/probes/off_knobs_parts.py --out "$O" "$@" > "$O/$label.log" 2>&1
    echo "$label: rc=$? wall $(($(date +%s) - t)) s (limit $limit, at $(elapsed) s)" >> "$S"
}

# 1. compile everything at once (a process per shape and batch, Triton's cache shared), the
#    GPU tests beside it
W=$(cap 80 95)
timed_step gpu_test "$O/gpu_test.log" 10 "$W" python3 -m pytest -q -p no:cacheprovider \
    tests/test_gpu_truncation.py -k "gluonpdl or (off_valued_knobs and not 100 and not 256)" &
for b in 1 16 64; do
    bench "warm_d2048_b$b" "$W" --warmup-only --shapes d2048-v151936 --batches $b --zero-d \
        --knobs $ZD_KNOBS --variants "$GSPLIT,$PARTS" &
done
bench warm_d4096_b64 "$W" --warmup-only --shapes d4096-v151936 --batches 64 --zero-d \
    --knobs $ZD_KNOBS --variants "$GSPLIT" &
bench warm_perrow_b64 "$W" --warmup-only --shapes d2048-v151936 --batches 64 \
    --knobs plain,off,mixed,all --variants "$GSPLIT" &
wait
say "warm-up done" >> "$S"
grep -E "passed|failed|^FAILED|^ERROR" "$O/gpu_test.log" >> "$S"
head -c 300 "$O/gpu_test.log" | head -1 >> "$S"

# 2. timed
bench ab_gsplit "$(cap 40 55)" --shapes d2048-v151936,d4096-v151936 --batches 64 --zero-d \
    --knobs $ZD_KNOBS --variants "$GSPLIT" --rounds 3 --rep 20 --label gsplit
bench ab_gsplit_perrow "$(cap 25 30)" --shapes d2048-v151936 --batches 64 \
    --knobs plain,off,mixed,all --variants "$GSPLIT" --rounds 3 --rep 20 --label gsplit-perrow
bench ab_parts "$(cap 35 2)" --shapes d2048-v151936 --batches 1,16,64 --zero-d \
    --knobs $ZD_KNOBS --variants "$PARTS" --rounds 2 --rep 20 --label parts
M=$(grep -h "drew other tokens" "$O"/*.log | grep -v "@floor" | sort -u)
if [ -n "$M" ]; then echo "$M" >> "$S"; else echo "token checks: no difference (but @floor's truncated rows, by design)" >> "$S"; fi
for f in "$O"/bench_off_knobs_*.csv; do echo "## $(basename "$f")"; cut -d, -f3- "$f"; done >> "$S" 2>/dev/null
echo "total $(elapsed) s" >> "$S"
cat "$S"
