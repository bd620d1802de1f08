"""Stock Inductor against the rewritten step on the CPU: why the pass leaves CPU graphs alone.

Off CUDA the fused op runs its PyTorch reference (a matmul, then the sampling math in
torch), so a rewritten CPU step cannot beat what stock Inductor makes of the same program.
This script times both, per sampling idiom, so the default can be checked on a new torch or
a new machine: each idiom is an LM head (``hidden @ weight.T``) and the sampling after it as
public code writes it, compiled once with ``backend="inductor"`` and once with
``backend="flashsampling"`` under ``FLASHSAMPLING_CPU=1`` (the switch that makes the pass
rewrite on the CPU), and timed as the median of wall-clock calls after warm-up
(``--cpu-time --threads 1``: of the CPU time the process spent per call, on one thread so
that no idle thread spins, which other processes on a shared machine disturb far less).

Needs only a CPU (CUDA tensors are never used). Prints one line per idiom and shape, with
the fused/stock ratio (above 1: the rewrite is slower); writes nothing.

    python benchmarks/bench_cpu.py
    python benchmarks/bench_cpu.py --shapes 4x1000x64 --repeats 20
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

import flashsampling_inductor  # noqa: F401  (registers backend="flashsampling")


def multinomial(hidden, weight):
    """HF / nanoGPT: temperature, softmax, torch.multinomial."""
    probs = F.softmax((hidden @ weight.t()).float() / 0.8, dim=-1)
    return torch.multinomial(probs, num_samples=1)


def exponential_race(hidden, weight):
    """gpt-fast: argmax(probs / Exp(1) noise)."""
    probs = torch.softmax((hidden @ weight.t()) / 0.8, dim=-1)
    return torch.argmax(probs / torch.empty_like(probs).exponential_(1), dim=-1, keepdim=True)


def greedy(hidden, weight):
    """Greedy decoding: argmax of the logits."""
    return (hidden @ weight.t()).argmax(dim=-1, keepdim=True)


def top_k_multinomial(hidden, weight):
    """nanoGPT / gpt-fast top-k: mask below the k-th logit, softmax, multinomial."""
    logits = (hidden @ weight.t()) / 0.8
    kth = torch.topk(logits, 50).values[:, -1:]
    logits = logits.masked_fill(logits < kth, -float("inf"))
    return torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)


def top_p_multinomial(hidden, weight):
    """transformers' top-p warper: sort, cumulative mass, scatter the mask back."""
    logits = (hidden @ weight.t()) / 0.8
    sorted_logits, sorted_indices = torch.sort(logits, descending=False)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    remove_sorted = cumulative <= 1 - 0.9
    remove_sorted[..., -1:] = False
    remove = remove_sorted.scatter(1, sorted_indices, remove_sorted)
    logits = logits.masked_fill(remove, -float("inf"))
    return torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)


IDIOMS = (multinomial, exponential_race, greedy, top_k_multinomial, top_p_multinomial)


def median_ms(fn, *args, repeats: int, clock=time.perf_counter) -> float:
    for _ in range(3):
        fn(*args)
    times = []
    for _ in range(repeats):
        start = clock()
        fn(*args)
        times.append(clock() - start)
    return 1e3 * sorted(times)[len(times) // 2]


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--shapes",
        nargs="+",
        default=["4x1000x64", "4x32000x512"],
        help="BATCHxVOCABxDIM of the LM head, fp32 (default: the demo's CPU shape and a"
        " Llama-2-sized vocabulary with a small hidden size)",
    )
    parser.add_argument("--repeats", type=int, default=30, help="timed calls per measurement")
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="time the process's CPU time per call instead of the wall clock",
    )
    parser.add_argument("--threads", type=int, help="torch's CPU threads (default: its own)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    clock = time.process_time if args.cpu_time else time.perf_counter
    os.environ["FLASHSAMPLING_CPU"] = "1"
    torch._inductor.config.fx_graph_cache = False
    kind = "CPU time" if args.cpu_time else "wall clock"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, {kind}")
    for shape in args.shapes:
        batch, vocab, dim = (int(part) for part in shape.split("x"))
        torch.manual_seed(0)
        hidden, weight = torch.randn(batch, dim), torch.randn(vocab, dim) / dim**0.5
        for idiom in IDIOMS:
            torch._dynamo.reset()
            counters.clear()
            stock = torch.compile(idiom, backend="inductor")
            fused = torch.compile(idiom, backend="flashsampling")
            fused(hidden, weight)
            rewrites = sum(counters["flashsampling"].values())
            stock_ms = median_ms(stock, hidden, weight, repeats=args.repeats, clock=clock)
            fused_ms = median_ms(fused, hidden, weight, repeats=args.repeats, clock=clock)
            print(
                f"{shape:>12} {idiom.__name__:<18} stock {stock_ms:8.3f} ms  fused {fused_ms:8.3f}"
                f" ms  fused/stock {fused_ms / stock_ms:5.2f}x  (rewrites: {rewrites})"
            )


if __name__ == "__main__":
    main()
