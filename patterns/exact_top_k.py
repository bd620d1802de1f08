"""Exactly k: ``probs.topk(k)`` -> ``multinomial`` among the k -> ``gather`` of the index,
as vLLM-style samplers write it.

``torch.topk`` keeps exactly k tokens and picks among the ones tied with the k-th; the op's
``top_k`` keeps every tied token. The two draw from the same distribution when no token
ties with the k-th largest probability. With fp32 logits that has probability zero, up to
the near-ties the tests allow anyway (two logits within a rounding of each other). Logits
rounded to bf16/fp16 tie often, so the rewrite is refused for them. The draw among the k
may renormalize first (``top / top.sum(-1, keepdim=True)``, which ``multinomial`` does
anyway); the probabilities must not be truncated already.
"""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F

from ._lm_head import match_lm_head
from ._rewrite import SamplingMatch
from ._tails import match_softmax, multinomial_draws, unnormalized
from ._truncation import take_outputs, top_k_value
from ._walk import NoMatch, Walk, aten, is_call, last_dim, val

IDIOM = "exact_top_k"
TARGET = aten.gather.default


def search(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    """The idiom as users write it."""
    probs = torch.softmax(F.linear(hidden, weight) / temperature, dim=-1)
    top_probs, top_tokens = probs.topk(50, dim=-1)
    choice = torch.multinomial(top_probs, num_samples=1)
    return torch.gather(top_tokens, -1, choice)


def example_inputs() -> tuple:
    """Arguments ``search`` is traced with in the tests."""
    return torch.randn(3, 24), torch.randn(1000, 24), 0.8


def check(walk: Walk) -> SamplingMatch | None:
    gather = walk.terminal
    tokens, dim, choice = gather.args[:3]
    if not (is_call(tokens, operator.getitem) and tokens.args[1] == 1):
        return None
    topk = tokens.args[0]
    if not is_call(topk, aten.topk.default) or not is_call(choice, aten.multinomial.default):
        return None
    top_probs = unnormalized(walk, choice.args[0])
    if not (is_call(top_probs, operator.getitem) and top_probs.args[0] is topk):
        return None
    if not last_dim(dim, val(tokens).dim()):
        raise NoMatch(f"{gather.name} gathers along dim {dim}, not the top-k dim")
    k = top_k_value(topk)
    num_samples = multinomial_draws(choice)
    for node in (tokens, choice, top_probs):
        walk.take(node)
    take_outputs(walk, topk)
    head = match_lm_head(walk, match_softmax(walk, topk.args[0]))
    if head.top_k is not None or head.top_p is not None or head.min_p is not None:
        raise NoMatch(f"{topk.name} ranks probabilities already truncated by a mask")
    if head.logits_dtype is not None:
        raise NoMatch(
            f"the logits are rounded to {head.logits_dtype}: ties at the k-th value are common"
            " there, and the op keeps them all where torch.topk keeps exactly k"
        )
    return SamplingMatch(head, num_samples=num_samples, top_k=k)
