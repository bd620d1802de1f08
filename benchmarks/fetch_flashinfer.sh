#!/usr/bin/env bash
# FlashInfer 0.7.2.post1 for a GPU machine, trimmed to its sampling path (issue 38 item 2).
# Its wheel (62 MB, 426 MB unpacked) does not fit a device call beside the project (64 MiB in
# all), so this keeps only what `import flashinfer` loads and what three JIT modules compile:
# `sampling` (sampling_from_logits, top_k_top_p_sampling_from_logits, the top-p / min-p
# samplers), `topk` (the radix top-k of top_k_top_p_sampling_from_logits' top-k-first path) and
# `cake_sampling_<hash>` (cake_top_k_top_p_sampling_from_probs). Left out: CUTLASS, spdlog, every
# other kernel's sources, the Python packages nothing imports (moe, attention kernels, ...).
#
#   PYTHON=/work/main/.venv/bin/python bash benchmarks/fetch_flashinfer.sh [DIR]   # DIR: .fi072
#
# Writes DIR/site/ (flashinfer + apache-tvm-ffi + cuda-tile for Python 3.12 / x86-64, about
# 60 MB unpacked, most of it the 47 MB generated cake source) and DIR/site.tar.xz (about 4 MB),
# which is what a device call carries. On the GPU machine:
#   mkdir -p /tmp/site072 && tar -xJf DIR/site.tar.xz -C /tmp/site072 && PYTHONPATH=/tmp/site072
# The GPU machine has the other dependencies 0.6.9 needs as well (requests, tabulate, einops,
# nvidia-ml-py, ninja, nvcc); 0.7.2's new ones (cuda-python, nccl4py, cutlass-dsl) are not
# imported by this path. PYTHON (a Python with torch) checks here that the trimmed package
# imports as far as the full one and writes the three modules' ninja files (no CUDA needed).
set -euo pipefail
dir=${1:-.fi072}
py=${PYTHON:-python3}
version=0.7.2.post1
tvm_ffi=apache-tvm-ffi==0.1.15.post2 # FlashInfer 0.7.2.post1 asks >= 0.1.11, < 0.2
cuda_tile=cuda-tile==1.7.0           # asks >= 1.4.0
mkdir -p "$dir/wheels" "$dir/scratch"
dir=$(cd "$dir" && pwd)
download() { # python version, target folder, requirements...
    local pyver=$1 target=$2
    shift 2
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$target" "$@" 2>&1 | grep -v '^WARNING: Location' || true
}
download 3.12 "$dir/wheels" "flashinfer-python==$version" "$tvm_ffi" "$cuda_tile"

full=$dir/scratch/full
rm -rf "$full" "$dir/site"
mkdir -p "$full" "$dir/site"
for wheel in "$dir"/wheels/*.whl; do python3 -m zipfile -e "$wheel" "$full"; done

# The import check runs the host's Python: its own builds of the two compiled dependencies and,
# where the host lacks them, the pure-Python ones the GPU machine has.
probe=$dir/scratch/probe
host_version=$("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
if [ ! -d "$probe/tvm_ffi" ]; then
    mkdir -p "$probe" "$dir/scratch/probe_wheels"
    download "$host_version" "$dir/scratch/probe_wheels" "$tvm_ffi" "$cuda_tile"
    for wheel in "$dir"/scratch/probe_wheels/*.whl; do python3 -m zipfile -e "$wheel" "$probe"; done
    missing=$("$py" -c 'import importlib.util as u; print(" ".join(p for m, p in [("requests",
        "requests"), ("tabulate", "tabulate"), ("einops", "einops"), ("pynvml", "nvidia-ml-py"),
        ("packaging", "packaging"), ("tqdm", "tqdm"), ("click", "click")] if not u.find_spec(m)))')
    [ -n "$missing" ] && "$py" -m pip install -q --target "$probe" $missing
fi

# What `import flashinfer` and the three JIT specs touch, seen from the full package.
FULL=$full PROBE=$probe OUTDIR=$dir FLASHINFER_WORKSPACE_BASE=$dir/scratch/ws_full \
    FLASHINFER_CUDA_ARCH_LIST=9.0a PYTHONPATH=$probe:$full "$py" - <<'EOF'
import json
import os
import sys
from pathlib import Path

import flashinfer
import flashinfer.sampling  # noqa: F401
import flashinfer.topk  # noqa: F401
from flashinfer.jit import cake_sampling, env
from flashinfer.jit.sampling import gen_sampling_module
from flashinfer.jit.topk import gen_topk_module

full = Path(os.environ["FULL"]).resolve()
keep = set()
for module in list(sys.modules.values()):
    path = getattr(module, "__file__", None)
    if path and Path(path).resolve().is_relative_to(full / "flashinfer"):
        keep.add(Path(path).resolve().relative_to(full))
package = full / "flashinfer"
keep.update(p.relative_to(full) for p in package.glob("*.py"))
keep.update(p.relative_to(full) for p in (package / "jit").rglob("*") if p.is_file())
# Sources the modules compile and what they include: nvcc -M on 0.7.2.post1 found only the
# FlashInfer headers, csrc's own, tvm-ffi's and the vendored CCCL (which precedes the toolkit's).
specs = (gen_sampling_module(), gen_topk_module())
for source in (s for spec in specs for s in spec.sources):
    keep.add(Path(source).resolve().relative_to(full))
data = package / "data"
keep.update(p.relative_to(full) for p in data.glob("csrc/*.h"))
keep.update(p.relative_to(full) for p in data.glob("csrc/*.cuh"))
for tree in ("include", "csrc/cake_sampling", "cccl/cub/cub", "cccl/libcudacxx/include",
             "cccl/thrust/thrust"):
    keep.update(p.relative_to(full) for p in (data / tree).rglob("*") if p.is_file())
for path in list(keep):  # every package on the way, so that the kept modules import
    for parent in path.parents:
        if (full / parent / "__init__.py").exists():
            keep.add(parent / "__init__.py")
keep.update(p.relative_to(full) for p in full.iterdir() if p.name.endswith(".dist-info"))
out = Path(os.environ["OUTDIR"])
(out / "scratch" / "keep.json").write_text(json.dumps(sorted(map(str, keep))))
print(f"full package: flashinfer {flashinfer.__version__}, keeping {len(keep)} files")
assert env.FLASHINFER_CSRC_DIR.is_dir() and cake_sampling.load_manifest()
EOF

# Copy the kept files of flashinfer, and the two dependencies whole.
(cd "$full" && python3 -c 'import json, sys; print("\n".join(json.load(open(sys.argv[1]))))' \
    "$dir/scratch/keep.json" | tar -cf - -T -) | tar -xf - -C "$dir/site"
(cd "$full" && tar -cf - tvm_ffi apache_tvm_ffi-*.dist-info cuda cuda_tile-*.dist-info \
    $(ls -d cutile_cache 2>/dev/null)) | tar -xf - -C "$dir/site"
find "$dir/site" -name __pycache__ -prune -exec rm -rf {} +

# The check: the trimmed package imports as far as the full one and its JIT specs write their
# ninja files (the compile itself needs nvcc and curand's headers: the GPU machine's).
check() { # site folder, workspace
    FLASHINFER_WORKSPACE_BASE=$2 FLASHINFER_CUDA_ARCH_LIST=9.0a PYTHONPATH=$probe:$1 \
        "$py" - <<'EOF' 2>&1 | grep -v 'INFO - \|^$' | tail -n 3
import flashinfer
import flashinfer.sampling as fi
from flashinfer.jit.cake_sampling import gen_cake_sampling_module
from flashinfer.jit.sampling import gen_sampling_module
from flashinfer.jit.topk import gen_topk_module

names = []
for spec in (gen_sampling_module(), gen_topk_module(), gen_cake_sampling_module()):
    spec.write_ninja()
    missing = [s for s in spec.sources if not s.exists()]
    assert not missing, missing
    names.append(spec.name)
print("flashinfer", flashinfer.__version__, "samplers:", fi.sampling_from_logits.__name__,
      fi.top_k_top_p_sampling_from_logits.__name__,
      flashinfer.cake_top_k_top_p_sampling_from_probs.__name__, "ninja:", " ".join(names))
EOF
}
echo "full:    $(check "$full" "$dir/scratch/ws_full")"
echo "trimmed: $(check "$dir/site" "$dir/scratch/ws_site")"
# Prebuilt modules, if any: DIR/aot/<name>/<name>.so (a GPU call's aot.tar, or built here with
# nvcc 13, curand's headers and a stub libcuda.so, see docs/performance.md) load without a build.
for so in "$dir"/aot/*/*.so; do
    [ -f "$so" ] || continue
    name=$(basename "$(dirname "$so")")
    mkdir -p "$dir/site/flashinfer/data/aot/$name" && cp "$so" "$dir/site/flashinfer/data/aot/$name/"
    echo "prebuilt: $name"
done
rm -f "$dir/site.tar.xz"
XZ_OPT="-T0 -6" tar -C "$dir/site" -cJf "$dir/site.tar.xz" .
du -sh "$dir/site" "$dir/site.tar.xz"

# FlashInfer 0.6.9 beside it, once its sampling module is prebuilt (DIR/aot069/sampling/
# sampling.so, from peers_prebuild_job.sh): its Python package without the kernel sources
# (a prebuilt module needs none; 57 MB of the wheel's 63), tvm-ffi and cuda-tile (the
# versions 0.7.2.post1 takes, above), as DIR/site069.tar.xz (about 3 MB).
if [ -f "$dir/aot069/sampling/sampling.so" ]; then
    download 3.12 "$dir/wheels069" flashinfer-python==0.6.9
    rm -rf "$dir/site069" && mkdir -p "$dir/site069"
    python3 -m zipfile -e "$dir"/wheels069/flashinfer_python-0.6.9-*.whl "$dir/site069"
    rm -rf "$dir"/site069/flashinfer/data/{csrc,cutlass,include,spdlog} "$dir"/site069/build_*.py
    (cd "$dir/site" && tar -cf - tvm_ffi apache_tvm_ffi-*.dist-info cuda cuda_tile-*.dist-info) |
        tar -xf - -C "$dir/site069"
    mkdir -p "$dir/site069/flashinfer/data/aot/sampling"
    cp "$dir/aot069/sampling/sampling.so" "$dir/site069/flashinfer/data/aot/sampling/"
    PYTHONPATH=$probe:$dir/site069 FLASHINFER_CUDA_ARCH_LIST=9.0a "$py" -c '
import flashinfer
from flashinfer.jit.sampling import gen_sampling_module
spec = gen_sampling_module()
assert spec.is_aot, spec.aot_path
print("0.6.9 trimmed:", flashinfer.__version__, "prebuilt", spec.name)' 2>&1 | tail -n 1
    rm -f "$dir/site069.tar.xz"
    XZ_OPT="-T0 -6" tar -C "$dir/site069" -cJf "$dir/site069.tar.xz" .
    du -sh "$dir/site069" "$dir/site069.tar.xz"
fi
