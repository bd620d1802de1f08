"""Kernel time per call, kernel by kernel, of generate's knob forms beside plain sampling:
``fused_sample`` under torch.profiler (eager calls; a kernel launched as a programmatic
dependent counts its wait too), bf16-rounded logits, std-5 rows, a fixed seed.

    python benchmarks/probes/knob_forms_profile.py [--shape 2048x151936] [--batches 1,16]

Forms (``module_ab.knobs``): plain (T = 0.7), k50 (top_k=50, a Python int), k50off (top-k
50 with top-p and min-p at their off values, all 0-d tensors: what ``hf.enable``'s generate
passes) and off (the same tensors at their off values). CUDA only.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab_rounds import kernel_times  # noqa: E402  (this folder)
from module_ab import knobs  # noqa: E402  (this folder)

from flashsampling_inductor import fused_sample  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="2048x151936")
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--calls", type=int, default=10)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("knob_forms_profile.py needs a CUDA GPU: nothing to run here")
        return
    hidden_size, vocab = map(int, args.shape.split("x"))
    torch.manual_seed(0)
    weight = torch.randn(vocab, hidden_size, device="cuda", dtype=torch.bfloat16)
    print(f"{torch.cuda.get_device_name()}, D = {hidden_size}, V = {vocab}, bf16 logits")
    for batch in map(int, args.batches.split(",")):
        hidden = torch.randn(batch, hidden_size, device="cuda", dtype=torch.bfloat16)
        hidden *= 5 / hidden_size**0.5
        print(f"== B={batch}")
        for form in ("plain", "k50", "k50off", "off"):
            arguments = dict(knobs(form), logits_dtype=torch.bfloat16)

            def call(hidden=hidden, arguments=arguments):
                return fused_sample(hidden, weight, seed=7, **arguments)

            times = kernel_times(call, args.calls)
            print(f"{form}: {sum(t for _, t in times):.1f} us in kernels")
            for name, us in times:
                print(f"   {us:7.1f} us  {name}")


if __name__ == "__main__":
    main()
