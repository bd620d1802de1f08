#!/bin/bash
# GPU job (one Hopper GPU, run by the lead) for issue 38 items 1 and 2 at 129-192 rows, within
# BUDGET seconds (first argument, default 195), everything written to $OUT. ROUND=1 (the
# default 2 since round 1 ran):
#   1. large_batch_ab.py --what truncating: bench_sampling's four truncating calls (bf16-rounded
#      logits) at D = 8192 / 4096, B = 144 / 160 / 192 (the cells where FlashInfer 0.7.2 won):
#      the default (wide 64-row Gluon tiles) against the swapped kernel's top-m epilogue
#      (packed / whole keys; ping-pong, on 128-entry tiles, cooperative), top-k 50 also on the
#      narrow 64-row, the wide 128-row Gluon tiles and the Triton tiles;
#   2. large_batch_ab.py --what swapped: plain sampling and greedy in the swapped kernel at
#      144 / 160 / 192 rows: ping-pong, on 128-entry tiles, cooperative, the other staging;
#   3. large_batch_profile.py --what truncating at D = 8192, B = 144: some of 1.'s calls
#      kernel by kernel (stage 1 / merge / stage 2) with the rows sent to the fallback.
# ROUND=2:
#   1. swap_kernel_sass.py in the background (Triton 3.6's registers / spills of the swapped
#      kernel's schedules at 160 / 192 rows);
#   2. large_batch_ab.py --what wide: the default before and after dispatch.swap_wide_tiles
#      at D = 8192 / 4096 / 2048, B = 144 / 160 / 192, every mode where they differ;
#   3. the GPU tests of the swapped kernel's schedules (tokens of the Triton kernel);
#   4. large_batch_ab.py --what truncating at D = 2048 (the rule's unmeasured shape).
# ROUND=3: FlashInfer 0.7.2.post1 beside the fused op (bench_sampling.py, CUDA graphs, std 5) at
# D = 8192 B = 144 / 160 / 192 and D = 4096 B = 144 / 160, then the GPU tests of the swapped
# kernel's schedules at 129 / 150 rows.
# Environment overrides: PEERS_S, PEERS4096_S, TRUNC_S, TRUNC_SHAPES, TRUNC_BATCHES, PROFILE_S, PROFILE_SHAPE,
# PROFILE_BATCH, PROFILE_PROVIDERS, SWAPPED_S, SWAPPED_SHAPES, SWAPPED_BATCHES, WIDE_S,
# WIDE_SHAPES, WIDE_BATCHES, WIDE_ROUNDS, TESTS_S, TESTS_K.
budget=${1:-195}
source benchmarks/jobs/device_job_lib.sh
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/wide10_out}
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
if [ "${ROUND:-2}" = 1 ]; then
say "truncating A/B"
ab "${TRUNC_S:-95}" 85 --what truncating --rounds 2 --batches "${TRUNC_BATCHES:-144,160,192}" \
    --shapes "${TRUNC_SHAPES:-8192x128256,4096x151936}"
say "swapped A/B"
ab "${SWAPPED_S:-60}" 30 --what swapped --rounds 2 --batches "${SWAPPED_BATCHES:-144,160,192}" \
    --shapes "${SWAPPED_SHAPES:-2048x151936,4096x151936,8192x128256}"
say "profile"
seconds=$(cap "${PROFILE_S:-30}" 2)
if [ "$seconds" -ge 10 ]; then
    timeout -k 3 "$seconds" python3 benchmarks/probes/large_batch_profile.py --what truncating \
        --shape "${PROFILE_SHAPE:-8192x128256}" --batch "${PROFILE_BATCH:-144}" --calls 5 \
        --providers "${PROFILE_PROVIDERS:-matmul,k50_default,k50_swapwhole,k50_swapwide,p09_default,p09_swapwide}" \
        --out-dir "$OUT" > "$OUT/profile.log" 2>&1
    echo "profile rc=$?"; grep -v Warning "$OUT/profile.log" | head -60
fi
say "done"
exit 0
fi
if [ "${ROUND:-2}" = 3 ]; then
say "FlashInfer 0.7.2 beside the fused op"
# (.fi072/site.tar.xz: fi8's 0.7.2.post1 site without the JIT sources and the cake module,
# its sampling and top-k modules prebuilt; carried, git-ignored)
if tar -xJf .fi072/site.tar.xz -C "$(mkdir -p /tmp/site072 && echo /tmp/site072)" 2>/dev/null; then
    FI=flashinfer_fi2,flashinfer_topk50,flashinfer_topk50_topp09,flashinfer_topp09,flashinfer_minp01
    FUSED=fused_topk50,fused_topk50_topp09,fused_topp09,fused_minp01
    for shapes in "8192x128256 144,160,192 ${PEERS_S:-70} 90" "4096x151936 144,160 ${PEERS4096_S:-35} 60"; do
        set -- $shapes
        seconds=$(cap "$3" "$4")
        [ "$seconds" -lt 25 ] && { echo "skipped peers $1 (budget)"; continue; }
        FLASHINFER_WORKSPACE_BASE=/tmp/fiws072 FLASHINFER_CUDA_ARCH_LIST=9.0a \
            PYTHONPATH=/tmp/site072:$PWD timeout -k 3 "$seconds" python3 benchmarks/bench_sampling.py \
            --shapes "$1" --batches "$2" --timing graph --logit-std 5 --warmup-ms 10 --rep-ms 30 \
            --providers "$FUSED,$FI" --budget-s $((seconds - 12)) --out-dir "$OUT" 2>&1 |
            grep -v "Warning\|warn" | tail -n 30
    done
else
    echo "no FlashInfer site (.fi072/site.tar.xz): peers skipped"
fi
say "GPU tests"
seconds=$(cap "${TESTS_S:-80}" 3)
if [ "$seconds" -ge 15 ]; then
    timeout -k 3 "$seconds" python3 -m pytest -q -p no:xdist -p no:cacheprovider -rA \
        tests/test_gpu_op.py -k "${TESTS_K:-(swapped_kernel_draws and 129) or (serves_truncation_knobs and 150)}" \
        > "$OUT/gpu_tests.log" 2>&1
    echo "GPU tests rc=$? (124: cut by the budget)"
    grep -E "passed|failed|PASSED|FAILED|Error" "$OUT/gpu_tests.log" | tail -15
fi
say "done"
exit 0
fi
say "swapped kernel's SASS (background)"
(timeout -k 3 "$(cap 150 10)" nice -n 19 python3 benchmarks/probes/swap_kernel_sass.py \
    --batches 160,192 --schedules ping-pong,ping-pong-wide --forms plain,p09bf16 \
    > "$OUT/swap_sass.txt" 2>&1) &
sass=$!
say "wide A/B"
ab "${WIDE_S:-85}" 95 --what wide --rounds "${WIDE_ROUNDS:-3}" \
    --batches "${WIDE_BATCHES:-144,160,192}" \
    --shapes "${WIDE_SHAPES:-8192x128256,4096x151936,2048x151936}"
say "GPU tests"
seconds=$(cap "${TESTS_S:-55}" 40)
if [ "$seconds" -ge 15 ]; then
    timeout -k 3 "$seconds" python3 -m pytest -q -p no:xdist -p no:cacheprovider -rA \
        tests/test_gpu_op.py -k "${TESTS_K:-(swapped_kernel_draws and (150 or 200)) or (serves_truncation_knobs and 150)}" \
        > "$OUT/gpu_tests.log" 2>&1
    echo "GPU tests rc=$? (124: cut by the budget)"
    grep -E "passed|failed|PASSED|FAILED|Error" "$OUT/gpu_tests.log" | tail -15
fi
say "truncating A/B at D = 2048"
ab "${TRUNC_S:-40}" 3 --what truncating --rounds 2 --batches "${TRUNC_BATCHES:-144,160,192}" \
    --shapes "${TRUNC_SHAPES:-2048x151936}"
wait "$sass"; echo "SASS:"; grep -E "^(B=|triton)" "$OUT/swap_sass.txt"
say "done"
