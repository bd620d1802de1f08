# Sourced by the one-call device scripts (*_device_run.sh, *_job.sh): a clock against the
# call's budget, and the TP jobs' set-up. A call is cut at its limit, so every step asks
# how many seconds are left before it starts, and gives up cleanly when too few are.
#
#   budget=200; source benchmarks/jobs/device_job_lib.sh
#   timeout "$(cap 60 40)" python3 ...   # at most 60 s, keeping 40 s for what follows

job_t0=$(date +%s)
elapsed() { echo $(($(date +%s) - job_t0)); }
left() { echo $((budget - $(elapsed))); }
# cap MAX [RESERVE]: the seconds a step may take: MAX, or what is left after RESERVE
cap() { local l=$(($(left) - ${2:-0})); [ "$l" -gt "$1" ] && l=$1; echo "$l"; }
say() { echo "== $(elapsed) s: $*"; }

# parse_budget_batches ARGS...: the single-GPU scripts' two options (--budget S, --batches LIST)
parse_budget_batches() {
    while [ $# -gt 0 ]; do
        case "$1" in
            --budget) budget=$2; shift ;;
            --batches) batches=$2; shift ;;
            *) echo "unknown argument: $1" >&2; exit 2 ;;
        esac
        shift
    done
}

# job_start NAME: a single-GPU job's output folder ($O = $OUT/NAME, summary $S headed by the
# job's name and commit), the machine in env.txt (and the summary), and an exit (0) without
# a CUDA GPU.
job_start() {
    export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
    O=${OUT:-/tmp/out}/$1; mkdir -p "$O"
    S=$O/summary.txt
    { echo "$1 job, $(cat COMMIT 2>/dev/null || git rev-parse HEAD 2>/dev/null)"; nvidia-smi -L; } > "$S" 2>&1
    if ! python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
        echo "no CUDA GPU: nothing run" | tee -a "$S"; exit 0
    fi
    { nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total --format=csv,noheader
      python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; } > "$O/env.txt" 2>&1
    cat "$O/env.txt" >> "$S"
}

# tp_job_start DIR MIN_GPUS: the TP jobs' output folder ($O, summary $S), the machine in
# env.txt, and an exit (0) when fewer than MIN_GPUS GPUs are present. Never NVLink multicast.
tp_job_start() {
    export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    O=${OUT:-/tmp/out}/$1; mkdir -p "$O"
    S=$O/summary.txt
    GPUS=$(python3 -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
    if [ "$GPUS" -lt "$2" ]; then echo "needs $2 CUDA GPUs (found $GPUS): nothing run" | tee "$S"; exit 0; fi
    { nvidia-smi -L; nvidia-smi --query-gpu=power.limit,clocks.max.sm --format=csv
      python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"
      cat COMMIT 2>/dev/null; } > "$O/env.txt" 2>&1
    echo "GPUs: $GPUS" >> "$S"
}

# timed_step LABEL LOG MIN LIMIT CMD...: CMD under LIMIT seconds into LOG when LIMIT >= MIN,
# then "LABEL: rc=... wall ... s" (or why it did not run) into the summary $S
timed_step() {
    local label=$1 log=$2 min=$3 limit=$4 t
    shift 4
    if [ "$limit" -lt "$min" ]; then echo "$label: no time left ($limit s)" >> "$S"; return; fi
    t=$(date +%s)
    timeout -k 5 "$limit" "$@" > "$log" 2>&1
    echo "$label: rc=$? wall $(($(date +%s) - t)) s" >> "$S"
}

# tp_bench LABEL LIMIT SHAPES PROVIDERS [BENCH ARGS...]: bench_tp.py on every GPU ($GPUS, from
# tp_job_start), CUDA-graph timing, into $O/bench_tp.log and its CSV; the step's line and each
# provider's row (first occurrence, in the run's order) into the summary $S
tp_bench() {
    local label=$1 limit=$2 shapes=$3 providers=$4
    shift 4
    timed_step "$label" "$O/bench_tp.log" 1 "$limit" python3 -m torch.distributed.run \
        --nproc_per_node="$GPUS" benchmarks/bench_tp.py --shapes "$shapes" --modes graph \
        --providers "$providers" --out-dir "$O" "$@"
    grep -E "^D=" "$O/bench_tp.log" | awk '!seen[$0]++' | head -64 >> "$S"
}

# tp_test LABEL LOG MIN LIMIT EXPRESSION: tests/test_tp_gpu.py's multi-GPU tests matching -k
# EXPRESSION under LIMIT seconds (when >= MIN) into $O/LOG, their verdict lines into $S
tp_test() {
    timed_step "$1" "$O/$2" "$3" "$4" python3 -m pytest -v -s -rA -p no:cacheprovider \
        -m multigpu tests/test_tp_gpu.py -k "$5"
    grep -E "ranks seeded apart|passed|failed|PASSED|FAILED" "$O/$2" | tail -6 >> "$S"
}
