"""Per-row top-k by rank in sorted order: ``sorted.masked_fill(arange(V) >= k[:, None], -inf)``
on logits sorted in descending order, written back to token order by ``scatter(-1, order,
sorted)`` or read back by ``gather(sorted, -1, order.argsort(-1))`` (the SGLang / Gemma
spelling of top-k, on logits). Exactly k tokens stay (the sort breaks ties), which the op's
``top_k`` keeps on fp32 logits (a tie has probability zero there); the rewrite is ONE fused
call drawing the program's distribution (chi-square against float64), and near misses are
left alone with their reason."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from .catalog_checks import (
    assert_left_alone,
    assert_one_fused_call,
    chi_square_p,
    compiled_draws,
    top_k_probs,
)

B, D, V = 3, 16, 64
torch.manual_seed(0)
WEIGHT = torch.randn(V, D)
X = torch.randn(B, D)
K_ROWS = torch.tensor([1, 5, 64])


def rank_scattered(h, k, weight=WEIGHT, descending=True, op=torch.ge):
    logits = F.linear(h, weight) / 0.9
    s, order = logits.sort(dim=-1, descending=descending)
    s = s.masked_fill(op(torch.arange(s.shape[-1]).view(1, -1), k.view(-1, 1)), -torch.inf)
    return torch.multinomial(s.scatter(-1, order, s).softmax(-1), 1)


def rank_gathered(h, k):  # kept by rank < k, read back through the inverse permutation
    logits = F.linear(h, WEIGHT)
    s, order = torch.sort(logits, dim=-1, descending=True)
    keep = torch.arange(s.shape[-1]).expand(s.shape[0], -1) < k.unsqueeze(1)
    s = torch.where(keep, s, -torch.inf)
    logits = torch.gather(s, -1, torch.argsort(order, dim=-1))
    probs = logits.softmax(-1)
    return probs.div_(torch.empty_like(probs).exponential_()).argmax(-1)


@pytest.mark.parametrize(
    "fn, idiom", [(rank_scattered, "multinomial"), (rank_gathered, "exponential_race")]
)
def test_rank_top_k_keeps_each_rows_distribution(fn, idiom):
    assert_one_fused_call(fn, X, K_ROWS, idiom=idiom)
    torch.manual_seed(3)
    n = 4000
    tokens = compiled_draws(fn, X.repeat_interleave(n, 0), K_ROWS.repeat_interleave(n), idiom=idiom)
    scale = 0.9 if fn is rank_scattered else 1.0
    for r in range(B):
        probs = top_k_probs((X[r] @ WEIGHT.T) / scale, int(K_ROWS[r]))
        assert chi_square_p(tokens.reshape(-1)[r * n : (r + 1) * n], probs) > 1e-4, r


def rank_past_k(h, k):  # arange > k removes: k + 1 tokens stay
    return rank_scattered(h, k, op=torch.gt)


def rank_ascending(h, k):  # the first k of an ascending sort are the smallest
    return rank_scattered(h, k, descending=False)


def rank_bf16(h, k):  # ties at the k-th value are common in bf16: exactly k is not the op's
    return rank_scattered(h.bfloat16(), k, weight=WEIGHT.bfloat16())


@pytest.mark.parametrize(
    "fn, reason",
    [
        (rank_past_k, "removes rank > k"),
        (rank_ascending, "not sorted in descending order"),
        (rank_bf16, "exact top-k on logits rounded to bfloat16"),
    ],
)
def test_rank_near_miss_is_left_alone(fn, reason):
    assert_left_alone(fn, X, K_ROWS, reason=reason)
