"""Top-p (nucleus) as a mask of the logits, in the two ways it is written. transformers'
``TopPLogitsWarper`` sorts ascending::

    sorted_logits, sorted_indices = torch.sort(scores, descending=False)
    cumulative_probs = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    sorted_to_remove = cumulative_probs <= (1 - top_p)
    sorted_to_remove[..., -min_tokens_to_keep:] = 0
    indices_to_remove = sorted_to_remove.scatter(1, sorted_indices, sorted_to_remove)
    scores = scores.masked_fill(indices_to_remove, -float("Inf"))

and the older ``top_k_top_p_filtering`` helpers (transformers 2.x-4.x, and the many
samplers copied from them) sort descending and shift the mask right by one::

    sorted_logits, sorted_indices = torch.sort(logits, descending=True)
    cumulative_probs = torch.cumsum(F.softmax(sorted_logits, dim=-1), dim=-1)
    sorted_indices_to_remove = cumulative_probs > top_p
    sorted_indices_to_remove[..., 1:] = sorted_indices_to_remove[..., :-1].clone()
    sorted_indices_to_remove[..., 0] = 0
    indices_to_remove = sorted_indices_to_remove.scatter(1, sorted_indices, ...)
    logits[indices_to_remove] = filter_value

Ascending, a token is removed iff the mass of the tokens sorted below it, itself included,
is at most ``1 - p``; descending, iff the mass sorted above it is > p. Either way it is kept
iff the mass sorted above it is < p, which is the op's ``top_p`` (``_truncation.py``), up to
equality: ``< 1 - p`` and the descending ``> p`` keep a token whose mass above is exactly p.
The program computes that mass by an fp32 cumsum and the op by its own fp32 sum, so a token
within a rounding of p goes either way in both cases: a near-tie, accepted. Checked
literals: a sort over the vocabulary dim, ``<=`` / ``<`` against ``1 - p`` ascending and
``>`` / ``>=`` against ``p`` descending, ``p`` in (0, 1], the largest token kept
(``min_tokens_to_keep == 1``: the last entry ascending, the shift and the first entry
descending; without that every token can go), the scatter back through the same sort's
indices.

Ties: the op keeps every token tied with the one that crosses ``p``; the masks keep the
tied tokens their sort puts on the kept side (its order among ties is unspecified). The two
agree unless the crossing token ties with another, which fp32 logits make a measure-zero
event but bf16/fp16 logits make common, so top-p on logits rounded to bf16/fp16 is not
rewritten (``_lm_head.py`` refuses it).
"""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch.fx import Node

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
    to_the_end,
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
    if not last_dim(sort_args.get("dim", -1), ndim):
        raise NoMatch(f"{sort.name} is not a sort over the vocabulary dim")
    if not removes:
        raise NoMatch(f"{condition.name} names the tokens kept, not the ones removed")
    if src is not sorted_removed or not last_dim(dim, ndim):
        raise NoMatch(f"{condition.name} does not scatter the sorted mask back over its sort")
    if sort_args.get("descending", False):
        over = _shifted_right(walk, sorted_removed)
        p = _top_p(walk, over, sort, descending=True)
    else:
        at_most = _keep_largest(walk, sorted_removed, val(source).shape[-1])
        p = _top_p(walk, at_most, sort, descending=False)
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
    if not (last_dim(dim, ndim) and step == 1 and to_the_end(end, vocab_size)):
        raise NoMatch(f"{removed.name} does not write the last entries of the vocabulary dim")
    if not (start == -1 or same(start, vocab_size - 1)):
        raise NoMatch(f"{removed.name} keeps tokens from {start} on: min_tokens_to_keep != 1")
    for node in (removed, zeros, zeros.args[0]):
        walk.take(node)
    take_constant(walk, zeros.args[1])
    return base


def _shifted_right(walk: Walk, removed: Node) -> Node:
    """``r[..., 1:] = r[..., :-1].clone(); r[..., 0] = 0`` (aten: a ``slice_scatter`` of the
    shifted slice, then a ``select_scatter`` of a zero) -> ``r`` before the shift; NoMatch if
    it is not exactly that shift (the first, largest token kept, the others moved by one)."""
    if not is_call(removed, aten.select_scatter.default):
        raise NoMatch(f"{removed.name} does not keep the largest token (min_tokens_to_keep)")
    shifted, zero, dim, index = removed.args
    ndim = val(shifted).dim()
    if not (
        last_dim(dim, ndim)
        and index == 0
        and is_call(zero, aten.copy.default, aten.fill.Scalar)
        and constant(zero.args[1]) == 0
        and is_call(zero.args[0], aten.select.int)
        and zero.args[0].args[0] is shifted
    ):
        raise NoMatch(f"{removed.name} writes something else than False at the largest token")
    if not is_call(shifted, aten.slice_scatter.default):
        raise NoMatch(f"{shifted.name} is not the removal mask shifted right by one")
    base, into = shifted.args[0], arguments(shifted, "src", "dim", "start", "end", "step")
    owned = [removed, zero, zero.args[0], shifted]
    moved = into["src"]
    if is_call(moved, aten.copy.default):  # ``r[..., 1:] = x``: a copy of x into the slice
        if not (is_call(moved.args[0], aten.slice.Tensor) and moved.args[0].args[0] is base):
            raise NoMatch(f"{shifted.name} is not the removal mask shifted right by one")
        owned += [moved, moved.args[0]]
        moved = moved.args[1]
    if is_call(moved, aten.clone.default):
        owned.append(moved)
        moved = moved.args[0]
    window = arguments(moved, "dim", "start", "end", "step")
    vocab_size = val(base).shape[-1]
    if not (
        last_dim(into.get("dim", 0), ndim)
        and into.get("start") == 1
        and to_the_end(into.get("end"), vocab_size)
        and into.get("step", 1) == 1
        and is_call(moved, aten.slice.Tensor)
        and moved.args[0] is base
        and last_dim(window.get("dim", 0), ndim)
        and window.get("start") in (0, None)
        and (window.get("end") == -1 or same(window.get("end"), vocab_size - 1))
        and window.get("step", 1) == 1
    ):
        raise NoMatch(f"{shifted.name} is not the removal mask shifted right by one")
    for node in (*owned, moved):
        walk.take(node)
    take_constant(walk, zero.args[1])
    return base


def _top_p(walk: Walk, compared: Node, sort: Node, descending: bool) -> float:
    """``cumsum(softmax(sorted), -1) <= 1 - p`` (``<`` too) for an ascending sort,
    ``> p`` (``>=`` too) for a descending one -> p in (0, 1]."""
    if descending:
        wanted, tensor_ops = (aten.gt.Scalar, aten.ge.Scalar), (aten.gt.Tensor, aten.ge.Tensor)
        what = "> p"
    else:
        wanted, tensor_ops = (aten.le.Scalar, aten.lt.Scalar), (aten.le.Tensor, aten.lt.Tensor)
        what = "<= 1 - p"
    if is_call(compared, *tensor_ops):
        raise NoMatch(f"{compared.name} compares with a tensor (a top_p made dynamic?), not p")
    if not is_call(compared, *wanted):
        raise NoMatch(f"{compared.name} is not cumulative mass {what}")
    cumsum, threshold = compared.args
    if not is_call(cumsum, aten.cumsum.default) or not last_dim(cumsum.args[1], val(cumsum).dim()):
        raise NoMatch(f"{compared.name} does not compare a cumsum over the vocabulary dim")
    if not isinstance(threshold, (int, float)) or isinstance(threshold, bool):
        raise NoMatch(f"{compared.name} compares with {threshold}, not a Python float")
    top_p = threshold if descending else 1.0 - threshold
    if not 0.0 < top_p <= 1.0:
        raise NoMatch(f"top_p = {top_p} is outside (0, 1]")
    probs = walk.take(cumsum).args[0]
    sorted_values = strip_converts(walk, match_softmax(walk, probs))
    if not (is_call(sorted_values, operator.getitem) and sorted_values.args[0] is sort):
        raise NoMatch(f"{cumsum.name} does not sum the softmax of the sorted logits")
    walk.take(compared), walk.take(sorted_values)
    return top_p
