"""Truncation filters of public projects, op for op: x-transformers' ``top_k`` (the top-k
values scattered into a row of -inf), ``top_p`` (a descending nucleus shifted by ``F.pad``,
masked in sorted order and scattered back) and ``min_p``, litgpt's ``sample`` (the same
top-k, an ascending top-p on one row, the race it samples with under ``torch.compile``),
and Llama's sorted nucleus with a per-row p. Each becomes one fused call that draws the
program's distribution; a temperature after a nucleus, and these forms on bf16 logits (ties
at the k-th value), are left alone with the reason."""

from __future__ import annotations

from math import ceil

import pytest
import torch
import torch.nn.functional as F

from .catalog_checks import (
    assert_left_alone,
    assert_one_fused_call,
    chi_square_p,
    compiled_draws,
    top_k_probs,
    top_p_probs,
)

B, T, D, V = 3, 5, 16, 64
torch.manual_seed(0)
WEIGHT = torch.randn(V, D)


# --- x-transformers (x_transformers/autoregressive_wrapper.py) ----------------------------
def xt_top_p(logits, thres=0.9):
    sorted_logits, sorted_indices = torch.sort(logits, descending=True)
    cum_probs = torch.cumsum(F.softmax(sorted_logits, dim=-1), dim=-1)
    sorted_indices_to_remove = cum_probs > thres
    sorted_indices_to_remove = F.pad(sorted_indices_to_remove, (1, -1), value=False)
    sorted_logits[sorted_indices_to_remove] = float("-inf")
    return sorted_logits.scatter(1, sorted_indices, sorted_logits)


def xt_top_k(logits, frac_num_tokens=0.1, k=None):
    num_tokens = logits.shape[-1]
    k = k if k is not None else ceil(frac_num_tokens * num_tokens)
    k = min(k, num_tokens)
    val, ind = torch.topk(logits, k)
    probs = torch.full_like(logits, float("-inf"))
    probs.scatter_(1, ind, val)
    return probs


def xt_min_p(logits, min_p=0.1):
    probs = logits.softmax(dim=-1)
    max_probs = probs.amax(dim=-1, keepdim=True)
    limit = min_p * max_probs
    return torch.where(probs < limit, float("-inf"), logits)


def xt_step(x, filter_fn=xt_top_k, temperature=1.0, weight=WEIGHT, **filter_kwargs):
    logits = F.linear(x, weight)[:, -1]
    filtered_logits = filter_fn(logits, **filter_kwargs)
    probs = F.softmax(filtered_logits / temperature, dim=-1)
    return torch.multinomial(probs, 1)


def xt_top_k_step(x):
    return xt_step(x, xt_top_k, 0.8)


def xt_top_p_step(x):
    return xt_step(x, xt_top_p)


def xt_min_p_step(x):
    return xt_step(x, xt_min_p)


def xt_gumbel_step(x, uniform_=False):  # x-transformers' gumbel_sample: clamped logs
    def log(t, eps=1e-20):
        return t.clamp(min=eps).log()

    def gumbel_noise(t):
        # (its current spelling draws into zeros: ``torch.zeros_like(t).uniform_(0, 1)``)
        noise = torch.zeros_like(t).uniform_(0, 1) if uniform_ else torch.rand_like(t)
        return -log(-log(noise))

    logits = xt_top_k(F.linear(x, WEIGHT)[:, -1], k=10)
    return ((logits / max(0.9, 1e-10)) + gumbel_noise(logits)).argmax(dim=-1)


# --- litgpt (litgpt/generate/base.py) -------------------------------------------------------
def multinomial_num_samples_1(probs):
    if torch._dynamo.is_compiling():
        distribution = torch.empty_like(probs).exponential_(1)
        return torch.argmax(probs / distribution, dim=-1, keepdim=True)
    return torch.multinomial(probs, num_samples=1)


def litgpt_sample_top_p(logits, top_p):
    sorted_logits, sorted_indices = torch.sort(logits, descending=False)
    cumulative_probs = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    sorted_indices_to_remove = cumulative_probs <= (1 - top_p)
    sorted_indices_to_remove[-1:] = 0
    indices_to_remove = sorted_indices_to_remove.scatter(
        0, sorted_indices, sorted_indices_to_remove
    )
    logits = logits.masked_fill(indices_to_remove, float("-inf"))
    return logits


def litgpt_sample(logits, temperature=1.0, top_k=None, top_p=1.0):
    logits = logits[0, -1]
    if top_k is not None:
        v, i = torch.topk(logits, min(top_k, logits.size(-1)))
        logits = torch.full_like(logits, float("-inf")).scatter_(-1, i, v)
    if temperature > 0.0 or top_p > 0.0:
        if temperature > 0.0:
            logits = logits / temperature
        if top_p < 1.0:
            logits = litgpt_sample_top_p(logits, top_p)
        probs = torch.nn.functional.softmax(logits, dim=-1)
        return multinomial_num_samples_1(probs)
    return torch.argmax(logits, dim=-1, keepdim=True)


def litgpt_step(x, weight=WEIGHT):
    return litgpt_sample(F.linear(x, weight), temperature=0.8, top_k=50, top_p=0.9)


# --- Llama's sample_top_p with one p per row ------------------------------------------------
def llama_per_row_p(x, p):
    probs = torch.softmax(F.linear(x[:, -1], WEIGHT) / 0.7, dim=-1)
    probs_sort, probs_idx = torch.sort(probs, dim=-1, descending=True)
    probs_sum = torch.cumsum(probs_sort, dim=-1)
    mask = probs_sum - probs_sort > p[:, None]
    probs_sort[mask] = 0.0
    probs_sort.div_(probs_sort.sum(dim=-1, keepdim=True))
    next_token = torch.multinomial(probs_sort, num_samples=1)
    return torch.gather(probs_idx, -1, next_token)


def top_p_without_keep_line(x, p):  # the cumsum keeps the top token anyway for p > 0
    scores = F.linear(x[:, -1], WEIGHT)
    sorted_logits, sorted_indices = torch.sort(scores, descending=False)
    cumulative_probs = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    sorted_indices_to_remove = cumulative_probs <= (1 - p).unsqueeze(-1)
    indices_to_remove = sorted_indices_to_remove.scatter(
        -1, sorted_indices, sorted_indices_to_remove
    )
    return torch.multinomial(scores.masked_fill(indices_to_remove, -torch.inf).softmax(-1), 1)


x = torch.randn(B, T, D)


@pytest.mark.parametrize(
    "fn, args, idiom",
    [
        pytest.param(xt_top_k_step, (x,), "multinomial", id="x-transformers-top-k"),
        pytest.param(xt_top_p_step, (x,), "multinomial", id="x-transformers-top-p"),
        pytest.param(xt_min_p_step, (x,), "multinomial", id="x-transformers-min-p"),
        pytest.param(xt_gumbel_step, (x,), "gumbel", id="x-transformers-gumbel"),
        pytest.param(
            lambda x: xt_gumbel_step(x, uniform_=True), (x,), "gumbel", id="x-transformers-uniform"
        ),
        pytest.param(litgpt_step, (x[:1],), "exponential_race", id="litgpt"),
        pytest.param(llama_per_row_p, (x, torch.rand(B)), "sorted_top_p", id="llama-per-row-p"),
        pytest.param(
            top_p_without_keep_line, (x, torch.rand(B)), "multinomial", id="top-p-no-keep-line"
        ),
    ],
)
def test_public_filter_becomes_one_fused_call(fn, args, idiom):
    assert_one_fused_call(fn, *args, idiom=idiom)


def xt_top_p_then_temperature(x):  # the nucleus of softmax(l), sampled at T = 0.7
    return xt_step(x, xt_top_p, 0.7)


def litgpt_bf16(x):
    return litgpt_step(x, WEIGHT.bfloat16())


@pytest.mark.parametrize(
    "fn, args, reason",
    [
        pytest.param(xt_top_p_then_temperature, (x,), "after the top-p", id="xt-top-p-then-T"),
        pytest.param(litgpt_bf16, (x[:1].bfloat16(),), "exact top-k", id="litgpt-bf16"),
    ],
)
def test_near_miss_is_left_alone(fn, args, reason):
    assert_left_alone(fn, *args, reason=reason)


def _one_row_problem(seed, scale=3.0):
    torch.manual_seed(seed)
    weight, row = torch.randn(12, D) * scale / D**0.5, torch.randn(D)
    return weight, row, (weight @ row).double()


@pytest.mark.parametrize(
    "seed, step, oracle",
    [
        pytest.param(
            3,
            lambda x, weight: xt_step(x, xt_top_k, 0.8, weight, k=5),
            lambda logits: top_k_probs(logits / 0.8, 5),
            id="top-k",
        ),
        pytest.param(
            4,
            lambda x, weight: xt_step(x, xt_top_p, 1.0, weight, thres=0.8),
            lambda logits: top_p_probs(logits, 0.8),
            id="top-p",
        ),
    ],
)
def test_x_transformers_filters_keep_the_distribution(seed, step, oracle):
    weight, row, logits = _one_row_problem(seed)
    rows = row.expand(30_000, 1, D).contiguous()
    tokens = compiled_draws(lambda x: step(x, weight), rows, idiom="multinomial")
    assert chi_square_p(tokens, oracle(logits)) > 1e-4


def test_llama_per_row_p_keeps_every_rows_distribution():
    weight, row, logits = _one_row_problem(5)
    p = torch.tensor([0.5, 0.8, 0.95])
    n = 12_000

    def step(x, p):
        probs = torch.softmax(F.linear(x[:, -1], weight), dim=-1)
        probs_sort, probs_idx = torch.sort(probs, dim=-1, descending=True)
        mask = torch.cumsum(probs_sort, dim=-1) - probs_sort > p[:, None]
        probs_sort[mask] = 0.0
        return torch.gather(probs_idx, -1, torch.multinomial(probs_sort, num_samples=1))

    tokens = compiled_draws(
        step, row.expand(3 * n, 1, D).contiguous(), p.repeat_interleave(n), idiom="sorted_top_p"
    )
    for r, p_row in enumerate(p.tolist()):
        assert chi_square_p(tokens[r * n : (r + 1) * n], top_p_probs(logits, p_row)) > 1e-4
