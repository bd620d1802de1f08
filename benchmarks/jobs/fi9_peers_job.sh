#!/usr/bin/env bash
# One GPU-machine call (one H200, about 220 s) filling issue 38 item 2's peer cells that the
# 2026-11-28 12:14 call (benchmarks/jobs/flashinfer_peers_job.sh) left: FlashInfer 0.6.9 at D = 2048
# and 8192 (every B), 0.7.2.post1 at D = 8192 B = 2/4/16/48/96/160-256 and D = 2048
# B = 2/4/16/48/96. Same set-up and timing as that script (prebuilt FlashInfer modules, a warmed
# Triton cache topped up by compile_fused.py's dry runs, CUDA-graph medians, logit std 5,
# matmul and the fused providers in every process so each ratio is in-process).
#
#   bash benchmarks/jobs/fi9_peers_job.sh [--budget S]
#
# Needs (git-ignored, carried): .fi072/site.tar.xz, .fi072/site069.tar.xz (fetch_flashinfer.sh)
# and .fi072/triton_peers.tar.xz (optional). Writes to $OUT: peers.tar (one CSV and PNG per
# process, run.log, summary.txt), peers_summary.txt and triton_fi9.tar.xz (the Triton cache
# after the call, cubins only, for the next call).
set -u -o pipefail
cd "$(dirname "$0")/../.."
budget=205 batches=unused
source benchmarks/jobs/device_job_lib.sh
parse_budget_batches "$@"
results=${OUT:-$PWD/benchmarks/results}
out=/tmp/peers
rm -rf "$out" && mkdir -p "$out" "$results"
echo "started $(date -u +%H:%M:%S) UTC; budget $budget s; see run.log" > "$out/summary.txt"
exec > >(tee -a "$out/run.log") 2>&1
export PYTHONUNBUFFERED=1

if ! python3 -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
    say "no CUDA device: nothing to time"
    echo "no CUDA device: nothing timed" >> "$out/summary.txt"
    cp "$out/summary.txt" "$results/peers_summary.txt"
    exit 0
fi
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm,temperature.gpu --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
cat COMMIT 2>/dev/null || git log --oneline -1
say "$(nproc) CPUs"

rm -rf /tmp/site069 /tmp/site072 /tmp/fiws069 /tmp/fiws072 && mkdir -p /tmp/site069 /tmp/site072
tar -xJf .fi072/site.tar.xz -C /tmp/site072 || say "0.7.2 site did not unpack"
tar -xJf .fi072/site069.tar.xz -C /tmp/site069 || say "0.6.9 site did not unpack"
export TRITON_CACHE_DIR=/tmp/triton_peers FLASHINFER_CUDA_ARCH_LIST=9.0a
if [ -f .fi072/triton_peers.tar.xz ]; then
    tar -xJf .fi072/triton_peers.tar.xz -C / && say "Triton cache: $(find "$TRITON_CACHE_DIR" \
        -name '*.cubin' | wc -l) cubins"
fi

SHAPES=2048x151936,8192x128256
pids=()
for index in $(seq 0 11); do
    PYTHONPATH=$PWD timeout "$(cap 60 140)" python3 benchmarks/compile_fused.py --shapes "$SHAPES" \
        --index "$index" --count 12 --threads 2 > "/tmp/compile_fused_$index.log" 2>&1 &
    pids+=($!)
done
wait "${pids[@]}"
say "compiled ahead: $(tail -qn 1 /tmp/compile_fused_*.log | sort | uniq -c | head -n 3 |
    tr '\n' ' '); $(find "$TRITON_CACHE_DIR" -name '*.cubin' | wc -l) cubins"

FUSED=fused,fused_topk50,fused_topk50_topp09,fused_topp09,fused_minp01
P069=$FUSED,flashinfer_fi2,flashinfer_fi1,flashinfer_topk50,flashinfer_topk50_topp09
P069+=,flashinfer_topp09,flashinfer_minp01
P072=$P069,flashinfer_cake_topk50,flashinfer_cake_topk50_topp09
bench() { # name, version, seconds, shapes, batches, providers
    local name=$1 v=$2 seconds=$3 shapes=$4 batches=$5 providers=$6
    [ "$seconds" -lt 20 ] && { say "$name: no time left ($seconds s)"; return; }
    say "$name: FlashInfer $v, $shapes, B $batches (budget $seconds s)"
    FLASHINFER_WORKSPACE_BASE=/tmp/fiws$v PYTHONPATH=/tmp/site$v timeout "$seconds" \
        python3 benchmarks/bench_sampling.py --shapes "$shapes" --batches "$batches" \
        --timing graph --logit-std 5 --warmup-ms 10 --rep-ms 30 --providers "$providers" \
        --budget-s $((seconds - 12)) --out-dir "$out/$name" |
        grep -v "^  D=\|^  (" | tail -n 40
}
ALL_B=1,2,4,8,16,32,48,64,96,128,144,160,192,224,256
bench fi069_d8192 069 "$(cap 75 80)" 8192x128256 "$ALL_B" "$P069"
bench fi072_d8192 072 "$(cap 50 45)" 8192x128256 2,4,16,48,96,160,192,224,256 "$P072"
bench fi069_d2048 069 "$(cap 60 25)" 2048x151936 "$ALL_B" "$P069"
bench fi072_d2048 072 "$(cap 30 8)" 2048x151936 2,4,16,48,96 "$P072"
{
    echo "done $(date -u +%H:%M:%S) UTC after $(elapsed) s"
    ls "$out"/*/*.csv 2>/dev/null
    grep -h "^|\|^###" "$out/run.log"
} >> "$out/summary.txt"
say "done"
tar -C /tmp -cf "$results/peers.tar" peers && cp "$out/summary.txt" "$results/peers_summary.txt"
XZ_OPT=-T0 tar -C / -cJf "$results/triton_fi9.tar.xz" --exclude='*.ttir' --exclude='*.ttgir' \
    --exclude='*.llir' --exclude='*.ptx' --exclude='*.source' "${TRITON_CACHE_DIR#/}" &&
    ls -la "$results/triton_fi9.tar.xz"
