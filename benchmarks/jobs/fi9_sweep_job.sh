#!/usr/bin/env bash
# One GPU-machine call (one H200): the full sweep of issue 38 item 4 on the defaults of the
# moment: matmul, fused and the four truncating fused providers (top-k 50, top-k 50 + top-p
# 0.9, top-p 0.9, min-p 0.1) at every B of bench_sampling's default list (1-256 with the
# non-powers of two) and D = 2048 / 4096 / 8192, CUDA-graph medians, std-5 logits, the timing
# of sweep_device_run.sh (do_bench 10 / 40 ms). The fused kernels are compiled first, nothing
# timed meanwhile, by compile_fused.py's dry runs in parallel (their wall time is printed: the
# sweep's compile cost); nvidia-smi samples power, SM clock and throttle reasons every 200 ms
# during the timed sweep (power.csv).
#
#   bash benchmarks/jobs/fi9_sweep_job.sh [--budget S] [--shapes DxV,...]
#
# --shapes splits the sweep over calls (e.g. 2048x151936,8192x128256 on one GPU and
# 4096x151936 on another). Needs .fi072/triton_peers.tar.xz (optional: a Triton cache of an
# earlier call). Writes to $OUT: the sweep's CSV and PNG, sweep.log, power.csv, and
# triton_fi9.tar.xz (the cache after the call, cubins only).
set -u -o pipefail
cd "$(dirname "$0")/../.."
budget=400 shapes=2048x151936,4096x151936,8192x128256
source benchmarks/jobs/device_job_lib.sh
while [ $# -gt 0 ]; do
    case "$1" in
        --budget) budget=$2; shift ;;
        --shapes) shapes=$2; shift ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
    shift
done
results=${OUT:-$PWD/benchmarks/results}
mkdir -p "$results"
exec > >(tee -a "$results/sweep.log") 2>&1
export PYTHONUNBUFFERED=1

if ! python3 -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
    say "no CUDA device: nothing to time"
    exit 0
fi
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm,temperature.gpu --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
cat COMMIT 2>/dev/null || git log --oneline -1
say "$(nproc) CPUs; shapes $shapes; budget $budget s; CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-}"
export TRITON_CACHE_DIR=/tmp/triton_peers
if [ -f .fi072/triton_peers.tar.xz ]; then
    tar -xJf .fi072/triton_peers.tar.xz -C / && say "Triton cache: $(find "$TRITON_CACHE_DIR" \
        -name '*.cubin' | wc -l) cubins"
fi

FUSED=fused,fused_topk50,fused_topk50_topp09,fused_topp09,fused_minp01
pids=()
t=$(date +%s)
for index in $(seq 0 11); do
    PYTHONPATH=$PWD timeout "$(cap 150 30)" python3 benchmarks/compile_fused.py \
        --shapes "$shapes" --index "$index" --count 12 --threads 2 \
        > "/tmp/compile_fused_$index.log" 2>&1 &
    pids+=($!)
done
wait "${pids[@]}"
say "compiled ahead in $(($(date +%s) - t)) s: $(tail -qn 1 /tmp/compile_fused_*.log | sort |
    uniq -c | head -n 3 | tr '\n' ' '); $(find "$TRITON_CACHE_DIR" -name '*.cubin' | wc -l) cubins"
grep -h "failed\|Error" /tmp/compile_fused_*.log | sort | uniq -c | head -n 5

# nvidia-smi ignores CUDA_VISIBLE_DEVICES: name the GPU by its UUID (as power_draw.py does)
uuid=$(python3 -c "import torch; print(f'GPU-{torch.cuda.get_device_properties(0).uuid}')")
nvidia-smi -i "$uuid" --format=csv -lms 200 \
    --query-gpu=timestamp,power.draw,clocks.sm,temperature.gpu,clocks_event_reasons.active \
    > "$results/power.csv" 2>&1 &
smi=$!
seconds=$(cap 400 15)
say "timed sweep (budget $seconds s)"
PYTHONPATH=$PWD timeout "$seconds" python3 benchmarks/bench_sampling.py --shapes "$shapes" \
    --providers "$FUSED" --timing graph --logit-std 5 --warmup-ms 10 --rep-ms 40 \
    --budget-s $((seconds - 15)) --out-dir "$results" | grep -v "^  ("
kill "$smi" 2>/dev/null
say "done"
XZ_OPT=-T0 tar -C / -cJf "$results/triton_fi9.tar.xz" --exclude='*.ttir' --exclude='*.ttgir' \
    --exclude='*.llir' --exclude='*.ptx' --exclude='*.source' "${TRITON_CACHE_DIR#/}" &&
    ls -la "$results/triton_fi9.tar.xz"
