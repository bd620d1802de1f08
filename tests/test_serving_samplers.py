"""Serving samplers with every knob per row: vLLM's ``Sampler`` (greedy and sampled rows in
one batch, ``apply_top_k_top_p`` in sorted order, min-p, the exponential race) and
transformers' continuous-batching warpers (the real classes, their knobs read from an int32
tensor). Each becomes ONE fused call whose per-row temperature / top_k / top_p / min_p are
the program's own tensors, checked in the graph; each draws, row by row, the distribution
the program defines (chi-square against float64); near misses are left alone with their
reason."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

from flashsampling_inductor.patterns import mixed_greedy

from .catalog_checks import (
    assert_left_alone,
    assert_one_fused_call,
    chi_square_p,
    compiled_draws,
    top_p_probs,
)

transformers = pytest.importorskip("transformers")
from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper  # noqa: E402
from transformers.generation.continuous_batching.cb_logits_processors import (  # noqa: E402
    ContinuousBatchingTemperatureLogitsWarper,
    ContinuousBatchingTopKLogitsWarper,
    ContinuousBatchingTopPLogitsWarper,
)

B, D, V = 4, 16, 64
torch.manual_seed(0)
WEIGHT = torch.randn(V, D)
_SAMPLING_EPS = 1e-5


# --- vLLM v1 (vllm/v1/sample/sampler.py, ops/topk_topp_sampler.py), op for op -------------
def apply_top_k_top_p(logits, k, p):
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
    if k is not None:
        top_k_mask = logits_sort.size(1) - k.to(torch.long)
        top_k_mask = logits_sort.gather(1, top_k_mask.unsqueeze(dim=1))
        top_k_mask = logits_sort < top_k_mask
        logits_sort.masked_fill_(top_k_mask, -float("inf"))
    if p is not None:
        probs_sort = logits_sort.softmax(dim=-1)
        probs_sum = torch.cumsum(probs_sort, dim=-1, out=probs_sort)
        top_p_mask = probs_sum <= 1 - p.unsqueeze(dim=1)
        top_p_mask[:, -1] = False
        logits_sort.masked_fill_(top_p_mask, -float("inf"))
    logits = logits_sort.scatter(dim=-1, index=logits_idx, src=logits_sort)
    return logits


def random_sample(probs):
    q = torch.empty_like(probs)
    q.exponential_()
    return probs.div_(q).argmax(dim=-1).view(-1)


def apply_min_p(logits, min_p):
    probability_values = torch.nn.functional.softmax(logits, dim=-1)
    max_probabilities = torch.amax(probability_values, dim=-1, keepdim=True)
    adjusted_min_p = min_p.unsqueeze(1) * max_probabilities
    valid_token_mask = probability_values >= adjusted_min_p
    logits[~valid_token_mask] = -float("inf")
    return logits


def vllm_sample(h, temperature, k, p, min_p=None, weight=WEIGHT, all_random=False):
    logits = F.linear(h, weight).to(torch.float32)
    greedy_sampled = None if all_random else logits.argmax(dim=-1).view(-1)
    logits = logits.div_(temperature.unsqueeze(dim=1))
    if min_p is not None:
        logits = apply_min_p(logits, min_p)
    logits = apply_top_k_top_p(logits, k, p)
    probs = logits.softmax(dim=-1, dtype=torch.float32)
    random_sampled = random_sample(probs)
    if greedy_sampled is None:
        return random_sampled
    return torch.where(temperature < _SAMPLING_EPS, greedy_sampled, random_sampled)


def vllm_all_random(h, temperature, k, p):
    return vllm_sample(h, temperature, k, p, all_random=True)


def vllm_top_k_int32(h, temperature, k, p):
    return vllm_sample(h, temperature, k.int(), p)


def vllm_top_p_only(h, temperature, k, p):
    return vllm_sample(h, temperature, None, p)


def vllm_min_p(h, temperature, k, p, min_p):  # min-p, no top-k / top-p: the race after it
    logits = F.linear(h, WEIGHT).div_(temperature.unsqueeze(dim=1))
    return random_sample(apply_min_p(logits, min_p).softmax(dim=-1, dtype=torch.float32))


# --- transformers continuous batching (the real warpers) ----------------------------------
CB = [
    ContinuousBatchingTemperatureLogitsWarper(TemperatureLogitsWarper(0.7)),
    ContinuousBatchingTopKLogitsWarper(TopKLogitsWarper(50)),
    ContinuousBatchingTopPLogitsWarper(TopPLogitsWarper(0.9)),
]


def cb_step(h, arguments, weight=WEIGHT):
    scores = F.linear(h, weight)
    for processor, argument in zip(CB, arguments, strict=True):
        scores = processor(scores, argument)
    probs = F.softmax(scores, dim=-1)
    return torch.multinomial(probs, num_samples=1).squeeze(1)


def cb_arguments(temperature, k, p, capacity=None):
    """The int32 storage the warpers read: one row per processor, floats viewed as int32."""
    capacity = capacity or temperature.numel() + 3
    storage = torch.zeros(3, capacity, dtype=torch.int32)
    storage[0, : temperature.numel()] = temperature.float().view(torch.int32)
    storage[1, : k.numel()] = k.int()
    storage[2, : p.numel()] = p.float().view(torch.int32)
    return storage


T_ROWS = torch.tensor([0.8, 0.0, 1.3, 0.5])
K_ROWS = torch.tensor([5, 64, 64, 3])
P_ROWS = torch.tensor([0.9, 1.0, 0.6, 1.0])
MIN_P_ROWS = torch.tensor([0.1, 0.0, 0.3, 0.05])
x = torch.randn(B, D)


ARGS = (x, T_ROWS, K_ROWS, P_ROWS)
SAMPLED_ARGS = (x, T_ROWS + 0.1, K_ROWS, P_ROWS)


@pytest.mark.parametrize(
    "fn, args, idiom",
    [
        pytest.param(vllm_sample, ARGS, "mixed_greedy", id="vllm"),
        pytest.param(vllm_all_random, SAMPLED_ARGS, "exponential_race", id="vllm-all-random"),
        pytest.param(vllm_top_k_int32, ARGS, "mixed_greedy", id="vllm-k-int32"),
        pytest.param(vllm_top_p_only, ARGS, "mixed_greedy", id="vllm-top-p"),
        pytest.param(vllm_min_p, (*SAMPLED_ARGS, MIN_P_ROWS), "exponential_race", id="vllm-min-p"),
        pytest.param(cb_step, (x, cb_arguments(*SAMPLED_ARGS[1:])), "multinomial", id="hf-cb"),
        pytest.param(mixed_greedy.search, mixed_greedy.example_inputs(), "mixed_greedy", id="doc"),
    ],
)
def test_serving_sampler_becomes_one_fused_call(fn, args, idiom):
    graph = assert_one_fused_call(fn, *args, idiom=idiom)
    # The per-row knobs are checked in the graph, without a host sync.
    assert "_assert_async" in graph and "item" not in graph


def per_row_probs(logits, temperature, k, p, greedy):
    """What each row of the programs above draws, in float64: the argmax for greedy rows,
    else softmax(l / T) after top-k (ties kept) then top-p on the survivors."""
    rows = []
    for row, t, k_row, p_row, g in zip(logits.double(), temperature, k, p, greedy, strict=True):
        if g:
            rows.append(F.one_hot(row.argmax(), row.numel()).double())
            continue
        scaled = row / t
        kth = scaled.sort(descending=True).values[int(k_row) - 1]
        scaled = scaled.masked_fill(scaled < kth, -torch.inf)
        rows.append(top_p_probs(scaled, float(p_row)))
    return torch.stack(rows)


def _draws_per_row(fn, n, logits_rows, temperature, k, p, greedy, *extra, idiom):
    rows = x.shape[0]
    h = x.repeat_interleave(n, 0)
    tokens = compiled_draws(
        fn, h, *(a.repeat_interleave(n, 0) for a in (temperature, k, p)), *extra, idiom=idiom
    )
    probs = per_row_probs(logits_rows, temperature, k, p, greedy)
    for r in range(rows):
        drawn = tokens[r * n : (r + 1) * n]
        if greedy[r]:
            assert (drawn == probs[r].argmax()).all(), r
        else:
            assert chi_square_p(drawn, probs[r]) > 1e-4, r


def test_vllm_sampler_keeps_every_rows_distribution():
    torch.manual_seed(1)
    n = 6000
    logits = x @ WEIGHT.T
    _draws_per_row(
        vllm_sample, n, logits, T_ROWS, K_ROWS, P_ROWS, T_ROWS < _SAMPLING_EPS, idiom="mixed_greedy"
    )


def test_transformers_continuous_batching_keeps_every_rows_distribution():
    torch.manual_seed(2)
    n = 6000
    t, k, p = T_ROWS + 0.1, torch.tensor([5, 64, 10, 3]), P_ROWS
    h = x.repeat_interleave(n, 0)
    arguments = cb_arguments(*(a.repeat_interleave(n, 0) for a in (t, k, p)))
    tokens = compiled_draws(cb_step, h, arguments, idiom="multinomial")
    probs = per_row_probs(x @ WEIGHT.T, t, k, p, torch.zeros(B, dtype=torch.bool))
    for r in range(B):
        assert chi_square_p(tokens[r * n : (r + 1) * n], probs[r]) > 1e-4, r


# --- near misses ----------------------------------------------------------------------------
def vllm_min_p_then_top_p(h, temperature, k, p, min_p):  # top-p renormalizes after min-p
    return vllm_sample(h, temperature, k, p, min_p)


def top_k_at_k(h, temperature, k, p):  # gathers the (k+1)-th value: another distribution
    logits = F.linear(h, WEIGHT) / temperature.unsqueeze(1)
    kth = logits.sort(dim=-1, descending=True)[0].gather(-1, k.unsqueeze(-1))
    return torch.multinomial(logits.masked_fill(logits < kth, -torch.inf).softmax(-1), 1)


def top_p_then_top_k_sorted(h, temperature, k, p):  # top-p on the whole row, then top-k
    logits = F.linear(h, WEIGHT) / temperature.unsqueeze(1)
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
    top_p_mask = logits_sort.softmax(-1).cumsum(-1) <= 1 - p.unsqueeze(1)
    top_p_mask[:, -1] = False
    logits_sort = logits_sort.masked_fill(top_p_mask, -torch.inf)
    kth = logits_sort.gather(1, (logits_sort.size(1) - k).unsqueeze(1))
    logits_sort = logits_sort.masked_fill(logits_sort < kth, -torch.inf)
    logits = logits_sort.scatter(-1, logits_idx, logits_sort)
    return random_sample(logits.softmax(-1))


def greedy_of_other_logits(h, temperature, k, p):  # the argmax of half the vocabulary
    logits = F.linear(h, WEIGHT)
    greedy = logits[:, : V // 2].argmax(-1)
    logits = logits / temperature.unsqueeze(1)
    sampled = random_sample(logits.softmax(-1))
    return torch.where(temperature < _SAMPLING_EPS, greedy, sampled)


def greedy_after_temperature(h, temperature, k, p):  # argmax(l / T) flips for T < 0
    logits = F.linear(h, WEIGHT) / temperature.unsqueeze(1)
    greedy = logits.argmax(-1)
    sampled = random_sample(logits.softmax(-1))
    return torch.where(temperature < _SAMPLING_EPS, greedy, sampled)


# SGLang's torch-native sampler (sglang/srt/layers/sampler.py): top-p measured on the whole
# row's mass next to a cut at rank k (the op's top_p_whole_row).
def sglang_top_k_top_p_min_p(h, top_ks, top_ps, min_ps):
    return sglang_sample_from_probs(
        torch.softmax(F.linear(h, WEIGHT), dim=-1), top_ks, top_ps, min_ps
    )


def sglang_sample_from_probs(probs, top_ks, top_ps, min_ps):
    """SGLang's ``top_k_top_p_min_p_sampling_from_probs_torch``, op for op."""
    probs_sort, probs_idx = probs.sort(dim=-1, descending=True)
    probs_sum = torch.cumsum(probs_sort, dim=-1)
    probs_sort[
        torch.arange(0, probs.shape[-1], device=probs.device).view(1, -1) >= top_ks.view(-1, 1)
    ] = 0.0
    probs_sort[(probs_sum - probs_sort) > top_ps.view(-1, 1)] = 0.0
    min_p_thresholds = probs_sort[:, 0] * min_ps
    probs_sort[probs_sort < min_p_thresholds.view(-1, 1)] = 0.0
    sampled_index = torch.multinomial(probs_sort, num_samples=1)
    probs_idx = probs_idx.to(torch.int32)
    return torch.gather(probs_idx, dim=1, index=sampled_index).view(-1)


# The Gemma reference sampler (gemma/model.py): the nucleus of the whole row, then top-k.
def gemma_sample(h, temperatures, top_ps, top_ks):
    logits = F.linear(h, WEIGHT)
    logits.div_(temperatures.unsqueeze(dim=1))
    probs = torch.softmax(logits, dim=-1, dtype=torch.float)
    probs_sort, probs_idx = torch.sort(probs, dim=-1, descending=True)
    probs_sum = torch.cumsum(probs_sort, dim=-1)
    top_ps_mask = (probs_sum - probs_sort) > top_ps.unsqueeze(dim=1)
    probs_sort = torch.where(top_ps_mask, 0, probs_sort)
    top_ks_mask = torch.arange(probs_idx.shape[-1], device=probs_idx.device)
    top_ks_mask = top_ks_mask.expand(probs_idx.shape[0], -1)
    top_ks_mask = top_ks_mask >= top_ks.unsqueeze(dim=1)
    probs_sort = torch.where(top_ks_mask, 0, probs_sort)
    probs_sort.div_(probs_sort.sum(dim=-1, keepdim=True))
    probs = torch.gather(probs_sort, dim=-1, index=torch.argsort(probs_idx, dim=-1))
    return torch.multinomial(probs, num_samples=1, replacement=True).squeeze(dim=-1)


@pytest.mark.parametrize(
    "fn, args, reason",
    [
        pytest.param(
            vllm_min_p_then_top_p,
            (x, T_ROWS, K_ROWS, P_ROWS, MIN_P_ROWS),
            "after the min-p mask",
            id="vllm-min-p-then-top-p",
        ),
        pytest.param(top_k_at_k, (x, T_ROWS + 0.1, K_ROWS, P_ROWS), "k - 1", id="gather-at-k"),
    ],
)
def test_near_miss_is_left_alone(fn, args, reason):
    assert_left_alone(fn, *args, reason=reason)


# --- top-p measured on the whole row next to a top-k cut (the op's top_p_whole_row) --------
def sglang_tempered(h, temperature, k, p, min_p):  # SGLang's Sampler.forward, then the above
    logits = F.linear(h, WEIGHT)
    logits.div_(temperature.view(-1, 1))
    return sglang_sample_from_probs(torch.softmax(logits, dim=-1), k, p, min_p)


WHOLE_ROW = [
    pytest.param(sglang_tempered, (*SAMPLED_ARGS, MIN_P_ROWS), "sorted_top_p", id="sglang"),
    pytest.param(
        sglang_top_k_top_p_min_p, (x, K_ROWS, P_ROWS, MIN_P_ROWS), "sorted_top_p", id="sglang-T1"
    ),
    pytest.param(gemma_sample, (x, T_ROWS + 0.1, P_ROWS, K_ROWS), "multinomial", id="gemma"),
    pytest.param(top_p_then_top_k_sorted, SAMPLED_ARGS, "exponential_race", id="top-p-then-top-k"),
]


@pytest.mark.parametrize("fn, args, idiom", WHOLE_ROW)
def test_whole_row_nucleus_becomes_one_fused_call(fn, args, idiom):
    graph = assert_one_fused_call(fn, *args, idiom=idiom)
    (call,) = [line for line in graph.splitlines() if "flashsampling.fused_sample" in line]
    assert call.endswith("True), kwargs = {})"), call  # (top_p_whole_row, the last argument)
    assert "_assert_async" in graph and "item" not in graph


def whole_row_probs(logits, temperature, k, p, min_p=None):
    """What each row of the programs above draws, in float64: softmax(l / T) over the tokens
    within the first k of the sorted row whose whole-row mass above is < p (and, with min-p,
    whose probability is >= min_p times the largest)."""
    rows = []
    min_p = torch.zeros(len(logits)) if min_p is None else min_p
    for row, t, k_row, p_row, m in zip(logits.double(), temperature, k, p, min_p, strict=True):
        probs = torch.softmax(row / t, -1)
        order = probs.argsort(descending=True)
        sorted_probs = probs[order]
        above = sorted_probs.cumsum(-1) - sorted_probs
        keep_sorted = (torch.arange(len(row)) < k_row) & (above < p_row)
        keep_sorted &= sorted_probs >= m * sorted_probs[0]
        keep = torch.zeros_like(keep_sorted).scatter(0, order, keep_sorted)
        kept = probs.masked_fill(~keep, 0.0)
        rows.append(kept / kept.sum())
    return torch.stack(rows)


@pytest.mark.parametrize("fn, args, idiom", WHOLE_ROW)
def test_whole_row_samplers_keep_every_rows_distribution(fn, args, idiom):
    torch.manual_seed(3)
    n = 6000
    h, *knobs = args
    tokens = compiled_draws(
        fn, h.repeat_interleave(n, 0), *(a.repeat_interleave(n, 0) for a in knobs), idiom=idiom
    )
    if fn is gemma_sample:
        temperature, p, k = knobs
        min_p = None
    elif fn is sglang_top_k_top_p_min_p:
        (k, p, min_p), temperature = knobs, torch.ones(B)
    else:
        temperature, k, p, *rest = knobs
        min_p = rest[0] if rest else None
    probs = whole_row_probs(h @ WEIGHT.T, temperature, k, p, min_p)
    for r in range(B):
        assert chi_square_p(tokens.reshape(B, n)[r], probs[r]) > 1e-4, r


def test_whole_row_sampler_with_a_dynamic_batch_is_fused_and_checks_its_rows():
    """Dynamo gives each input's dynamic batch a symbol of its own, and SGLang's
    ``probs_sort[mask] = 0`` never unifies them with the logits': the step is fused all the
    same (stock Inductor fails to compile it), and a knob with another number of rows than
    the logits fails the call, as the program's own mask would, instead of the kernels
    reading past it."""
    torch._dynamo.reset()
    counters.clear()
    step = torch.compile(sglang_tempered, backend="flashsampling")
    for batch in (5, 7):
        knobs = (
            torch.rand(batch) + 0.5,
            torch.randint(1, 9, (batch,)),
            torch.rand(batch) * 0.5 + 0.5,
        )
        args = (torch.randn(batch, D), *knobs, torch.rand(batch) * 0.1)
        for arg in args:
            torch._dynamo.mark_dynamic(arg, 0)
        with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):
            tokens = step(*args)
        assert tokens.shape == (batch,) and tokens.dtype == torch.int32
    assert dict(counters["flashsampling"]) == {"sorted_top_p": 1}  # (one graph for both)
    bad = (
        torch.randn(7, D),
        torch.rand(7) + 0.5,
        torch.randint(1, 9, (6,)),
        torch.rand(7),
        torch.rand(7) * 0.1,
    )
    with pytest.raises(RuntimeError, match="another number of rows"), torch.no_grad():
        step(*bad)


def gemma_top_p_only(h, temperature, k, p):  # one top-p mask, put back in token order
    probs = torch.softmax(F.linear(h, WEIGHT) / temperature.unsqueeze(1), dim=-1)
    probs_sort, probs_idx = torch.sort(probs, dim=-1, descending=True)
    probs_sum = torch.cumsum(probs_sort, dim=-1)
    probs_sort = torch.where((probs_sum - probs_sort) > p.unsqueeze(1), 0, probs_sort)
    probs_sort = probs_sort / probs_sort.sum(-1, keepdim=True)
    probs = torch.gather(probs_sort, dim=-1, index=torch.argsort(probs_idx, dim=-1))
    return torch.multinomial(probs, 1).squeeze(-1)


def test_one_sorted_top_p_mask_put_back_in_token_order_is_top_p():
    graph = assert_one_fused_call(gemma_top_p_only, *SAMPLED_ARGS, idiom="multinomial")
    (call,) = [line for line in graph.splitlines() if "flashsampling.fused_sample" in line]
    assert not call.endswith("True), kwargs = {})"), call  # (no top-k: no whole-row flag)
    torch.manual_seed(4)
    n = 6000
    h, temperature, k, p = SAMPLED_ARGS
    tokens = compiled_draws(
        gemma_top_p_only, *(a.repeat_interleave(n, 0) for a in SAMPLED_ARGS), idiom="multinomial"
    )
    probs = whole_row_probs(h @ WEIGHT.T, temperature, torch.full((B,), V), p)
    for r in range(B):
        assert chi_square_p(tokens.reshape(B, n)[r], probs[r]) > 1e-4, r
