#!/usr/bin/env bash
# One call on a machine with several GPUs (the nvidia-h200-x2 kind): the tensor-parallel GPU
# tests, then benchmarks/bench_tp.py on every GPU of the host.
#
#   bash benchmarks/tp_device_run.sh [--tests-timeout 240] [--bench-timeout 300] [-- bench args]
#
# FlashInfer (the FI2 peer) comes from .whl/ when carried (../shared/gpu/README.md). Writes into
# $OUT (default benchmarks/results): tp_gpu_tests.log, bench_tp.log and bench_tp_*.{csv,md,png}.
# About 3 minutes of tests and 3 of benchmark (a minute of it FlashInfer's first JIT build).
set -u -o pipefail
cd "$(dirname "$0")/.."
# Never NVLink multicast: it can take the shared host's GPUs out of service.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OUT=${OUT:-$PWD/benchmarks/results} PYTHONUNBUFFERED=1
tests_timeout=240 bench_timeout=300 bench_args=()
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) sed -n '2,/^set /p' "benchmarks/$(basename "$0")" | grep '^#' | cut -c3-; exit 0 ;;
        --tests-timeout) tests_timeout=$2; shift ;;
        --bench-timeout) bench_timeout=$2; shift ;;
        --) shift; bench_args+=("$@"); break ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
    shift
done
if ! python3 -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
    echo "$(basename "$0") runs on a GPU machine; python3 here has no CUDA torch: nothing run"
    exit 0
fi
mkdir -p "$OUT"
failed=0
if ls .whl/*.whl >/dev/null 2>&1 && ! python3 -c "import flashinfer" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
echo "== $gpus GPUs; tests (limit ${tests_timeout} s)"
timeout -k 10 "$tests_timeout" python3 -m pytest -q -s -rA -p no:cacheprovider \
    -m "gpu or multigpu" tests/test_tp_gpu.py 2>&1 | tee "$OUT/tp_gpu_tests.log" || failed=1
echo "== bench_tp on $gpus GPUs (limit ${bench_timeout} s)"
timeout -k 10 "$bench_timeout" python3 -m torch.distributed.run --nproc_per_node="$gpus" \
    benchmarks/bench_tp.py --out-dir "$OUT" ${bench_args[@]+"${bench_args[@]}"} \
    2>&1 | tee "$OUT/bench_tp.log" || failed=1
exit $failed
