#!/usr/bin/env bash
# One GPU-machine call that only compiles what a timed peer sweep (issue 38 item 2) needs, with
# no kernel launched and no CUDA context (the Triton processes held one each, 520 MiB, until
# compile_fused.py's DryRunFakeMode; the log's "on the GPU" lines show any), so it can share a
# machine with another job's timings:
#  - FlashInfer's JIT modules, built by the machine's nvcc for sm_90a with the GPU hidden
#    (CUDA_VISIBLE_DEVICES empty, FLASHINFER_CUDA_ARCH_LIST=9.0a), four builds at once:
#    0.7.2.post1's `sampling`, `topk` (the radix top-k of top_k_top_p_sampling_from_logits'
#    top-k-first path) and `cake_sampling_<hash>` (one 47 MB translation unit, hence
#    -split-compile=0), and 0.6.9's `sampling`; each built module is then loaded once (the
#    import check: the .so opens and FlashInfer finds its functions; no CUDA call);
#  - the fused providers' Triton kernels at every shape and batch (benchmarks/compile_fused.py:
#    dry runs on fake tensors, a few processes splitting the compiles) into
#    TRITON_CACHE_DIR=/tmp/triton_peers, the path the timed call must use too.
#
#   bash benchmarks/jobs/peers_prebuild_job.sh [--budget S]
#
# Needs (git-ignored, carried): .fi072/site.tar.xz (benchmarks/fetch_flashinfer.sh) and
# 0.6.9's wheels in .whl/ (../shared/gpu/fetch-wheels.sh). Writes to $OUT, flat (a few files):
# flashinfer_aot.tar.xz (aot072/<name>/<name>.so, aot069/sampling/sampling.so: put 0.7.2's as
# .fi072/aot/<name>/<name>.so and rerun fetch_flashinfer.sh; logs/), triton_peers.tar.xz (the
# cache, cubins and launchers, no IR: `tar -xJf triton_peers.tar.xz -C /`), and a module not
# built in time as its ninja build folder (flashinfer_partial.tar.xz, same /tmp paths, for a
# next call to resume from); a file over 15 MiB comes back in parts (cat FILE.part* > FILE).
set -u -o pipefail
cd "$(dirname "$0")/../.."
budget=440
source benchmarks/jobs/device_job_lib.sh
while [ $# -gt 0 ]; do
    case "$1" in
        --budget) budget=$2; shift ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
    shift
done
out=${OUT:-$PWD/benchmarks/results}
logs=/tmp/fi_prebuild_logs
mkdir -p "$out" && rm -rf "$logs" && mkdir -p "$logs"
export PYTHONUNBUFFERED=1
if ! command -v nvcc > /dev/null; then
    say "no nvcc: nothing built"
    exit 0
fi
nvcc --version | tail -n 1
say "budget $budget s; $(nproc) CPUs; load $(cut -d' ' -f1-3 /proc/loadavg)"

rm -rf /tmp/site069 /tmp/site072 /tmp/fiws069 /tmp/fiws072 && mkdir -p /tmp/site069 /tmp/site072
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site069 .whl/*.whl ||
    say "0.6.9 wheels did not install"
tar -xJf .fi072/site.tar.xz -C /tmp/site072 || say "0.7.2 site did not unpack"

cat > /tmp/fi_prebuild.py <<'EOF'
"""Build one FlashInfer JIT module without a GPU, then load it (no CUDA call)."""

import sys
import time

what, start = sys.argv[1], time.perf_counter()
import flashinfer  # noqa: E402

if what == "sampling":
    from flashinfer.jit.sampling import gen_sampling_module as gen
elif what == "topk":
    from flashinfer.jit.topk import gen_topk_module as gen
else:
    from flashinfer.jit.cake_sampling import gen_cake_sampling_module as gen
spec = gen()
print(f"{spec.name}: building (flashinfer {flashinfer.__version__})", flush=True)
spec.build(False)
built = time.perf_counter() - start
module = spec.build_and_load()  # a second build would be a no-op: this only loads the .so
names = [n for n in dir(module) if not n.startswith("_")][:6]
print(f"{what} ok: {spec.name} built in {built:.0f} s, loads ({', '.join(names)}): "
      f"{spec.get_library_path()}")
EOF

# The Triton kernels first, at the lowest priority: the FlashInfer builds matter more.
export TRITON_CACHE_DIR=/tmp/triton_peers
rm -rf "$TRITON_CACHE_DIR"
triton_pids=() triton_count=4
for index in $(seq 0 $((triton_count - 1))); do
    PYTHONPATH=$PWD timeout "$(cap 9999 50)" nice -n 19 python3 benchmarks/compile_fused.py \
        --index "$index" --count "$triton_count" --threads 3 > "$logs/triton_$index.log" 2>&1 &
    triton_pids+=($!)
done

pids=()
for job in 072:cake 072:topk 072:sampling 069:sampling; do
    v=${job%%:*} what=${job#*:}
    flags="-split-compile=4"
    [ "$what" = cake ] && flags="-split-compile=0"
    CUDA_VISIBLE_DEVICES= FLASHINFER_CUDA_ARCH_LIST=9.0a FLASHINFER_EXTRA_CUDAFLAGS=$flags \
        FLASHINFER_WORKSPACE_BASE=/tmp/fiws$v PYTHONPATH=/tmp/site$v \
        timeout "$(cap 9999 45)" nice -n 10 python3 /tmp/fi_prebuild.py "$what" \
        > "$logs/build_${v}_$what.log" 2>&1 &
    pids+=($!)
done
descendants() { local pid; for pid in $(pgrep -P "$1"); do echo "$pid"; descendants "$pid"; done; }
while [ "$(jobs -rp | wc -l)" -gt 0 ]; do  # (the builds and the Triton compiles)
    sleep 10
    [ $(($(elapsed) % 60)) -lt 10 ] || continue
    say "building; load $(cut -d' ' -f1-3 /proc/loadavg)"
    # (which of this job's processes hold a CUDA context, and how much of the GPU)
    mine=$(descendants $$ | paste -sd'|')
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader 2>/dev/null |
        grep -E "^($mine)," | sed 's/^/   on the GPU: /'
done
wait "${pids[@]}" "${triton_pids[@]}"
for log in "$logs"/build_*.log "$logs"/triton_*.log; do
    say "$(basename "$log" .log): $(tail -n 1 "$log")"
done
say "Triton cache: $(find "$TRITON_CACHE_DIR" -name '*.cubin' | wc -l) cubins, $(du -sh "$TRITON_CACHE_DIR" | cut -f1)"
XZ_OPT="-T0 -6" tar -C / -cJf "$out/triton_peers.tar.xz" --exclude='*.ttir' --exclude='*.ttgir' \
    --exclude='*.llir' --exclude='*.ptx' --exclude='*.source' "${TRITON_CACHE_DIR#/}"

# fit FILE: FILE in 15 MiB parts (FILE.part00, ...) when it is larger: a call brings back files
# of 16 MiB at most (cat FILE.part* > FILE joins them)
fit() {
    [ -f "$1" ] || return
    ls -la "$1"
    [ "$(stat -c %s "$1")" -le $((15 << 20)) ] && return
    split -b 15M -d "$1" "$1.part" && rm "$1" && ls -la "$1".part*
}

# The built modules by version, and the unfinished modules' build folders.
rm -rf /tmp/fi_aot && mkdir -p /tmp/fi_aot
partial=()
for v in 069 072; do
    for dir in /tmp/fiws$v/.cache/flashinfer/*/*/cached_ops/*/; do
        [ -d "$dir" ] || continue
        name=$(basename "$dir")
        if [ -f "$dir/$name.so" ]; then
            mkdir -p "/tmp/fi_aot/aot$v/$name" && cp "$dir/$name.so" "/tmp/fi_aot/aot$v/$name/"
        else
            partial+=("${dir#/}")
        fi
    done
done
cp -r "$logs" /tmp/fi_aot/logs
XZ_OPT="-T0 -6" tar -C /tmp/fi_aot -cJf "$out/flashinfer_aot.tar.xz" . &&
    say "modules: $(cd /tmp/fi_aot && find . -name '*.so' -printf '%p %s\n' | tr '\n' ' ')"
fit "$out/flashinfer_aot.tar.xz"
fit "$out/triton_peers.tar.xz"
if [ ${#partial[@]} -gt 0 ]; then
    say "unfinished: ${partial[*]}"
    XZ_OPT="-T0 -1" timeout "$(cap 30 3)" tar -C / -cJf "$out/flashinfer_partial.tar.xz" \
        --exclude='*.so' tmp/fiws069/.cache tmp/fiws072/.cache 2>/dev/null
    fit "$out/flashinfer_partial.tar.xz"
fi
say "done"
