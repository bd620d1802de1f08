"""hf generate's prompt token on the kernels (``op.sample_logits_without_waiting``) against
the reference (``impl="torch"``, as before), in one process, calls interleaved.

Per batch size: the first ``generate`` (compile included, prompt token on the reference
while its kernels compile behind it; the step's Inductor compile dominates), then rounds of
``kernels`` / ``reference`` calls, each ``generate`` timed whole (32-token prompt, its
prefill, ``--new-tokens`` tokens). Prints the median wall time of each and their
difference, and an eager draw alone (``sample_logits`` on [B, V] bf16 logits, top-k as
given, CUDA events over 20 calls, each path). CUDA only.

    python benchmarks/probes/prompt_token_ab.py --batches 1,64 --new-tokens 8 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

import bench_generate as bg  # noqa: E402

import flashsampling_inductor.hf as fs_hf  # noqa: E402
from flashsampling_inductor import ahead, op  # noqa: E402


def _on_reference(logits, **knobs):
    return op.sample_logits(logits, impl="torch", **knobs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", default="qwen3-1.7b")
    parser.add_argument("--batches", default="1,64")
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--top-k", type=int, default=50)
    args = parser.parse_args()
    model = bg.build(args.shape)
    kernels = fs_hf.sample_logits_without_waiting
    for batch in (int(b) for b in args.batches.split(",")):
        prompt = torch.randint(0, 1000, (batch, bg.PROMPT), device=bg.DEVICE)

        def call(prompt=prompt):
            return bg.hf_call(model, "hf_fused", prompt, args.new_tokens, top_k=args.top_k)

        first = bg.timed(call)
        ahead.wait_for_background_compiles()
        times = {"kernels": [], "reference": []}
        for _ in range(args.rounds):
            for name in times:
                fs_hf.sample_logits_without_waiting = (
                    kernels if name == "kernels" else _on_reference
                )
                times[name].append(bg.timed(call))
        fs_hf.sample_logits_without_waiting = kernels
        medians = {name: statistics.median(ts) * 1e3 for name, ts in times.items()}
        logits = (5 * torch.randn(batch, model.config.vocab_size, device=bg.DEVICE)).bfloat16()
        draw = {}
        for name, fn in (("kernels", op.sample_logits), ("reference", _on_reference)):
            for _ in range(3):
                fn(logits, temperature=0.7, top_k=args.top_k)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(20):
                fn(logits, temperature=0.7, top_k=args.top_k)
            end.record()
            torch.cuda.synchronize()
            draw[name] = start.elapsed_time(end) / 20
        print(
            f"{args.shape} B={batch} top_k={args.top_k} new_tokens={args.new_tokens}: first call"
            f" {first:.1f} s; generate median kernels {medians['kernels']:.2f} ms, reference"
            f" {medians['reference']:.2f} ms (diff {medians['reference'] - medians['kernels']:.2f}"
            f" ms); prompt draw alone kernels {draw['kernels'] * 1e3:.1f} us, reference"
            f" {draw['reference'] * 1e3:.1f} us",
            flush=True,
        )


if __name__ == "__main__":
    main()
