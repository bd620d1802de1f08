#!/usr/bin/env bash
# One GPU-machine call for a full sampling sweep (issue 38), with the Triton compiles done in
# parallel first: a cold sweep compiles every (shape, batch range, provider) kernel one after
# another (8-10 s each for top-p / min-p), minutes of a short lease. Here 15 throw-away sweeps
# (3 shapes x 5 batch ranges, 1 ms timings) fill one Triton cache at once, beside the GPU tests
# and the exactness sweep, none of them timed; then the timed sweep runs alone on that cache.
#
#   bash benchmarks/sweep_device_run.sh [--tests S] [--exactness S] [--flashinfer S]
#                                       [--warm S] [--sweep S] [--cache-in FILE] [--cache-out]
#
#   --tests S       tests/test_gpu_op.py, test_gpu_truncation.py, test_gpu_min_p.py (xdist),
#                   cut at S seconds, beside the warm-up
#   --exactness S   benchmarks/exactness_sweep.py, S seconds per mode, beside the warm-up
#   --flashinfer S  FlashInfer 0.7.2.post1 / 0.6.9 peers after the sweep (S seconds each) from
#                   .fi/ (fi072_trim.tar.xz and the 0.6.9 wheels); their JIT builds run during
#                   the warm-up and the sweep, at low priority
#   --flashinfer069 S  the 0.6.9 sweep's budget (default 20; 0.7.2 runs first)
#   --warm S        cap of the warm-up (default 120)
#   --sweep S       budget of the timed sweep (default 75)
#   --cache-in F    a Triton cache tarball from an earlier call: no warm-up then
#   --cache-out     write the sweep's Triton cache (cubins only) to $OUT/triton_cache.tar.xz
#
# Everything goes to $OUT (default benchmarks/results): run.log, the sweep's CSV and PNG, the
# FlashInfer CSVs, the exactness JSON and CSV.
set -u -o pipefail
cd "$(dirname "$0")/.."
tests_s=0 exact_s=0 fi_s=0 fi069_s=20 warm_s=120 sweep_s=75 cache_in="" cache_out=0
while [ $# -gt 0 ]; do
    case "$1" in
        --tests) tests_s=$2; shift ;;
        --exactness) exact_s=$2; shift ;;
        --flashinfer) fi_s=$2; shift ;;
        --flashinfer069) fi069_s=$2; shift ;;
        --warm) warm_s=$2; shift ;;
        --sweep) sweep_s=$2; shift ;;
        --cache-in) cache_in=$2; shift ;;
        --cache-out) cache_out=1 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
    shift
done
export OUT=${OUT:-$PWD/benchmarks/results} PYTHONUNBUFFERED=1
mkdir -p "$OUT" /tmp/warm
exec > >(tee -a "$OUT/run.log") 2>&1
t0=$(date +%s)
say() { echo "== $(($(date +%s) - t0)) s: $*"; }
SHAPES=(2048x151936 4096x151936 8192x128256)
GROUPS_B=(1,2,4,8,16 32,48,64 96,128 144,160,192 224,256)
PROVIDERS=fused,fused_topk50,fused_topk50_topp09,fused_topp09,fused_minp01
BENCH=(python3 benchmarks/bench_sampling.py --timing graph --logit-std 5)
export TRITON_CACHE_DIR=/tmp/triton_sweep

nvidia-smi --query-gpu=name,driver_version,power.limit,power.max_limit,clocks.max.sm,clocks.max.mem,temperature.gpu --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
git log -1 --format='commit %h %s' 2>/dev/null || true

fi_pids=()
if [ "$fi_s" -gt 0 ]; then
    say "FlashInfer: install and JIT builds in the background"
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site069 .fi/*.whl
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site072 \
        .fi/apache_tvm_ffi*.whl .fi/cuda_tile*.whl
    tar -xJf .fi/fi072_trim.tar.xz -C /tmp/site072
    export FLASHINFER_CUDA_ARCH_LIST=9.0a FLASHINFER_EXTRA_CUDAFLAGS="-split-compile=0"
    for job in 072:sampling 072:topk 072:cake 069:sampling; do
        v=${job%%:*} what=${job#*:}
        FLASHINFER_WORKSPACE_BASE=/tmp/fiws$v PYTHONPATH=/tmp/site$v nice -n 15 \
            python3 .fi/warm_fi.py "$what" > /tmp/fi_build_${v}_$what.log 2>&1 &
        fi_pids+=($!)
    done
fi

side_pids=()
if [ "$tests_s" -gt 0 ]; then
    say "GPU tests in the background (cut at $tests_s s)"
    TRITON_CACHE_DIR=/tmp/triton_tests nice -n 5 timeout "$tests_s" python3 -m pytest -q \
        -n 6 -p no:cacheprovider --durations=12 tests/test_gpu_op.py \
        tests/test_gpu_truncation.py tests/test_gpu_min_p.py > /tmp/gpu_tests.log 2>&1 &
    side_pids+=($!)
fi
if [ "$exact_s" -gt 0 ]; then
    say "exactness sweep in the background ($exact_s s a mode)"
    TRITON_CACHE_DIR=/tmp/triton_exact timeout $((exact_s * 3 + 60)) python3 \
        benchmarks/exactness_sweep.py --budget-s "$exact_s" --out-dir "$OUT" \
        > /tmp/exactness.log 2>&1 &
    side_pids+=($!)
fi

if [ -n "$cache_in" ]; then
    say "Triton cache from $cache_in"
    tar -xJf "$cache_in" -C /
else
    say "warm-up: ${#SHAPES[@]} x ${#GROUPS_B[@]} throw-away sweeps (cap $warm_s s)"
    warm_pids=()
    for shape in "${SHAPES[@]}"; do
        for group in "${GROUPS_B[@]}"; do
            name=${shape}_${group//,/-}
            timeout "$warm_s" "${BENCH[@]}" --shapes "$shape" --batches "$group" \
                --providers "$PROVIDERS" --warmup-ms 1 --rep-ms 1 --out-dir "/tmp/warm/$name" \
                > "/tmp/warm/$name.log" 2>&1 &
            warm_pids+=($!)
        done
    done
    wait "${warm_pids[@]}"
    say "warm-up done; failures: $(grep -l 'Error\|error' /tmp/warm/*.log | wc -l)"
    grep -h "Error" /tmp/warm/*.log | sort | uniq -c | head -5
fi
[ ${#side_pids[@]} -gt 0 ] && wait "${side_pids[@]}"
say "side jobs done"

say "timed sweep (budget $sweep_s s)"
timeout $((sweep_s + 40)) "${BENCH[@]}" --providers "$PROVIDERS" --warmup-ms 10 --rep-ms 40 \
    --budget-s "$sweep_s" --out-dir "$OUT"

if [ "$cache_out" = 1 ]; then
    say "Triton cache out"
    du -sh /tmp/triton_sweep
    XZ_OPT=-T0 tar -C / -cJf "$OUT/triton_cache.tar.xz" --exclude='*.ttir' --exclude='*.ttgir' \
        --exclude='*.llir' --exclude='*.ptx' --exclude='*.source' tmp/triton_sweep
    ls -la "$OUT/triton_cache.tar.xz"
fi
say "exactness:"
cat /tmp/exactness.log 2>/dev/null | tail -n 12
say "GPU tests:"
cat /tmp/gpu_tests.log 2>/dev/null
if [ "$fi_s" -gt 0 ]; then
    for v in 072 069; do
        say "FlashInfer $v builds:"
        tail -n 3 /tmp/fi_build_${v}_*.log
        [ "$v" = 069 ] && fi_s=$fi069_s
        providers=fused_topk50,fused_topk50_topp09,flashinfer_fi2,flashinfer_topk50
        providers+=,flashinfer_topk50_topp09,flashinfer_topp09,flashinfer_minp01
        providers+=,fused_topp09,fused_minp01
        if [ "$v" = 072 ] && grep -q "^cake ok" /tmp/fi_build_072_cake.log; then
            providers+=,flashinfer_cake_topk50,flashinfer_cake_topk50_topp09
        fi
        mkdir -p /tmp/fi$v
        FLASHINFER_WORKSPACE_BASE=/tmp/fiws$v PYTHONPATH=/tmp/site$v timeout $((fi_s + 30)) \
            "${BENCH[@]}" --providers "$providers" --batches 1,16,64,128,144,192,256 \
            --warmup-ms 10 --rep-ms 40 --budget-s "$fi_s" --out-dir /tmp/fi$v | tail -n 25
        cp /tmp/fi$v/*.csv "$OUT/" 2>/dev/null
    done
    kill "${fi_pids[@]}" 2>/dev/null
fi

say "done"
