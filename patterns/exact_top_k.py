"""Exactly k: ``probs.topk(k)`` -> ``multinomial`` among the k -> ``gather`` of the index,
as vLLM-style samplers write it; or the top k logits first, then the softmax of those k
values (``values, indices = logits.topk(k)``, ``softmax(values)``: the same distribution,
as tutorials and many small samplers write it); either with the exponential race
(``argmax(p / Exp(1), keepdim=True)``) among the k in place of ``multinomial``.

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
from torch.fx import Node

from ._lm_head import match_lm_head
from ._rewrite import SamplingMatch
from ._tails import match_noise, match_softmax, multinomial_draws, unnormalized
from ._truncation import take_outputs, top_k_value
from ._walk import NoMatch, Walk, arguments, aten, is_call, last_dim, strip_converts, val

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
    if not is_call(topk, aten.topk.default):
        return None
    if is_call(choice, aten.multinomial.default):
        top_probs = choice.args[0]
        values_first = _softmax_of_values(walk, top_probs, topk)
        if not values_first:
            top_probs = unnormalized(walk, top_probs)
    elif is_call(choice, aten.argmax.default):
        top_probs = _raced(walk, choice)
        values_first = top_probs is not None and _softmax_of_values(walk, top_probs, topk)
    else:
        return None
    if not values_first and not _value_of(top_probs, topk):
        return None
    if not last_dim(dim, val(tokens).dim()):
        raise NoMatch(f"{gather.name} gathers along dim {dim}, not the top-k dim")
    k = top_k_value(topk)
    num_samples = multinomial_draws(choice) if is_call(choice, aten.multinomial.default) else 1
    for node in (tokens, choice, top_probs):
        walk.take(node)
    take_outputs(walk, topk)
    if values_first:  # (the softmax is the values', the logits go into topk)
        head = match_lm_head(walk, topk.args[0])
    else:
        head = match_lm_head(walk, match_softmax(walk, topk.args[0]))
    if head.top_k is not None or head.top_p is not None or head.min_p is not None:
        raise NoMatch(f"{topk.name} ranks probabilities already truncated by a mask")
    if head.logits_dtype is not None:
        raise NoMatch(
            f"the logits are rounded to {head.logits_dtype}: ties at the k-th value are common"
            " there, and the op keeps them all where torch.topk keeps exactly k"
        )
    return SamplingMatch(head, num_samples=num_samples, top_k=k)


def _value_of(node, topk: Node) -> bool:
    """``node`` is ``topk``'s values."""
    return is_call(node, operator.getitem) and node.args[0] is topk and node.args[1] == 0


def _softmax_of_values(walk: Walk, probs: Node, topk: Node) -> bool:
    """``probs`` is the softmax of ``topk``'s values (the top k logits first); the walk then
    owns that softmax and the values. A probe walk, so a failed match takes nothing."""
    probe = Walk(walk.terminal)
    try:
        scores = strip_converts(probe, match_softmax(probe, probs))
    except NoMatch:
        return False
    if probe.tail_rows or not _value_of(scores, topk):
        return False
    walk.owned += probe.owned
    walk.take(scores)
    return True


def _raced(walk: Walk, argmax: Node) -> Node | None:
    """``argmax(p / E, dim=-1, keepdim=True)`` with E Exp(1) noise of p's shape -> p (the
    race among the k draws one of them with probability p / sum(p), as ``multinomial``)."""
    args = arguments(argmax, "dim", "keepdim")
    race = argmax.args[0]
    if not is_call(race, aten.div.Tensor) or args.get("keepdim") is not True:
        return None
    if not last_dim(args.get("dim"), val(race).dim()):
        return None
    probs, noise = race.args
    if not match_noise(walk, noise, val(race)):
        return None
    walk.take(race)
    return probs
