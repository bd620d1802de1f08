#!/usr/bin/env bash
# One GPU-machine call (one Hopper GPU, about 200 s, the GPU to itself) timing FlashInfer
# 0.7.2.post1 and 0.6.9 beside the fused op on cuBLAS logits, issue 38 item 2's cells: plain
# (FI2 sampling_from_logits, FI1 top_k_top_p_sampling_from_logits(V, 1.0)), top-k 50 and top-k
# 50 + top-p 0.9 (top_k_top_p_sampling_from_logits: 0.7.2's default top-k-first path and, at
# D = 4096, the "joint" order; 0.7.2's cake_top_k_top_p_sampling_from_probs on the fp32
# softmax, counted), top-p 0.9 and min-p 0.1 (softmax + *_sampling_from_probs). No build runs
# here: FlashInfer's modules come prebuilt and the fused kernels from a warmed Triton cache
# (benchmarks/jobs/peers_prebuild_job.sh); a kernel the cache lacks (the source changed since) is
# compiled first by compile_fused.py's dry runs, before anything is timed.
#
#   bash benchmarks/jobs/flashinfer_peers_job.sh [--budget S] [--batches LIST]
#
# Each version times in processes of its own (its own PYTHONPATH and JIT workspace), matmul and
# the fused providers in each, so every ratio is taken in-process. Order, so that a short call
# loses the least: 0.7.2 at D = 4096, 0.6.9 at D = 4096, 0.7.2 at D = 2048 and 8192, 0.6.9 at
# D = 2048 and 8192 (these two at ten B: rest_batches); a provider whose CUDA-graph capture failed at D = 4096 is timed again in
# events mode with the time left. Needs (git-ignored, carried), from fetch_flashinfer.sh:
# .fi072/site.tar.xz (0.7.2, its three modules prebuilt), .fi072/site069.tar.xz (0.6.9, its
# sampling module prebuilt) and .fi072/triton_peers.tar.xz (optional). Writes $OUT/peers.tar
# (summary.txt, run.log, one CSV and PNG per process: one file, as a call brings back few and
# none deeper than two folders) and $OUT/peers_summary.txt.
set -u -o pipefail
cd "$(dirname "$0")/../.."
budget=195 batches=1,2,4,8,16,32,48,64,96,128,144,160,192,224,256
rest_batches=1,8,32,64,128,144,160,192,224,256 # D = 2048 and 8192: ten B, the cliff's all
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

rm -rf /tmp/site069 /tmp/site072 /tmp/fiws069 /tmp/fiws072 && mkdir -p /tmp/site069 /tmp/site072
tar -xJf .fi072/site.tar.xz -C /tmp/site072 || say "0.7.2 site did not unpack"
tar -xJf .fi072/site069.tar.xz -C /tmp/site069 || say "0.6.9 site did not unpack"
say "prebuilt: $(cd /tmp && ls -d site0*/flashinfer/data/aot/* 2>/dev/null | tr '\n' ' ')"
export TRITON_CACHE_DIR=/tmp/triton_peers FLASHINFER_CUDA_ARCH_LIST=9.0a
if [ -f .fi072/triton_peers.tar.xz ]; then
    tar -xJf .fi072/triton_peers.tar.xz -C / && say "Triton cache: $(find "$TRITON_CACHE_DIR" \
        -name '*.cubin' | wc -l) cubins"
fi

# Whatever the cache lacks, compiled before anything is timed (dry runs: no GPU work), in
# parallel; with a full cache this is the host code alone.
pids=()
for index in $(seq 0 11); do
    PYTHONPATH=$PWD timeout "$(cap 60 140)" python3 benchmarks/compile_fused.py \
        --index "$index" --count 12 --threads 2 > "/tmp/compile_fused_$index.log" 2>&1 &
    pids+=($!)
done
wait "${pids[@]}"
say "compiled ahead: $(tail -qn 1 /tmp/compile_fused_*.log | sort | uniq -c | head -n 3 |
    tr '\n' ' '); $(find "$TRITON_CACHE_DIR" -name '*.cubin' | wc -l) cubins"

FUSED=fused,fused_topk50,fused_topk50_topp09,fused_topp09,fused_minp01
FI_PLAIN=flashinfer_fi2,flashinfer_fi1,flashinfer_topk50,flashinfer_topk50_topp09
FI_PROBS=flashinfer_topp09,flashinfer_minp01
P069=$FUSED,$FI_PLAIN,$FI_PROBS
P072=$P069,flashinfer_cake_topk50,flashinfer_cake_topk50_topp09
JOINT=flashinfer_topk50_joint,flashinfer_topk50_topp09_joint
bench() { # name, version, seconds, shapes, providers, [bench arguments]
    local name=$1 v=$2 seconds=$3 shapes=$4 providers=$5
    shift 5
    [ "$seconds" -lt 20 ] && { say "$name: no time left ($seconds s)"; return; }
    say "$name: FlashInfer $v, $shapes (budget $seconds s)"
    FLASHINFER_WORKSPACE_BASE=/tmp/fiws$v PYTHONPATH=/tmp/site$v timeout "$seconds" \
        python3 benchmarks/bench_sampling.py --shapes "$shapes" --batches "$batches" \
        --timing graph --logit-std 5 --warmup-ms 10 --rep-ms 30 --providers "$providers" \
        --budget-s $((seconds - 14)) --out-dir "$out/$name" "$@" |
        grep -v "^  D=\|^  (" | tail -n 40
}
bench fi072_d4096 072 "$(cap 58 105)" 4096x151936 "$P072,$JOINT"
bench fi069_d4096 069 "$(cap 36 70)" 4096x151936 "$P069"
bench fi072_rest 072 "$(cap 62 20)" 2048x151936,8192x128256 "$P072" --batches "$rest_batches"
bench fi069_rest 069 "$(cap 60 14)" 2048x151936,8192x128256 "$P069" --batches "$rest_batches"
# A provider whose graph capture failed at D = 4096 (every row empty), in events mode.
failed=$(python3 - "$out"/fi07*_d4096/*.csv <<'EOF'
import csv
import sys

times = {}
for path in sys.argv[1:]:
    for row in csv.DictReader(open(path)):
        times.setdefault(row["provider"], []).append(row["median_us"])
print(",".join(p for p, t in times.items() if p.startswith("flashinfer") and not any(t)))
EOF
)
[ -n "$failed" ] && bench fi072_d4096_events 072 "$(cap 60 4)" 4096x151936 "$failed" \
    --timing events --batches 1,16,64,128,144,192,256
{
    echo "done $(date -u +%H:%M:%S) UTC after $(elapsed) s"
    ls "$out"/*/*.csv 2>/dev/null
    grep -h "^|\|^###" "$out/run.log"
} >> "$out/summary.txt"
say "done"
tar -C /tmp -cf "$results/peers.tar" peers && cp "$out/summary.txt" "$results/peers_summary.txt"
