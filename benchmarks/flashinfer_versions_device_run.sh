#!/usr/bin/env bash
# One GPU-machine call (one Hopper GPU) timing FlashInfer 0.7.2.post1 beside 0.6.9 on cuBLAS
# logits, and the fused op, at D = 4096, V = 151936 (issue 38 item 2). Each FlashInfer version
# runs in its own process with its own PYTHONPATH and JIT workspace; bench_sampling.py writes
# the version into its CSV's flashinfer column and file name. matmul and plain fused run in
# every process, so every ratio is taken in-process.
#
#   bash benchmarks/flashinfer_versions_device_run.sh [--budget S] [--batches LIST]
#
# Needs (git-ignored, carried): .fi072/site.tar.xz from benchmarks/fetch_flashinfer.sh and the
# 0.6.9 wheels in .whl/ (../shared/gpu/fetch-wheels.sh). The JIT builds (0.6.9 sampling; 0.7.2
# sampling, topk and cake_sampling, each in its own process, at low priority) run while the
# fused providers are timed; a version's providers run once its builds finish or at the latest
# the budget allows, and the cake providers only when cake_sampling built. Modules prebuilt
# into the site (flashinfer/data/aot/<name>/<name>.so) load without a build; one that does not
# load is removed and built. The built modules come back as $OUT/fi072/aot.tar for the next call. Everything goes to $OUT/fi072 (default benchmarks/results/fi072).
set -u -o pipefail
cd "$(dirname "$0")/.."
budget=290 batches=1,16,64,128,256
source benchmarks/device_job_lib.sh
parse_budget_batches "$@"
out=${OUT:-$PWD/benchmarks/results}/fi072
mkdir -p "$out"
exec > >(tee -a "$out/run.log") 2>&1
export PYTHONUNBUFFERED=1

if ! python3 -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
    say "no CUDA device: nothing to time"
    exit 0
fi
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
nvcc --version | tail -n 2

say "FlashInfer 0.6.9 into /tmp/site069, 0.7.2.post1 into /tmp/site072"
rm -rf /tmp/site069 /tmp/site072 && mkdir -p /tmp/site069 /tmp/site072
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site069 .whl/*.whl ||
    say "0.6.9 wheels did not install"
tar -xJf .fi072/site.tar.xz -C /tmp/site072 || say "0.7.2 site did not unpack"
export FLASHINFER_CUDA_ARCH_LIST=9.0a
cat > /tmp/fi_build.py <<'EOF'
"""Build (or load) one FlashInfer JIT module and call it once; prints '<what> ok' at the end."""

import os
import shutil
import sys
import time
from pathlib import Path

import torch

what, start = sys.argv[1], time.perf_counter()
import flashinfer  # noqa: E402
import flashinfer.sampling as fi  # noqa: E402

logits = torch.randn(64, 151936, device="cuda", dtype=torch.bfloat16)
try:
    if what == "sampling":
        fi.sampling_from_logits(logits)
        fi.top_k_top_p_sampling_from_logits(logits, top_k=logits.shape[1], top_p=1.0)
    elif what == "topk":  # the radix top-k of top_k_top_p_sampling_from_logits' top-k-first path
        from flashinfer.jit.topk import gen_topk_module

        gen_topk_module().build_and_load()
        fi.top_k_top_p_sampling_from_logits(logits, top_k=50, top_p=0.9)
    elif what == "cake":
        probs = torch.softmax(logits.float(), dim=-1)
        flashinfer.cake_top_k_top_p_sampling_from_probs(probs, 50, 0.9)
    torch.cuda.synchronize()
except Exception as error:  # a prebuilt module that does not load here: build it instead
    prebuilt = Path(flashinfer.__file__).parent / "data" / "aot" / what
    if not prebuilt.is_dir() or os.environ.get("FI_REBUILD"):
        raise
    print(f"prebuilt {what} failed ({error}); building it", flush=True)
    shutil.rmtree(prebuilt)
    os.environ["FI_REBUILD"] = "1"
    os.execv(sys.executable, [sys.executable, *sys.argv])
print(f"{what} ok: flashinfer {flashinfer.__version__}, {time.perf_counter() - start:.0f} s")
EOF
build_pids=() pids_069=() pids_072=()
for job in 069:sampling 072:sampling 072:topk 072:cake; do
    v=${job%%:*} what=${job#*:}
    flags=""
    [ "$what" = cake ] && flags="-split-compile=0" # one 47 MB translation unit
    FLASHINFER_EXTRA_CUDAFLAGS=$flags FLASHINFER_WORKSPACE_BASE=/tmp/fiws$v \
        PYTHONPATH=/tmp/site$v timeout "$budget" nice -n 15 python3 /tmp/fi_build.py "$what" \
        > "$out/build_${v}_$what.log" 2>&1 &
    build_pids+=($!)
    eval "pids_$v+=($!)"
done
built() { # version, modules...: all of them built?
    local v=$1
    shift
    for what in "$@"; do grep -q "^$what ok" "$out/build_${v}_$what.log" || return 1; done
}
building() { # pids...: any still running? (a failed build stops the waiting)
    local pid
    for pid in "$@"; do kill -0 "$pid" 2>/dev/null && return 0; done
    return 1
}

BENCH=(python3 benchmarks/bench_sampling.py --shapes 4096x151936 --batches "$batches"
    --timing graph --logit-std 5 --warmup-ms 10 --rep-ms 40)
bench() { # name, seconds, providers, [version]
    local name=$1 seconds=$2 providers=$3 v=${4:-}
    [ "$seconds" -lt 15 ] && { say "$name: no time left"; return; }
    say "$name: $providers (budget $seconds s)"
    if [ -n "$v" ]; then
        FLASHINFER_WORKSPACE_BASE=/tmp/fiws$v PYTHONPATH=/tmp/site$v timeout "$seconds" \
            "${BENCH[@]}" --providers "$providers" --budget-s $((seconds - 12)) \
            --out-dir "$out/$name" | tail -n 22
    else
        timeout "$seconds" "${BENCH[@]}" --providers "$providers" \
            --budget-s $((seconds - 12)) --out-dir "$out/$name" | tail -n 22
    fi
}

# The fused providers first (their Triton compiles beside the FlashInfer builds); the 0.7.2
# process last, the one whose builds take longest. Each waits for its builds while time is left.
bench fused $(($(left) * 45 / 100)) fused,fused_topk50,fused_topk50_topp09
FI_PROVIDERS=flashinfer_fi2,flashinfer_fi1,flashinfer_topk50,flashinfer_topk50_topp09
while ! built 069 sampling && building "${pids_069[@]}" && [ "$(left)" -gt 130 ]; do sleep 2; done
say "0.6.9 builds: $(tail -qn 1 "$out"/build_069_*.log | tr '\n' ' ')"
s069=$(($(left) - 85))
bench flashinfer069 $((s069 < 60 ? s069 : 60)) "$FI_PROVIDERS" 069 # 30 cells: 60 s is plenty
while ! built 072 sampling topk cake && building "${pids_072[@]}" && [ "$(left)" -gt 75 ]; do
    sleep 2
done
say "0.7.2 builds: $(tail -qn 1 "$out"/build_072_*.log | tr '\n' ' ')"
providers=$FI_PROVIDERS
built 072 cake && providers+=,flashinfer_cake_topk50,flashinfer_cake_topk50_topp09
bench flashinfer072 $(($(left) - 5)) "$providers" 072
kill "${build_pids[@]}" 2>/dev/null

# The built modules as aot<version>/<name>/<name>.so, for a next call that loads them instead of
# building (fetch_flashinfer.sh takes 0.7.2's from .fi072/aot/).
rm -rf /tmp/aot && mkdir -p /tmp/aot
for v in 069 072; do
    for so in /tmp/fiws$v/.cache/flashinfer/*/*/cached_ops/*/*.so; do
        [ -f "$so" ] || continue
        name=$(basename "$(dirname "$so")")
        mkdir -p "/tmp/aot/aot$v/$name" && cp "$so" "/tmp/aot/aot$v/$name/"
    done
done
tar -C /tmp/aot -cf "$out/aot.tar" . && ls -la "$out/aot.tar"
say "done: $(ls "$out"/*/*.csv 2>/dev/null | tr '\n' ' ')"
