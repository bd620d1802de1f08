# ruff: noqa: E501  (the expected graphs are printed verbatim)
"""Top-p without top-k and min-p, as their projects write them: transformers'
``TopPLogitsWarper`` alone and ``MinPLogitsWarper`` (the real classes), a hand-written min-p,
and Llama's sorted nucleus ``sample_top_p``: one fused call with ``top_p`` / ``min_p``,
drawing what the program draws; their near misses left alone, with the reason."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

from flashsampling_inductor import sample_logits
from flashsampling_inductor.patterns import min_p_mask, sorted_top_p

from .catalog_checks import (
    assert_left_alone,
    assert_one_fused_call,
    chi_square_p,
    compiled_draws,
    min_p_probs,
    top_k_probs,
    top_p_probs,
)
from .graph_capture import TestCase, graph_after_pass

transformers = pytest.importorskip("transformers")
from transformers import (  # noqa: E402
    LogitsProcessorList,
    MinPLogitsWarper,
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


top_p_alone = warpers(TopPLogitsWarper(0.9))
min_p = warpers(TemperatureLogitsWarper(0.7), MinPLogitsWarper(0.1))
min_p_alone = warpers(MinPLogitsWarper(0.05))
top_k_min_p = warpers(TemperatureLogitsWarper(0.7), TopKLogitsWarper(50), MinPLogitsWarper(0.1))
top_p_min_p = warpers(TemperatureLogitsWarper(0.7), TopPLogitsWarper(0.9), MinPLogitsWarper(0.1))


def bf16_model_min_p(input_ids, h):  # bf16 logits, .float() before the warpers
    return min_p(input_ids, h, WEIGHT_BF16)


def min_p_by_hand(input_ids, h):  # max(...).values, keep form, no scatter
    logits = F.linear(h[:, -1], WEIGHT) / 0.8
    probs = logits.softmax(-1)
    keep = probs >= 0.1 * probs.max(dim=-1, keepdim=True).values
    return torch.multinomial(torch.where(keep, logits, -torch.inf).softmax(-1), 1)


def min_p_4x(input_ids, h, keep=1, sorted_of=None, weight=WEIGHT, min_p=0.1):
    """MinPLogitsWarper as transformers 4.x wrote it (copied into many samplers), after a
    temperature; ``keep`` is its min_tokens_to_keep."""
    scores = F.linear(h[..., -1, :], weight) / 0.8
    probs = torch.softmax(scores, dim=-1)
    top_probs, _ = probs.max(dim=-1, keepdim=True)
    tokens_to_remove = probs < min_p * top_probs
    ranked = scores if sorted_of is None else sorted_of(scores)
    sorted_indices = torch.argsort(ranked, descending=True, dim=-1)
    sorted_indices_to_remove = torch.gather(tokens_to_remove, dim=-1, index=sorted_indices)
    sorted_indices_to_remove[..., :keep] = False
    indices_to_remove = sorted_indices_to_remove.scatter(
        1, sorted_indices, sorted_indices_to_remove
    )
    scores = scores.masked_fill(indices_to_remove, -float("Inf"))
    return torch.multinomial(F.softmax(scores, dim=-1), num_samples=1)


# Llama's reference (llama/generation.py), as written there.
def sample_top_p(probs, p):
    probs_sort, probs_idx = torch.sort(probs, dim=-1, descending=True)
    probs_sum = torch.cumsum(probs_sort, dim=-1)
    mask = probs_sum - probs_sort > p
    probs_sort[mask] = 0.0
    probs_sort.div_(probs_sort.sum(dim=-1, keepdim=True))
    next_token = torch.multinomial(probs_sort, num_samples=1)
    next_token = torch.gather(probs_idx, -1, next_token)
    return next_token


def llama(input_ids, h, temperature=0.6, top_p=0.9, weight=WEIGHT):
    logits = F.linear(h[:, -1], weight)
    probs = torch.softmax(logits / temperature, dim=-1)
    return sample_top_p(probs, top_p)


def llama_float_logits(input_ids, h):  # the model's float() output, temperature after
    logits = F.linear(h[:, -1], WEIGHT).float()
    return sample_top_p(torch.softmax(logits / 0.6, dim=-1), 0.9)


def nucleus_masked_fill_top_k(input_ids, h):  # a top-k mask before, masked_fill, no renorm
    logits = TopKLogitsWarper(50)(input_ids, F.linear(h[:, -1], WEIGHT) / 0.8)
    probs_sort, probs_idx = logits.softmax(-1).sort(dim=-1, descending=True)
    removed = probs_sort.cumsum(-1) - probs_sort > 0.8
    choice = probs_sort.masked_fill(removed, 0.0).multinomial(2, replacement=True)
    return probs_idx.gather(-1, choice)


# The older transformers helper (and the samplers copied from it), as written there.
def top_k_top_p_filtering(logits, top_k=0, top_p=1.0, filter_value=-float("Inf"), keep=1):
    if top_p < 1.0:
        sorted_logits, sorted_indices = torch.sort(logits, descending=True)
        cumulative_probs = torch.cumsum(F.softmax(sorted_logits, dim=-1), dim=-1)
        sorted_indices_to_remove = cumulative_probs > top_p
        if keep > 1:
            sorted_indices_to_remove[..., :keep] = 0
        sorted_indices_to_remove[..., 1:] = sorted_indices_to_remove[..., :-1].clone()
        sorted_indices_to_remove[..., 0] = 0
        indices_to_remove = sorted_indices_to_remove.scatter(
            1, sorted_indices, sorted_indices_to_remove
        )
        logits[indices_to_remove] = filter_value
    return logits


def shifted_top_p(input_ids, h, keep=1):
    logits = top_k_top_p_filtering(F.linear(h[:, -1], WEIGHT) / 0.8, top_p=0.9, keep=keep)
    return torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)


def filtering_the_head_view(input_ids, h):
    # As its callers wrote it: the helper's in-place write lands in the LM head's own output.
    logits = top_k_top_p_filtering(F.linear(h, WEIGHT)[:, -1, :], top_p=0.9)
    return torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)


h = torch.randn(B, T, D)


def min_p_per_row(input_ids, h, min_ps):  # vLLM: a [B] tensor, asserted in [0, 1] in the graph
    logits = F.linear(h[:, -1], WEIGHT)
    probs = logits.softmax(-1)
    removed = probs < min_ps[:, None] * probs.amax(-1, keepdim=True)
    return torch.multinomial(logits.masked_fill(removed, -torch.inf).softmax(-1), 1)


POSITIVE = [
    pytest.param(top_p_alone, (IDS, h), "multinomial", id="top-p-alone"),
    pytest.param(min_p, (IDS, h), "multinomial", id="T-min-p"),
    pytest.param(min_p_alone, (IDS, h), "multinomial", id="min-p-alone"),
    pytest.param(top_k_min_p, (IDS, h), "multinomial", id="T-top-k-min-p"),
    pytest.param(top_p_min_p, (IDS, h), "multinomial", id="T-top-p-min-p"),
    pytest.param(bf16_model_min_p, (IDS, h.bfloat16()), "multinomial", id="bf16-.float()-min-p"),
    pytest.param(min_p_by_hand, (IDS, h), "multinomial", id="min-p-by-hand"),
    pytest.param(llama, (IDS, h), "sorted_top_p", id="llama-sample-top-p"),
    pytest.param(llama_float_logits, (IDS, h), "sorted_top_p", id="llama-.float()"),
    pytest.param(nucleus_masked_fill_top_k, (IDS, h), "sorted_top_p", id="top-k-sorted-top-p"),
    pytest.param(shifted_top_p, (IDS, h), "multinomial", id="top_k_top_p_filtering"),
    pytest.param(filtering_the_head_view, (IDS, h), "multinomial", id="filtering-in-place"),
    pytest.param(min_p_4x, (IDS, h), "multinomial", id="min-p-transformers-4"),
    pytest.param(min_p_per_row, (IDS, h, torch.full((B,), 0.1)), "multinomial", id="min-p-rows"),
]


@pytest.mark.parametrize("fn, args, idiom", POSITIVE)
def test_becomes_one_fused_call(fn, args, idiom):
    assert_one_fused_call(fn, *args, idiom=idiom)


@pytest.mark.parametrize(
    "fn, idiom",
    [
        (shifted_top_p, "multinomial"),
        (min_p_by_hand, "multinomial"),
        (nucleus_masked_fill_top_k, "sorted_top_p"),
    ],
    ids=["top_k_top_p_filtering", "min-p-by-hand", "top-k-sorted-top-p"],
)
def test_dynamic_shapes_are_rewritten(fn, idiom):
    """Literal p and min_p stay constants under dynamic=True."""
    assert_one_fused_call(fn, IDS, h, idiom=idiom, dynamic=True)


def test_dynamic_top_p_argument_is_rewritten():
    """A p passed in as a Python float becomes a graph input under dynamic=True (a 0-d
    tensor): rewritten, its value checked in the graph as a per-row p's is."""
    graph = assert_one_fused_call(llama, IDS, h, idiom="sorted_top_p", dynamic=True)
    assert "_assert_async" in graph


@pytest.mark.parametrize("module", [min_p_mask, sorted_top_p], ids=lambda m: m.IDIOM)
def test_search_function_is_rewritten(module):
    idiom = "multinomial" if module is min_p_mask else module.IDIOM
    assert_one_fused_call(module.search, *module.example_inputs(), idiom=idiom)


# --- near misses ----------------------------------------------------------------------------
MIN_P_KEEP_2 = MinPLogitsWarper(0.1, min_tokens_to_keep=2)


def min_p_keeps_two(input_ids, h):
    scores = MIN_P_KEEP_2(input_ids, F.linear(h[:, -1], WEIGHT))
    return torch.multinomial(F.softmax(scores, -1), 1)


def bf16_softmax_min_p(input_ids, h):  # the probabilities compared are bf16
    scores = MinPLogitsWarper(0.1)(input_ids, F.linear(h[:, -1], WEIGHT_BF16))
    return torch.multinomial(F.softmax(scores.float(), -1), 1)


def min_p_then_temperature(input_ids, h):  # min-p of softmax(l), sampled at T = 0.7
    scores = MinPLogitsWarper(0.1)(input_ids, F.linear(h[:, -1], WEIGHT))
    return torch.multinomial(F.softmax(scores / 0.7, -1), 1)


def min_p_then_top_p(input_ids, h):  # the op applies min-p last
    logits = F.linear(h[:, -1], WEIGHT)
    scores = TopPLogitsWarper(0.9)(input_ids, MinPLogitsWarper(0.1)(input_ids, logits))
    return torch.multinomial(F.softmax(scores, -1), 1)


def min_p_le(input_ids, h):  # drops the tokens at the threshold too
    logits = F.linear(h[:, -1], WEIGHT)
    probs = logits.softmax(-1)
    removed = probs <= 0.1 * probs.amax(-1, keepdim=True)
    return torch.multinomial(logits.masked_fill(removed, -torch.inf).softmax(-1), 1)


def min_p_probs_returned(input_ids, h):
    logits = F.linear(h[:, -1], WEIGHT)
    probs = logits.softmax(-1)
    removed = probs < 0.1 * probs.amax(-1, keepdim=True)
    return torch.multinomial(logits.masked_fill(removed, -torch.inf).softmax(-1), 1), probs


def llama_bf16_logits(input_ids, h):  # ties at the token crossing p
    logits = F.linear(h[:, -1], WEIGHT_BF16).float()
    return sample_top_p(torch.softmax(logits / 0.6, dim=-1), 0.9)


def llama_bf16_probs(input_ids, h):
    return llama(input_ids, h, weight=WEIGHT_BF16)


def nucleus_cumsum_over_p(input_ids, h):  # drops the token that crosses p
    probs = torch.softmax(F.linear(h[:, -1], WEIGHT), dim=-1)
    probs_sort, probs_idx = torch.sort(probs, dim=-1, descending=True)
    mask = torch.cumsum(probs_sort, dim=-1) > 0.9
    probs_sort[mask] = 0.0
    return torch.gather(probs_idx, -1, torch.multinomial(probs_sort, 1))


def nucleus_ascending(input_ids, h):
    probs = torch.softmax(F.linear(h[:, -1], WEIGHT), dim=-1)
    probs_sort, probs_idx = torch.sort(probs, dim=-1)
    probs_sort[probs_sort.cumsum(-1) - probs_sort > 0.9] = 0.0
    return torch.gather(probs_idx, -1, torch.multinomial(probs_sort, 1))


def nucleus_sorted_returned(input_ids, h):
    probs = torch.softmax(F.linear(h[:, -1], WEIGHT), dim=-1)
    probs_sort, probs_idx = torch.sort(probs, dim=-1, descending=True)
    kept = probs_sort.masked_fill(probs_sort.cumsum(-1) - probs_sort > 0.9, 0.0)
    return torch.gather(probs_idx, -1, torch.multinomial(kept, 1)), probs_sort


def shifted_top_p_crossing_dropped(input_ids, h):  # no shift: drops the token crossing p
    logits = F.linear(h[:, -1], WEIGHT)
    sorted_logits, sorted_indices = torch.sort(logits, descending=True)
    removed = torch.cumsum(F.softmax(sorted_logits, dim=-1), dim=-1) > 0.9
    removed[..., 0] = 0
    removed = removed.scatter(1, sorted_indices, removed)
    return torch.multinomial(F.softmax(logits.masked_fill(removed, -torch.inf), dim=-1), 1)


def nucleus_after_top_p(input_ids, h):
    logits = TopPLogitsWarper(0.95)(input_ids, F.linear(h[:, -1], WEIGHT))
    return sample_top_p(torch.softmax(logits, dim=-1), 0.9)


NEGATIVE = [
    pytest.param(min_p_keeps_two, (IDS, h), "min_tokens_to_keep", id="min-p-keep-2"),
    pytest.param(min_p_4x, (IDS, h, 2), "min_tokens_to_keep != 1", id="min-p-4.x-keep-2"),
    pytest.param(
        min_p_4x, (IDS, h, 1, torch.neg), "another tensor's sort", id="min-p-4.x-other-sort"
    ),
    pytest.param(
        bf16_softmax_min_p, (IDS, h.bfloat16()), "bfloat16 probabilities", id="min-p-bf16-probs"
    ),
    pytest.param(min_p_then_temperature, (IDS, h), "after the min-p", id="min-p-then-T"),
    pytest.param(min_p_then_top_p, (IDS, h), "after the min-p", id="min-p-then-top-p"),
    pytest.param(min_p_le, (IDS, h), "removes p <= min_p", id="min-p-<="),
    pytest.param(min_p_probs_returned, (IDS, h), "also read by", id="min-p-probs-returned"),
    pytest.param(
        llama_bf16_logits, (IDS, h.bfloat16()), "ties at the token", id="llama-bf16-logits"
    ),
    pytest.param(
        llama_bf16_probs, (IDS, h.bfloat16()), "bfloat16 probabilities", id="llama-bf16-probs"
    ),
    pytest.param(nucleus_cumsum_over_p, (IDS, h), "mass sorted above", id="cumsum-over-p"),
    pytest.param(nucleus_ascending, (IDS, h), "not a descending sort", id="ascending"),
    pytest.param(nucleus_sorted_returned, (IDS, h), "also read by", id="sorted-returned"),
    pytest.param(nucleus_after_top_p, (IDS, h), "already truncated", id="nucleus-after-top-p"),
    pytest.param(llama, (IDS, h, 0.6, 1.5), "outside (0, 1]", id="p=1.5"),
    pytest.param(shifted_top_p, (IDS, h, 2), "cumulative mass > p", id="shifted-keep-2"),
    pytest.param(
        shifted_top_p_crossing_dropped, (IDS, h), "drops the one crossing p", id="not-shifted"
    ),
]


@pytest.mark.parametrize("fn, args, reason", NEGATIVE)
def test_near_miss_is_left_alone(fn, args, reason):
    assert_left_alone(fn, *args, reason=reason)


def test_fallback_random_leaves_the_nucleus_alone():
    graph, rewrites = graph_after_pass(llama, IDS, h, fallback_random=True)
    assert not rewrites and "fused_sample" not in graph


class TestGraphs(TestCase):
    def test_llama_after(self):
        after = assert_one_fused_call(llama, IDS[:, :1], h[:, :1], idiom="sorted_top_p")
        self.assertExpectedInline(
            after,
            """\
graph():
    %arg0_1 : [num_users=1] = placeholder[target=arg0_1]
    %arg1_1 : [num_users=1] = placeholder[target=arg1_1]
    %select : [num_users=1] = call_function[target=torch.ops.aten.select.int](args = (%arg0_1, 1, -1), kwargs = {})
    %randint_low : [num_users=1] = call_function[target=torch.ops.aten.randint.low](args = (0, 4611686018427387904, []), kwargs = {device: cpu, pin_memory: False})
    %fused_sample_default : [num_users=1] = call_function[target=torch.ops.flashsampling.fused_sample.default](args = (%select, %arg1_1, None, None, 0.6, %randint_low, 0, 1, None, auto, None, 0, None, 0.9), kwargs = {})
    return (fused_sample_default,)""",
        )

    def test_min_p_after(self):
        after = assert_one_fused_call(top_k_min_p, IDS[:, :1], h[:, :1], idiom="multinomial")
        self.assertExpectedInline(
            after,
            """\
graph():
    %arg0_1 : [num_users=1] = placeholder[target=arg0_1]
    %arg1_1 : [num_users=1] = placeholder[target=arg1_1]
    %select : [num_users=1] = call_function[target=torch.ops.aten.select.int](args = (%arg0_1, 1, -1), kwargs = {})
    %randint_low : [num_users=1] = call_function[target=torch.ops.aten.randint.low](args = (0, 4611686018427387904, []), kwargs = {device: cpu, pin_memory: False})
    %fused_sample_default : [num_users=1] = call_function[target=torch.ops.flashsampling.fused_sample.default](args = (%select, %arg1_1, None, None, 0.7, %randint_low, 0, 1, None, auto, None, 50, None, 1.0, None, 0.1), kwargs = {})
    %squeeze : [num_users=1] = call_function[target=torch.ops.aten.squeeze.dim](args = (%fused_sample_default, 1), kwargs = {})
    return (squeeze,)""",
        )


# --- distributions --------------------------------------------------------------------------
# 40_000 draws over V = 12 give the test power against a 1% shift in any one token's
# probability; p > 1e-4 keeps the fixed-seed test from flaking when the sampler is right.
SMALL_WEIGHT = torch.randn(12, D) * 0.1  # logits within a few units: several survivors


def sorted_nucleus_small(h):
    return sample_top_p(torch.softmax(F.linear(h, SMALL_WEIGHT) / 0.8, dim=-1), 0.8)


def shifted_top_p_small(h):
    logits = top_k_top_p_filtering(F.linear(h, SMALL_WEIGHT) / 0.8, top_p=0.8)
    return torch.multinomial(F.softmax(logits, dim=-1), 1)


MIN_P_CHAIN = LogitsProcessorList(
    [TemperatureLogitsWarper(0.8), TopKLogitsWarper(10), MinPLogitsWarper(0.15)]
)


def min_p_after_top_k_small(h):
    logits = F.linear(h, SMALL_WEIGHT)
    return torch.multinomial(F.softmax(MIN_P_CHAIN(IDS[:1], logits), dim=-1), 1)


def min_p_4x_small(h):
    return min_p_4x(IDS[:1], h[:, None, :], weight=SMALL_WEIGHT, min_p=0.1)


@pytest.mark.parametrize(
    "step, idiom, oracle",
    [
        (sorted_nucleus_small, "sorted_top_p", lambda logits: top_p_probs(logits, 0.8)),
        (min_p_4x_small, "multinomial", lambda logits: min_p_probs(logits, 0.1)),
        (shifted_top_p_small, "multinomial", lambda logits: top_p_probs(logits, 0.8)),
        (
            min_p_after_top_k_small,
            "multinomial",
            lambda logits: min_p_probs(top_k_probs(logits, 10).log(), 0.15),
        ),
    ],
    ids=["sorted-top-p-0.8", "min-p-4.x-0.1", "shifted-top-p-0.8", "top-k-10-min-p-0.15"],
)
def test_compiled_step_keeps_the_distribution(step, idiom, oracle):
    torch.manual_seed(1)
    row = torch.randn(D)
    tokens = compiled_draws(step, row.expand(40_000, D), idiom=idiom)
    probs = oracle(F.linear(row, SMALL_WEIGHT).double() / 0.8)
    assert 3 <= (probs > 0).sum() < 10  # the truncation keeps several tokens, not all
    assert chi_square_p(tokens, probs) > 1e-4


PATHWISE_WARPERS = LogitsProcessorList([TopPLogitsWarper(0.95), MinPLogitsWarper(0.02)])


def sample_after_warpers(input_ids, h, seed):
    """Warped logits handed to ``sample_logits``: the warpers become the op's knobs."""
    logits = F.linear(h[:, -1], WEIGHT) / 0.7
    return sample_logits(PATHWISE_WARPERS(input_ids, logits), seed=seed, num_samples=2)


def test_warped_sample_logits_draws_eager_tokens():
    """Pathwise: the same seed draws the tokens eager ``sample_logits`` draws on the warped
    logits (the noise is the op's, keyed on the vocabulary index)."""
    args = (IDS[:1].expand(64, T), torch.randn(64, T, D), torch.tensor(11))
    torch._dynamo.reset()
    counters.clear()
    with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):
        compiled = torch.compile(sample_after_warpers, backend="flashsampling")(*args)
        assert dict(counters["flashsampling"]) == {"sample_logits": 1}
        torch.testing.assert_close(compiled, sample_after_warpers(*args), rtol=0, atol=0)
