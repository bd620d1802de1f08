"""Misses explained: ``explain()`` per sampling site, and the pass's one WARNING per compiled
graph that leaves a sampling op unfused, also when the caches are on."""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters
from torch._inductor.utils import fresh_cache

import flashsampling_inductor
from flashsampling_inductor import explain

torch.manual_seed(0)
WEIGHT = torch.randn(12, 8)


def fused_step(h):
    return torch.multinomial(F.softmax(h @ WEIGHT.T / 0.7, dim=-1), 1)


def probs_returned(h):  # the probabilities read outside: nothing to sample them from
    probs = F.softmax(h @ WEIGHT.T, dim=-1)
    return torch.multinomial(probs, 1), probs


def classifier(h):  # an argmax no sampling idiom claims: not a sampling op, no warning
    return torch.argmax(h @ WEIGHT.T / torch.tensor(0.5), dim=-1)


def _warnings(caplog) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == "flashsampling_inductor" and record.levelno == logging.WARNING
    ]


def test_explain_lists_each_site_with_its_reason():
    h = torch.randn(3, 8)
    with torch.no_grad():
        fused, missed = explain(fused_step, h), explain(probs_returned, h)
    assert [(s.op, s.idiom, s.rewritten) for s in fused] == [
        ("aten.multinomial", "multinomial", True)
    ]
    assert str(fused).splitlines() == [
        "flashsampling: 1 of 1 sampling op(s) fused",
        "  multinomial (aten.multinomial): rewritten by multinomial",
    ]
    (site,) = missed
    assert not site.rewritten and site.reason == "div is also read by output"
    assert "not rewritten (multinomial): div is also read by output" in str(missed)
    assert flashsampling_inductor.explain is explain


def test_one_warning_per_compiled_graph_with_a_miss(caplog):
    h = torch.randn(3, 8)
    caplog.set_level(logging.WARNING, logger="flashsampling_inductor")
    with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):
        for step in (fused_step, classifier):
            torch._dynamo.reset()
            torch.compile(step, backend="flashsampling")(h)
        assert _warnings(caplog) == []
        torch._dynamo.reset()
        compiled = torch.compile(probs_returned, backend="flashsampling")
        compiled(h)
        compiled(h)  # the same compiled graph: no second warning
    (warning,) = _warnings(caplog)
    assert "1 sampling op(s) of this compiled graph left unfused" in warning
    assert "div is also read by output" in warning


def _cache_hits() -> int:
    return (
        counters["aot_autograd"]["autograd_cache_hit"] + counters["inductor"]["fxgraph_cache_hit"]
    )


def test_caches_on_a_miss_warns_again_and_explain_still_sees_a_hit(caplog):
    """A graph with a miss never enters the caches, so compiling it again warns again; a
    fused graph is cached, and explain() still reports it rewritten after the cache hit."""
    h = torch.randn(3, 8)
    caplog.set_level(logging.WARNING, logger="flashsampling_inductor")
    with (
        fresh_cache(),
        torch._inductor.config.patch(fx_graph_cache=True),
        torch._functorch.config.patch(enable_autograd_cache=True),
        torch.no_grad(),
    ):
        for expected_hit in (False, True):
            torch._dynamo.reset()
            counters.clear()
            torch.compile(fused_step, backend="flashsampling")(h)
            assert bool(_cache_hits()) == expected_hit
        (site,) = explain(fused_step, h)
        assert site.rewritten
        for _ in range(2):
            torch._dynamo.reset()
            counters.clear()
            caplog.clear()
            torch.compile(probs_returned, backend="flashsampling")(h)
            assert _cache_hits() == 0 and len(_warnings(caplog)) == 1


def test_fallback_random_is_a_reason():
    with torch.no_grad(), torch._inductor.config.patch(fallback_random=True):
        (site,) = explain(fused_step, torch.randn(3, 8))
    assert not site.rewritten and "fallback_random" in site.reason


def test_a_check_that_breaks_leaves_the_site_to_stock_inductor(monkeypatch, caplog):
    """A pattern check that raises something other than its refusals (a graph it did not
    foresee) must not fail the user's compile: the site is left unfused, with a WARNING and
    the error as its reason. The tests run with FLASHSAMPLING_STRICT=1, where it raises."""
    from flashsampling_inductor.patterns import multinomial

    def broken(walk, logits, **kwargs):
        raise RuntimeError("an unforeseen graph")

    monkeypatch.setattr(multinomial, "match_lm_head", broken)
    monkeypatch.setenv("FLASHSAMPLING_STRICT", "0")
    caplog.set_level(logging.WARNING, logger="flashsampling_inductor")
    h = torch.randn(3, 8)
    with torch.no_grad():
        (site,) = explain(fused_step, h)
    assert not site.rewritten and "the pass's check failed" in site.reason
    assert "an unforeseen graph" in site.reason
    assert any("the pass's check failed" in message for message in _warnings(caplog))
    torch._dynamo.reset()
    tokens = torch.compile(fused_step, backend="flashsampling")(h)
    assert tokens.shape == (3, 1) and bool(((tokens >= 0) & (tokens < 12)).all())


def test_off_cuda_without_the_switch_the_graph_stays_stock(monkeypatch, caplog):
    """On the CPU the fused op runs its PyTorch reference, slower than stock Inductor's code:
    without FLASHSAMPLING_CPU=1 (which the suite sets) a CPU graph is left as stock Inductor
    compiles it, explain() gives the reason, nothing is WARNED, and the graph is cached apart
    from the rewritten one (the switch is part of the pass's uuid)."""
    from flashsampling_inductor.graph_pass import FlashSamplingPass

    h = torch.randn(3, 8)
    fused_uuid = FlashSamplingPass().uuid()
    monkeypatch.delenv("FLASHSAMPLING_CPU")
    stock_uuid = FlashSamplingPass().uuid()
    assert None not in (fused_uuid, stock_uuid) and fused_uuid != stock_uuid
    caplog.set_level(logging.INFO, logger="flashsampling_inductor")
    with torch.no_grad():
        (site,) = explain(fused_step, h)
    assert not site.rewritten and site.idiom == "multinomial"
    assert "on cpu the fused op runs its PyTorch reference" in site.reason
    assert "FLASHSAMPLING_CPU=1" in site.reason
    assert _warnings(caplog) == []
    assert any("FLASHSAMPLING_CPU=1" in record.getMessage() for record in caplog.records)


def test_an_fp32_head_on_cuda_with_tf32_off_stays_stock(monkeypatch, caplog):
    """On CUDA the fused kernel's IEEE fp32 dot is slower than cuBLAS's fp32 matmul and the
    stock sampling after it: an fp32 LM head is left stock unless TF32 is on (or
    FLASHSAMPLING_FP32=1, which the suite sets), with the reason in explain() and at INFO,
    and the setting is part of the pass's uuid. (The CPU graph poses as CUDA's here.)"""
    from flashsampling_inductor.patterns import _rewrite

    cuda = torch.device("cuda")
    monkeypatch.setattr(_rewrite, "_device", lambda head: cuda)
    matmul, tf32 = torch.backends.cuda.matmul, torch.backends.cuda.matmul.allow_tf32
    try:
        matmul.allow_tf32 = False
        _fp32_head_stays_stock(monkeypatch, caplog, cuda)
    finally:
        matmul.allow_tf32 = tf32


def _fp32_head_stays_stock(monkeypatch, caplog, cuda):
    from flashsampling_inductor import op
    from flashsampling_inductor.graph_pass import FlashSamplingPass

    fused_uuid = FlashSamplingPass().uuid()
    monkeypatch.delenv("FLASHSAMPLING_FP32")
    stock_uuid = FlashSamplingPass().uuid()
    assert None not in (fused_uuid, stock_uuid) and fused_uuid != stock_uuid
    caplog.set_level(logging.INFO, logger="flashsampling_inductor")
    with torch.no_grad():
        (site,) = explain(fused_step, torch.randn(3, 8))
    assert not site.rewritten and "an fp32 LM head with TF32 off" in site.reason
    assert _warnings(caplog) == []
    assert op.why_not_fused_on(cuda, torch.bfloat16) == ""
    torch.backends.cuda.matmul.allow_tf32 = True
    assert op.why_not_fused_on(cuda, torch.float32) == ""
    assert FlashSamplingPass().uuid() not in (stock_uuid, None)
