"""A sampler compiled on its own, on logits it is given (nano-vllm's compiled ``Sampler``,
vLLM's sampler as a function of the logits): stock Inductor's code for it (``stock``), the
same program compiled with backend="flashsampling" (``pass``: the pass rewrites it into one
``sample_logits`` call) and that call made directly (``ours``), each in a CUDA graph. Decides
where the pass may rewrite such a sampler (never slower than stock). Not a route of the op.

Programs (logits [B, 151936] of std 3 as given; per-row temperature 0.7; k 50 / p 0.9 /
min-p 0.1 as per-row tensors):

  race   nano-vllm's / vLLM's plain draw on bf16 logits: upcast, divide by T, softmax, then
         ``probs.div_(exponential).argmax``
  k      vLLM's sampler on bf16 logits with top-k only: greedy rows (T < eps) mixed in,
         ``apply_top_k_top_p`` (sort, top-k, scatter back), the race
  minp   vLLM's ``apply_min_p`` on bf16 logits, then the race
  kp     ``apply_top_k_top_p`` with top-k and top-p on fp32 logits (top-p on bf16 logits is
         refused: ties), then the race
  returned  a decode step (D = 2048, bf16) that samples its logits and returns them too: the
         matmul stays, the draw is one ``sample_logits`` call on its logits

``--check``: per program, 8192 copies of one row whose mass sits on 8 tokens, drawn by the
pass's graph, against the program's distribution in float64 (chi-square).

    python benchmarks/probes/logits_input_ab.py --batches 1,16,64,128,256
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
from torch._dynamo.utils import counters

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import flashsampling_inductor  # noqa: E402, F401  (registers backend="flashsampling")
from flashsampling_inductor import sample_logits  # noqa: E402
from tests.catalog_checks import chi_square_p, min_p_probs, top_k_probs  # noqa: E402
from tests.test_serving_samplers import (  # noqa: E402
    apply_min_p,
    apply_top_k_top_p,
    per_row_probs,
    random_sample,
)


def race(logits, t, k, p, min_p):
    logits = logits.to(torch.float32).div_(t.unsqueeze(1))
    return random_sample(logits.softmax(dim=-1, dtype=torch.float32))


def top_k(logits, t, k, p, min_p):
    greedy = logits.argmax(dim=-1).view(-1)
    logits = logits.to(torch.float32).div_(t.unsqueeze(1))
    logits = apply_top_k_top_p(logits, k, None)
    sampled = random_sample(logits.softmax(dim=-1, dtype=torch.float32))
    return torch.where(t < 1e-5, greedy, sampled)


def minp(logits, t, k, p, min_p):
    logits = logits.to(torch.float32).div_(t.unsqueeze(1))
    logits = apply_min_p(logits, min_p)
    return random_sample(logits.softmax(dim=-1, dtype=torch.float32))


def kp(logits, t, k, p, min_p):
    logits = apply_top_k_top_p(logits / t.unsqueeze(1), k, p)
    return random_sample(logits.softmax(dim=-1, dtype=torch.float32))


HIDDEN = 2048
WEIGHT: list[torch.Tensor] = []  # [V, HIDDEN] bf16, made in main


def returned(hidden, t, k, p, min_p):  # a decode step that returns its logits too
    logits = hidden @ WEIGHT[0].T
    probs = (logits.float() / t.unsqueeze(1)).softmax(dim=-1)
    return torch.multinomial(probs, 1), logits


PROGRAMS = {"race": race, "k": top_k, "minp": minp, "kp": kp, "returned": returned}
KNOBS = {"race": (), "k": ("top_k",), "minp": ("min_p",), "kp": ("top_k", "top_p")}
DTYPES = {"race": torch.bfloat16, "k": torch.bfloat16, "minp": torch.bfloat16, "kp": torch.float32}
DTYPES["returned"] = torch.bfloat16


def graphed(fn, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def time_graph(graph, loops):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    for _ in range(loops):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000 / loops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", default="1,16,64,128,256")
    parser.add_argument("--programs", default="race,k,minp,kp,returned")
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--loops", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    # (two compiled wrappers of each program, a graph per batch size each)
    torch._dynamo.config.recompile_limit = 64
    torch._dynamo.config.accumulated_recompile_limit = 4096
    WEIGHT.append(torch.randn(args.vocab, HIDDEN, device="cuda", dtype=torch.bfloat16) * 0.05)
    print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(), flush=True)
    if args.check:
        for name in args.programs.split(","):
            if name in KNOBS:  # (the given-logits programs)
                check(name, args.vocab)
    print("program,batch,stock_us,pass_us,ours_us,pass/stock,stock_first_s,pass_first_s")
    for name in args.programs.split(","):
        stock = torch.compile(PROGRAMS[name], dynamic=False)
        fused = torch.compile(PROGRAMS[name], dynamic=False, backend="flashsampling")
        for batch in (int(b) for b in args.batches.split(",")):
            measure(name, stock, fused, batch, args)


def check(name, vocab, n=8192) -> None:
    torch.manual_seed(7)
    row = torch.full((vocab,), -40.0, dtype=torch.float64)
    row[torch.randperm(vocab)[:8]] = torch.randn(8, dtype=torch.float64) * 1.5
    row = row.to(DTYPES[name]).double()
    t, k, p, min_p = 0.7, 5, 0.9, 0.1
    if name == "race":
        probs = torch.softmax(row / t, -1)
    elif name == "k":
        probs = top_k_probs(row / t, k)
    elif name == "minp":
        probs = min_p_probs(row / t, min_p)
    else:
        scalars = (torch.tensor([t]), torch.tensor([k]), torch.tensor([p]))
        probs = per_row_probs(row[None], *scalars, torch.zeros(1, dtype=torch.bool))[0]
    logits = row.to(DTYPES[name]).cuda().expand(n, vocab).contiguous()
    knobs = [torch.full((n,), x, device="cuda") for x in (t, k, p, min_p)]
    knobs[1] = knobs[1].long()
    torch._dynamo.reset()
    counters.clear()
    tokens = torch.compile(PROGRAMS[name], backend="flashsampling")(logits, *knobs)
    print(f"check {name}: rewrites {dict(counters['flashsampling'])}", flush=True)
    # (over the tokens of non-negligible mass: the 151928 others would swamp the test)
    support = (probs > 1e-9).nonzero().flatten()
    inside = torch.isin(tokens.cpu(), support)
    kept = probs[support] / probs[support].sum()
    p_value = chi_square_p(torch.searchsorted(support, tokens.cpu()[inside]), kept)
    print(
        f"check {name}: chi-square p = {p_value:.4f} over {n} draws,"
        f" {int((~inside).sum())} outside the {support.numel()} tokens of mass > 1e-9",
        flush=True,
    )


def measure(name, stock_compiled, fused_compiled, batch, args) -> None:
    torch.manual_seed(batch)
    logits = (torch.randn(batch, args.vocab, device="cuda") * 3).to(DTYPES[name])
    if name == "returned":  # (its first argument is the hidden state; ours: no matmul)
        logits = torch.randn(batch, HIDDEN, device="cuda", dtype=torch.bfloat16)
    t = torch.full((batch,), 0.7, device="cuda")
    k = torch.full((batch,), 50, device="cuda", dtype=torch.int64)
    p = torch.full((batch,), 0.9, device="cuda")
    min_p = torch.full((batch,), 0.1, device="cuda")
    seed = torch.tensor(5, device="cuda")
    knobs = {"top_k": k, "top_p": p, "min_p": min_p}
    graphs, firsts = {}, {}
    programs = {
        "stock": lambda: stock_compiled(logits, t, k, p, min_p),
        "pass": lambda: fused_compiled(logits, t, k, p, min_p),
        "ours": lambda: sample_logits(
            logits, temperature=t, seed=seed, **{key: knobs[key] for key in KNOBS[name]}
        ),
    }
    if name == "returned":
        del programs["ours"]
    for label, program in programs.items():
        begin = time.perf_counter()
        try:
            graphs[label], out = graphed(program)
        except Exception as error:  # (stock Inductor fails on some of these programs)
            print(f"# {name} B={batch} {label} failed: {type(error).__name__}", flush=True)
            continue
        firsts[label] = time.perf_counter() - begin
        out = out[0] if isinstance(out, tuple) else out
        assert 0 <= int(out.min()) and int(out.max()) < args.vocab, label
    times = {label: [] for label in graphs}
    for round_ in range(args.rounds):
        order = list(graphs) if round_ % 2 == 0 else list(graphs)[::-1]
        for label in order:
            times[label].append(time_graph(graphs[label], args.loops))
    us = {label: statistics.median(t) for label, t in times.items()}
    stock_us, pass_us = us.get("stock", float("nan")), us.get("pass", float("nan"))
    print(
        f"{name},{batch},{stock_us:.1f},{pass_us:.1f},{us.get('ours', float('nan')):.1f},"
        f"{pass_us / stock_us:.3f},{firsts.get('stock', float('nan')):.1f},"
        f"{firsts.get('pass', float('nan')):.1f}",
        flush=True,
    )


if __name__ == "__main__":
    main()
