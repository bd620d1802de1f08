# ruff: noqa: E501  (the expected graphs are printed verbatim)
"""Exactly k, as vLLM-style samplers write it: ``probs.topk(k)`` -> ``multinomial`` among the
k -> ``gather`` of the index. One fused call with ``top_k`` for fp32 logits; refused where
the logits are rounded to bf16/fp16 (ties at the k-th value: exactly k is another
distribution than the op's ties-kept top-k)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from flashsampling_inductor.graph_pass import SITES
from flashsampling_inductor.patterns import exact_top_k

from .catalog_checks import (
    assert_left_alone,
    assert_one_fused_call,
    chi_square_p,
    compiled_draws,
    top_k_probs,
)
from .graph_capture import TestCase, graph_after_pass

D, V = 24, 1000
torch.manual_seed(0)
WEIGHT = torch.randn(V, D)


def top_k_sampler(h, k=50, weight=WEIGHT):
    probs = torch.softmax(F.linear(h, weight) / 0.8, dim=-1, dtype=torch.float32)
    top_probs, top_tokens = probs.topk(k, dim=-1)
    choice = torch.multinomial(top_probs, num_samples=1)
    return top_tokens.gather(-1, choice)


def renormalized_two_samples(h):
    probs = F.softmax(F.linear(h, WEIGHT), dim=-1)
    top_probs, top_tokens = torch.topk(probs, 20)
    top_probs = top_probs / top_probs.sum(dim=-1, keepdim=True)
    choice = torch.multinomial(top_probs, num_samples=2, replacement=True)
    return torch.gather(top_tokens, -1, choice)


def values_first(h, k=50, weight=WEIGHT):
    """The top k logits first, then the softmax of those k values (tutorials, small samplers)."""
    values, indices = torch.topk(F.linear(h, weight) / 0.8, k, dim=-1)
    choice = torch.multinomial(torch.softmax(values, dim=-1), num_samples=1)
    return indices.gather(-1, choice)


def values_first_raced(h, k=50, weight=WEIGHT):
    values, indices = torch.topk(F.linear(h, weight) / 0.8, k, dim=-1)
    probs = torch.softmax(values, dim=-1)
    q = torch.empty_like(probs).exponential_(1)
    return indices.gather(-1, torch.argmax(probs / q, dim=-1, keepdim=True))


def top_probs_raced(h, k=50, weight=WEIGHT):
    probs = torch.softmax(F.linear(h, weight) / 0.8, dim=-1)
    top_probs, top_tokens = probs.topk(k, dim=-1)
    q = torch.empty_like(top_probs).exponential_(1)
    return top_tokens.gather(-1, (top_probs / q).argmax(dim=-1, keepdim=True))


h = torch.randn(3, D)


@pytest.mark.parametrize(
    "fn, args",
    [
        pytest.param(top_k_sampler, (h,), id="fp32"),
        pytest.param(renormalized_two_samples, (h,), id="renormalized-n2"),
        pytest.param(values_first, (h,), id="values-first"),
        pytest.param(values_first_raced, (h,), id="values-first-race"),
        pytest.param(top_probs_raced, (h,), id="top-probs-race"),
        pytest.param(exact_top_k.search, exact_top_k.example_inputs(), id="search"),
    ],
)
def test_exact_top_k_becomes_one_fused_call(fn, args):
    assert_one_fused_call(fn, *args, idiom="exact_top_k")


def bf16_logits(h):
    return top_k_sampler(h, 50, WEIGHT.bfloat16())


def without_replacement(h):
    top_probs, top_tokens = F.softmax(F.linear(h, WEIGHT), dim=-1).topk(20)
    return top_tokens.gather(-1, torch.multinomial(top_probs, 2))


def top_probs_returned(h):
    top_probs, top_tokens = F.softmax(F.linear(h, WEIGHT), dim=-1).topk(20)
    return top_tokens.gather(-1, torch.multinomial(top_probs, 1)), top_probs


def smallest_k(h):
    top_probs, top_tokens = F.softmax(F.linear(h, WEIGHT), dim=-1).topk(20, largest=False)
    return top_tokens.gather(-1, torch.multinomial(top_probs, 1))


def values_first_retempered(h):  # softmax(values / 0.5) of logits / 0.8: not left to guess
    values, indices = torch.topk(F.linear(h, WEIGHT) / 0.8, 20, dim=-1)
    choice = torch.multinomial(torch.softmax(values / 0.5, dim=-1), num_samples=1)
    return indices.gather(-1, choice)


def values_first_bf16(h):
    values, indices = torch.topk(F.linear(h, WEIGHT.bfloat16()), 20, dim=-1)
    choice = torch.multinomial(torch.softmax(values.float(), dim=-1), num_samples=1)
    return indices.gather(-1, choice)


def race_shared_noise(h):  # one noise row for every row: correlated rows
    top_probs, top_tokens = F.softmax(F.linear(h, WEIGHT), dim=-1).topk(20)
    q = torch.empty_like(top_probs[:1]).exponential_(1)
    return top_tokens.gather(-1, (top_probs / q).argmax(dim=-1, keepdim=True))


@pytest.mark.parametrize(
    "fn, args, reason",
    [
        pytest.param(bf16_logits, (h.bfloat16(),), "ties at the k-th value", id="bf16"),
        pytest.param(
            values_first_bf16, (h.bfloat16(),), "ties at the k-th value", id="values-bf16"
        ),
        pytest.param(values_first_retempered, (h,), None, id="values-retempered"),
        pytest.param(race_shared_noise, (h,), "not drawn per token", id="race-shared-noise"),
        pytest.param(without_replacement, (h,), "without replacement", id="n2-no-replacement"),
        pytest.param(top_probs_returned, (h,), "also read by", id="top-probs-read"),
        pytest.param(smallest_k, (h,), "smallest", id="largest=False"),
    ],
)
def test_near_miss_is_left_alone(fn, args, reason):
    assert_left_alone(fn, *args, reason=reason)


class TestGraphs(TestCase):
    def test_top_k_sampler_after(self):
        self.assertExpectedInline(
            assert_one_fused_call(top_k_sampler, h, idiom="exact_top_k"),
            """\
graph():
    %arg0_1 : [num_users=1] = placeholder[target=arg0_1]
    %arg1_1 : [num_users=1] = placeholder[target=arg1_1]
    %randint_low : [num_users=1] = call_function[target=torch.ops.aten.randint.low](args = (0, 4611686018427387904, []), kwargs = {device: cpu, pin_memory: False})
    %view_default : [num_users=1] = call_function[target=torch.ops.aten.view.default](args = (%arg0_1, [-1, 24]), kwargs = {})
    %fused_sample_default : [num_users=1] = call_function[target=torch.ops.flashsampling.fused_sample.default](args = (%view_default, %arg1_1, None, None, 0.8, %randint_low, 0, 1, None, auto, None, 50), kwargs = {})
    return (fused_sample_default,)""",
        )


def test_compiled_sampler_keeps_the_distribution():
    torch.manual_seed(1)
    weight, row = torch.randn(12, D) * 0.1, torch.randn(D)
    tokens = compiled_draws(
        lambda h: top_k_sampler(h, 4, weight), row.expand(40_000, D), idiom="exact_top_k"
    )
    probs = top_k_probs(F.linear(row, weight).double() / 0.8, 4)
    assert chi_square_p(tokens, probs) > 1e-4


@pytest.mark.parametrize(
    "fn", [values_first, values_first_raced, top_probs_raced], ids=lambda f: f.__name__
)
def test_other_spellings_keep_the_distribution(fn):
    torch.manual_seed(2)
    weight, row = torch.randn(12, D) * 0.1, torch.randn(D)
    tokens = compiled_draws(lambda h: fn(h, 4, weight), row.expand(40_000, D), idiom="exact_top_k")
    probs = top_k_probs(F.linear(row, weight).double() / 0.8, 4)
    assert chi_square_p(tokens, probs) > 1e-4


def test_a_refusal_is_one_site_not_two():
    """The multinomial inside the idiom is part of the gather's site: the warning and
    explain() give the idiom's reason once, not a second, misleading one for the draw."""
    sites = []
    token = SITES.set(sites)
    try:
        graph_after_pass(bf16_logits, h.bfloat16())
    finally:
        SITES.reset(token)
    assert [(site.op, site.rewritten) for site in sites] == [("aten.gather", False)]
