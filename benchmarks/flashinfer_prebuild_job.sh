#!/usr/bin/env bash
# One GPU-machine call that only compiles: FlashInfer's JIT modules for the peer benchmarks
# (issue 38 item 2), built by the machine's nvcc for sm_90a with the GPU hidden
# (CUDA_VISIBLE_DEVICES empty, FLASHINFER_CUDA_ARCH_LIST=9.0a), so it can share a machine with
# another job's timings. Four builds at once, each a process of its own at nice 19:
# 0.7.2.post1's `sampling`, `topk` (the radix top-k of top_k_top_p_sampling_from_logits'
# top-k-first path) and `cake_sampling_<hash>` (one 47 MB translation unit, hence
# -split-compile=0), and 0.6.9's `sampling`. Each built module is then loaded once (the
# import check: the .so opens and FlashInfer finds its functions; no CUDA call).
#
#   bash benchmarks/flashinfer_prebuild_job.sh [--budget S]
#
# Needs (git-ignored, carried): .fi072/site.tar.xz (benchmarks/fetch_flashinfer.sh) and
# 0.6.9's wheels in .whl/ (../shared/gpu/fetch-wheels.sh). Writes to $OUT, flat (a few files):
# flashinfer_aot.tar.xz (aot072/<name>/<name>.so, aot069/sampling/sampling.so: put 0.7.2's as
# .fi072/aot/<name>/<name>.so and rerun fetch_flashinfer.sh), build logs inside it and in
# the job's output; a module not built in time comes back as its ninja build folder
# (flashinfer_partial.tar.xz, same /tmp paths, for a next call to resume from).
set -u -o pipefail
cd "$(dirname "$0")/.."
budget=440
source benchmarks/device_job_lib.sh
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

pids=()
for job in 072:cake 072:topk 072:sampling 069:sampling; do
    v=${job%%:*} what=${job#*:}
    flags="-split-compile=4"
    [ "$what" = cake ] && flags="-split-compile=0"
    CUDA_VISIBLE_DEVICES= FLASHINFER_CUDA_ARCH_LIST=9.0a FLASHINFER_EXTRA_CUDAFLAGS=$flags \
        FLASHINFER_WORKSPACE_BASE=/tmp/fiws$v PYTHONPATH=/tmp/site$v \
        timeout "$(cap 9999 45)" nice -n 19 python3 /tmp/fi_prebuild.py "$what" \
        > "$logs/build_${v}_$what.log" 2>&1 &
    pids+=($!)
done
while [ "$(jobs -rp | wc -l)" -gt 0 ]; do
    sleep 10
    [ $(($(elapsed) % 60)) -lt 10 ] && say "building; load $(cut -d' ' -f1-3 /proc/loadavg)"
done
wait "${pids[@]}"
for log in "$logs"/build_*.log; do say "$(basename "$log" .log): $(tail -n 1 "$log")"; done

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
if [ ${#partial[@]} -gt 0 ]; then
    say "unfinished: ${partial[*]}"
    XZ_OPT="-T0 -1" timeout "$(cap 30 3)" tar -C / -cJf "$out/flashinfer_partial.tar.xz" \
        --exclude='*.so' tmp/fiws069/.cache tmp/fiws072/.cache 2>/dev/null
    fit "$out/flashinfer_partial.tar.xz"
fi
say "done"
