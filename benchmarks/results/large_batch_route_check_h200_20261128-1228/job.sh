#!/bin/bash
# Lead check: does bench_sampling's fused_topk50 take big8's 129-256-row route? new / old / new, one GPU.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
cat COMMIT
args="--shapes 4096x151936 --batches 144,160,256 --providers matmul,fused,fused_topk50 --timing graph"
for run in new old new2; do
  if [ $run = old ]; then pre="import flashsampling_inductor.dispatch as d; d.LARGE_BATCH_GLUON=False;"; else pre=""; fi
  mkdir -p $OUT/$run
  timeout 95 python3 -c "$pre
import runpy, sys; sys.argv=['bench_sampling.py'] + '''$args --out-dir $OUT/$run'''.split(); runpy.run_path('benchmarks/bench_sampling.py', run_name='__main__')" > $OUT/$run/log.txt 2>&1
  echo "== $run rc=$?"; grep -E "^ *4096|ratio|fused" $OUT/$run/log.txt | tail -12
done
