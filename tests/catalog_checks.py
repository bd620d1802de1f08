"""What every idiom's test module checks: one fused call in the graph, near misses left
exactly as stock Inductor sees them, and the compiled program's distribution against the
program's own math in float64."""

from __future__ import annotations

import numpy as np
import torch
from scipy import stats
from torch._dynamo.utils import counters

from flashsampling_inductor.graph_pass import SITES

from .graph_capture import graph_after_pass

# Graph text that means the logits (or their sort / top-k) are still materialized.
MATERIALIZED = ("aten.mm", "aten.addmm", "aten.topk", "aten.sort", "multinomial", "argmax")


def assert_one_fused_call(fn, *args, idiom: str, dynamic=None) -> str:
    """-> the graph after the pass, which must hold one fused call and nothing of the idiom."""
    graph, rewrites = graph_after_pass(fn, *args, dynamic=dynamic)
    assert rewrites == {idiom: 1}, graph
    assert graph.count("flashsampling.fused_sample") == 1, graph
    for node in MATERIALIZED:
        assert node not in graph, graph
    return graph


def graph_and_sites(fn, *args) -> tuple[str, dict[str, int], list]:
    """-> (the graph after the pass, rewrites per idiom, the ``SamplingSite``s it recorded)."""
    sites = []
    token = SITES.set(sites)
    try:
        graph, rewrites = graph_after_pass(fn, *args)
    finally:
        SITES.reset(token)
    return graph, rewrites, sites


def assert_left_alone(fn, *args, reason: str | None = None) -> str:
    """-> the graph after the pass: nothing rewritten, the very graph stock Inductor
    compiles (the pass only drops no-op views, which Inductor drops later anyway), and the
    site's recorded reason contains ``reason``."""
    graph, rewrites, sites = graph_and_sites(fn, *args)
    assert not rewrites and "fused_sample" not in graph, graph
    if reason is not None:
        assert any(reason in site.reason for site in sites), sites
    stock, _ = graph_after_pass(fn, *args, backend="inductor")
    assert _ops(graph) == _ops(stock)
    return graph


def _ops(graph: str) -> list[str]:
    return [line.split("](")[0].split("[target=")[-1] for line in graph.splitlines()]


def compiled_draws(fn, *args, idiom: str) -> torch.Tensor:
    """Run ``fn`` compiled with the FlashSampling backend; it must have been rewritten."""
    torch._dynamo.reset()
    counters.clear()
    with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):
        tokens = torch.compile(fn, backend="flashsampling")(*args)
    assert dict(counters["flashsampling"]) == {idiom: 1}
    return tokens


def chi_square_p(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of the tokens against ``probs`` over the cells with positive probability;
    a token drawn outside them fails at once."""
    observed = np.bincount(tokens.flatten().numpy(), minlength=probs.numel())
    support = probs.numpy() > 0
    assert observed[~support].sum() == 0, "drew a token the program never draws"
    if support.sum() == 1:
        return 1.0  # one token: drawn every time, as checked above
    expected = probs.numpy()[support] * tokens.numel()
    return stats.chisquare(observed[support], expected).pvalue


def top_k_probs(logits: torch.Tensor, k: int) -> torch.Tensor:
    """softmax over the tokens >= the k-th largest logit (ties kept), in float64."""
    logits = logits.double()
    kth = torch.topk(logits, k).values[..., -1:]
    return torch.softmax(logits.masked_fill(logits < kth, -torch.inf), -1)


def top_p_probs(logits: torch.Tensor, p: float) -> torch.Tensor:
    """transformers' TopPLogitsWarper then softmax, in float64."""
    logits = logits.double()
    sorted_logits, order = torch.sort(logits, descending=False)
    removed = sorted_logits.softmax(-1).cumsum(-1) <= 1 - p
    removed[..., -1:] = False
    removed = removed.scatter(-1, order, removed)
    return torch.softmax(logits.masked_fill(removed, -torch.inf), -1)


def min_p_probs(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """transformers' MinPLogitsWarper then softmax, in float64."""
    probs = torch.softmax(logits.double(), -1)
    return torch.softmax(
        logits.double().masked_fill(probs < min_p * probs.amax(-1, keepdim=True), -torch.inf), -1
    )
