#!/usr/bin/env bash
# One GPU-machine call (one H200, about 220 s): transformers' warpers compiled by stock Inductor
# as issue 38 item 2's other peer, beside the fused providers and cuBLAS, in-process:
# hf_topk50, hf_topk50_topp09, hf_topp09, hf_minp01 (the installed transformers' warper classes
# on the fp32 logits, softmax, multinomial; torch.compile mode="reduce-overhead") and
# inductor_multinomial_cg (plain sampling: transformers adds no warper at T = 1).
#
#   bash benchmarks/jobs/fi9_hf_job.sh [--budget S]
#
# Inductor's cold compiles (two per shape and provider: B = 1 and the dynamic B >= 2) would
# take most of the call one after another, so throw-away processes (one per shape and compiled
# provider, the first two B of the timed list, 1 ms timings) fill one Inductor cache at once,
# beside compile_fused.py's dry runs of the fused kernels (all shapes and batches: how long the full
# sweep's compiles take with the kernels of the moment, timed). Then one timed process per
# shape reads both caches: eight B at D = 2048 and 8192, then every B at D = 4096.
# Needs .fi072/triton_peers.tar.xz (optional, a Triton cache). Writes to $OUT: hf.tar
# (CSVs, PNGs, each process's log, run.log, summary.txt), hf_summary.txt, triton_fi9.tar.xz.
set -u -o pipefail
cd "$(dirname "$0")/../.."
budget=205 batches=unused
source benchmarks/jobs/device_job_lib.sh
parse_budget_batches "$@"
results=${OUT:-$PWD/benchmarks/results}
out=/tmp/hf
rm -rf "$out" /tmp/hf_warm && mkdir -p "$out" "$results" /tmp/hf_warm
echo "started $(date -u +%H:%M:%S) UTC; budget $budget s; see run.log" > "$out/summary.txt"
exec > >(tee -a "$out/run.log") 2>&1
export PYTHONUNBUFFERED=1

if ! python3 -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
    say "no CUDA device: nothing to time"
    echo "no CUDA device: nothing timed" >> "$out/summary.txt"
    cp "$out/summary.txt" "$results/hf_summary.txt"
    exit 0
fi
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm,temperature.gpu --format=csv
python3 -c "import torch, triton, transformers as t; print('torch', torch.__version__, 'triton',
    triton.__version__, 'transformers', t.__version__)"
cat COMMIT 2>/dev/null || git log --oneline -1
say "$(nproc) CPUs"
export TRITON_CACHE_DIR=/tmp/triton_peers TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_fi9
export TORCHINDUCTOR_COMPILE_THREADS=2 # the same in the warm-up and the timed processes
if [ -f .fi072/triton_peers.tar.xz ]; then
    tar -xJf .fi072/triton_peers.tar.xz -C / && say "Triton cache: $(find "$TRITON_CACHE_DIR" \
        -name '*.cubin' | wc -l) cubins"
fi

SHAPES=(2048x151936 4096x151936 8192x128256)
declare -A BATCHES_OF=([4096x151936]=1,2,4,8,16,32,48,64,96,128,144,160,192,224,256
    [2048x151936]=1,8,32,64,128,144,192,256 [8192x128256]=1,8,32,64,128,144,192,256)
COMPILED=(inductor_multinomial_cg hf_topk50 hf_topk50_topp09 hf_topp09 hf_minp01)
FUSED=fused,fused_topk50,fused_topk50_topp09,fused_topp09,fused_minp01
pids=()
for index in $(seq 0 7); do
    PYTHONPATH=$PWD timeout "$(cap 100 85)" python3 benchmarks/compile_fused.py \
        --index "$index" --count 8 --threads 2 > "/tmp/compile_fused_$index.log" 2>&1 &
    pids+=($!)
done
say "compile_fused: 8 processes, every shape and B"
for shape in "${SHAPES[@]}"; do
    for provider in "${COMPILED[@]}"; do
        PYTHONPATH=$PWD timeout "$(cap 100 85)" python3 \
            benchmarks/bench_sampling.py --shapes "$shape" --timing graph \
            --batches "$(echo "${BATCHES_OF[$shape]}" | cut -d, -f1-2)" \
            --providers "$provider" --warmup-ms 1 --rep-ms 1 --logit-std 5 \
            --out-dir "/tmp/hf_warm/${shape}_$provider" > "/tmp/hf_warm/${shape}_$provider.log" 2>&1 &
        pids+=($!)
    done
done
say "Inductor warm-up: ${#SHAPES[@]} x ${#COMPILED[@]} processes"
wait "${pids[0]}" "${pids[1]}" "${pids[2]}" "${pids[3]}" "${pids[4]}" "${pids[5]}" "${pids[6]}" \
    "${pids[7]}"
say "compile_fused done (all shapes, all B, 5 providers): $(tail -qn 1 /tmp/compile_fused_*.log |
    sort | uniq -c | head -n 3 | tr '\n' ' '); $(find "$TRITON_CACHE_DIR" -name '*.cubin' | wc -l) cubins"
wait "${pids[@]}"
say "Inductor warm-up done; rows with errors: $(grep -h "hf_\|inductor_" /tmp/hf_warm/*.log |
    grep -c "Error\|error")"
grep -h "sweep:" /tmp/hf_warm/*.log | sort | uniq -c | tr '\n' ' '

providers=$FUSED,$(IFS=,; echo "${COMPILED[*]}")
bench() { # name, seconds, shape, batches
    local name=$1 seconds=$2 shape=$3 batches=$4
    [ "$seconds" -lt 20 ] && { say "$name: no time left ($seconds s)"; return; }
    say "$name: $shape, B $batches (budget $seconds s)"
    PYTHONPATH=$PWD timeout "$seconds" python3 benchmarks/bench_sampling.py --shapes "$shape" \
        --batches "$batches" --timing graph --logit-std 5 --warmup-ms 10 --rep-ms 30 \
        --providers "$providers" --budget-s $((seconds - 12)) --out-dir "$out/$name" 2>&1 |
        tee "$out/$name.log" | grep -v "^  D=\|^  (" | tail -n 25
}
bench hf_d2048 "$(cap 35 50)" 2048x151936 "${BATCHES_OF[2048x151936]}"
bench hf_d8192 "$(cap 35 15)" 8192x128256 "${BATCHES_OF[8192x128256]}"
bench hf_d4096 "$(cap 50 0)" 4096x151936 "${BATCHES_OF[4096x151936]}"
{
    echo "done $(date -u +%H:%M:%S) UTC after $(elapsed) s"
    ls "$out"/*/*.csv 2>/dev/null
    grep -h "^|\|^###\|^==" "$out/run.log"
} >> "$out/summary.txt"
say "done"
cp /tmp/compile_fused_*.log /tmp/hf_warm/*.log "$out/" 2>/dev/null
tar -C /tmp -cf "$results/hf.tar" hf && cp "$out/summary.txt" "$results/hf_summary.txt"
XZ_OPT=-T0 tar -C / -cJf "$results/triton_fi9.tar.xz" --exclude='*.ttir' --exclude='*.ttgir' \
    --exclude='*.llir' --exclude='*.ptx' --exclude='*.source' "${TRITON_CACHE_DIR#/}" &&
    ls -la "$results/triton_fi9.tar.xz"
