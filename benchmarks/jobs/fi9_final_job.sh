#!/usr/bin/env bash
# One GPU-machine call (one H200, about 300 s of a 400 s budget) on the session's final
# defaults, issue 38 items 4 and 2:
#  1. the full sweep: matmul, fused and the four truncating fused providers (top-k 50, top-k 50
#     + top-p 0.9, top-p 0.9, min-p 0.1) at every B of bench_sampling's default list (1-256,
#     non-powers of two included) and D = 2048 / 4096 / 8192 (or --shapes), CUDA-graph medians,
#     std-5 logits, do_bench 10 / 40 ms (sweep_device_run.sh's settings), nvidia-smi sampling
#     power, SM clock and throttle reasons every 200 ms meanwhile (power.csv);
#  2. transformers' TopPLogitsWarper compiled by stock Inductor (hf_topp09, hf_topk50_topp09),
#     which torch 2.11 compiled only at B = 1 (pytorch#180221; bench_sampling backports the fix);
#  3. FlashInfer 0.7.2.post1 at B = 128-256, every D (the cells where it won against the
#     kernels of 12:14 / 13:33), beside the fused calls of the final defaults.
# Nothing is timed while anything compiles: first, in parallel, compile_fused.py's dry runs
# (every shape and B; their wall time printed: the sweep's compile cost) and one throw-away
# process per shape and transformers provider (Inductor's cache).
#
#   bash benchmarks/jobs/fi9_final_job.sh [--budget S] [--shapes DxV,...] [--skip-peers]
#
# --shapes splits the sweep over calls (2048x151936,8192x128256 on one GPU and 4096x151936 on
# another; --skip-peers on one of them). Needs (git-ignored, carried, all optional):
# .fi072/triton_peers.tar.xz (a Triton cache), .fi072/site.tar.xz (FlashInfer 0.7.2, its
# modules prebuilt: benchmarks/fetch_flashinfer.sh). Writes to $OUT: the sweep's CSV and PNG,
# final.log, power.csv, peers.tar (the peers' CSVs, PNGs and logs), triton_fi9.tar.xz.
set -u -o pipefail
cd "$(dirname "$0")/../.."
budget=400 shapes=2048x151936,4096x151936,8192x128256 peers=1
source benchmarks/jobs/device_job_lib.sh
while [ $# -gt 0 ]; do
    case "$1" in
        --budget) budget=$2; shift ;;
        --shapes) shapes=$2; shift ;;
        --skip-peers) peers=0 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
    shift
done
results=${OUT:-$PWD/benchmarks/results}
peer_out=/tmp/fi9_peers
mkdir -p "$results" && rm -rf "$peer_out" /tmp/hf_warm && mkdir -p "$peer_out" /tmp/hf_warm
exec > >(tee -a "$results/final.log") 2>&1
export PYTHONUNBUFFERED=1

if ! python3 -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
    say "no CUDA device: nothing to time"
    exit 0
fi
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm,temperature.gpu --format=csv
python3 -c "import torch, triton, transformers as t; print('torch', torch.__version__, 'triton',
    triton.__version__, 'transformers', t.__version__)"
cat COMMIT 2>/dev/null || git log --oneline -1
say "$(nproc) CPUs; shapes $shapes; peers $peers; budget $budget s"
export TRITON_CACHE_DIR=/tmp/triton_peers TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_fi9
export TORCHINDUCTOR_COMPILE_THREADS=2 FLASHINFER_CUDA_ARCH_LIST=9.0a
if [ -f .fi072/triton_peers.tar.xz ]; then
    tar -xJf .fi072/triton_peers.tar.xz -C / && say "Triton cache: $(find "$TRITON_CACHE_DIR" \
        -name '*.cubin' | wc -l) cubins"
fi
if [ "$peers" = 1 ] && [ -f .fi072/site.tar.xz ]; then
    rm -rf /tmp/site072 /tmp/fiws072 && mkdir -p /tmp/site072
    tar -xJf .fi072/site.tar.xz -C /tmp/site072 || say "0.7.2 site did not unpack"
fi

FUSED=fused,fused_topk50,fused_topk50_topp09,fused_topp09,fused_minp01
HF=(hf_topp09 hf_topk50_topp09)
declare -A HF_BATCHES=([4096x151936]=1,2,4,8,16,32,48,64,96,128,144,160,192,224,256
    [2048x151936]=1,8,32,64,128,144,192,256 [8192x128256]=1,8,32,64,128,144,192,256)
compile_pids=() warm_pids=()
t=$(date +%s)
for index in $(seq 0 11); do
    PYTHONPATH=$PWD timeout "$(cap 150 200)" python3 benchmarks/compile_fused.py \
        --shapes "$shapes" --index "$index" --count 12 --threads 2 \
        > "/tmp/compile_fused_$index.log" 2>&1 &
    compile_pids+=($!)
done
if [ "$peers" = 1 ]; then
    for shape in 2048x151936 4096x151936 8192x128256; do
        for provider in "${HF[@]}"; do
            PYTHONPATH=$PWD timeout "$(cap 150 200)" python3 benchmarks/bench_sampling.py \
                --shapes "$shape" --timing graph --providers "$provider" --logit-std 5 \
                --batches "$(echo "${HF_BATCHES[$shape]}" | cut -d, -f1-2)" --warmup-ms 1 \
                --rep-ms 1 --out-dir "/tmp/hf_warm/${shape}_$provider" \
                > "/tmp/hf_warm/${shape}_$provider.log" 2>&1 &
            warm_pids+=($!)
        done
    done
fi
wait "${compile_pids[@]}"
say "compiled ahead in $(($(date +%s) - t)) s: $(tail -qn 1 /tmp/compile_fused_*.log | sort |
    uniq -c | head -n 3 | tr '\n' ' '); $(find "$TRITON_CACHE_DIR" -name '*.cubin' | wc -l) cubins"
grep -h "failed\|Error" /tmp/compile_fused_*.log | sort | uniq -c | head -n 5
[ ${#warm_pids[@]} -gt 0 ] && wait "${warm_pids[@]}"
say "Inductor warm-up done after $(($(date +%s) - t)) s; $(grep -h "^  D=" /tmp/hf_warm/*.log |
    grep -c "Error") failed rows"

# nvidia-smi ignores CUDA_VISIBLE_DEVICES: name the GPU by its UUID (as power_draw.py does)
uuid=$(python3 -c "import torch; print(f'GPU-{torch.cuda.get_device_properties(0).uuid}')")
nvidia-smi -i "$uuid" --format=csv -lms 200 \
    --query-gpu=timestamp,power.draw,clocks.sm,temperature.gpu,clocks_event_reasons.active \
    > "$results/power.csv" 2>&1 &
smi=$!
seconds=$(cap 150 $((peers * 110)))
say "timed sweep (budget $seconds s)"
PYTHONPATH=$PWD timeout "$seconds" python3 benchmarks/bench_sampling.py --shapes "$shapes" \
    --providers "$FUSED" --timing graph --logit-std 5 --warmup-ms 10 --rep-ms 40 \
    --budget-s $((seconds - 15)) --out-dir "$results" | grep -v "^  ("
kill "$smi" 2>/dev/null

peer() { # name, seconds, shape, batches, providers, [PYTHONPATH]
    local name=$1 seconds=$2 shape=$3 batches=$4 providers=$5 path=${6:-}
    [ "$seconds" -lt 20 ] && { say "$name: no time left ($seconds s)"; return; }
    say "$name: $shape, B $batches (budget $seconds s)"
    FLASHINFER_WORKSPACE_BASE=/tmp/fiws072 PYTHONPATH=$PWD${path:+:$path} timeout "$seconds" \
        python3 benchmarks/bench_sampling.py --shapes "$shape" --batches "$batches" \
        --timing graph --logit-std 5 --warmup-ms 10 --rep-ms 30 --providers "$providers" \
        --budget-s $((seconds - 12)) --out-dir "$peer_out/$name" 2>&1 |
        tee "$peer_out/$name.log" | grep "^|\|^###\|sweep:"
}
if [ "$peers" = 1 ]; then
    TOPP=fused_topk50_topp09,fused_topp09,hf_topp09,hf_topk50_topp09
    peer hf_d2048 "$(cap 35 75)" 2048x151936 "${HF_BATCHES[2048x151936]}" "$TOPP"
    peer hf_d8192 "$(cap 35 45)" 8192x128256 "${HF_BATCHES[8192x128256]}" "$TOPP"
    peer hf_d4096 "$(cap 45 0)" 4096x151936 "${HF_BATCHES[4096x151936]}" "$TOPP"
    P072=$FUSED,flashinfer_fi2,flashinfer_fi1,flashinfer_topk50,flashinfer_topk50_topp09
    P072+=,flashinfer_topp09,flashinfer_minp01,flashinfer_cake_topk50,flashinfer_cake_topk50_topp09
    [ -d /tmp/site072/flashinfer ] && peer fi072_large "$(cap 60 0)" \
        2048x151936,4096x151936,8192x128256 128,144,160,192,224,256 "$P072" /tmp/site072
    cp /tmp/hf_warm/*.log "$peer_out/" 2>/dev/null
    tar -C /tmp -cf "$results/peers.tar" fi9_peers
fi
say "done"
XZ_OPT=-T0 tar -C / -cJf "$results/triton_fi9.tar.xz" --exclude='*.ttir' --exclude='*.ttgir' \
    --exclude='*.llir' --exclude='*.ptx' --exclude='*.source' "${TRITON_CACHE_DIR#/}" &&
    ls -la "$results/triton_fi9.tar.xz"
