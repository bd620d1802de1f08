# ruff: noqa: E501  (the expected graphs are printed verbatim)
"""nanoGPT's ``generate`` with ``top_k``: ``logits[logits < v[:, [-1]]] = -float('Inf')`` (an
in-place ``index_put``), then softmax -> multinomial: one fused call with ``top_k``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from flashsampling_inductor.patterns import top_k_mask

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
LM_HEAD = torch.nn.Linear(D, V, bias=False)


# nanoGPT model.py GPT.generate, one step, as written there.
def generate_step(x, temperature=0.8, top_k=200, lm_head=LM_HEAD):
    logits = lm_head(x)
    # pluck the logits at the final step and scale by desired temperature
    logits = logits[:, -1, :] / temperature
    # optionally crop the logits to only the top k options
    if top_k is not None:
        v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
        logits[logits < v[:, [-1]]] = -float("Inf")
    # apply softmax to convert logits to (normalized) probabilities
    probs = F.softmax(logits, dim=-1)
    # sample from the distribution
    idx_next = torch.multinomial(probs, num_samples=1)
    return idx_next


def float_logits(x):
    logits = F.linear(x[:, -1, :], LM_HEAD.weight.bfloat16()).float() / 0.8
    v, _ = torch.topk(logits, 200)
    logits[logits < v[:, [-1]]] = -float("Inf")
    return torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)


# The mask written in place into the LM head's own [B, T, V] output, through the view of its
# last position (no temperature division first makes a copy): functionalization writes the
# masked row back into the whole tensor (select_scatter) and reads it back.
def in_place_on_the_head_view(x, top_k=200, lm_head=LM_HEAD):
    logits = lm_head(x)[:, -1, :]
    v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
    logits[logits < v[:, [-1]]] = -float("Inf")
    return torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)


def temperature_after_the_in_place_mask(x):
    logits = LM_HEAD(x)[:, -1, :]
    v, _ = torch.topk(logits, 200)
    logits[logits < v[:, [-1]]] = -float("Inf")
    return torch.multinomial(F.softmax(logits / 0.8, dim=-1), num_samples=1)


def masked_fill_on_the_head_view(x):  # TopKLogitsWarper's mask, in place
    scores = F.linear(x, LM_HEAD.weight)[:, -1, :]
    scores.masked_fill_(scores < torch.topk(scores, 200)[0][..., -1, None], -float("inf"))
    return torch.multinomial(F.softmax(scores, dim=-1), num_samples=1)


x = torch.randn(3, 5, D)


@pytest.mark.parametrize(
    "fn, args",
    [
        pytest.param(generate_step, (x,), id="nanogpt"),
        pytest.param(float_logits, (x.bfloat16(),), id="bf16-.float()"),
        pytest.param(top_k_mask.search, top_k_mask.example_inputs(), id="search"),
        pytest.param(in_place_on_the_head_view, (x,), id="in-place-on-the-head-view"),
        pytest.param(temperature_after_the_in_place_mask, (x,), id="T-after-in-place"),
        pytest.param(masked_fill_on_the_head_view, (x,), id="masked_fill_-on-the-view"),
    ],
)
def test_nanogpt_becomes_one_fused_call(fn, args):
    assert_one_fused_call(fn, *args, idiom="multinomial")


def fill_minus_1e4(x):
    logits = LM_HEAD(x)[:, -1, :] / 0.8
    v, _ = torch.topk(logits, 200)
    logits[logits < v[:, [-1]]] = -1e4
    return torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)


def pivot_first(x):
    logits = LM_HEAD(x)[:, -1, :] / 0.8
    v, _ = torch.topk(logits, 200)
    logits[logits < v[:, [0]]] = -float("Inf")
    return torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)


def mask_over_positions(x):  # top-k over the time dim, then the last position
    logits = LM_HEAD(x) / 0.8
    v, _ = torch.topk(logits, 2, dim=1)
    logits[logits < v[:, [-1], :]] = -float("Inf")
    return torch.multinomial(F.softmax(logits[:, -1, :], dim=-1), num_samples=1)


def the_whole_head_returned_too(x):  # it holds the masked row: the program needs it
    all_logits = LM_HEAD(x)
    logits = all_logits[:, -1, :]
    v, _ = torch.topk(logits, 200)
    logits[logits < v[:, [-1]]] = -float("Inf")
    return torch.multinomial(F.softmax(logits, dim=-1), num_samples=1), all_logits


def another_position_sampled(x):  # masks the last position, samples the one before
    all_logits = LM_HEAD(x)
    logits = all_logits[:, -1, :]
    v, _ = torch.topk(logits, 200)
    logits[logits < v[:, [-1]]] = -float("Inf")
    return torch.multinomial(F.softmax(all_logits[:, -2, :], dim=-1), num_samples=1)


@pytest.mark.parametrize(
    "fn, reason",
    [
        pytest.param(fill_minus_1e4, "not -inf", id="fill--1e4"),
        pytest.param(the_whole_head_returned_too, "also read by", id="head-returned"),
        pytest.param(another_position_sampled, "select_scatter", id="another-position"),
        pytest.param(pivot_first, "not the k-th largest", id="v[:, [0]]"),
        pytest.param(mask_over_positions, "not the vocabulary dim", id="topk-dim-1"),
    ],
)
def test_near_miss_is_left_alone(fn, reason):
    assert_left_alone(fn, x, reason=reason)


class TestGraphs(TestCase):
    def test_generate_step_before_and_after(self):
        before, _ = graph_after_pass(generate_step, x, backend="inductor")
        # Stock's graph as torch <= 2.14 writes it (2.15 writes the -inf fill as a
        # scalar_tensor); the graph after the pass is compared on every version.
        if torch.torch_version.TorchVersion(torch.__version__) < (2, 15):
            self.assertExpectedInline(
                before,
                """\
graph():
    %arg0_1 : [num_users=1] = placeholder[target=arg0_1]
    %arg1_1 : [num_users=1] = placeholder[target=arg1_1]
    %permute : [num_users=1] = call_function[target=torch.ops.aten.permute.default](args = (%arg0_1, [1, 0]), kwargs = {})
    %view : [num_users=1] = call_function[target=torch.ops.aten.view.default](args = (%arg1_1, [15, 24]), kwargs = {})
    %mm : [num_users=1] = call_function[target=torch.ops.aten.mm.default](args = (%view, %permute), kwargs = {})
    %view_1 : [num_users=1] = call_function[target=torch.ops.aten.view.default](args = (%mm, [3, 5, 1000]), kwargs = {})
    %select : [num_users=1] = call_function[target=torch.ops.aten.select.int](args = (%view_1, 1, -1), kwargs = {})
    %div : [num_users=3] = call_function[target=torch.ops.aten.div.Tensor](args = (%select, 0.8), kwargs = {})
    %topk : [num_users=1] = call_function[target=torch.ops.aten.topk.default](args = (%div, 200), kwargs = {})
    %getitem : [num_users=1] = call_function[target=operator.getitem](args = (%topk, 0), kwargs = {})
    %_tensor_constant0 : [num_users=1] = get_attr[target=_tensor_constant0]
    %lift_fresh_copy : [num_users=1] = call_function[target=torch.ops.aten.lift_fresh_copy.default](args = (%_tensor_constant0,), kwargs = {})
    %index : [num_users=1] = call_function[target=torch.ops.aten.index.Tensor](args = (%getitem, [None, %lift_fresh_copy]), kwargs = {})
    %lt : [num_users=1] = call_function[target=torch.ops.aten.lt.Tensor](args = (%div, %index), kwargs = {})
    %_tensor_constant1 : [num_users=1] = get_attr[target=_tensor_constant1]
    %lift_fresh_copy_1 : [num_users=1] = call_function[target=torch.ops.aten.lift_fresh_copy.default](args = (%_tensor_constant1,), kwargs = {})
    %index_put : [num_users=2] = call_function[target=torch.ops.aten.index_put.default](args = (%div, [%lt], %lift_fresh_copy_1), kwargs = {})
    %amax : [num_users=1] = call_function[target=torch.ops.aten.amax.default](args = (%index_put, [-1], True), kwargs = {})
    %sub : [num_users=1] = call_function[target=torch.ops.aten.sub.Tensor](args = (%index_put, %amax), kwargs = {})
    %exp : [num_users=2] = call_function[target=torch.ops.aten.exp.default](args = (%sub,), kwargs = {})
    %sum_1 : [num_users=1] = call_function[target=torch.ops.aten.sum.dim_IntList](args = (%exp, [-1], True), kwargs = {})
    %div_1 : [num_users=1] = call_function[target=torch.ops.aten.div.Tensor](args = (%exp, %sum_1), kwargs = {})
    %multinomial : [num_users=1] = call_function[target=torch.ops.aten.multinomial.default](args = (%div_1, 1), kwargs = {})
    return (multinomial,)""",
            )
        self.assertExpectedInline(
            assert_one_fused_call(generate_step, x, idiom="multinomial"),
            """\
graph():
    %arg0_1 : [num_users=1] = placeholder[target=arg0_1]
    %arg1_1 : [num_users=1] = placeholder[target=arg1_1]
    %select_int : [num_users=1] = call_function[target=torch.ops.aten.select.int](args = (%arg1_1, 1, -1), kwargs = {})
    %randint_low : [num_users=1] = call_function[target=torch.ops.aten.randint.low](args = (0, 4611686018427387904, []), kwargs = {device: cpu, pin_memory: False})
    %fused_sample_default : [num_users=1] = call_function[target=torch.ops.flashsampling.fused_sample.default](args = (%select_int, %arg0_1, None, None, 0.8, %randint_low, 0, 1, None, auto, None, 200), kwargs = {})
    return (fused_sample_default,)""",
        )


def test_in_place_on_the_head_view_keeps_the_distribution():
    torch.manual_seed(2)
    lm_head, row = torch.nn.Linear(D, 12, bias=False), torch.randn(D)
    lm_head.weight.data.mul_(3)

    def step(x):
        return in_place_on_the_head_view(x, 5, lm_head)

    tokens = compiled_draws(step, row.expand(40_000, 1, D), idiom="multinomial")
    probs = top_k_probs(lm_head(row).detach().double(), 5)
    assert chi_square_p(tokens, probs) > 1e-4


def test_compiled_generate_keeps_the_distribution():
    torch.manual_seed(1)
    lm_head, row = torch.nn.Linear(D, 12, bias=False), torch.randn(D)
    lm_head.weight.data.mul_(3)  # logits within a few units: several survivors

    def step(x):
        return generate_step(x, 0.8, 5, lm_head)

    tokens = compiled_draws(step, row.expand(40_000, 1, D), idiom="multinomial")
    probs = top_k_probs(lm_head(row).detach().double() / 0.8, 5)
    assert chi_square_p(tokens, probs) > 1e-4
