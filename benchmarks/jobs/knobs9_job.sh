#!/usr/bin/env bash
# knobs9's device job (issue 35 item 2: what off-valued per-row knobs cost over plain
# sampling), as it runs on main: one GPU, BUDGET seconds (first argument, default 215). A/B
# in one process against the default, CUDA graphs, tokens checked equal
# (benchmarks/probes/off_knobs_parts.py, bench_off_knobs.py's variants):
#   notrig  truncation_kernel.TAIL_TRIGGER_FIRST = False (the tail after stage 1 scheduled
#           kernel by kernel, as before knobs9)
#   (nocap, the Triton tiles carrying both epilogues uncapped: knobs10 timed it and made it
#   the default, so the cap and this variant are gone)
#   nofb / floor  the fallback's two launches left out / stage 1 then the plain stage 2
#           (the parts, for timing only: floor's truncated tokens differ by design)
# 0-d knobs (generate's) plain / off / k50off / qwen3off at B = 1, 16, 64, D = 2048 / 4096;
# [B] knobs (continuous batching) off / mixed / all at B = 16, 64; registers and spills of
# the kernels (benchmarks/jobs/knobs9_regs.py). Everything under $OUT/knobs9/, summary.txt
# first. (Rounds 1 and 2 ran this job's earlier form with the levers of branch knobs9-levers,
# at 8f6881a and 316b2c4: docs/performance.md, "The tail after stage 1 ... (knobs9)".)
set -u
cd "$(dirname "$0")/../.."
budget=${1:-215}
for lib in benchmarks/device_job_lib.sh benchmarks/jobs/device_job_lib.sh; do
    [ -f "$lib" ] && source "$lib" && break
done
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
O=${OUT:-/tmp/out}/knobs9; mkdir -p "$O"
S=$O/summary.txt
{ echo "knobs9 job, $(cat COMMIT 2>/dev/null || git rev-parse HEAD 2>/dev/null)"; nvidia-smi -L; } > "$S" 2>&1
if ! python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "no CUDA GPU: nothing run" | tee -a "$S"; exit 0
fi
{ nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; } > "$O/env.txt" 2>&1
cat "$O/env.txt" >> "$S"

LEVERS="notrig:truncation_kernel.TAIL_TRIGGER_FIRST=False"
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

# 1. compile everything at once (a process per shape and batch, Triton's cache shared)
W=$(cap 90 105)
timeout -k 2 "$W" python3 benchmarks/jobs/knobs9_regs.py > "$O/regs.log" 2>&1 &
for shape in d2048-v151936 d4096-v151936; do
    for b in 1 16 64; do
        bench "warm_${shape%%-*}_b$b" "$W" --warmup-only --shapes $shape --batches $b --zero-d \
            --knobs $ZD_KNOBS --variants "$LEVERS,$PARTS" &
    done
done
for b in 16 64; do
    bench "warm_perrow_b$b" "$W" --warmup-only --shapes d2048-v151936 --batches $b \
        --knobs plain,off,mixed,all --variants "$LEVERS" &
done
wait
say "warm-up done" >> "$S"

# 2. timed, each shape in one process (configurations interleaved over rounds)
bench ab_d2048 "$(cap 40 55)" --shapes d2048-v151936 --batches 1,16,64 --zero-d \
    --knobs $ZD_KNOBS --variants "$LEVERS,$PARTS" --rounds 2 --rep 20 --label ab-d2048
bench ab_perrow "$(cap 25 30)" --shapes d2048-v151936 --batches 16,64 \
    --knobs plain,off,mixed,all --variants "$LEVERS" --rounds 2 --rep 20 --label ab-perrow
bench ab_d4096 "$(cap 30 2)" --shapes d4096-v151936 --batches 1,16,64 --zero-d \
    --knobs $ZD_KNOBS --variants "$LEVERS,$PARTS" --rounds 2 --rep 20 --label ab-d4096
M=$(grep -h "drew other tokens" "$O"/*.log | grep -v "@floor" | sort -u)
if [ -n "$M" ]; then echo "$M" >> "$S"; else echo "token checks: no difference (but @floor's truncated rows, by design)" >> "$S"; fi
for f in "$O"/bench_off_knobs_*.csv; do echo "## $(basename "$f")"; cut -d, -f3- "$f"; done >> "$S" 2>/dev/null
grep -E "^_" "$O/regs.log" | sort -u >> "$S" 2>/dev/null
echo "total $(elapsed) s" >> "$S"
cat "$S"
