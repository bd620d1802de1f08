#!/usr/bin/env bash
# One GPU-machine call (one H200) for issue 38 items 4 and 2 on the defaults of the moment:
#  sweep  (default) the full sweep: matmul, fused and the four truncating fused providers
#         (top-k 50, top-k 50 + top-p 0.9, top-p 0.9, min-p 0.1) at every B of bench_sampling's
#         default list (1-256, non-powers of two included) and D = 2048 / 4096 / 8192 (or
#         --shapes), CUDA-graph medians, std-5 logits, do_bench 10 / 40 ms (sweep_device_run.sh's
#         settings), nvidia-smi sampling power, SM clock and throttle reasons every 200 ms
#         meanwhile (power.csv); about 60 s of compiles (on 16-32 cores) and 60 s timed;
#  --hf   transformers' TopPLogitsWarper compiled by stock Inductor (hf_topp09,
#         hf_topk50_topp09) beside the fused top-p calls, all three shapes at nine B in one
#         process: torch 2.11 compiled it at B = 1 only (pytorch#180221; bench_sampling
#         backports the fix);
#  --flashinfer  FlashInfer 0.7.2.post1 at B = 128-256, every D (where it won against the
#         kernels of 12:14 / 13:33), beside the fused calls.
# Nothing is timed while anything compiles: first, in parallel, compile_fused.py's dry runs
# (their wall time printed: the sweep's compile cost) and, for --hf, one throw-away process per
# shape and transformers provider (Inductor's cache).
#
#   bash benchmarks/jobs/fi9_final_job.sh [--budget S] [--shapes DxV,...] [--no-sweep] [--hf]
#                                         [--flashinfer]
#
# --shapes splits the sweep over calls (2048x151936,8192x128256 on one GPU and 4096x151936 on
# another). Needs (git-ignored, carried, all optional): .fi072/triton_peers.tar.xz (a Triton
# cache), .fi072/site.tar.xz (FlashInfer 0.7.2 with its modules prebuilt, for --flashinfer:
# benchmarks/fetch_flashinfer.sh). Writes to $OUT: the sweep's CSV and PNG, final.log,
# power.csv, peers.tar (the peers' CSVs, PNGs and logs), triton_fi9.tar.xz.
set -u -o pipefail
cd "$(dirname "$0")/../.."
budget=290 shapes=2048x151936,4096x151936,8192x128256 sweep=1 hf=0 flashinfer=0
source benchmarks/jobs/device_job_lib.sh
while [ $# -gt 0 ]; do
    case "$1" in
        --budget) budget=$2; shift ;;
        --shapes) shapes=$2; shift ;;
        --no-sweep) sweep=0 ;;
        --hf) hf=1 ;;
        --flashinfer) flashinfer=1 ;;
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
say "$(nproc) CPUs; sweep $sweep ($shapes), hf $hf, flashinfer $flashinfer; budget $budget s"
export TRITON_CACHE_DIR=/tmp/triton_peers TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_fi9
export TORCHINDUCTOR_COMPILE_THREADS=2 FLASHINFER_CUDA_ARCH_LIST=9.0a
if [ -f .fi072/triton_peers.tar.xz ]; then
    tar -xJf .fi072/triton_peers.tar.xz -C / && say "Triton cache: $(find "$TRITON_CACHE_DIR" \
        -name '*.cubin' | wc -l) cubins"
fi
if [ "$flashinfer" = 1 ]; then
    rm -rf /tmp/site072 /tmp/fiws072 && mkdir -p /tmp/site072
    tar -xJf .fi072/site.tar.xz -C /tmp/site072 || say "0.7.2 site did not unpack"
fi

ALL=2048x151936,4096x151936,8192x128256
FUSED=fused,fused_topk50,fused_topk50_topp09,fused_topp09,fused_minp01
TOPP=fused_topk50_topp09,fused_topp09,hf_topp09,hf_topk50_topp09
HF_B=1,2,8,32,64,128,144,192,256
LARGE_B=128,144,160,192,224,256
# what compile_fused.py dry-runs: the sweep's kernels, else those of the peers' processes
compile=(--shapes "$shapes")
[ "$sweep" = 0 ] && [ "$flashinfer" = 0 ] &&
    compile=(--shapes "$ALL" --batches "$HF_B" --providers fused,fused_topk50_topp09,fused_topp09)
[ "$sweep" = 0 ] && [ "$flashinfer" = 1 ] && compile=(--shapes "$ALL")
reserve=$((sweep * 75 + hf * 50 + flashinfer * 45))
compile_pids=() warm_pids=()
t=$(date +%s)
for index in $(seq 0 11); do
    PYTHONPATH=$PWD timeout "$(cap 150 "$reserve")" python3 benchmarks/compile_fused.py \
        "${compile[@]}" --index "$index" --count 12 --threads 2 \
        > "/tmp/compile_fused_$index.log" 2>&1 &
    compile_pids+=($!)
done
if [ "$hf" = 1 ]; then
    for shape in ${ALL//,/ }; do
        for provider in hf_topp09 hf_topk50_topp09; do
            PYTHONPATH=$PWD timeout "$(cap 150 "$reserve")" python3 benchmarks/bench_sampling.py \
                --shapes "$shape" --timing graph --providers "$provider" --logit-std 5 \
                --batches "$(echo "$HF_B" | cut -d, -f1-2)" --warmup-ms 1 --rep-ms 1 \
                --out-dir "/tmp/hf_warm/${shape}_$provider" \
                > "/tmp/hf_warm/${shape}_$provider.log" 2>&1 &
            warm_pids+=($!)
        done
    done
fi
wait "${compile_pids[@]}"
say "compiled ahead in $(($(date +%s) - t)) s: $(tail -qn 1 /tmp/compile_fused_*.log | sort |
    uniq -c | head -n 3 | tr '\n' ' '); $(find "$TRITON_CACHE_DIR" -name '*.cubin' | wc -l) cubins"
grep -h "failed\|Error" /tmp/compile_fused_*.log | sort | uniq -c | head -n 5
if [ ${#warm_pids[@]} -gt 0 ]; then
    wait "${warm_pids[@]}"
    say "Inductor warm-up done after $(($(date +%s) - t)) s; failed rows: $(grep -h "^  D=" \
        /tmp/hf_warm/*.log | grep -c "Error")"
    grep -h "^  D=.*Error" /tmp/hf_warm/*.log | cut -c1-200 | head -n 4
fi

if [ "$sweep" = 1 ]; then
    # nvidia-smi ignores CUDA_VISIBLE_DEVICES: name the GPU by its UUID (as power_draw.py does)
    uuid=$(python3 -c "import torch; print(f'GPU-{torch.cuda.get_device_properties(0).uuid}')")
    nvidia-smi -i "$uuid" --format=csv -lms 200 \
        --query-gpu=timestamp,power.draw,clocks.sm,temperature.gpu,clocks_event_reasons.active \
        > "$results/power.csv" 2>&1 &
    smi=$!
    seconds=$(cap 160 $((hf * 50 + flashinfer * 45)))
    say "timed sweep (budget $seconds s)"
    PYTHONPATH=$PWD timeout "$seconds" python3 benchmarks/bench_sampling.py --shapes "$shapes" \
        --providers "$FUSED" --timing graph --logit-std 5 --warmup-ms 10 --rep-ms 40 \
        --budget-s $((seconds - 15)) --out-dir "$results" | grep -v "^  ("
    kill "$smi" 2>/dev/null
fi

peer() { # name, seconds, batches, providers, [PYTHONPATH]
    local name=$1 seconds=$2 batches=$3 providers=$4 path=${5:-}
    [ "$seconds" -lt 20 ] && { say "$name: no time left ($seconds s)"; return; }
    say "$name: $ALL, B $batches (budget $seconds s)"
    FLASHINFER_WORKSPACE_BASE=/tmp/fiws072 PYTHONPATH=$PWD${path:+:$path} timeout "$seconds" \
        python3 benchmarks/bench_sampling.py --shapes "$ALL" --batches "$batches" \
        --timing graph --logit-std 5 --warmup-ms 10 --rep-ms 30 --providers "$providers" \
        --budget-s $((seconds - 10)) --out-dir "$peer_out/$name" 2>&1 |
        tee "$peer_out/$name.log" | grep "^|\|^###\|sweep:\|budget spent"
}
[ "$hf" = 1 ] && peer hf_topp "$(cap 80 $((flashinfer * 45)))" "$HF_B" "$TOPP"
P072=$FUSED,flashinfer_fi2,flashinfer_fi1,flashinfer_topk50,flashinfer_topk50_topp09
P072+=,flashinfer_topp09,flashinfer_minp01,flashinfer_cake_topk50,flashinfer_cake_topk50_topp09
[ "$flashinfer" = 1 ] && peer fi072_large "$(cap 60 0)" "$LARGE_B" "$P072" /tmp/site072
if [ "$hf" = 1 ] || [ "$flashinfer" = 1 ]; then
    cp /tmp/hf_warm/*.log "$peer_out/" 2>/dev/null
    tar -C /tmp -cf "$results/peers.tar" fi9_peers
fi
say "done"
XZ_OPT=-T0 tar -C / -cJf "$results/triton_fi9.tar.xz" --exclude='*.ttir' --exclude='*.ttgir' \
    --exclude='*.llir' --exclude='*.ptx' --exclude='*.source' "${TRITON_CACHE_DIR#/}" &&
    ls -la "$results/triton_fi9.tar.xz"
