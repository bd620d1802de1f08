"""SGLang's torch-native sampler behind an LM head, stock Inductor against the FlashSampling
backend (which fuses it with ``top_p_whole_row``), and what the flag costs the op itself.

    python benchmarks/probes/whole_row_ab.py [--shapes 2048x151936,4096x151936]
                                             [--batches 1,16,64] [--rounds 3] [--tf32]

Per-row knobs as SGLang passes them (temperature 0.7, top-k 20, top-p 0.95, min-p 0 or 0.05
in alternate rows), fp32 weights and hidden states (on bf16 logits the pass leaves top-p
alone: ties at the token crossing p). Providers, each captured in a CUDA graph of one step and
replayed 50 times between events (median of 5 such loops), rounds interleaved:

  eager      the step (F.linear, div_, softmax, SGLang's sampling_from_probs) as SGLang runs
             it, eagerly (in the CUDA graph)
  stock      the step compiled by stock Inductor (torch 2.11 fails to compile it: printed)
  fused      the same step compiled with backend="flashsampling" (one fused call)
  op_row     fused_sample(..., top_p_whole_row=True) alone, the same knobs
  op_topk    fused_sample with the survivors' top-p (the flag off): the flag's cost
  matmul     hidden @ W.T alone (cuBLAS)

Also checks, once per cell, that the fused step's processed logprob of 4096 draws of the
first row matches the whole-row contract in float64 (the largest deviation printed). One
GPU; without CUDA it says so and exits 0.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a plain checkout
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
from bench_sampling import capture_graph  # noqa: E402

import flashsampling_inductor  # noqa: E402,F401  (registers the backend)
from flashsampling_inductor import fused_sample  # noqa: E402

# SGLang's sampler, op for op, from the tests' one copy of it (tests/ is a package)
from tests.test_serving_samplers import sglang_sample_from_probs  # noqa: E402


class Step(torch.nn.Module):
    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(weight, requires_grad=False)

    def forward(self, h, temperature, top_ks, top_ps, min_ps):
        logits = F.linear(h, self.weight)
        logits.div_(temperature.view(-1, 1))
        return sglang_sample_from_probs(torch.softmax(logits, dim=-1), top_ks, top_ps, min_ps)


def loop_us(graph: torch.cuda.CUDAGraph, replays: int = 50, loops: int = 5) -> float:
    times = []
    for _ in range(loops):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / replays)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", default="2048x151936,4096x151936", help="DxV list")
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--tf32",
        action="store_true",
        help="TF32 matmuls (without it the pass leaves the fp32 head)",
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing run")
        return
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    for shape in args.shapes.split(","):
        hidden_size, vocab = (int(v) for v in shape.split("x"))
        weight = torch.randn(vocab, hidden_size, device="cuda") * 0.04
        step = Step(weight)
        stock = torch.compile(step, backend="inductor", dynamic=False)
        fused = torch.compile(step, backend="flashsampling", dynamic=False)
        for batch in (int(b) for b in args.batches.split(",")):
            cell(step, stock, fused, weight, batch, args.rounds)


def cell(step, stock, fused, weight: torch.Tensor, batch: int, rounds: int) -> None:
    """One (shape, batch) cell: the providers timed, then row 0's draws checked."""
    vocab, hidden_size = weight.shape
    h = torch.randn(batch, hidden_size, device="cuda")
    t = torch.full((batch,), 0.7, device="cuda")
    k = torch.full((batch,), 20, device="cuda", dtype=torch.int64)
    p = torch.full((batch,), 0.95, device="cuda")
    m = torch.tensor([0.0, 0.05], device="cuda").repeat(batch)[:batch]
    knobs = dict(temperature=t, top_k=k, top_p=p, min_p=m)
    providers = {
        "eager": lambda: step(h, t, k, p, m),
        "stock": lambda: stock(h, t, k, p, m),
        "fused": lambda: fused(h, t, k, p, m),
        "op_row": lambda: fused_sample(h, weight, top_p_whole_row=True, **knobs),
        "op_topk": lambda: fused_sample(h, weight, **knobs),
        "matmul": lambda: h @ weight.T,
    }
    with torch.no_grad():
        graphs = {}
        for name, fn in providers.items():
            try:
                graphs[name] = capture_graph(fn)
            except Exception as error:  # (stock Inductor's own failures: reported, not ours)
                print(f"{name} failed: {type(error).__name__}: {str(error)[:200]}", flush=True)
        times = {name: [] for name in graphs}
        for _ in range(rounds):
            for name, graph in graphs.items():
                times[name].append(loop_us(graph))
        # The fused step's draws of row 0 against the whole-row contract (float64).
        rows = 4096
        big = h[:1].expand(rows, -1).contiguous()
        ones = torch.ones(rows, device="cuda")
        tokens, logprobs = fused_sample(
            big, weight, temperature=0.7 * ones, top_k=(20 * ones).long(), top_p=0.95 * ones,
            min_p=0.05 * ones, top_p_whole_row=True, return_logprobs="processed",
        )  # fmt: skip
        logits = (h[:1].double() @ weight.double().T)[0] / 0.7
        probs = torch.softmax(logits, -1)
        order = probs.argsort(descending=True)
        sorted_probs = probs[order]
        above = sorted_probs.cumsum(-1) - sorted_probs
        keep_sorted = (torch.arange(vocab, device="cuda") < 20) & (above < 0.95)
        keep_sorted &= sorted_probs >= 0.05 * sorted_probs[0]
        keep = torch.zeros_like(keep_sorted).scatter(0, order, keep_sorted)
        expected = torch.log_softmax(logits.masked_fill(~keep, -torch.inf), -1)
        drawn = tokens[:, 0]
        outside = int((~keep[drawn]).sum())
        error = float((logprobs[:, 0].double() - expected[drawn]).abs().max())
    us = {name: statistics.median(v) for name, v in times.items()}
    print(
        f"D={hidden_size} V={vocab} B={batch}: "
        + " ".join(f"{name} {value:.1f}" for name, value in us.items())
        + " us | "
        + " ".join(
            f"{a}/{b} {us[a] / us[b]:.3f}"
            for a, b in (
                ("fused", "eager"),
                ("fused", "stock"),
                ("op_row", "op_topk"),
                ("op_row", "eager"),
                ("fused", "matmul"),
            )
            if a in us and b in us
        )
        + f" | row 0: {outside} of {rows} draws outside the kept set, kept {int(keep.sum())},"
        + f" logprob error {error:.2e}",
        flush=True,
    )


if __name__ == "__main__":
    main()
