#!/bin/bash
# GPU job (one Hopper GPU, run by the lead) for issue 38 item 1 at 129-256 rows, within BUDGET
# seconds (first argument, default 200), everything written to $OUT:
#   1. large_batch_ab.py --what rounding: top-k 50 on bf16-rounded and fp32 logits, the old
#      stage-1 choice against the wide Gluon tiles (and their top-m search on whole keys);
#   2. large_batch_profile.py: the same calls kernel by kernel, with the rows sent to the
#      fallback (where the rounded logits' extra time goes);
#   3. large_batch_ab.py --what noise: plain sampling and greedy with this tree's kernels
#      against the baseline's (BASELINE, default _baseline/flashsampling_baseline: a copy of
#      main's package put beside the job), default choice and wide Gluon tiles.
budget=${1:-200}
for lib in benchmarks/jobs/device_job_lib.sh benchmarks/device_job_lib.sh; do
    [ -f "$lib" ] && source "$lib" && break
done
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/big9_out}
mkdir -p "$OUT"
if ! python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "no CUDA device: nothing run"; exit 0
fi
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
cat COMMIT 2>/dev/null
ab() {  # seconds, reserve, then large_batch_ab.py's arguments
    local seconds; seconds=$(cap "$1" "$2"); shift 2
    [ "$seconds" -lt 20 ] && { echo "skipped $* (budget)"; return; }
    timeout -k 3 "$seconds" python3 benchmarks/probes/large_batch_ab.py --budget $((seconds - 2)) \
        --out-dir "$OUT" "$@" 2>&1 | grep -v Warning
}
say "rounding A/B"
ab "${ROUNDING_S:-75}" 120 --what rounding --rounds 3 --batches "${ROUNDING_BATCHES:-144,160}" \
    --shapes "${ROUNDING_SHAPES:-4096x151936}"
say "profile"
timeout -k 3 "$(cap "${PROFILE_S:-25}" 100)" python3 benchmarks/probes/large_batch_profile.py --what rounding \
    --shape 4096x151936 --batch 144 --out-dir "$OUT" > "$OUT/profile.txt" 2>&1
echo "profile rc=$?"; grep -v Warning "$OUT/profile.txt" | grep -v "^ *$" | head -60
BASELINE=${BASELINE:-_baseline/flashsampling_baseline}
if [ -d "$BASELINE" ]; then
    say "noise: this tree against $BASELINE"
    ab "${NOISE_S:-120}" 3 --what noise --baseline "$BASELINE" --rounds 2 \
        --batches "${NOISE_BATCHES:-144,256}" --shapes "${NOISE_SHAPES:-2048x151936,4096x151936}"
fi
say "done"
