# ruff: noqa: E501  (the expected graphs are printed verbatim)
"""gpt-fast's ``sample``: ``logits_to_probs`` with ``top_k`` (``torch.topk``, pivot
``v.select(-1, -1)``, ``torch.where(logits < pivot, -inf, logits)``) and its exponential race
``multinomial_sample_one_no_sync``: one fused call with ``top_k``."""

from __future__ import annotations

import pytest
import torch

from .catalog_checks import (
    assert_left_alone,
    assert_one_fused_call,
    chi_square_p,
    compiled_draws,
    top_k_probs,
)
from .graph_capture import TestCase

D, V = 24, 1000
torch.manual_seed(0)
WEIGHT = torch.randn(V, D)


# gpt-fast generate.py, as written there.
def multinomial_sample_one_no_sync(
    probs_sort,
):  # Does multinomial sampling without a cuda synchronization
    q = torch.empty_like(probs_sort).exponential_(1)
    return torch.argmax(probs_sort / q, dim=-1, keepdim=True).to(dtype=torch.int)


def logits_to_probs(logits, temperature: float = 1.0, top_k: int | None = None):
    logits = logits / max(temperature, 1e-5)

    if top_k is not None:
        v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
        pivot = v.select(-1, -1).unsqueeze(-1)
        logits = torch.where(logits < pivot, -float("Inf"), logits)
    probs = torch.nn.functional.softmax(logits, dim=-1)
    return probs


def sample(logits, temperature: float = 1.0, top_k: int | None = None):
    probs = logits_to_probs(logits[:, -1], temperature, top_k)
    idx_next = multinomial_sample_one_no_sync(probs)
    return idx_next, probs


def model_output(x, weight=WEIGHT):  # Transformer.output: logits for every position
    return torch.nn.functional.linear(x, weight)


def decode_one_token(x, temperature=0.8, top_k=200):
    return sample(model_output(x), temperature, top_k)[0]


def decode_bf16_model(x):  # the model in bf16: the temperature and softmax run in bf16
    return sample(model_output(x, WEIGHT.bfloat16()), 0.8, 200)[0]


def decode_float_logits(x):
    return sample(model_output(x, WEIGHT.bfloat16()).float(), 0.8, 200)[0]


def decode_batch_one(x):  # gpt-fast's own shape: logits[0, -1] of a [1, T, V] output
    probs = logits_to_probs(model_output(x)[0, -1], 0.8, 200)
    return multinomial_sample_one_no_sync(probs)


x = torch.randn(3, 5, D)


@pytest.mark.parametrize(
    "fn, args",
    [
        pytest.param(decode_one_token, (x,), id="fp32"),
        pytest.param(decode_bf16_model, (x.bfloat16(),), id="bf16-model"),
        pytest.param(decode_float_logits, (x.bfloat16(),), id="bf16-.float()"),
        pytest.param(decode_batch_one, (x[:1],), id="1d-logits"),
    ],
)
def test_gpt_fast_becomes_one_fused_call(fn, args):
    assert_one_fused_call(fn, *args, idiom="exponential_race")


def probs_returned(x):  # gpt-fast's sample() returns the probs too
    return sample(model_output(x), 0.8, 200)


def pivot_is_the_max(x):
    logits = model_output(x)[:, -1] / 0.8
    v, _ = torch.topk(logits, 200)
    logits = torch.where(logits < v.select(-1, 0).unsqueeze(-1), -float("Inf"), logits)
    return multinomial_sample_one_no_sync(torch.softmax(logits, dim=-1))


def k_from_a_tensor(x, k):  # k read from a tensor: no bound the pass can prove
    logits = model_output(x)[:, -1] / 0.8
    v, _ = torch.topk(logits, k.item())
    logits = torch.where(logits < v.select(-1, -1).unsqueeze(-1), -float("Inf"), logits)
    return multinomial_sample_one_no_sync(torch.softmax(logits, dim=-1))


@pytest.mark.parametrize(
    "fn, args, reason",
    [
        pytest.param(probs_returned, (x,), "also read by", id="probs-returned"),
        pytest.param(pivot_is_the_max, (x,), "not the k-th largest", id="pivot-v[0]"),
    ],
)
def test_near_miss_is_left_alone(fn, args, reason):
    assert_left_alone(fn, *args, reason=reason)


def test_k_from_a_tensor_is_left_alone():
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        assert_left_alone(k_from_a_tensor, x, torch.tensor(200), reason="provably >= 1")


class TestGraphs(TestCase):
    def test_decode_one_token_after(self):
        after = assert_one_fused_call(decode_one_token, x, idiom="exponential_race")
        self.assertExpectedInline(
            after,
            """\
graph():
    %arg0_1 : [num_users=1] = placeholder[target=arg0_1]
    %arg1_1 : [num_users=1] = placeholder[target=arg1_1]
    %select_int : [num_users=1] = call_function[target=torch.ops.aten.select.int](args = (%arg0_1, 1, -1), kwargs = {})
    %randint_low : [num_users=1] = call_function[target=torch.ops.aten.randint.low](args = (0, 4611686018427387904, []), kwargs = {device: cpu, pin_memory: False})
    %fused_sample_default : [num_users=1] = call_function[target=torch.ops.flashsampling.fused_sample.default](args = (%select_int, %arg1_1, None, None, 0.8, %randint_low, 0, 1, None, auto, None, 200), kwargs = {})
    %convert_element_type : [num_users=1] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%fused_sample_default, torch.int32), kwargs = {})
    return (convert_element_type,)""",
        )


def test_compiled_sample_keeps_the_distribution():
    torch.manual_seed(1)
    weight, row = torch.randn(12, D) * 0.1, torch.randn(D)

    def step(x):
        probs = logits_to_probs(torch.nn.functional.linear(x, weight), 0.8, 4)
        return multinomial_sample_one_no_sync(probs)

    tokens = compiled_draws(step, row.expand(40_000, D), idiom="exponential_race")
    probs = top_k_probs(torch.nn.functional.linear(row, weight).double() / 0.8, 4)
    assert chi_square_p(tokens.long(), probs) > 1e-4
