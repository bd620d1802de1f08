#!/bin/bash
# One GPU-machine call (<= 150 s on one GPU): the backend's deterministic mode (backend.py)
# checked across fresh processes (generate at B = 8 with the mode, with Inductor's timings
# inverted, and the default (mode off) as the control; tests/test_gpu_determinism.py),
# then its cost: B = 8 and 64, mode on / off, timed in turns one process at a time.
# Writes $OUT/determ/ (default ./determ). Not run yet (written 2026-11-28, no device time left).
cd "$(dirname "$0")/../.."
O="${OUT:-.}/determ"; mkdir -p "$O"
export PYTHONPATH=$PWD
export TORCHINDUCTOR_COMPILE_THREADS=4
export FLASHSAMPLING_DETERMINISTIC=1  # (the mode is opt-in; OFF below is the default)
{ nvidia-smi -L; python3 -c 'import torch,triton,transformers;print(torch.__version__,triton.__version__,transformers.__version__)'; } > "$O/env.txt" 2>&1
start=$SECONDS
run() {  # tag, "VAR=value ..." (or -), part, extra args...
  local tag=$1 envs=$2 part=$3; shift 3
  [ "$envs" = - ] && envs=""
  local c=$(mktemp -d)
  env $envs TRITON_CACHE_DIR=$c/triton TORCHINDUCTOR_CACHE_DIR=$c/inductor \
    timeout 135 python3 benchmarks/probes/token_repro.py $part --tag $tag --out "$O" "$@" > "$O/${part}_${tag}.log" 2>&1
  echo "$part $tag [$envs] rc=$? at $((SECONDS-start)) s" >> "$O/summary.txt"
  (cd $c && find . -name '*.best_config' | tar -czf "$O/best_configs_$tag.tar.gz" -T - 2>/dev/null)
  rm -rf "$c"
}
INV=TORCHINDUCTOR_DISTORT_BENCHMARKING_RESULT=inverse
OFF=FLASHSAMPLING_DETERMINISTIC=0
run f1 - generate & p1=$!
run fi $INV generate & p2=$!
run ci "$OFF $INV" generate & p3=$!
( timeout 135 python3 -m pytest -q -x -p no:cacheprovider tests/test_gpu_determinism.py \
    > "$O/test_gpu_determinism.log" 2>&1; echo "pytest test_gpu_determinism rc=$? at $((SECONDS-start)) s" >> "$O/summary.txt" ) & p4=$!
declare -A pid
run ton - generate --time-calls 5 & pid[ton]=$!
run toff $OFF generate --time-calls 5 & pid[toff]=$!
run ton64 - generate --batch 64 --time-calls 5 & pid[ton64]=$!
run toff64 $OFF generate --batch 64 --time-calls 5 & pid[toff64]=$!
# Timing turns on an otherwise idle GPU: after the other runs end and every timed run is
# compiled, one process at a time, fix and control alternating.
wait $p1 $p2 $p3 $p4
for tag in ton toff ton64 toff64; do
  while [ ! -e "$O/ready_$tag" ] && kill -0 ${pid[$tag]} 2>/dev/null && [ $((SECONDS-start)) -lt 125 ]; do sleep 0.2; done
done
echo "timing turns start at $((SECONDS-start)) s" >> "$O/summary.txt"
for turn in 0 1; do
  for tag in ton toff ton64 toff64; do
    [ -e "$O/ready_$tag" ] || continue
    touch "$O/go_${tag}_$turn"
    while [ ! -e "$O/done_${tag}_$turn" ] && kill -0 ${pid[$tag]} 2>/dev/null && [ $((SECONDS-start)) -lt 133 ]; do sleep 0.05; done
  done
done
wait
timeout 10 python3 benchmarks/probes/token_repro.py compare --out "$O" > "$O/compare.txt" 2>&1
grep -h "turn\|call [01] (" "$O"/generate_t*.log > "$O/timing.txt"
cat "$O/summary.txt" "$O/timing.txt" "$O/compare.txt" | head -80
