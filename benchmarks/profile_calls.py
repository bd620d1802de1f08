"""Where the time of one ``fused_sample`` call goes: each kernel's device time
(torch.profiler, mean over calls) beside the whole call replayed from a CUDA graph and the
cuBLAS matmul alone, so that the launch gaps between kernels show as the difference.

    python benchmarks/profile_calls.py [--shapes 2048x151936] [--batches 1,64]
                                       [--modes plain,topk50,topk50_topp09,topp09,minp01]
                                       [--logits bf16|fp32]

Logits have std 5 (~3.6 nats, as bench_sampling's --logit-std 5): no row leaves the fast
path. Needs a CUDA GPU (without one it says so and exits 0); prints one line per (shape,
batch, mode), writes nothing.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a plain checkout
import flashsampling_inductor as fs  # noqa: E402

MODES = {
    "plain": {},
    "topk50": dict(top_k=50),
    "topk256": dict(top_k=256),
    "topk50_topp09": dict(top_k=50, top_p=0.9),
    "topp09": dict(top_p=0.9),
    "minp01": dict(min_p=0.1),
}


def graph_us(fn) -> float:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return triton.testing.do_bench(graph.replay, warmup=10, rep=60, return_mode="median") * 1e3


def kernel_us(fn, calls: int = 10) -> dict[str, float]:
    """Mean device time per call of each kernel name."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    totals: dict[str, float] = collections.defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name[:28]] += event.device_time / calls
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


def profile_point(
    hidden: torch.Tensor, weight: torch.Tensor, modes: list[str], logits_dtype: torch.dtype | None
) -> None:
    matmul = graph_us(lambda: hidden @ weight.T)
    print(f"--- D={weight.shape[1]} B={hidden.shape[0]} cuBLAS matmul {matmul:.1f} us", flush=True)
    for mode in modes:

        def call(knobs=MODES[mode]):
            return fs.fused_sample(
                hidden, weight, temperature=1.0, logits_dtype=logits_dtype, **knobs
            )

        total = graph_us(call)
        kernels = " ".join(f"{name}={us:.1f}" for name, us in kernel_us(call).items())
        print(f"{mode:>14s} {total:7.1f} us x{total / matmul:.3f} | {kernels}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", default="2048x151936", help="DxV list (default 2048x151936)")
    parser.add_argument("--batches", default="1,64", help="B list (default 1,64)")
    parser.add_argument(
        "--modes",
        default="plain,topk50,topk50_topp09,topp09,minp01",
        help="calls to profile (default: all of plain,topk50,topk50_topp09,topp09,minp01)",
    )
    parser.add_argument(
        "--logits", choices=("bf16", "fp32"), default="bf16",
        help="the logits the calls sample: bf16 (what a bf16 LM head's rewrite passes) or fp32",
    )  # fmt: skip
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("profile_calls.py profiles CUDA kernels; there is no CUDA GPU here: nothing run")
        return
    logits_dtype = torch.bfloat16 if args.logits == "bf16" else None
    print(
        torch.cuda.get_device_name(),
        f"torch {torch.__version__}, triton {triton.__version__}, {args.logits} logits",
    )
    for shape in args.shapes.split(","):
        dim, vocab = map(int, shape.split("x"))
        weight = torch.randn(vocab, dim, device="cuda", dtype=torch.bfloat16) * 5 * dim**-0.5
        for batch in map(int, args.batches.split(",")):
            hidden = torch.randn(batch, dim, device="cuda", dtype=torch.bfloat16)
            profile_point(hidden, weight, args.modes.split(","), logits_dtype)


if __name__ == "__main__":
    main()
