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
from ._truncation import Mask, sort_direction, sort_of, take_outputs
from ._walk import (
    RESHAPES,
    NoMatch,
    Walk,
    arguments,
    aten,
    constant,
    is_call,
    knob_of_rows,
    last_dim,
    same,
    strip_converts,
    take_zero,
    to_the_end,
    val,
    writes_zero,
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
    is no scatter through ``torch.sort(source)``'s indices. In sorted order (``source``
    is sorted values, ``_truncation.match_sorted``), the removal mask itself."""
    sort = sort_of(source)
    if sort is not None:
        if not _compares_a_cumsum(condition):
            return None
        if not removes:
            raise NoMatch(f"{condition.name} names the tokens kept, not the ones removed")
        descending = sort_direction(sort, sort.args[0])
        p = removed_by_mass(walk, condition, source, descending)
        return Mask(source, top_p=p)
    if not is_call(condition, aten.scatter.src):
        return None
    sorted_removed, dim, indices, src = condition.args
    if not (is_call(indices, operator.getitem) and indices.args[1] == 1):
        return None
    sort = indices.args[0]
    if not is_call(sort, aten.sort.default, aten.sort.stable) or sort.args[0] is not source:
        return None
    ndim = val(source).dim()
    descending = sort_direction(sort, source)
    if not removes:
        raise NoMatch(f"{condition.name} names the tokens kept, not the ones removed")
    if src is not sorted_removed or not last_dim(dim, ndim):
        raise NoMatch(f"{condition.name} does not scatter the sorted mask back over its sort")
    sorted_values = next((u for u in sort.users if u.args[1] == 0), None)
    p = removed_by_mass(walk, sorted_removed, sorted_values, descending)
    walk.take(condition), walk.take(indices)
    take_outputs(walk, sort)
    if sorted_values is not None:
        walk.take(sorted_values)
    return Mask(source, top_p=p)


def _compares_a_cumsum(removed: Node) -> bool:
    """``removed`` is a comparison of a cumsum (maybe of the mass above each token), maybe
    under the keep-largest line: a top-p condition, right or wrong."""
    node = removed
    while is_call(node, aten.slice_scatter.default, aten.select_scatter.default):
        node = node.args[0]
    if is_call(node, aten.constant_pad_nd.default):
        node = node.args[0]
    if not is_call(node, *_CUMSUM_COMPARISONS):
        return False
    summed = node.args[0]
    if is_call(summed, aten.sub.Tensor):
        summed = summed.args[0]
    return is_call(summed, aten.cumsum.default)


_CUMSUM_COMPARISONS = (
    aten.le.Scalar, aten.lt.Scalar, aten.gt.Scalar, aten.ge.Scalar,
    aten.le.Tensor, aten.lt.Tensor, aten.gt.Tensor, aten.ge.Tensor,
)  # fmt: skip


def removed_by_mass(walk: Walk, removed: Node, sorted_values, descending: bool) -> float | Node:
    """The sorted removal mask of a nucleus over ``sorted_values`` (sorted logits) -> p:
    ascending, ``cumsum(softmax(sorted)) <= 1 - p`` with the largest token kept (the last
    entry set to False, or no such line: the cumsum there is the whole mass, > 1 - p for
    p > 0); descending, ``cumsum > p`` shifted right by one (the first entry False), or the
    mass above each token, ``cumsum - probs > p`` (maybe with the first entry set to False,
    which that keeps anyway). ``p`` a Python float, or a node of per-row p (``1 - p`` read
    back to p)."""
    vocab_size = val(removed).shape[-1]
    if descending:
        if is_call(removed, aten.select_scatter.default) and not is_call(
            removed.args[0], aten.slice_scatter.default
        ):
            removed = _keep_first(walk, removed)
            p, above = _top_p(walk, removed, sorted_values, descending=True)
            if not above:
                raise NoMatch(f"{removed.name} keeps the first token but drops the one crossing p")
            return p
        if is_call(removed, aten.select_scatter.default, aten.constant_pad_nd.default):
            over = _shifted_right(walk, removed)
            p, above = _top_p(walk, over, sorted_values, descending=True)
            if above:
                raise NoMatch(f"{removed.name} shifts the mass above each token once more")
            return p
        p, above = _top_p(walk, removed, sorted_values, descending=True)
        if not above:
            raise NoMatch(f"{removed.name} drops the token crossing p (cumsum > p, unshifted)")
        return p
    if is_call(removed, aten.slice_scatter.default, aten.select_scatter.default):
        removed = _keep_largest(walk, removed, vocab_size)
    p, above = _top_p(walk, removed, sorted_values, descending=False)
    if above:
        raise NoMatch(f"{removed.name} compares the mass above each token in ascending order")
    return p


def _keep_largest(walk: Walk, removed: Node, vocab_size) -> Node:
    """``removed[..., -1:] = 0`` (aten: ``slice_scatter`` of a zeroed slice) or
    ``removed[:, -1] = False`` (``select_scatter``) -> ``removed`` before it; NoMatch if the
    largest token is not kept, or more than one is."""
    if is_call(removed, aten.select_scatter.default):
        base, zero, dim, index = removed.args
        if not (
            last_dim(dim, val(base).dim())
            and (index == -1 or same(index, vocab_size - 1))
            and writes_zero(zero, base, aten.select.int)
        ):
            raise NoMatch(f"{removed.name} writes something else than False at the largest token")
        walk.take(removed)
        take_zero(walk, zero)
        return base
    if not is_call(removed, aten.slice_scatter.default):
        raise NoMatch(f"{removed.name} does not keep the largest token (min_tokens_to_keep)")
    base, args = removed.args[0], arguments(removed, "src", "dim", "start", "end", "step")
    zeros, dim, start = args["src"], args.get("dim", 0), args.get("start")
    end, step, ndim = args.get("end"), args.get("step", 1), val(base).dim()
    if not writes_zero(zeros):
        raise NoMatch(f"{removed.name} writes something else than False into the sorted mask")
    if not (last_dim(dim, ndim) and step == 1 and to_the_end(end, vocab_size)):
        raise NoMatch(f"{removed.name} does not write the last entries of the vocabulary dim")
    if not (start == -1 or same(start, vocab_size - 1)):
        raise NoMatch(f"{removed.name} keeps tokens from {start} on: min_tokens_to_keep != 1")
    walk.take(removed)
    take_zero(walk, zeros)
    return base


def _keep_first(walk: Walk, removed: Node) -> Node:
    """``removed[..., 0] = False`` -> ``removed`` before it."""
    base, zero, dim, index = removed.args
    if not (
        last_dim(dim, val(base).dim()) and index == 0 and writes_zero(zero, base, aten.select.int)
    ):
        raise NoMatch(f"{removed.name} writes something else than False at the largest token")
    walk.take(removed)
    take_zero(walk, zero)
    return base


def _shifted_right(walk: Walk, removed: Node) -> Node:
    """``r[..., 1:] = r[..., :-1].clone(); r[..., 0] = 0`` (aten: a ``slice_scatter`` of the
    shifted slice, then a ``select_scatter`` of a zero) -> ``r`` before the shift; NoMatch if
    it is not exactly that shift (the first, largest token kept, the others moved by one).
    ``F.pad(r, (1, -1), value=False)`` (x-transformers) is the same shift."""
    if is_call(removed, aten.constant_pad_nd.default):
        base, pad = removed.args[:2]
        value = removed.args[2] if len(removed.args) > 2 else removed.kwargs.get("value", 0)
        if list(pad) != [1, -1] or constant(value) != 0:
            raise NoMatch(f"{removed.name} is not the removal mask shifted right by one")
        walk.take(removed)
        return base
    if not is_call(removed, aten.select_scatter.default):
        raise NoMatch(f"{removed.name} does not keep the largest token (min_tokens_to_keep)")
    shifted, zero, dim, index = removed.args
    ndim = val(shifted).dim()
    if not (last_dim(dim, ndim) and index == 0 and writes_zero(zero, shifted, aten.select.int)):
        raise NoMatch(f"{removed.name} writes something else than False at the largest token")
    if not is_call(shifted, aten.slice_scatter.default):
        raise NoMatch(f"{shifted.name} is not the removal mask shifted right by one")
    base, into = shifted.args[0], arguments(shifted, "src", "dim", "start", "end", "step")
    owned = [removed, shifted]
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
    take_zero(walk, zero)
    return base


def _top_p(
    walk: Walk, compared: Node, sorted_values, descending: bool
) -> tuple[float | Node, bool]:
    """``cumsum(softmax(sorted), -1) <= 1 - p`` (``<`` too) for an ascending sort,
    ``> p`` (``>=`` too) for a descending one -> (p, False); the mass above each token,
    ``cumsum(probs) - probs > p``, -> (p, True). p is a Python float in (0, 1] or the node of
    a per-row p (a float tensor, one per row: its values are asserted in the rewritten graph).
    ``sorted_values``: the sorted logits whose softmax is summed."""
    if descending:
        wanted = (aten.gt.Scalar, aten.ge.Scalar, aten.gt.Tensor, aten.ge.Tensor)
        what = "> p"
    else:
        wanted = (aten.le.Scalar, aten.lt.Scalar, aten.le.Tensor, aten.lt.Tensor)
        what = "<= 1 - p"
    if not is_call(compared, *wanted):
        raise NoMatch(f"{compared.name} is not cumulative mass {what}")
    cumsum, threshold = compared.args
    above = None
    if is_call(cumsum, aten.sub.Tensor) and "alpha" not in cumsum.kwargs:
        above, cumsum = cumsum, cumsum.args[0]
    if not is_call(cumsum, aten.cumsum.default) or not last_dim(cumsum.args[1], val(cumsum).dim()):
        raise NoMatch(f"{compared.name} does not compare a cumsum over the vocabulary dim")
    if above is not None and above.args[1] is not cumsum.args[0]:
        raise NoMatch(f"{above.name} subtracts something else than the summed probabilities")
    if isinstance(threshold, Node):
        top_p = per_row_p(walk, threshold, val(compared).shape[:-1], descending)
    elif not isinstance(threshold, (int, float)) or isinstance(threshold, bool):
        raise NoMatch(f"{compared.name} compares with {threshold}, not a Python float")
    else:
        top_p = threshold if descending else 1.0 - threshold
        if not 0.0 < top_p <= 1.0:
            raise NoMatch(f"top_p = {top_p} is outside (0, 1]")
    probs = walk.take(cumsum).args[0]
    softmax_input = strip_converts(walk, match_softmax(walk, probs))
    if softmax_input is not sorted_values or sorted_values is None:
        raise NoMatch(f"{cumsum.name} does not sum the softmax of the sorted logits")
    walk.take(compared)
    if above is not None:
        walk.take(above)
    return top_p, above is not None


def per_row_p(walk: Walk, threshold: Node, rows, descending: bool) -> Node:
    """The threshold ``p[:, None]`` (descending) or ``1 - p[:, None]`` (ascending, the
    ``1 -`` before or after the unsqueeze) of a per-row p -> the node of p, [*rows]; or of
    one p for every row, 0-d (a float argument that Dynamo made dynamic)."""
    steps, node = [], threshold
    while is_call(node, aten.unsqueeze.default, *RESHAPES):
        steps.append(node)
        node = node.args[0]
    if not descending:
        one_minus = _one_minus(node)
        if one_minus is None:
            raise NoMatch(f"{threshold.name} is not 1 - p of a per-row p")
        steps += one_minus[0]
        node = one_minus[1]
        while is_call(node, aten.unsqueeze.default, *RESHAPES):
            steps.append(node)
            node = node.args[0]
    if not knob_of_rows(val(node), rows):
        raise NoMatch(f"{threshold.name} is not one p per row, read from a float tensor")
    for step in steps:
        walk.take(step)
    return node


def _one_minus(node: Node) -> tuple[list[Node], Node] | None:
    """``1 - p`` -> (its nodes, p's node): on a tensor (``rsub`` / ``sub``), or on a float
    that Dynamo made dynamic, whose arithmetic it turns into tensor ops on a 0-d tensor:
    ``1.0 + (-1) * p`` (both constants ``scalar_tensor``s)."""
    if "alpha" in node.kwargs:
        return None
    if is_call(node, aten.rsub.Scalar) and constant(node.args[1]) == 1:
        return [node], node.args[0]
    if is_call(node, aten.sub.Tensor) and constant(node.args[0]) == 1:
        return [node], node.args[1]
    if is_call(node, aten.add.Tensor):
        for one, product in (node.args, node.args[::-1]):
            if constant(one) != 1 or not is_call(product, aten.mul.Tensor):
                continue
            for minus_one, p in (product.args, product.args[::-1]):
                if constant(minus_one) == -1 and isinstance(p, Node):
                    return [node, product], p
    return None
