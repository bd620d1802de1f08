# ruff: noqa: E501  (the expected graphs are printed verbatim)
"""``sample_logits(lm_head(h), ...)`` under the backend: one ``fused_sample`` call carrying the
call's temperature, top_k, top_p, seed and num_samples, drawing the tokens eager
``sample_logits`` draws on the same seed; refused where the logits are needed or not made
by an LM-head matmul."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

from flashsampling_inductor import sample_logits
from flashsampling_inductor.patterns import sample_logits as idiom

from .catalog_checks import assert_left_alone, assert_one_fused_call
from .graph_capture import TestCase, graph_after_pass

B, T, D, V = 16, 5, 24, 1000
torch.manual_seed(0)
WEIGHT, BIAS = torch.randn(V, D), torch.randn(V)


def qwen3_step(h, seed):
    logits = F.linear(h[:, -1, :], WEIGHT).float()
    return sample_logits(logits, temperature=0.6, top_k=20, top_p=0.95, seed=seed)


def per_row_step(h, temperature, top_k, top_p, seed):
    logits = (
        F.linear(h[:, -1], WEIGHT, BIAS) / 0.8
    )  # the chain's temperature and the call's multiply
    return sample_logits(
        logits, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, num_samples=3
    )


def bf16_step(h, seed):
    logits = F.linear(h, WEIGHT.bfloat16()).float()
    return sample_logits(logits, temperature=0.9, top_k=50, seed=seed)


def min_p_softcap_step(h, seed):  # the call's own soft-cap and min-p
    logits = F.linear(h, WEIGHT, BIAS)
    return sample_logits(logits, temperature=0.8, top_p=0.9, min_p=0.05, softcap=5.0, seed=seed)


h = torch.randn(B, T, D)
temperature = torch.rand(B) + 0.5
temperature[0] = 0.0  # a greedy row
top_k = torch.randint(0, 60, (B,))
top_p = torch.rand(B) * 0.9 + 0.1
seeds = torch.randint(0, 2**40, (B,))
CASES = [
    pytest.param(qwen3_step, (h, 1234), id="scalars"),
    pytest.param(per_row_step, (h, temperature, top_k, top_p, seeds), id="per-row-tensors"),
    pytest.param(bf16_step, (h[:, -1].bfloat16(), torch.tensor(7)), id="bf16-.float()"),
    pytest.param(min_p_softcap_step, (h[:, -1], 99), id="min-p-softcap"),
]


@pytest.mark.parametrize("fn, args", CASES)
def test_sample_logits_becomes_one_fused_call_with_eager_tokens(fn, args):
    assert_one_fused_call(fn, *args, idiom="sample_logits")
    torch._dynamo.reset()
    counters.clear()
    with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):
        compiled = torch.compile(fn, backend="flashsampling")(*args)
        assert counters["flashsampling"]["sample_logits"] == 1
        torch.testing.assert_close(compiled, fn(*args), rtol=0, atol=0)


def test_search_function_is_rewritten():
    assert_one_fused_call(idiom.search, *idiom.example_inputs(), idiom="sample_logits")


def logits_returned(h):
    logits = F.linear(h, WEIGHT)
    return sample_logits(logits, top_k=20, seed=1), logits


def logits_from_elsewhere(logits):
    return sample_logits(logits * 2.0, top_k=20, seed=1)


def softcap_of_scaled_logits(h):  # the op soft-caps the raw logits
    return sample_logits(F.linear(h, WEIGHT) / 0.7, softcap=5.0, seed=1)


def masked_twice(h):
    logits = F.linear(h, WEIGHT)
    logits = torch.where(logits < torch.topk(logits, 50)[0][..., -1:], -torch.inf, logits)
    return sample_logits(logits, top_k=20, seed=1)


@pytest.mark.parametrize(
    "fn, args, reason",
    [
        pytest.param(logits_returned, (h[:, -1],), "also read by", id="logits-returned"),
        pytest.param(
            logits_from_elsewhere, (torch.randn(B, V),), "no LM-head matmul", id="no-matmul"
        ),
        pytest.param(masked_twice, (h[:, -1],), "truncates them again", id="mask-and-top-k"),
        pytest.param(softcap_of_scaled_logits, (h[:, -1],), "already scaled", id="softcap-after-T"),
    ],
)
def test_near_miss_is_left_alone(fn, args, reason):
    assert_left_alone(fn, *args, reason=reason)


class TestGraphs(TestCase):
    def test_qwen3_step_before_and_after(self):
        before, _ = graph_after_pass(qwen3_step, h[:3, -1:], 1234, backend="inductor")
        self.assertExpectedInline(
            before,
            """\
graph():
    %arg0_1 : [num_users=1] = placeholder[target=arg0_1]
    %arg1_1 : [num_users=1] = placeholder[target=arg1_1]
    %select : [num_users=1] = call_function[target=torch.ops.aten.select.int](args = (%arg0_1, 1, -1), kwargs = {})
    %permute : [num_users=1] = call_function[target=torch.ops.aten.permute.default](args = (%arg1_1, [1, 0]), kwargs = {})
    %mm : [num_users=1] = call_function[target=torch.ops.aten.mm.default](args = (%select, %permute), kwargs = {})
    %sample_logits : [num_users=1] = call_function[target=torch.ops.flashsampling.sample_logits.default](args = (%mm, None, 0.6, None, 1234, 1, None, 20, None, 0.95), kwargs = {})
    return (sample_logits,)""",
        )
        after = assert_one_fused_call(qwen3_step, h[:3, -1:], 1234, idiom="sample_logits")
        self.assertExpectedInline(
            after,
            """\
graph():
    %arg0_1 : [num_users=1] = placeholder[target=arg0_1]
    %arg1_1 : [num_users=1] = placeholder[target=arg1_1]
    %select : [num_users=1] = call_function[target=torch.ops.aten.select.int](args = (%arg0_1, 1, -1), kwargs = {})
    %fused_sample_default : [num_users=1] = call_function[target=torch.ops.flashsampling.fused_sample.default](args = (%select, %arg1_1, None, None, 0.6, None, 1234, 1, None, auto, None, 20, None, 0.95), kwargs = {})
    return (fused_sample_default,)""",
        )
