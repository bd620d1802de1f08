#!/bin/bash
# Issue 36 item 7 device job (one GPU): first calls of stock compiled and fused generate,
# each pair STARTED TOGETHER on the one GPU (the same host load for both), each run a fresh
# process with fresh Inductor and Triton caches; then tests/test_gpu_compile_ahead.py.
#   OUT=/tmp/out bash benchmarks/jobs/first_call_job.sh --budget 500 [--batches "1,16,64 8"]
# Writes $OUT/first_call/{summary.txt,<run>.log,<run>.json.gz,gpu_tests.log}. TESTS=0: no
# tests (the pairs then keep no time for them). FLASHSAMPLING_* variables pass through to
# both runs of a pair (stock ignores them) and are written to env.txt; the hand-off A/B
# (docs/hf.md; the default, late, against now), B = 1 pairs:
#   FLASHSAMPLING_COMPILE_AHEAD_HANDOFF=now TESTS=0 OUT=/tmp/out \
#       bash benchmarks/jobs/first_call_job.sh --budget 270 --batches "1 1 1"
budget=500
batches="1,16,64 8"
cd "$(dirname "$0")/../.."  # (the repository root, from anywhere)
source benchmarks/jobs/device_job_lib.sh
parse_budget_batches "$@"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}/first_call; mkdir -p "$O"; S=$O/summary.txt
if ! python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "no CUDA GPU: nothing run" | tee "$S"; exit 0
fi
{ nvidia-smi -L; nproc; python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"
  cat COMMIT 2>/dev/null; env | grep FLASHSAMPLING; } > "$O/env.txt" 2>&1
# the seconds each pair may take: 1,16,64 ~ 2 compiles of 45-75 s each when run together
pair_limit() { case "$1" in *,*) echo 240 ;; *) echo 95 ;; esac; }
pair=0
for b in $batches; do
    pair=$((pair + 1))
    limit=$(cap "$(pair_limit "$b")" "$([ "${TESTS:-1}" = 0 ] && echo 5 || echo 100)")
    name=b${b//,/_}
    # (a batch list given again, e.g. "1 1 1": each pair keeps its own logs)
    [ -e "$O/${name}_stock.log" ] && name=${name}_pair$pair
    if [ "$limit" -lt 60 ]; then echo "$name: no time left ($limit s)" >> "$S"; continue; fi
    say "pair B=$b, limit $limit s"
    pids=()
    for config in hf_stock hf_fused; do
        run=$O/${name}_${config#hf_}
        mkdir -p "$run.inductor" "$run.triton"
        TORCHINDUCTOR_CACHE_DIR=$run.inductor TRITON_CACHE_DIR=$run.triton \
            timeout -k 5 "$limit" python3 benchmarks/profile_first_call.py --child "$config" \
            --batch "$b" --top-k 50 --timeline "$run.json.gz" > "$run.log" 2>&1 &
        pids+=($!)
    done
    t=$(date +%s)
    for i in 0 1; do wait "${pids[$i]}"; echo "${name} $([ $i = 0 ] && echo stock || echo fused): rc=$? after $(($(date +%s) - t)) s" >> "$S"; done
    rm -rf "$O"/*.inductor "$O"/*.triton
    grep -h "^== hf_" "$O/${name}_stock.log" "$O/${name}_fused.log" >> "$S"
done
limit=$(cap 200 5)
if [ "${TESTS:-1}" = 0 ]; then
    echo "gpu_tests: not asked (TESTS=0)" >> "$S"
elif [ "$limit" -ge 60 ]; then
    say "tests/test_gpu_compile_ahead.py, limit $limit s"
    t=$(date +%s)
    timeout -k 5 "$limit" python3 -m pytest -q -p no:xdist -p no:cacheprovider -m gpu -rA \
        tests/test_gpu_compile_ahead.py > "$O/gpu_tests.log" 2>&1
    echo "gpu_tests: rc=$? wall $(($(date +%s) - t)) s" >> "$S"
    tail -14 "$O/gpu_tests.log" | grep -E "PASS|FAIL|passed|failed" >> "$S"
else
    echo "gpu_tests: no time left ($limit s)" >> "$S"
fi
say done; cat "$S"
