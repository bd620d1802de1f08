"""Top-p (nucleus) as transformers' ``TopPLogitsWarper`` writes it::

    sorted_logits, sorted_indices = torch.sort(scores, descending=False)
    cumulative_probs = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    sorted_to_remove = cumulative_probs <= (1 - top_p)
    sorted_to_remove[..., -min_tokens_to_keep:] = 0
    indices_to_remove = sorted_to_remove.scatter(1, sorted_indices, sorted_to_remove)
    scores = scores.masked_fill(indices_to_remove, -float("Inf"))

A token is removed iff the mass of the tokens sorted below it, itself included, is at most
``1 - p``: it is kept iff the mass sorted above it is < p, which is the op's ``top_p``
(``_truncation.py``). Checked literals: an ascending sort over the vocabulary dim, ``<=``
(``<`` differs at equality), ``p`` in (0, 1] (the literal is ``1 - p``), the largest token
kept (``min_tokens_to_keep == 1``; without that line every token can go), the scatter back
through the same sort's indices.

Ties: the op keeps every token tied with the one that crosses ``p``; transformers keeps the
tied tokens its sort puts last (the sort's order among ties is unspecified). The two agree
unless the crossing token ties with another, which fp32 logits make a measure-zero event
but bf16/fp16 logits make common, so top-p on logits rounded to bf16/fp16 is not rewritten
(``_lm_head.py`` refuses it).
"""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch.fx import Node
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ._tails import match_softmax
from ._truncation import Mask, take_outputs
from ._walk import (
    NoMatch,
    Walk,
    arguments,
    aten,
    constant,
    is_call,
    last_dim,
    same,
    strip_converts,
    take_constant,
    val,
)

IDIOM = "top_p_mask"


def search(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    """The idiom as users write it (transformers' TopPLogitsWarper, then sampling)."""
    scores = F.linear(hidden, weight) / temperature
    sorted_logits, sorted_indices = torch.sort(scores, descending=False)
    cumulative_probs = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    sorted_indices_to_remove = cumulative_probs <= (1 - 0.9)
    sorted_indices_to_remove[..., -1:] = 0
    indices_to_remove = sorted_indices_to_remove.scatter(
        1, sorted_indices, sorted_indices_to_remove
    )
    scores = scores.masked_fill(indices_to_remove, -float("Inf"))
    return torch.multinomial(F.softmax(scores, dim=-1), num_samples=1)


def example_inputs() -> tuple:
    """Arguments ``search`` is traced with in the tests."""
    return torch.randn(3, 24), torch.randn(1000, 24), 0.8


def condition(walk: Walk, condition: Node, source: Node, removes: bool) -> Mask | None:
    """The scatter of the sorted removal mask -> ``Mask(top_p=p)``; None if ``condition``
    is no scatter through ``torch.sort(source)``'s indices."""
    if not is_call(condition, aten.scatter.src):
        return None
    sorted_removed, dim, indices, src = condition.args
    if not (is_call(indices, operator.getitem) and indices.args[1] == 1):
        return None
    sort = indices.args[0]
    if not is_call(sort, aten.sort.default, aten.sort.stable) or sort.args[0] is not source:
        return None
    ndim = val(source).dim()
    sort_args = arguments(sort, "dim", "descending")
    if not last_dim(sort_args.get("dim", -1), ndim) or sort_args.get("descending", False):
        raise NoMatch(f"{sort.name} is not an ascending sort over the vocabulary dim")
    if not removes:
        raise NoMatch(f"{condition.name} names the tokens kept, not the ones removed")
    if src is not sorted_removed or not last_dim(dim, ndim):
        raise NoMatch(f"{condition.name} does not scatter the sorted mask back over its sort")
    at_most = _keep_largest(walk, sorted_removed, val(source).shape[-1])
    p = _top_p(walk, at_most, sort)
    walk.take(condition), walk.take(indices)
    take_outputs(walk, sort)
    return Mask(source, top_p=p)


def _keep_largest(walk: Walk, removed: Node, vocab_size) -> Node:
    """``removed[..., -1:] = 0`` (aten: ``slice_scatter`` of a zeroed slice) -> ``removed``
    before it; NoMatch if the largest token is not kept, or more than one is."""
    if not is_call(removed, aten.slice_scatter.default):
        raise NoMatch(f"{removed.name} does not keep the largest token (min_tokens_to_keep)")
    base, args = removed.args[0], arguments(removed, "src", "dim", "start", "end", "step")
    zeros, dim, start = args["src"], args.get("dim", 0), args.get("start")
    end, step, ndim = args.get("end"), args.get("step", 1), val(base).dim()
    if not (is_call(zeros, aten.copy.default, aten.fill.Scalar) and constant(zeros.args[1]) == 0):
        raise NoMatch(f"{removed.name} writes something else than False into the sorted mask")
    if not (
        last_dim(dim, ndim)
        and step == 1
        and end is not None
        and statically_known_true(end >= vocab_size)
    ):
        raise NoMatch(f"{removed.name} does not write the last entries of the vocabulary dim")
    if not (start == -1 or same(start, vocab_size - 1)):
        raise NoMatch(f"{removed.name} keeps tokens from {start} on: min_tokens_to_keep != 1")
    for node in (removed, zeros, zeros.args[0]):
        walk.take(node)
    take_constant(walk, zeros.args[1])
    return base


def _top_p(walk: Walk, at_most: Node, sort: Node) -> float:
    """``cumsum(softmax(sorted), -1) <= 1 - p`` -> p in (0, 1]."""
    if is_call(at_most, aten.lt.Scalar, aten.lt.Tensor):
        raise NoMatch(f"{at_most.name} removes cumulative mass < 1 - p, not <= 1 - p")
    if is_call(at_most, aten.le.Tensor):
        raise NoMatch(f"{at_most.name} compares with a tensor (a top_p made dynamic?), not 1 - p")
    if not is_call(at_most, aten.le.Scalar):
        raise NoMatch(f"{at_most.name} is not cumulative mass <= 1 - p")
    cumsum, threshold = at_most.args
    if not is_call(cumsum, aten.cumsum.default) or not last_dim(cumsum.args[1], val(cumsum).dim()):
        raise NoMatch(f"{at_most.name} does not compare a cumsum over the vocabulary dim")
    if not isinstance(threshold, (int, float)) or isinstance(threshold, bool):
        raise NoMatch(f"{at_most.name} compares with {threshold}, not a Python float")
    top_p = 1.0 - threshold
    if not 0.0 < top_p <= 1.0:
        raise NoMatch(f"top_p = {top_p} is outside (0, 1]")
    probs = walk.take(cumsum).args[0]
    sorted_values = strip_converts(walk, match_softmax(walk, probs))
    if not (is_call(sorted_values, operator.getitem) and sorted_values.args[0] is sort):
        raise NoMatch(f"{cumsum.name} does not sum the softmax of the sorted logits")
    walk.take(at_most), walk.take(sorted_values)
    return top_p
