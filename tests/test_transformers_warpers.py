# ruff: noqa: E501  (the expected graphs are printed verbatim)
"""transformers' ``TopKLogitsWarper`` and ``TopPLogitsWarper`` (the real classes), alone and
chained after ``TemperatureLogitsWarper``, then softmax -> multinomial as ``generate`` samples:
one fused call with ``top_k`` / ``top_p``; their near misses left alone."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from flashsampling_inductor.patterns import top_p_mask

from .catalog_checks import (
    assert_left_alone,
    assert_one_fused_call,
    chi_square_p,
    compiled_draws,
    top_k_probs,
    top_p_probs,
)
from .graph_capture import TestCase, graph_after_pass

transformers = pytest.importorskip("transformers")
from transformers import (  # noqa: E402
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

B, T, D, V = 3, 5, 24, 1000
torch.manual_seed(0)
WEIGHT = torch.randn(V, D)
WEIGHT_BF16 = WEIGHT.bfloat16()
IDS = torch.zeros(B, T, dtype=torch.long)


def warpers(*processors):
    chain = LogitsProcessorList(processors)

    def step(input_ids, h, weight=WEIGHT):
        # generate: the last position's logits, upcast to fp32, then the processors.
        logits = F.linear(h[:, -1, :], weight).to(copy=True, dtype=torch.float32)
        probs = F.softmax(chain(input_ids, logits), dim=-1)
        return torch.multinomial(probs, num_samples=1).squeeze(1)

    return step


top_k = warpers(TemperatureLogitsWarper(0.7), TopKLogitsWarper(50))
top_p = warpers(TemperatureLogitsWarper(0.7), TopPLogitsWarper(0.9))
top_k_top_p = warpers(TemperatureLogitsWarper(0.6), TopKLogitsWarper(20), TopPLogitsWarper(0.95))


def temperature_after_top_k(input_ids, h):
    scores = TopKLogitsWarper(50)(input_ids, F.linear(h[:, -1, :], WEIGHT))
    return torch.multinomial(F.softmax(scores / 0.7, dim=-1), 1)


def per_row_temperature_after_top_k(input_ids, h, t):
    scores = TopKLogitsWarper(50)(input_ids, F.linear(h[:, -1, :], WEIGHT))
    return torch.multinomial(F.softmax(scores / t[:, None], dim=-1), 1)


def bf16_model_top_k(input_ids, h):
    return top_k(input_ids, h, WEIGHT_BF16)


def top_p_then_top_k(input_ids, h):  # the nucleus of the whole row, cut at k: top_p_whole_row
    logits = F.linear(h[:, -1, :], WEIGHT)
    scores = TopKLogitsWarper(20)(input_ids, TopPLogitsWarper(0.9)(input_ids, logits))
    return torch.multinomial(F.softmax(scores, dim=-1), 1)


h = torch.randn(B, T, D)
POSITIVE = [
    pytest.param(top_k, (IDS, h), id="top-k"),
    pytest.param(top_p, (IDS, h), id="top-p"),
    pytest.param(top_k_top_p, (IDS, h), id="top-k-top-p"),
    pytest.param(temperature_after_top_k, (IDS, h), id="T-after-mask"),
    pytest.param(per_row_temperature_after_top_k, (IDS, h, torch.rand(B) + 0.5), id="row-T-after"),
    pytest.param(bf16_model_top_k, (IDS, h.bfloat16()), id="bf16-.float()-top-k"),
    pytest.param(top_p_then_top_k, (IDS, h), id="top-p-then-top-k"),
]


@pytest.mark.parametrize("fn, args", POSITIVE)
def test_warpers_become_one_fused_call(fn, args):
    assert_one_fused_call(fn, *args, idiom="multinomial")


def test_dynamic_shapes_and_k_are_rewritten():
    assert_one_fused_call(top_k, IDS, h, idiom="multinomial", dynamic=True)


def test_dynamic_top_p_is_rewritten():
    """dynamic=True (or a top_p that changed between calls) makes p a graph input, a 0-d
    tensor that the mask compares with as ``1.0 + (-1) * p``: rewritten, p checked in the
    graph (tests/test_dynamic_float_knobs.py draws with it)."""
    graph = assert_one_fused_call(top_p, IDS, h, idiom="multinomial", dynamic=True)
    assert "_assert_async" in graph


# --- near misses ----------------------------------------------------------------------------
def top_k_le(input_ids, h):  # drops the k-th value itself
    scores = F.linear(h[:, -1, :], WEIGHT) / 0.7
    scores = scores.masked_fill(scores <= torch.topk(scores, 50)[0][..., -1, None], -torch.inf)
    return torch.multinomial(F.softmax(scores, dim=-1), 1)


def top_k_values_returned(input_ids, h):
    scores = F.linear(h[:, -1, :], WEIGHT) / 0.7
    values = torch.topk(scores, 50)[0]
    scores = scores.masked_fill(scores < values[..., -1, None], -torch.inf)
    return torch.multinomial(F.softmax(scores, dim=-1), 1), values


def top_k_finfo_min(input_ids, h):  # a finite filter value is another distribution's tail
    logits = F.linear(h[:, -1, :], WEIGHT)
    scores = TopKLogitsWarper(50, filter_value=torch.finfo(torch.float32).min)(input_ids, logits)
    return torch.multinomial(F.softmax(scores, dim=-1), 1)


def top_p_written_by_hand(p, keep=1, comparison=torch.le):
    def step(input_ids, h):
        scores = F.linear(h[:, -1, :], WEIGHT) / 0.7
        sorted_logits, sorted_indices = torch.sort(scores, descending=False)
        cumulative_probs = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        sorted_indices_to_remove = comparison(cumulative_probs, 1 - p)
        sorted_indices_to_remove[..., -keep:] = 0
        indices_to_remove = sorted_indices_to_remove.scatter(
            1, sorted_indices, sorted_indices_to_remove
        )
        return torch.multinomial(
            F.softmax(scores.masked_fill(indices_to_remove, -torch.inf), -1), 1
        )

    return step


def top_p_then_temperature(input_ids, h):  # top-p of softmax(l), sampled from softmax(l / T)
    scores = TopPLogitsWarper(0.9)(input_ids, F.linear(h[:, -1, :], WEIGHT))
    return torch.multinomial(F.softmax(scores / 0.7, dim=-1), 1)


def top_k_over_batch(input_ids, h):
    scores = F.linear(h[:, -1, :], WEIGHT)
    kth = torch.topk(scores, 2, dim=0)[0][-1:, :]
    return torch.multinomial(F.softmax(scores.masked_fill(scores < kth, -torch.inf), -1), 1)


def bf16_model_top_p(input_ids, h):
    return top_p(input_ids, h, WEIGHT_BF16)


NEGATIVE = [
    pytest.param(top_k_le, (IDS, h), "removes x <= kth", id="top-k-<="),
    pytest.param(top_k_values_returned, (IDS, h), "also read by", id="top-k-values-read"),
    pytest.param(top_k_finfo_min, (IDS, h), "not -inf", id="filter-value-finfo-min"),
    pytest.param(top_p_written_by_hand(1.5), (IDS, h), "outside (0, 1]", id="p=1.5"),
    pytest.param(top_p_written_by_hand(0.9, keep=2), (IDS, h), "min_tokens", id="keep-2"),
    pytest.param(top_p_then_temperature, (IDS, h), "after the top-p", id="top-p-then-T"),
    pytest.param(top_k_over_batch, (IDS, h), "not the vocabulary dim", id="top-k-dim-0"),
    pytest.param(bf16_model_top_p, (IDS, h.bfloat16()), "ties at the token", id="bf16-top-p"),
]


@pytest.mark.parametrize("fn, args, reason", NEGATIVE)
def test_near_miss_is_left_alone(fn, args, reason):
    assert_left_alone(fn, *args, reason=reason)


def test_top_p_strict_comparison_is_rewritten():
    """``< 1 - p`` keeps a token whose mass above is exactly p, where ``<=`` (and the op)
    drop it: the program's fp32 cumsum and the op's fp32 sum round differently anyway, so
    that is a near-tie (top_p_mask.py), as for the descending ``> p`` forms."""
    step = top_p_written_by_hand(0.9, comparison=torch.lt)
    assert_one_fused_call(step, IDS, h, idiom="multinomial")


def test_each_mask_module_rewrites_its_search_function():
    assert_one_fused_call(top_p_mask.search, *top_p_mask.example_inputs(), idiom="multinomial")


class TestGraphs(TestCase):
    def test_top_k_top_p_before_and_after(self):
        args = (IDS[:, :1], torch.randn(B, 1, D))
        before, _ = graph_after_pass(top_k_top_p, *args, backend="inductor")
        # Stock's graph, what the pass matches, as torch <= 2.14 writes it: 2.15 decomposes
        # the keep-the-top-token line (mask[..., -1] = False) another way, which the pass
        # also matches (patterns/_walk.writes_zero); the graph after the pass is the same.
        if torch.torch_version.TorchVersion(torch.__version__) < (2, 15):
            self.assertExpectedInline(
                before,
                """\
graph():
    %arg0_1 : [num_users=1] = placeholder[target=arg0_1]
    %arg1_1 : [num_users=1] = placeholder[target=arg1_1]
    %select : [num_users=1] = call_function[target=torch.ops.aten.select.int](args = (%arg0_1, 1, -1), kwargs = {})
    %permute : [num_users=1] = call_function[target=torch.ops.aten.permute.default](args = (%arg1_1, [1, 0]), kwargs = {})
    %mm : [num_users=1] = call_function[target=torch.ops.aten.mm.default](args = (%select, %permute), kwargs = {})
    %convert_element_type : [num_users=1] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%mm, torch.float32), kwargs = {})
    %div : [num_users=3] = call_function[target=torch.ops.aten.div.Tensor](args = (%convert_element_type, 0.6), kwargs = {})
    %topk : [num_users=1] = call_function[target=torch.ops.aten.topk.default](args = (%div, 20), kwargs = {})
    %getitem : [num_users=1] = call_function[target=operator.getitem](args = (%topk, 0), kwargs = {})
    %select_1 : [num_users=1] = call_function[target=torch.ops.aten.select.int](args = (%getitem, 1, -1), kwargs = {})
    %unsqueeze : [num_users=1] = call_function[target=torch.ops.aten.unsqueeze.default](args = (%select_1, 1), kwargs = {})
    %lt : [num_users=1] = call_function[target=torch.ops.aten.lt.Tensor](args = (%div, %unsqueeze), kwargs = {})
    %scalar_tensor : [num_users=1] = call_function[target=torch.ops.aten.scalar_tensor.default](args = (-inf,), kwargs = {dtype: torch.float32, layout: torch.strided, device: cpu})
    %where : [num_users=2] = call_function[target=torch.ops.aten.where.self](args = (%lt, %scalar_tensor, %div), kwargs = {})
    %sort : [num_users=2] = call_function[target=torch.ops.aten.sort.default](args = (%where,), kwargs = {})
    %getitem_2 : [num_users=2] = call_function[target=operator.getitem](args = (%sort, 0), kwargs = {})
    %getitem_3 : [num_users=1] = call_function[target=operator.getitem](args = (%sort, 1), kwargs = {})
    %amax : [num_users=1] = call_function[target=torch.ops.aten.amax.default](args = (%getitem_2, [-1], True), kwargs = {})
    %sub : [num_users=1] = call_function[target=torch.ops.aten.sub.Tensor](args = (%getitem_2, %amax), kwargs = {})
    %exp : [num_users=2] = call_function[target=torch.ops.aten.exp.default](args = (%sub,), kwargs = {})
    %sum_1 : [num_users=1] = call_function[target=torch.ops.aten.sum.dim_IntList](args = (%exp, [-1], True), kwargs = {})
    %div_1 : [num_users=1] = call_function[target=torch.ops.aten.div.Tensor](args = (%exp, %sum_1), kwargs = {})
    %cumsum : [num_users=1] = call_function[target=torch.ops.aten.cumsum.default](args = (%div_1, -1), kwargs = {})
    %le : [num_users=2] = call_function[target=torch.ops.aten.le.Scalar](args = (%cumsum, 0.050000000000000044), kwargs = {})
    %_tensor_constant0 : [num_users=1] = get_attr[target=_tensor_constant0]
    %lift_fresh_copy : [num_users=1] = call_function[target=torch.ops.aten.lift_fresh_copy.default](args = (%_tensor_constant0,), kwargs = {})
    %slice_1 : [num_users=1] = call_function[target=torch.ops.aten.slice.Tensor](args = (%le, 1, -1, 9223372036854775807), kwargs = {})
    %copy : [num_users=1] = call_function[target=torch.ops.aten.copy.default](args = (%slice_1, %lift_fresh_copy), kwargs = {})
    %slice_scatter : [num_users=1] = call_function[target=torch.ops.aten.slice_scatter.default](args = (%le, %copy, 1, -1, 9223372036854775807), kwargs = {})
    %scatter : [num_users=1] = call_function[target=torch.ops.aten.scatter.src](args = (%slice_scatter, 1, %getitem_3, %slice_scatter), kwargs = {})
    %scalar_tensor_1 : [num_users=1] = call_function[target=torch.ops.aten.scalar_tensor.default](args = (-inf,), kwargs = {dtype: torch.float32, layout: torch.strided, device: cpu})
    %where_1 : [num_users=2] = call_function[target=torch.ops.aten.where.self](args = (%scatter, %scalar_tensor_1, %where), kwargs = {})
    %amax_1 : [num_users=1] = call_function[target=torch.ops.aten.amax.default](args = (%where_1, [-1], True), kwargs = {})
    %sub_1 : [num_users=1] = call_function[target=torch.ops.aten.sub.Tensor](args = (%where_1, %amax_1), kwargs = {})
    %exp_1 : [num_users=2] = call_function[target=torch.ops.aten.exp.default](args = (%sub_1,), kwargs = {})
    %sum_2 : [num_users=1] = call_function[target=torch.ops.aten.sum.dim_IntList](args = (%exp_1, [-1], True), kwargs = {})
    %div_2 : [num_users=1] = call_function[target=torch.ops.aten.div.Tensor](args = (%exp_1, %sum_2), kwargs = {})
    %multinomial : [num_users=1] = call_function[target=torch.ops.aten.multinomial.default](args = (%div_2, 1), kwargs = {})
    %squeeze : [num_users=1] = call_function[target=torch.ops.aten.squeeze.dim](args = (%multinomial, 1), kwargs = {})
    return (squeeze,)""",
            )
        after = assert_one_fused_call(top_k_top_p, *args, idiom="multinomial")
        self.assertExpectedInline(
            after,
            """\
graph():
    %arg0_1 : [num_users=1] = placeholder[target=arg0_1]
    %arg1_1 : [num_users=1] = placeholder[target=arg1_1]
    %select : [num_users=1] = call_function[target=torch.ops.aten.select.int](args = (%arg0_1, 1, -1), kwargs = {})
    %randint_low : [num_users=1] = call_function[target=torch.ops.aten.randint.low](args = (0, 4611686018427387904, []), kwargs = {device: cpu, pin_memory: False})
    %view_default : [num_users=1] = call_function[target=torch.ops.aten.view.default](args = (%select, [-1, 24]), kwargs = {})
    %fused_sample_default : [num_users=1] = call_function[target=torch.ops.flashsampling.fused_sample.default](args = (%view_default, %arg1_1, None, None, 0.6, %randint_low, 0, 1, None, auto, None, 20, None, 0.95), kwargs = {})
    %squeeze : [num_users=1] = call_function[target=torch.ops.aten.squeeze.dim](args = (%fused_sample_default, 1), kwargs = {})
    return (squeeze,)""",
        )

    def test_near_miss_top_k_le_is_untouched(self):
        self.assertExpectedInline(
            assert_left_alone(top_k_le, IDS, h),
            """\
graph():
    %arg0_1 : [num_users=1] = placeholder[target=arg0_1]
    %arg1_1 : [num_users=1] = placeholder[target=arg1_1]
    %select : [num_users=1] = call_function[target=torch.ops.aten.select.int](args = (%arg0_1, 1, -1), kwargs = {})
    %permute : [num_users=1] = call_function[target=torch.ops.aten.permute.default](args = (%arg1_1, [1, 0]), kwargs = {})
    %mm : [num_users=1] = call_function[target=torch.ops.aten.mm.default](args = (%select, %permute), kwargs = {})
    %div : [num_users=3] = call_function[target=torch.ops.aten.div.Tensor](args = (%mm, 0.7), kwargs = {})
    %topk : [num_users=1] = call_function[target=torch.ops.aten.topk.default](args = (%div, 50), kwargs = {})
    %getitem : [num_users=1] = call_function[target=operator.getitem](args = (%topk, 0), kwargs = {})
    %select_1 : [num_users=1] = call_function[target=torch.ops.aten.select.int](args = (%getitem, 1, -1), kwargs = {})
    %unsqueeze : [num_users=1] = call_function[target=torch.ops.aten.unsqueeze.default](args = (%select_1, 1), kwargs = {})
    %le : [num_users=1] = call_function[target=torch.ops.aten.le.Tensor](args = (%div, %unsqueeze), kwargs = {})
    %scalar_tensor : [num_users=1] = call_function[target=torch.ops.aten.scalar_tensor.default](args = (-inf,), kwargs = {dtype: torch.float32, layout: torch.strided, device: cpu})
    %where : [num_users=2] = call_function[target=torch.ops.aten.where.self](args = (%le, %scalar_tensor, %div), kwargs = {})
    %amax : [num_users=1] = call_function[target=torch.ops.aten.amax.default](args = (%where, [-1], True), kwargs = {})
    %sub : [num_users=1] = call_function[target=torch.ops.aten.sub.Tensor](args = (%where, %amax), kwargs = {})
    %exp : [num_users=2] = call_function[target=torch.ops.aten.exp.default](args = (%sub,), kwargs = {})
    %sum_1 : [num_users=1] = call_function[target=torch.ops.aten.sum.dim_IntList](args = (%exp, [-1], True), kwargs = {})
    %div_1 : [num_users=1] = call_function[target=torch.ops.aten.div.Tensor](args = (%exp, %sum_1), kwargs = {})
    %multinomial : [num_users=1] = call_function[target=torch.ops.aten.multinomial.default](args = (%div_1, 1), kwargs = {})
    return (multinomial,)""",
        )


# 40_000 draws over V = 12 give the test power against a 1% shift in any one token's
# probability; p > 1e-4 keeps the fixed-seed test from flaking when the sampler is right.
SMALL_WEIGHT = torch.randn(12, D) * 0.1  # logits within a few units: several survivors


@pytest.mark.parametrize(
    "processors, oracle",
    [
        ((TopKLogitsWarper(4),), lambda logits: top_k_probs(logits, 4)),
        ((TopPLogitsWarper(0.8),), lambda logits: top_p_probs(logits, 0.8)),
        (
            (TopKLogitsWarper(6), TopPLogitsWarper(0.7)),
            lambda logits: top_p_probs(top_k_probs(logits, 6).log(), 0.7),
        ),
        (  # the nucleus of the whole row, then its top 3 (the op's top_p_whole_row)
            (TopPLogitsWarper(0.9), TopKLogitsWarper(3)),
            lambda logits: top_k_probs(top_p_probs(logits, 0.9).log(), 3),
        ),
    ],
    ids=["top-k-4", "top-p-0.8", "top-k-6-top-p-0.7", "top-p-0.9-top-k-3"],
)
def test_compiled_warpers_keep_the_distribution(processors, oracle):
    chain = LogitsProcessorList([TemperatureLogitsWarper(0.8), *processors])

    def step(input_ids, h):
        logits = F.linear(h, SMALL_WEIGHT)
        return torch.multinomial(F.softmax(chain(input_ids, logits), dim=-1), 1)

    torch.manual_seed(1)
    row = torch.randn(D)
    tokens = compiled_draws(
        step, IDS[:1].expand(40_000, T), row.expand(40_000, D), idiom="multinomial"
    )
    probs = oracle(F.linear(row, SMALL_WEIGHT).double() / 0.8)
    assert 3 <= (probs > 0).sum() < 12  # the truncation keeps several tokens, not all
    assert chi_square_p(tokens, probs) > 1e-4


def test_negative_temperature_after_the_mask_fails_loudly():
    """-inf / T is +inf for T < 0 (the program's probabilities become NaN): the sign cannot be
    folded into the hidden state there, so the rewritten step asserts T > 0."""
    torch._dynamo.reset()
    compiled = torch.compile(per_row_temperature_after_top_k, backend="flashsampling")
    with torch.no_grad(), pytest.raises(RuntimeError, match="flashsampling: a rewritten"):
        compiled(IDS, h, torch.tensor([0.7, -0.7, 1.0]))


def test_a_near_miss_draws_what_stock_inductor_draws():
    """Left alone means unchanged: on the same seed the step compiled with the backend
    draws exactly the tokens of the step compiled by stock Inductor."""
    tokens = {}
    for backend in ("inductor", "flashsampling"):
        torch._dynamo.reset()
        torch.manual_seed(5)
        with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):
            tokens[backend] = torch.compile(top_k_le, backend=backend)(IDS, h)
    torch.testing.assert_close(tokens["flashsampling"], tokens["inductor"], rtol=0, atol=0)
