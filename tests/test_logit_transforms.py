# ruff: noqa: E501  (the expected graphs are printed verbatim)
"""Logit transforms of real LM heads, folded into the one fused call: constant scales
(Cohere's ``logit_scale``, Granite's ``logits_scaling``, Falcon-H1's muP
``lm_head_multiplier``) and the temperature become one temperature, Gemma 2's soft-cap
``tanh(l / c) * c`` the op's ``softcap``, and ``argmax((l + g) / T)`` Gumbel-max at
temperature 1. Each refusal that remains (a negative or non-constant scale, a soft-cap after
the temperature tensor or a mask) is a graph test with its reason."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

from flashsampling_inductor import patterns, sample_logits

from .catalog_checks import assert_left_alone, assert_one_fused_call, chi_square_p, compiled_draws
from .graph_capture import TestCase, graph_after_pass

B, T, D, V = 3, 5, 24, 1000
torch.manual_seed(0)
WEIGHT = torch.randn(V, D)
WEIGHT_BF16 = WEIGHT.bfloat16()


# As the models' forward writes them (transformers 5.x), then sampling as generate does.
def cohere(h, weight=WEIGHT):
    logits = F.linear(h[:, -1], weight)
    logits = logits * 0.0625  # CohereForCausalLM: logits * self.logit_scale
    return torch.multinomial(F.softmax(logits.float() / 0.7, dim=-1), 1)


def granite_bf16(h):
    logits = F.linear(h[:, -1], WEIGHT_BF16)
    logits = logits / 8.0  # GraniteForCausalLM: logits / self.config.logits_scaling
    return torch.multinomial(F.softmax(logits.float() / 0.7, dim=-1), 1)


def falcon_h1_row_temperature(h, temperature):
    logits = F.linear(h[:, -1], WEIGHT) * 0.5  # lm_head(h) * lm_head_multiplier
    return torch.multinomial(F.softmax(logits / temperature[:, None], dim=-1), 1)


def times_inverse_temperature(h, temperature):  # l * (1 / T): T, rounded once more
    return torch.multinomial(F.softmax(F.linear(h[:, -1], WEIGHT) * (1 / temperature), -1), 1)


def times_reciprocal_per_row(h, temperature):
    logits = F.linear(h[:, -1], WEIGHT) * temperature[:, None].reciprocal()
    return torch.multinomial(F.softmax(logits, dim=-1), 1)


def scales_around_top_k(h):  # positive scales commute with top-k
    logits = F.linear(h[:, -1], WEIGHT) * 4.0
    logits = torch.where(logits < torch.topk(logits, 20)[0][..., -1:], -torch.inf, logits)
    return torch.multinomial(F.softmax(logits / 2.0 * 0.5, dim=-1), 1)


def gemma2(h, weight=WEIGHT_BF16):
    logits = F.linear(h[:, -1], weight)
    logits = logits / 30.0  # Gemma2ForCausalLM: final_logit_softcapping
    logits = torch.tanh(logits)
    logits = logits * 30.0
    return torch.multinomial(F.softmax(logits.float() / 0.7, dim=-1), 1)


def gemma2_fp32_greedy(h):
    logits = torch.tanh(F.linear(h, WEIGHT) / 30.0) * 30.0
    return logits.argmax(-1)


def temperature_then_softcap(h):  # tanh(l / (T c)) * c: a soft-cap of T c at temperature T
    logits = F.linear(h, WEIGHT) / 0.7
    return torch.multinomial(F.softmax(torch.tanh(logits / 30.0) * 30.0, dim=-1), 1)


def gumbel_divided(h):
    logits = F.linear(h, WEIGHT)
    g = -torch.log(-torch.log(torch.rand_like(logits)))
    return torch.argmax((logits + g) / 0.7, dim=-1)


def gumbel_scaled_logits_divided(h):  # the chain's scale stays, the outer one goes
    logits = F.linear(h, WEIGHT) * 2.0
    g = -torch.log(torch.empty_like(logits).exponential_())
    return ((logits + g) * 0.5).argmax(-1, keepdim=True)


h = torch.randn(B, T, D)
POSITIVE = [
    pytest.param(cohere, (h,), "multinomial", id="cohere-logit-scale"),
    pytest.param(granite_bf16, (h.bfloat16(),), "multinomial", id="granite-bf16"),
    pytest.param(
        falcon_h1_row_temperature, (h, torch.rand(B) + 0.5), "multinomial", id="mup-row-T"
    ),
    pytest.param(scales_around_top_k, (h,), "multinomial", id="scales-around-top-k"),
    pytest.param(times_inverse_temperature, (h, torch.tensor(0.7)), "multinomial", id="times-1/T"),
    pytest.param(
        times_reciprocal_per_row, (h, torch.rand(B) + 0.5), "multinomial", id="times-1/T-rows"
    ),
    pytest.param(gemma2, (h.bfloat16(),), "multinomial", id="gemma2-softcap-bf16"),
    pytest.param(gemma2_fp32_greedy, (h[:, -1],), "greedy", id="softcap-greedy"),
    pytest.param(temperature_then_softcap, (h[:, -1],), "multinomial", id="T-then-softcap"),
    pytest.param(gumbel_divided, (h[:, -1],), "gumbel", id="gumbel-divided"),
    pytest.param(gumbel_scaled_logits_divided, (h[:, -1],), "gumbel", id="gumbel-scaled"),
]


@pytest.mark.parametrize("fn, args, idiom", POSITIVE)
def test_transform_becomes_one_fused_call(fn, args, idiom):
    graph = assert_one_fused_call(fn, *args, idiom=idiom)
    assert "tanh" not in graph


@pytest.mark.parametrize(
    "fn, args", [(cohere, (h,)), (gemma2, (h.bfloat16(),))], ids=["cohere", "gemma2"]
)
def test_dynamic_shapes_are_rewritten(fn, args):
    assert_one_fused_call(fn, *args, idiom="multinomial", dynamic=True)


# --- near misses ----------------------------------------------------------------------------
def negative_scale(h):
    return torch.multinomial(F.softmax(F.linear(h, WEIGHT) * -2.0, dim=-1), 1)


def zero_scale(h):
    return torch.multinomial(F.softmax(F.linear(h, WEIGHT) * 0.0, dim=-1), 1)


def tensor_scale(h, scale):  # a multiplier read from a tensor: any sign
    return torch.multinomial(F.softmax(F.linear(h, WEIGHT) * scale, dim=-1), 1)


def two_tensor_temperatures(h, t1, t2):
    return torch.multinomial(F.softmax(F.linear(h, WEIGHT) / t1 / t2, dim=-1), 1)


def scale_after_top_p(h):  # top-p kept the tokens of softmax(l), not of softmax(2 l)
    logits = F.linear(h, WEIGHT)
    sorted_logits, sorted_indices = torch.sort(logits, descending=False)
    removed = sorted_logits.softmax(dim=-1).cumsum(dim=-1) <= 0.1
    removed[..., -1:] = 0
    removed = removed.scatter(1, sorted_indices, removed)
    return torch.multinomial(F.softmax(logits.masked_fill(removed, -torch.inf) * 2.0, -1), 1)


def softcap_after_tensor_temperature(h, t):
    logits = F.linear(h, WEIGHT) / t
    return torch.multinomial(F.softmax(torch.tanh(logits / 30.0) * 30.0, dim=-1), 1)


def softcap_after_top_k(h):  # tanh(-inf) is -1: the masked tokens come back
    logits = F.linear(h, WEIGHT)
    logits = torch.where(logits < torch.topk(logits, 20)[0][..., -1:], -torch.inf, logits)
    return torch.multinomial(F.softmax(torch.tanh(logits / 30.0) * 30.0, dim=-1), 1)


def softcap_twice(h):
    logits = torch.tanh(F.linear(h, WEIGHT) / 30.0) * 30.0
    return torch.multinomial(F.softmax(torch.tanh(logits / 20.0) * 20.0, dim=-1), 1)


def bias_after_softcap(h, bias):  # the op adds its bias to the raw logits
    logits = torch.tanh(F.linear(h, WEIGHT) / 30.0) * 30.0 + bias
    return torch.multinomial(F.softmax(logits, dim=-1), 1)


def softcapped_logits_returned(h):
    logits = torch.tanh(F.linear(h, WEIGHT) / 30.0) * 30.0
    return torch.multinomial(F.softmax(logits, dim=-1), 1), logits


def gumbel_negative_temperature(h):  # argmax(-(l + g)) is no sample of softmax(l)
    logits = F.linear(h, WEIGHT)
    g = -torch.log(-torch.log(torch.rand_like(logits)))
    return torch.argmax((logits + g) / -0.7, dim=-1)


def gumbel_tensor_temperature(h, t):
    logits = F.linear(h, WEIGHT)
    g = -torch.log(-torch.log(torch.rand_like(logits)))
    return torch.argmax((logits + g) / t, dim=-1)


x = h[:, -1]
NEGATIVE = [
    pytest.param(negative_scale, (x,), "scales by -2.0", id="negative-scale"),
    pytest.param(zero_scale, (x,), "scales by 0.0", id="zero-scale"),
    pytest.param(tensor_scale, (x, torch.tensor(2.0)), "by a tensor", id="tensor-scale"),
    pytest.param(
        two_tensor_temperatures,
        (x, torch.tensor(2.0), torch.tensor(0.5)),
        "second tensor temperature",
        id="two-tensor-T",
    ),
    pytest.param(scale_after_top_p, (x,), "after the top-p", id="scale-after-top-p"),
    pytest.param(
        softcap_after_tensor_temperature,
        (x, torch.tensor(0.7)),
        "soft-caps logits divided by a tensor",
        id="softcap-after-tensor-T",
    ),
    pytest.param(softcap_after_top_k, (x,), "or masked", id="softcap-after-top-k"),
    pytest.param(softcap_twice, (x,), "a second time", id="softcap-twice"),
    pytest.param(bias_after_softcap, (x, torch.randn(V)), "soft-cap", id="bias-after-softcap"),
    pytest.param(gumbel_negative_temperature, (x,), "by -0.7", id="gumbel-negative-T"),
    pytest.param(
        gumbel_tensor_temperature, (x, torch.tensor(0.7)), "by a tensor", id="gumbel-tensor-T"
    ),
]


@pytest.mark.parametrize("fn, args, reason", NEGATIVE)
def test_near_miss_is_left_alone(fn, args, reason):
    assert_left_alone(fn, *args, reason=reason)


def test_fallback_random_leaves_the_transforms_alone():
    graph, rewrites = graph_after_pass(gemma2, h.bfloat16(), fallback_random=True)
    assert not rewrites and "fused_sample" not in graph


def test_the_pass_uuid_covers_every_catalog_module():
    """The uuid hashes every module file of patterns/ (``source_hash``): new idioms and
    masks invalidate cached graphs without a list to keep in sync."""
    folder = patterns.__file__.rsplit("/", 1)[0]
    for module in (*patterns.IDIOMS, *patterns.MASKS, patterns.tp_gather):
        assert module.__file__.rsplit("/", 1)[0] == folder


class TestGraphs(TestCase):
    def test_gemma2_after(self):
        after = assert_one_fused_call(gemma2, h[:, :1].bfloat16(), idiom="multinomial")
        self.assertExpectedInline(
            after,
            """\
graph():
    %arg0_1 : [num_users=1] = placeholder[target=arg0_1]
    %arg1_1 : [num_users=1] = placeholder[target=arg1_1]
    %select : [num_users=1] = call_function[target=torch.ops.aten.select.int](args = (%arg0_1, 1, -1), kwargs = {})
    %randint_low : [num_users=1] = call_function[target=torch.ops.aten.randint.low](args = (0, 4611686018427387904, []), kwargs = {device: cpu, pin_memory: False})
    %view_default : [num_users=1] = call_function[target=torch.ops.aten.view.default](args = (%select, [-1, 24]), kwargs = {})
    %fused_sample_default : [num_users=1] = call_function[target=torch.ops.flashsampling.fused_sample.default](args = (%view_default, %arg1_1, None, None, 0.7, %randint_low, 0, 1, torch.bfloat16, auto, None, 0, None, 1.0, None, 0.0, 30.0), kwargs = {})
    return (fused_sample_default,)""",
        )

    def test_cohere_after(self):
        after = assert_one_fused_call(cohere, h[:, :1], idiom="multinomial")
        self.assertExpectedInline(
            after,
            """\
graph():
    %arg0_1 : [num_users=1] = placeholder[target=arg0_1]
    %arg1_1 : [num_users=1] = placeholder[target=arg1_1]
    %select : [num_users=1] = call_function[target=torch.ops.aten.select.int](args = (%arg0_1, 1, -1), kwargs = {})
    %randint_low : [num_users=1] = call_function[target=torch.ops.aten.randint.low](args = (0, 4611686018427387904, []), kwargs = {device: cpu, pin_memory: False})
    %fused_sample_default : [num_users=1] = call_function[target=torch.ops.flashsampling.fused_sample.default](args = (%select, %arg1_1, None, None, 11.2, %randint_low, 0, 1, None, auto), kwargs = {})
    return (fused_sample_default,)""",
        )


# --- distributions --------------------------------------------------------------------------
# 40_000 draws over V = 12 give the test power against a 1% shift in any one token's
# probability; p > 1e-4 keeps the fixed-seed test from flaking when the sampler is right.
SMALL_WEIGHT = torch.randn(12, D)  # logits of a few units: the soft-cap of 1.5 bites


def scaled_small(h):
    logits = F.linear(h, SMALL_WEIGHT) * 0.25 / 0.5
    return torch.multinomial(F.softmax(logits / 0.8, dim=-1), 1)


def softcapped_small(h):
    logits = torch.tanh(F.linear(h, SMALL_WEIGHT) / 1.5) * 1.5
    return torch.multinomial(F.softmax(logits / 0.8, dim=-1), 1)


def gumbel_divided_small(h):
    logits = F.linear(h, SMALL_WEIGHT)
    g = -torch.log(-torch.log(torch.rand_like(logits)))
    return torch.argmax((logits + g) / 0.3, dim=-1)


@pytest.mark.parametrize(
    "step, idiom, oracle",
    [
        (scaled_small, "multinomial", lambda logits: logits * 0.25 / 0.5 / 0.8),
        (softcapped_small, "multinomial", lambda logits: torch.tanh(logits / 1.5) * 1.5 / 0.8),
        (gumbel_divided_small, "gumbel", lambda logits: logits),
    ],
    ids=["scales", "softcap", "gumbel-divided"],
)
def test_compiled_transform_keeps_the_distribution(step, idiom, oracle):
    torch.manual_seed(1)
    row = torch.randn(D) * 0.3
    tokens = compiled_draws(step, row.expand(40_000, D), idiom=idiom)
    probs = torch.softmax(oracle(F.linear(row, SMALL_WEIGHT).double()), -1)
    assert chi_square_p(tokens, probs) > 1e-4


def capped_sample_logits(h, seed):
    logits = torch.tanh(F.linear(h, WEIGHT) / 2.0) * 2.0 * 1.25  # a soft-cap and a scale
    return sample_logits(logits, temperature=0.6, top_k=50, seed=seed)


def test_transformed_sample_logits_draws_eager_tokens():
    """Pathwise: the soft-cap and the scale folded into the op draw the tokens eager
    ``sample_logits`` draws on the program's transformed logits, on the same seed."""
    args = (torch.randn(64, D), torch.tensor(5))
    torch._dynamo.reset()
    counters.clear()
    with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):
        compiled = torch.compile(capped_sample_logits, backend="flashsampling")(*args)
        assert dict(counters["flashsampling"]) == {"sample_logits": 1}
        torch.testing.assert_close(compiled, capped_sample_logits(*args), rtol=0, atol=0)
