#!/usr/bin/env bash
# The stage-2 experiment of 2026-11-29 (issues 38 / 35; ran 02:46 UTC at 19fe09d: slower, and
# the switch was removed after; docs/performance.md, "Stage 2's searches: not the instruction
# caches"). It asked: does
# letting the fallback's programs be scheduled at stage 2's end (truncation_kernel.
# STAGE2_TRIGGER_LAST, PDL 3) speed stage 2's searches, whose block-wide steps took 2-3x
# their cost alone in a hot loop (docs/performance.md, "Stage 2 per phase")? One GPU,
# BUDGET seconds (first argument, default 300):
#   1. stage 2 per phase, default and STAGE2_TRIGGER_LAST (stage2_phases.py --patch),
#      top-k 50 / top-k 50 + top-p 0.9 / top-p 0.9 / min-p, B = 16;
#   2. whole calls, one process, tokens checked equal (module_ab.py: "@old" is the switch
#      on), D = 2048, B = 1 / 16 / 64.
# Everything under $OUT/stage2_next/, summary.txt first.
set -u
cd "$(dirname "$0")/../.."
budget=${1:-300}
source benchmarks/jobs/device_job_lib.sh
job_start stage2_next

LAST="STAGE2_TRIGGER_LAST = False=>STAGE2_TRIGGER_LAST = True"
FORMS=k50,k50p09,p09,minp
timed_step phases "$O/phases.txt" 20 "$(cap 60 170)" python3 benchmarks/probes/stage2_phases.py \
    --batches 16 --forms $FORMS --calls 10
timed_step phases_last "$O/phases_last.txt" 20 "$(cap 60 110)" python3 \
    benchmarks/probes/stage2_phases.py --batches 16 --forms $FORMS --calls 10 --patch "$LAST"
timed_step ab_last "$O/ab_last.txt" 30 "$(cap 200 2)" python3 benchmarks/probes/module_ab.py \
    --old-patch "$LAST" --batches 1,16,64 --forms $FORMS,off --rounds 3
for f in phases phases_last ab_last; do
    echo "## $f"; grep -v -i warn "$O/$f.txt" | grep -E "^[a-zA-Z0-9 =]" | tail -12
done >> "$S"
