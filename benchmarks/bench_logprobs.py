"""What ``return_logprobs`` costs: one ``fused_sample`` call with and without it, replayed
from a CUDA graph (``profile_calls.graph_us``), with each kernel's device time.

    python benchmarks/bench_logprobs.py [--shapes 4096x151936] [--batches 1,64,256]
                                        [--modes plain,raw,processed,plain_triton]

Modes: ``plain`` (no logprobs), ``raw`` / ``processed`` (``return_logprobs``), and
``plain_triton``: the plain call on the Triton stage 1 where the default is Hopper's Gluon
one (logprob calls take the Triton kernel), so the logprobs' own cost shows apart from the
change of kernel. ``topk50`` and ``topk50_raw`` / ``topk50_processed``: the same with
top_k=50. bf16 hidden and weight, logits of std 5, T = 1, a fixed 0-d device seed. Needs a
CUDA GPU (without one it says so and exits 0); prints one line per (shape, batch, mode).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a plain checkout
from profile_calls import graph_us, kernel_us  # noqa: E402

import flashsampling_inductor as fs  # noqa: E402
from flashsampling_inductor.dispatch import default_config, triton_fused_sample  # noqa: E402
from flashsampling_inductor.params import SamplingParams  # noqa: E402

MODES = ("plain", "raw", "processed", "plain_triton", "topk50", "topk50_raw", "topk50_processed")


def call_for(mode: str, hidden: torch.Tensor, weight: torch.Tensor, seed: torch.Tensor):
    """The call of ``mode``, or None where it would repeat ``plain``."""
    top_k = 50 if mode.startswith("topk50") else None
    logprobs = mode.rsplit("_", 1)[-1] if mode.endswith(("raw", "processed")) else None
    if mode == "plain_triton":
        config = default_config(hidden.shape[0], hidden.shape[1], hidden.device)
        if not config.warp_specialized_rows:
            return None
        config = dataclasses.replace(config, warp_specialized_rows=0)
        params = SamplingParams(None, 1.0, seed, 0, 1, torch.bfloat16)
        return lambda: triton_fused_sample(hidden, weight, None, params, config)
    return lambda: fs.fused_sample(
        hidden, weight, temperature=1.0, seed=seed, top_k=top_k,
        logits_dtype=torch.bfloat16, return_logprobs=logprobs,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", default="4096x151936", help="DxV list (default 4096x151936)")
    parser.add_argument("--batches", default="1,64,256", help="B list (default 1,64,256)")
    parser.add_argument(
        "--modes", default="plain,raw,processed,plain_triton", help=f"of {', '.join(MODES)}"
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_logprobs.py times CUDA kernels; there is no CUDA GPU here: nothing run")
        return
    print(torch.cuda.get_device_name(), f"torch {torch.__version__}, triton {triton.__version__}")
    seed = torch.tensor(0, device="cuda")
    for shape in args.shapes.split(","):
        dim, vocab = map(int, shape.split("x"))
        weight = torch.randn(vocab, dim, device="cuda", dtype=torch.bfloat16) * 5 * dim**-0.5
        for batch in map(int, args.batches.split(",")):
            hidden = torch.randn(batch, dim, device="cuda", dtype=torch.bfloat16)
            for mode in args.modes.split(","):
                call = call_for(mode, hidden, weight, seed)
                if call is None:
                    continue
                total = graph_us(call)
                kernels = " ".join(f"{name}={us:.1f}" for name, us in kernel_us(call).items())
                print(f"D={dim} B={batch:>3d} {mode:>16s} {total:7.1f} us | {kernels}", flush=True)


if __name__ == "__main__":
    main()
