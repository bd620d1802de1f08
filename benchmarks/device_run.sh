#!/usr/bin/env bash
# One GPU-machine call: FlashInfer wheels, machine and versions, the sweep, the gpu tests.
#
#   bash benchmarks/device_run.sh [--skip-check] [--skip-bench] [--quick] [--total-s 540]
#                                 [--check-timeout 200] [-- more bench_sampling.py arguments]
#
# Needs `carry: [".whl"]` for FlashInfer (installed to /tmp/site unless it already imports).
# Writes into $OUT (default benchmarks/results): device_run.log (everything printed),
# gpu_check.log, gpu_check.xml, bench_sampling_<gpu>_<date>.csv and .png. A failing step
# does not stop the next one; the exit code is 1 if any step failed. The sweep gets what
# --total-s leaves after --check-timeout (it stops starting new points in time, then writes
# its plot and table) and the gpu check is cut at --check-timeout seconds, so the whole call
# fits in --total-s.
set -u -o pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
skip_check=0 skip_bench=0 total_s=540 check_timeout=200 bench_args=()
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) sed -n '2,/^set /p' "benchmarks/$(basename "$0")" | grep '^#' | cut -c3-; exit 0 ;;
        --skip-check) skip_check=1 ;;
        --skip-bench) skip_bench=1 ;;
        --quick) bench_args+=(--quick) ;;
        --total-s) total_s=$2; shift ;;
        --check-timeout) check_timeout=$2; shift ;;
        --) shift; bench_args+=("$@"); break ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
    shift
done
if ! python3 -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
    echo "$(basename "$0") runs on a GPU machine; python3 here has no CUDA torch: nothing run"
    exit 0
fi
export OUT=${OUT:-$PWD/benchmarks/results}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"

main() {
    local failed=0
    if ls .whl/*.whl >/dev/null 2>&1 && ! python3 -c "import flashinfer" 2>/dev/null; then
        echo "== installing .whl/ into /tmp/site"
        if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
            --upgrade --target /tmp/site .whl/*.whl; then
            export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
        else
            echo "wheel install failed: the FlashInfer providers will be skipped"
            failed=1
        fi
    fi

    echo "== machine"
    nvidia-smi || failed=1
    python3 - <<'EOF' || failed=1
import sys, torch, triton
print(f"Python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda}),"
      f" triton {triton.__version__}")
print(torch.cuda.get_device_name(), torch.cuda.get_device_properties(0))
try:
    import flashinfer
    print("flashinfer", flashinfer.__version__)
except Exception as error:
    print("flashinfer does not import:", error)
EOF

    # The sweep runs before the gpu check: right after the check (its compile workers and
    # their CPU load still winding down) the first shape's timings from Python were
    # host-bound on both GPUs (compiled step without CUDA graphs up to 1.9x the fused op,
    # against 1.0-1.16x with the sweep first: benchmarks/README.md).
    if [ "$skip_bench" = 0 ]; then
        # Leave room for a point in flight (compiles) when the budget runs out and the plot
        # (60 s with the check after it, which rarely needs all of its time; 90 s alone).
        local reserved=90
        [ "$skip_check" = 0 ] && reserved=$((60 + check_timeout))
        local budget=$((total_s - ($(date +%s) - start) - reserved))
        echo "== bench_sampling ($(( $(date +%s) - start )) s in, budget ${budget} s)"
        if [ "$budget" -lt 30 ]; then
            echo "no time left for the sweep: run it alone with --skip-check"
            failed=1
        else
            timeout -k 10 $((budget + 60)) \
                python3 benchmarks/bench_sampling.py --out-dir "$OUT" --budget-s "$budget" \
                ${bench_args[@]+"${bench_args[@]}"} \
                || { echo "bench_sampling exit code $?"; failed=1; }
        fi
    fi
    if [ "$skip_check" = 0 ]; then
        echo "== gpu_check ($(( $(date +%s) - start )) s in)"
        timeout -k 10 $((check_timeout + 20)) \
            python3 benchmarks/gpu_check.py --timeout "$check_timeout" \
            || { echo "gpu_check exit code $?"; failed=1; }
    fi
    echo "== done in $(( $(date +%s) - start )) s; files in $OUT:"
    ls -la "$OUT"
    return "$failed"
}

main 2>&1 | tee "$OUT/device_run.log"
exit "${PIPESTATUS[0]}"
