"""A decode step's sampling compiled in torch.compile's default mode (no CUDA graphs: each
kernel launched from the host at every call), stock Inductor against backend="flashsampling":
time a call with a sync after it, and the host's time a call without one. The step is the
LM head then transformers' warpers as public code writes them (temperature, top-k, top-p),
softmax and torch.multinomial. CUDA only.

    python benchmarks/probes/default_mode_step.py --batches 1,64 --forms plain,top_k50
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import flashsampling_inductor as fs  # noqa: E402


def step(hidden, weight, top_k: int, top_p: float):
    logits = F.linear(hidden, weight).float() / 0.7
    if top_k:
        kth = torch.topk(logits, top_k)[0][..., -1, None]
        logits = logits.masked_fill(logits < kth, -float("inf"))
    if top_p < 1.0:
        sorted_logits, sorted_indices = torch.sort(logits, descending=False)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = cumulative <= (1 - top_p)
        remove_sorted[..., -1:] = 0
        remove = remove_sorted.scatter(1, sorted_indices, remove_sorted)
        logits = logits.masked_fill(remove, -float("inf"))
    probs = F.softmax(logits, dim=-1)
    return torch.multinomial(probs, num_samples=1)


FORMS = {"plain": (0, 1.0), "top_k50": (50, 1.0), "top_k50_top_p09": (50, 0.9)}


def timed(call, calls: int, sync_each: bool) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        call()
        if sync_each:
            torch.cuda.synchronize()
    elapsed = (time.perf_counter() - start) / calls
    torch.cuda.synchronize()
    return elapsed * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", default="1,64")
    parser.add_argument("--forms", default="plain,top_k50")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    weight = torch.randn(151936, 2048, device="cuda", dtype=torch.bfloat16) * 0.05
    for form in args.forms.split(","):
        top_k, top_p = FORMS[form]
        compiled = {
            backend: torch.compile(
                lambda h, w, top_k=top_k, top_p=top_p: step(h, w, top_k, top_p),
                backend=backend,
                dynamic=False,
            )
            for backend in ("inductor", "flashsampling")
        }
        for batch in (int(b) for b in args.batches.split(",")):
            hidden = torch.randn(batch, 2048, device="cuda", dtype=torch.bfloat16)
            start = time.perf_counter()
            for fn in compiled.values():
                fn(hidden, weight)
            torch.cuda.synchronize()
            print(
                f"{form} B={batch}: compiled both in {time.perf_counter() - start:.1f} s",
                flush=True,
            )
            report = fs.explain(lambda h, w, k=top_k, p=top_p: step(h, w, k, p), hidden, weight)
            print("  " + str(report).splitlines()[0], flush=True)
            results = {backend: ([], []) for backend in compiled}
            for _ in range(args.rounds):
                for backend, fn in compiled.items():
                    call = lambda fn=fn, hidden=hidden: fn(hidden, weight)  # noqa: E731
                    for _ in range(10):
                        call()
                    results[backend][0].append(timed(call, args.calls, sync_each=True))
                    results[backend][1].append(timed(call, args.calls, sync_each=False))
            line = []
            for backend, (synced, host) in results.items():
                line.append(f"{backend} {min(synced):.0f} us synced / {min(host):.0f} us host")
            ratio = min(results["flashsampling"][0]) / min(results["inductor"][0])
            print(
                f"  {form} B={batch}: " + "; ".join(line) + f"; fused/stock synced {ratio:.3f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
