"""A sampler whose top_p or min_p is a Python float argument, compiled: once the value
changes between calls Dynamo makes it dynamic, a 0-d CPU tensor in the graph (``1 - p`` becomes
``1.0 + (-1) * p``). The step compiles once more and must stay fused, draw what the constant
graph draws on the same seed, keep the distribution, and refuse a p outside [0, 1] with the
pass's error instead of drawing from another distribution."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

from flashsampling_inductor.patterns._rewrite import BAD_TRUNCATION

from .catalog_checks import chi_square_p, min_p_probs, top_p_probs

transformers = pytest.importorskip("transformers")
from transformers import MinPLogitsWarper, TopPLogitsWarper  # noqa: E402

B, D, V = 3, 16, 300
torch.manual_seed(0)
WEIGHT = torch.randn(V, D)
HIDDEN = torch.randn(B, D)
IDS = torch.zeros(B, 1, dtype=torch.long)


def transformers_top_p(h, top_p):
    """generate's chain with the setting passed per call (a server building its warper per
    request)."""
    scores = F.linear(h, WEIGHT) / 0.7
    scores = TopPLogitsWarper(top_p)(IDS[: h.shape[0]], scores)
    return torch.multinomial(F.softmax(scores, dim=-1), 1)


def transformers_min_p(h, min_p):
    scores = MinPLogitsWarper(min_p)(IDS[: h.shape[0]], F.linear(h, WEIGHT) / 0.7)
    return torch.multinomial(F.softmax(scores, dim=-1), 1)


def llama_top_p(h, top_p):
    """Llama's reference ``sample_top_p``: descending, ``mass above > p``."""
    probs = torch.softmax(F.linear(h, WEIGHT) / 0.7, dim=-1)
    probs_sort, probs_idx = torch.sort(probs, dim=-1, descending=True)
    mask = torch.cumsum(probs_sort, dim=-1) - probs_sort > top_p
    probs_sort[mask] = 0.0
    probs_sort.div_(probs_sort.sum(dim=-1, keepdim=True))
    return torch.gather(probs_idx, -1, torch.multinomial(probs_sort, 1))


def _calls(fn, settings, h=HIDDEN, seed=None):
    """Compile ``fn`` once and call it with each setting in turn -> (tokens of the last call,
    rewrites, the pass's warnings)."""
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(fn, backend="flashsampling")
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("flashsampling_inductor")
    logger.addHandler(handler)
    try:
        with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):
            for setting in settings:
                if seed is not None:
                    torch.manual_seed(seed)
                tokens = compiled(h, setting)
    finally:
        logger.removeHandler(handler)
    warnings = [r.getMessage() for r in records if r.levelno >= logging.WARNING]
    rewrites = dict(counters["flashsampling"])
    # Every graph compiled is fused: two on torch 2.13 (the constant p, then p dynamic);
    # torch 2.11 compiled a third for the third value.
    assert sum(rewrites.values()) == counters["stats"]["unique_graphs"], rewrites
    return tokens, rewrites, warnings


@pytest.mark.parametrize(
    "fn, settings, idiom",
    [
        pytest.param(transformers_top_p, (0.9, 0.8, 0.7), "multinomial", id="transformers-top-p"),
        pytest.param(transformers_min_p, (0.1, 0.2, 0.3), "multinomial", id="transformers-min-p"),
        pytest.param(llama_top_p, (0.9, 0.8, 0.7), "sorted_top_p", id="llama-top-p"),
    ],
)
def test_a_changed_float_knob_stays_fused(fn, settings, idiom):
    """The first call compiles a constant p; the second compiles once more with p dynamic;
    the third reuses that graph. Both graphs fused, nothing warned."""
    _, rewrites, warnings = _calls(fn, settings)
    assert list(rewrites) == [idiom] and rewrites[idiom] >= 2, rewrites
    assert not [w for w in warnings if "unfused" in w or "not rewritten" in w], warnings


@pytest.mark.parametrize(
    "fn, value",
    [
        pytest.param(transformers_top_p, 0.8, id="transformers-top-p"),
        pytest.param(transformers_min_p, 0.2, id="transformers-min-p"),
        pytest.param(llama_top_p, 0.8, id="llama-top-p"),
    ],
)
def test_the_dynamic_graph_draws_the_constant_graphs_tokens(fn, value):
    """Pathwise: on the same seed, the graph with p dynamic draws the tokens of the graph
    compiled for that p as a constant."""
    h = HIDDEN.repeat(200, 1)
    constant, _, _ = _calls(fn, (value,), h=h, seed=7)
    dynamic, rewrites, _ = _calls(fn, (0.5, value), h=h, seed=7)
    assert len(rewrites) == 1 and sum(rewrites.values()) >= 2
    assert torch.equal(constant, dynamic)


@pytest.mark.parametrize(
    "fn, value, probs",
    [
        pytest.param(transformers_top_p, 0.6, top_p_probs, id="top-p"),
        pytest.param(transformers_min_p, 0.3, min_p_probs, id="min-p"),
    ],
)
def test_the_dynamic_graph_keeps_the_distribution(fn, value, probs):
    n = 4000
    torch.manual_seed(3)
    tokens, rewrites, _ = _calls(fn, (0.5, value), h=HIDDEN.repeat_interleave(n, 0))
    assert list(rewrites) == ["multinomial"] and rewrites["multinomial"] >= 2, rewrites
    expected = probs(F.linear(HIDDEN, WEIGHT) / 0.7, value)
    for row in range(B):
        assert chi_square_p(tokens[row * n : (row + 1) * n], expected[row]) > 1e-4, row


def test_a_p_outside_zero_one_fails_with_the_passs_error():
    """p = 1.5 passes transformers' own check only through the dynamic graph; the fused
    step raises rather than draw (as a per-row p outside [0, 1] does)."""
    with pytest.raises(Exception, match="top_p or min_p outside"):
        _calls(llama_top_p, (0.9, 1.5))
    assert "top_p or min_p outside" in BAD_TRUNCATION


@pytest.mark.gpu
def test_dynamic_top_p_on_cuda_graph_replays():
    """mode="reduce-overhead": p reaches the GPU step as a 0-d CPU input each call; every
    replay draws from its own call's nucleus (no token outside it, the kept tokens'
    frequencies right)."""
    vocab, dim, batch = 4096, 128, 8192
    weight = torch.randn(vocab, dim, device="cuda") * 0.3
    row = torch.randn(dim, device="cuda")
    h = row.expand(batch, dim).contiguous()

    def step(h, top_p):
        scores = F.linear(h, weight) / 0.7
        sorted_scores, order = torch.sort(scores, descending=False)
        removed = sorted_scores.softmax(dim=-1).cumsum(dim=-1) <= (1 - top_p)
        removed[..., -1:] = 0
        scores = scores.masked_fill(removed.scatter(1, order, removed), -float("inf"))
        return torch.multinomial(F.softmax(scores, dim=-1), 1)

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(step, backend="flashsampling", mode="reduce-overhead")
    with torch.no_grad():
        compiled(h, 0.9)
        for top_p in (0.5, 0.8, 0.5):
            draws = torch.cat([compiled(h, top_p).clone() for _ in range(4)]).flatten().cpu()
            expected = top_p_probs(F.linear(row, weight).cpu() / 0.7, top_p)
            assert chi_square_p(draws, expected) > 1e-4, top_p
    assert counters["flashsampling"]["multinomial"] == counters["stats"]["unique_graphs"] >= 2


def meta_top_p(h, p):
    """Meta's ``top_p(probs, p: torch.Tensor)``: one 0-d tensor p for every row."""
    probs = torch.softmax(F.linear(h, WEIGHT) / 0.7, dim=-1)
    probs_sort, probs_idx = torch.sort(probs, dim=-1, descending=True)
    mask = torch.cumsum(probs_sort, dim=-1) - probs_sort > p
    probs_sort[mask] = 0.0
    return torch.gather(probs_idx, -1, torch.multinomial(probs_sort, 1))


def min_p_of_a_tensor(h, min_p):
    """A min-p warper that keeps its min_p as a 0-d tensor."""
    scores = F.linear(h, WEIGHT) / 0.7
    probs = torch.softmax(scores, dim=-1)
    top, _ = probs.max(dim=-1, keepdim=True)
    scores = scores.masked_fill(probs < min_p * top, -float("inf"))
    return torch.multinomial(F.softmax(scores, dim=-1), 1)


@pytest.mark.parametrize(
    "fn, value, idiom",
    [
        pytest.param(meta_top_p, 0.8, "sorted_top_p", id="top-p"),
        pytest.param(min_p_of_a_tensor, 0.2, "multinomial", id="min-p"),
    ],
)
def test_a_zero_d_tensor_knob_is_one_value_for_every_row(fn, value, idiom):
    """Fused, and on the same seed the tokens of the same program with a Python float."""
    h = HIDDEN.repeat(200, 1)
    constant, rewrites, _ = _calls(fn, (value,), h=h, seed=5)
    assert rewrites == {idiom: 1}
    tensor, rewrites, _ = _calls(fn, (torch.tensor(value),), h=h, seed=5)
    assert rewrites == {idiom: 1}
    assert torch.equal(constant, tensor)
