"""Power, SM clock and energy per call of the fused sampler and cuBLAS under sustained load.

Why this exists. From B = 128 up, an H200 runs every provider, cuBLAS's matmul included, at
its 700 W power limit, with the SM clock pulled down to whatever fits under it (the driver's
"SW power cap" reason). There a call's time is its energy over the limit, so the fused op's
ratio to the matmul is the ratio of their energies: the matmul's work plus the noise's (a
Philox evaluation per four tokens and a logarithm per token) against the matmul's alone.
``fused_greedy`` is the same kernel at T = 0, which draws no noise: fused minus fused_greedy
is what the noise costs, in time and in millijoules.

For each shape, batch size and provider: the do_bench median (as bench_sampling.py), then
``--seconds`` of back-to-back calls (``--graph-calls N``: CUDA-graph replays of N calls, whose
loop the host cannot slow down: eager truncating calls are host-bound there) while
``nvidia-smi`` samples power and SM clock every 100 ms; energy per call = mean power x wall
time per call of that loop. nvidia-smi's power reading trails the load by about a second (a
1 s loop read 500-560 W where 2 s loops read 690-697 W on the same H200), so keep
``--seconds`` at 2 or more. Prints a table and writes ``power_draw_<gpu>_<date>.csv`` into
``--out-dir``.

    python benchmarks/power_draw.py              # D = 2048 and 4096, B = 64, 128, 256: ~2 min
    python benchmarks/power_draw.py --shapes 8192x128256 --batches 128

Needs a CUDA GPU and ``nvidia-smi`` (without CUDA it says so and exits 0).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime
import functools
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a plain checkout, as bench_sampling.py

from benchmarks.bench_sampling import parse_ints, parse_shapes, slug  # noqa: E402

PROVIDERS = ("matmul", "fused", "fused_greedy")
# The truncating forms of bench_sampling's providers (``--providers``), Python-scalar knobs.
TRUNCATING = {
    "fused_topk50": dict(top_k=50),
    "fused_topk50_topp09": dict(top_k=50, top_p=0.9),
    "fused_topp09": dict(top_p=0.9),
    "fused_minp01": dict(min_p=0.1),
}
COLUMNS = (
    "gpu", "torch", "triton", "date", "D", "V", "B", "provider", "median_us", "loop_us",
    "power_w", "power_limit_w", "sm_mhz", "max_sm_mhz", "reasons", "energy_mj",
    "time_ratio_to_matmul", "energy_ratio_to_matmul",
)  # fmt: skip
SMI_FIELDS = "power.draw,clocks.sm,clocks_event_reasons.active"


def step(provider: str, weight: torch.Tensor, graph_calls: int = 0):
    """One call of ``provider`` on a hidden batch; with ``graph_calls`` a seed tensor and bf16
    logits (as bench_sampling's graph timing: capturable)."""
    from flashsampling_inductor import fused_sample

    if provider == "matmul":
        return lambda hidden: hidden @ weight.T
    temperature = 0.0 if provider == "fused_greedy" else 1.0
    knobs = dict(TRUNCATING.get(provider, {}))
    if graph_calls:
        knobs.update(seed=torch.tensor(7, device="cuda"), logits_dtype=torch.bfloat16)
    return lambda hidden: fused_sample(hidden, weight, temperature=temperature, **knobs)


def replayed(call, graph_calls: int):
    """``graph_calls`` calls of ``call`` captured in one CUDA graph (after warm-up): its
    replay, which the host launches in one go, so the loop measures the GPU, not Python."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(graph_calls):
            call()
    return graph.replay


@functools.cache
def smi_gpu() -> str:
    """The GPU that CUDA calls device 0, as nvidia-smi's ``-i`` names it: by its UUID, since
    nvidia-smi ignores CUDA_VISIBLE_DEVICES (its "-i 0" is the host's first GPU, which on a
    shared host read an idle card: 78-124 W at 345 MHz beside a loaded one, 2026-11-28)."""
    candidates = []
    with contextlib.suppress(Exception):
        candidates.append(f"GPU-{torch.cuda.get_device_properties(0).uuid}")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    candidates += [visible] if visible else []
    for gpu in candidates:
        probe = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", gpu],
            capture_output=True, text=True,
        )  # fmt: skip
        if probe.returncode == 0:
            return gpu
    return "0"


def smi(query: str) -> list[str]:
    line = subprocess.run(
        ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits", "-i", smi_gpu()],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return [field.strip() for field in line.strip().split(",")]


def sustained(fn, seconds: float, calls_each: int = 1) -> tuple[float, list[list[str]]]:
    """Wall time per call over ``seconds`` of back-to-back calls (``calls_each`` calls a
    ``fn``), and nvidia-smi's samples from that loop (the first half second left out: the
    clock settles)."""
    sampler = subprocess.Popen(
        ["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits",
         "-i", smi_gpu(), "-lms", "100"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    start = time.monotonic()
    calls = 0
    while time.monotonic() - start < seconds:
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        calls += 20
    elapsed = time.monotonic() - start
    calls *= calls_each
    sampler.terminate()
    lines = sampler.communicate()[0].strip().splitlines()
    samples = [[f.strip() for f in line.split(",")] for line in lines]
    samples = [s for s in samples if len(s) == 3][5:-1]  # settled, and not the loop's end
    return elapsed / calls * 1e6, samples


def summarize(samples: list[list[str]]) -> tuple[float, float, str]:
    """Mean power (W), median SM clock (MHz) and the throttle reasons seen; NaN where
    nvidia-smi gave no readable sample (a loop too short, or "[N/A]" fields)."""
    readings = []
    for power, clock, reason in samples:
        try:
            readings.append((float(power), float(clock), reason))
        except ValueError:
            continue
    if not readings:
        return float("nan"), float("nan"), "no samples"
    return (
        statistics.fmean(r[0] for r in readings),
        statistics.median(r[1] for r in readings),
        "|".join(sorted({r[2] for r in readings})),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--shapes",
        type=parse_shapes,
        default=((2048, 151936), (4096, 151936)),
        help="DxV list (default 2048x151936,4096x151936)",
    )
    parser.add_argument(
        "--batches", type=parse_ints, default=(64, 128, 256), help="B list (default 64,128,256)"
    )
    parser.add_argument(
        "--providers",
        type=lambda text: tuple(text.split(",")),
        default=PROVIDERS,
        help=f"matmul first, then any of {', '.join(PROVIDERS[1:] + tuple(TRUNCATING))}"
        " (default: matmul,fused,fused_greedy)",
    )
    parser.add_argument(
        "--logit-std", type=float, default=1.0,
        help="the logits' std (default 1, flat rows); 5 as bench_sampling's --logit-std 5 for"
        " the top-p / min-p providers, whose kept set a flat row makes huge",
    )  # fmt: skip
    parser.add_argument(
        "--seconds", type=float, default=2.5, help="sustained-load loop per point (default 2.5)"
    )
    parser.add_argument(
        "--graph-calls", type=int, default=0,
        help="> 0: time and load with CUDA-graph replays of this many calls each (a seed tensor,"
        " bf16 logits), not eager calls, whose host time bounds the truncating calls' loops",
    )  # fmt: skip
    parser.add_argument(
        "--out-dir", type=Path, default=REPO / "benchmarks" / "results", help="folder of the CSV"
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("power_draw.py measures a CUDA GPU; there is none here: nothing run", flush=True)
        return 0
    import triton

    now = datetime.datetime.now(datetime.timezone.utc)
    gpu = torch.cuda.get_device_name()
    meta = (gpu, torch.__version__, triton.__version__, now.strftime("%Y-%m-%d %H:%M UTC"))
    power_limit, max_clock = smi("power.limit,clocks.max.sm")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    path = args.out_dir / f"power_draw_{slug(gpu)}_{now.strftime('%Y%m%d-%H%M')}.csv"
    print(
        f"{meta}, nvidia-smi -i {smi_gpu()}, power limit {power_limit} W,"
        f" max SM clock {max_clock} MHz\nwriting {path}"
    )
    print(f"{'D':>5} {'B':>4} {'provider':<13} {'us':>7} {'loop us':>8} {'W':>6} {'MHz':>5}"
          f" {'mJ':>6} {'t/mm':>5} {'E/mm':>5}  reasons")  # fmt: skip
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(COLUMNS)
        for dim, vocab in args.shapes:
            weight = torch.randn(vocab, dim, device="cuda", dtype=torch.bfloat16)
            weight *= args.logit_std * dim**-0.5
            for batch in args.batches:
                hidden = torch.randn(batch, dim, device="cuda", dtype=torch.bfloat16)
                base = None
                for provider in args.providers:
                    call = functools.partial(step(provider, weight, args.graph_calls), hidden)
                    call()  # compile
                    calls_each = max(1, args.graph_calls)
                    if args.graph_calls:
                        call = replayed(call, args.graph_calls)
                    median = triton.testing.do_bench(call, return_mode="median") / calls_each
                    loop_us, samples = sustained(call, args.seconds, calls_each)
                    power, clock, reasons = summarize(samples)
                    energy = power * loop_us * 1e-3  # W x us = uJ; in mJ
                    base = base or (median * 1e3, energy)
                    row = (
                        *meta, dim, vocab, batch, provider, f"{median * 1e3:.2f}",
                        f"{loop_us:.2f}", f"{power:.1f}", power_limit, f"{clock:.0f}",
                        max_clock, reasons, f"{energy:.2f}",
                        f"{median * 1e3 / base[0]:.4f}", f"{energy / base[1]:.4f}",
                    )  # fmt: skip
                    writer.writerow(row)
                    file.flush()
                    print(f"{dim:>5} {batch:>4} {provider:<13} {median * 1e3:7.1f} {loop_us:8.1f}"
                          f" {power:6.1f} {clock:5.0f} {energy:6.1f} {row[-2][:5]:>5}"
                          f" {row[-1][:5]:>5}  {reasons}", flush=True)  # fmt: skip
            del weight
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
