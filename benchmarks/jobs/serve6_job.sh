#!/usr/bin/env bash
# serve6's device job (issue 35 item 3, the serving grid with stock compiled): one shape on one
# GPU, SHAPE=qwen3-1.7b or llama-3.1-8b (env var or $1), within TOTAL_S (default 540) s.
# bench_serving.py at B = 16, 64, 128, 256: stock (its own compile config, its warmup, CUDA
# graphs; scans kept whole where Inductor's split scan fails) against fused, interleaved,
# REPEATS (3) timed runs each after an untimed run of each configuration at every B (WARM=every:
# captures of a B's new sizes stay out of the timed runs; the compiles happen once, at B = 16,
# and serve every B); at least MIN_REQUESTS (48) requests a cell, so B = 16 gets 3 x B. The
# script's deadline stops starting cells CELL_STOP_S (400) s in; SIGINT at TOTAL_S - 20 s makes
# it write what ran. PROFILE_B=64: profile that B's cell (each configuration, 2 s of its steps)
# whether it meets the goal or not, instead of the smallest B that misses. Everything under
# $OUT; the CSV printed at the end.
set -u
cd "$(dirname "$0")/../.."
shape=${1:-${SHAPE:-qwen3-1.7b}}
budget=${TOTAL_S:-540}
source benchmarks/jobs/device_job_lib.sh
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}
mkdir -p "$O"
if ! python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "no CUDA: nothing run" | tee "$O/summary.txt"
    exit 0
fi
{ nvidia-smi -L; python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"
  cat COMMIT 2>/dev/null || git log -1 --format=%H 2>/dev/null; } > "$O/env.txt" 2>&1
say "bench_serving $shape, $(left) s left"
timeout -s INT -k 15 "$(cap 600 20)" python3 benchmarks/bench_serving.py --shapes "$shape" \
    --concurrency "${CONCURRENCY:-16,64,128,256}" --repeats "${REPEATS:-3}" --warm "${WARM:-every}" \
    --min-requests "${MIN_REQUESTS:-48}" --stock-compile default --budget-s "${CELL_STOP_S:-400}" \
    --profile-s 2 --profile-at 1 --profile-concurrency "${PROFILE_B:-0}" --profile-rows 30 \
    --out "$O" > "$O/bench_serving_$shape.log" 2>&1
say "bench_serving rc=$?"
grep -E "split scan|scans kept|manager made|run [0-9]+:|rewrites|deadline|failed|Error|interrupted" \
    "$O/bench_serving_$shape.log" | grep -v Warning | tail -60
cat "$O"/bench_serving_*.csv
