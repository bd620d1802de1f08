"""Host time of eager ``sample_logits`` / ``fused_sample`` calls on CUDA (as vLLM calls its
sampler, outside the model's CUDA graphs): per call, the host's time to return (no sync) and
the time with a sync after each call, then a cProfile of the slowest form's calls (the top
functions by own time). CUDA only.

    python benchmarks/probes/eager_host_time.py --batches 1,64
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from flashsampling_inductor import fused_sample, sample_logits  # noqa: E402

FORMS = {"plain": {}, "top_k50": {"top_k": 50}, "top_k50_top_p09": {"top_k": 50, "top_p": 0.9}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", default="1,64")
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    torch.manual_seed(0)
    weight = torch.randn(151936, 2048, device="cuda", dtype=torch.bfloat16) * 0.05
    for batch in (int(b) for b in args.batches.split(",")):
        hidden = torch.randn(batch, 2048, device="cuda", dtype=torch.bfloat16)
        logits = (5 * torch.randn(batch, 151936, device="cuda")).bfloat16()
        calls = {
            "sample_logits": lambda knobs, logits=logits: sample_logits(
                logits, temperature=0.7, **knobs
            ),
            "fused_sample": lambda knobs, hidden=hidden: fused_sample(
                hidden, weight, temperature=0.7, **knobs
            ),
        }
        for entry, call in calls.items():
            for form, knobs in FORMS.items():
                for _ in range(5):
                    call(knobs)
                torch.cuda.synchronize()
                start = time.perf_counter()
                for _ in range(args.calls):
                    call(knobs)
                host = (time.perf_counter() - start) / args.calls
                torch.cuda.synchronize()
                start = time.perf_counter()
                for _ in range(args.calls):
                    call(knobs)
                    torch.cuda.synchronize()
                synced = (time.perf_counter() - start) / args.calls
                print(
                    f"B={batch} {entry} {form}: host {host * 1e6:.0f} us a call,"
                    f" with a sync {synced * 1e6:.0f} us",
                    flush=True,
                )
        if batch == int(args.batches.split(",")[0]):
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(100):
                calls["sample_logits"](FORMS["top_k50"])
            profile.disable()
            torch.cuda.synchronize()
            pstats.Stats(profile).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
