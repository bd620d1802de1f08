"""Top-k as a threshold mask: every logit below the k-th largest of its row becomes -inf.

Three projects write it, and all three are this one mask in the aten graph:

* transformers ``TopKLogitsWarper``:
  ``scores.masked_fill(scores < torch.topk(scores, k)[0][..., -1, None], -inf)``;
* gpt-fast ``logits_to_probs``: ``pivot = v.select(-1, -1).unsqueeze(-1)``,
  ``torch.where(logits < pivot, -float("Inf"), logits)``;
* nanoGPT: ``logits[logits < v[:, [-1]]] = -float("Inf")`` (an ``index_put``).

``<`` keeps every token tied with the k-th value, as the op's ``top_k`` does; ``<=`` drops
the k-th value itself and is refused, as are a ``topk`` over another dim or of the smallest
values, a pivot that is not the k-th (last) value, and ``sorted=False``. ``k`` must be a
Python int or a SymInt provably >= 1. The mask becomes the op's ``top_k``
(``_truncation.py``); its tail (softmax -> multinomial, the exponential race, ...) is the
terminal idiom's.
"""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch.fx import Node

from ._truncation import Mask, sort_direction, sort_of, take_outputs, top_k_value
from ._walk import (
    CONVERTS,
    RESHAPES,
    NoMatch,
    Walk,
    aten,
    constant,
    is_call,
    last_dim,
    one_per_row,
    prims,
    same,
    same_shape,
    take_constant,
    val,
)

IDIOM = "top_k_mask"

# From the top-k values to the pivot: pick the last value, then broadcast it per row.
_PIVOT_STEPS = (
    aten.select.int,
    aten.slice.Tensor,
    aten.index.Tensor,
    aten.unsqueeze.default,
    *RESHAPES,
)
# x OP pivot, for each comparison written as (x, pivot) or (pivot, x).
_COMPARISONS = {
    aten.lt.Tensor: ("<", ">"),
    aten.gt.Tensor: (">", "<"),
    aten.le.Tensor: ("<=", ">="),
    aten.ge.Tensor: (">=", "<="),
}


def search(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    """The idiom as users write it (transformers' TopKLogitsWarper, then sampling)."""
    scores = F.linear(hidden, weight) / temperature
    indices_to_remove = scores < torch.topk(scores, 50)[0][..., -1, None]
    scores = scores.masked_fill(indices_to_remove, -float("Inf"))
    return torch.multinomial(F.softmax(scores, dim=-1), num_samples=1)


def example_inputs() -> tuple:
    """Arguments ``search`` is traced with in the tests."""
    return torch.randn(3, 24), torch.randn(1000, 24), 0.8


def condition(walk: Walk, condition: Node, source: Node, removes: bool) -> Mask | None:
    """``source < kth`` (removed) or ``source >= kth`` (kept) -> ``Mask(top_k=k)``; None if
    the condition does not compare ``source`` with a ``topk`` of it."""
    if not is_call(condition, *_COMPARISONS):
        return None
    a, b = condition.args
    ranked = rank_in_sorted_order(walk, condition, source, removes)
    if ranked is not None:
        return ranked
    if a is source:
        pivot, op = b, _COMPARISONS[condition.target][0]
    elif b is source:
        pivot, op = a, _COMPARISONS[condition.target][1]
    else:
        return None
    k = _kth_largest(walk, pivot, source)
    if k is None:
        k = _kth_sorted(walk, pivot, source)
    if k is None:
        return None
    wanted = "<" if removes else ">="
    if op != wanted:
        role = "removes" if removes else "keeps"
        raise NoMatch(f"{condition.name} {role} x {op} kth, where top-k {role} x {wanted} kth")
    walk.take(condition)
    return Mask(source, top_k=k)


def rank_in_sorted_order(walk: Walk, condition: Node, source: Node, removes: bool) -> Mask | None:
    """``arange(V) >= k[:, None]`` (removed) or ``arange(V) < k[:, None]`` (kept) on values
    sorted in descending order (SGLang's and the Gemma reference sampler's per-row top-k,
    written back to token order by ``_truncation.match_sorted`` / ``match_gathered``): the
    first k of each row stay, exactly k, the sort breaking ties at the k-th value (the op
    keeps them all: ``exact_k``, fp32 logits only). None if the condition compares no
    ``arange`` over the vocabulary."""
    if condition.target not in _COMPARISONS:
        return None  # (a comparison with a Python number: no rank tensor in it)
    a, b = condition.args
    steps, ranks = _broadcast_steps(a)
    op = _COMPARISONS[condition.target][0]
    if not _is_vocabulary_arange(ranks, source):
        steps, ranks = _broadcast_steps(b)
        op, b = _COMPARISONS[condition.target][1], a
        if not _is_vocabulary_arange(ranks, source):
            return None
    sort = sort_of(source)
    if sort is None or not sort_direction(sort, sort.args[0]):
        raise NoMatch(
            f"{condition.name} keeps the first k positions of values that are not sorted in"
            " descending order"
        )
    wanted = ">=" if removes else "<"
    if op != wanted:
        role = "removes" if removes else "keeps"
        raise NoMatch(f"{condition.name} {role} rank {op} k, where top-k {role} rank {wanted} k")
    k_steps, k = _integer_steps(b)
    value, rows = val(k), val(source).shape[:-1]
    if not (isinstance(value, torch.Tensor) and not value.is_floating_point()):
        raise NoMatch(f"{condition.name} compares the ranks with a k that is not an integer tensor")
    if value.dtype == torch.bool or not one_per_row(value.shape, rows):
        raise NoMatch(f"{condition.name} compares the ranks with a k of shape {tuple(value.shape)}")
    for node in (*steps, ranks, *k_steps, condition):
        walk.take(node)
    return Mask(source, top_k=k, exact_k=True)


def _broadcast_steps(node) -> tuple[list[Node], object]:
    steps = []
    while is_call(node, aten.unsqueeze.default, aten.expand.default, *RESHAPES):
        steps.append(node)
        node = node.args[0]
    return steps, node


def _is_vocabulary_arange(node, source: Node) -> bool:
    """``torch.arange(V)`` (aten: ``iota``), V the vocabulary size of ``source``."""
    vocab_size = val(source).shape[-1]
    if is_call(node, prims.iota.default):
        return (
            same(node.args[0], vocab_size)
            and node.kwargs.get("start") == 0
            and node.kwargs.get("step") == 1
        )
    if is_call(node, aten.arange.default):
        return same(node.args[0], vocab_size)
    if is_call(node, aten.arange.start):
        return node.args[0] == 0 and same(node.args[1], vocab_size)
    return False


def _kth_largest(walk: Walk, pivot: Node, source: Node) -> int | Node | None:
    """``k`` if ``pivot`` is the k-th (last) value per row of ``torch.topk(source, k)``,
    broadcast along the vocabulary dim; None if ``pivot`` does not come from a ``topk``."""
    chain, node = [], pivot
    while is_call(node, *_PIVOT_STEPS):
        chain.append(node)
        node = node.args[0]
    if not (is_call(node, operator.getitem) and node.args[1] == 0):
        return None
    topk = node.args[0]
    if not is_call(topk, aten.topk.default) or topk.args[0] is not source:
        return None
    values, k = node, top_k_value(topk)
    sorted_values = topk.args[4] if len(topk.args) > 4 else topk.kwargs.get("sorted", True)
    if not sorted_values:
        raise NoMatch(f"{topk.name} is unsorted: its last value is not the k-th largest")
    broadcasts = all(is_call(n, aten.unsqueeze.default, *RESHAPES) for n in chain[:-1])
    if not chain or not broadcasts or not _picks_last(walk, chain[-1], values, k):
        raise NoMatch(f"{pivot.name} is not the k-th largest value of {topk.name}")
    rows = val(source).shape[:-1]
    expected = [tuple(rows) + (1,)] + ([(), (1,)] if not rows else [])
    if not any(same_shape(val(pivot).shape, shape) for shape in expected):
        raise NoMatch(f"{pivot.name} is not one threshold per row of the logits")
    for n in chain:
        walk.take(n)
    walk.take(values)
    take_outputs(walk, topk)
    return k


def _picks_last(walk: Walk, step: Node, values: Node, k) -> bool:
    """``step`` takes the last of the k values along the last dim: ``v[..., -1]``,
    ``v[:, [-1]]``, ``v[..., -1:]`` (or index k - 1)."""
    ndim = val(values).dim()

    def last(index) -> bool:
        return isinstance(index, int) and (index == -1 or same(index, k - 1))

    if step.args[0] is not values:
        return False
    if is_call(step, aten.select.int):
        return last_dim(step.args[1], ndim) and last(step.args[2])
    if is_call(step, aten.slice.Tensor):
        dim, start = step.args[1], step.args[2] if len(step.args) > 2 else None
        return last_dim(dim, ndim) and last(start)
    if not is_call(step, aten.index.Tensor):
        return False
    indices = step.args[1]
    if len(indices) != ndim or any(i is not None for i in indices[:-1]):
        return False
    index = constant(indices[-1])
    if index is None or val(indices[-1]).numel() != 1 or not last(int(index)):
        return False
    take_constant(walk, indices[-1])
    return True


def _kth_sorted(walk: Walk, pivot: Node, source: Node) -> Node | None:
    """The node of per-row ``k`` if ``pivot`` is each row's k-th largest value read from a
    sort by a gather: ``sort(source, descending=True)[0].gather(-1, (k - 1)[:, None])``
    (transformers' continuous-batching ``TopKLogitsWarper``), or, on values sorted in
    ascending order and masked in that order, ``sorted.gather(1, (V - k)[:, None])`` with
    ``sorted`` the very values masked (vLLM's ``apply_top_k_top_p``, also after its top-p
    mask). None if ``pivot`` gathers nothing from a sort.

    ``k`` is one integer per row; a ``k`` outside [1, V] makes the gather fail, so the
    rewritten graph asserts ``k >= 1`` (``_rewrite.py``) and ``k >= V`` is the op's "off",
    as it keeps every token here too (the pivot is the row's smallest value)."""
    if not is_call(pivot, aten.gather.default):
        return None
    sorted_values, dim, index = pivot.args[:3]
    sort = sort_of(sorted_values)
    if sort is None:
        return None
    masked_before = not (is_call(sorted_values, operator.getitem) and sorted_values.args[1] == 0)
    if masked_before and sorted_values is not source:
        raise NoMatch(f"{pivot.name} reads the k-th value from values masked before")
    # (sorted values that the chain's earlier masks (top-p, min-p) masked, read where this one
    # masks: each keeps a prefix of the sorted row, so the value at rank k is the row's k-th
    # largest where they kept it and -inf where they kept fewer: the top k of what they keep
    # either way, the op's top-k after a top-p measured on the whole row)
    if sort.args[0] is not source and sorted_values is not source:
        raise NoMatch(f"{pivot.name} reads the k-th value of another tensor than the one masked")
    ndim = val(source).dim()
    descending = sort_direction(sort, sort.args[0])
    if not last_dim(dim, ndim):
        raise NoMatch(f"{pivot.name} gathers along dim {dim}, not the vocabulary dim")
    rows, vocab_size = val(source).shape[:-1], val(source).shape[-1]
    if ndim != 2 or not one_per_row(val(pivot).shape, (*rows, 1)):
        raise NoMatch(f"{pivot.name} is not one threshold per row of [B, V] logits")
    steps, k = _integer_steps(index)
    offset = None
    if is_call(k, aten.sub.Tensor, aten.sub.Scalar) and "alpha" not in k.kwargs:
        a, b = k.args
        if descending and isinstance(a, Node) and b == 1:
            offset, k = k, a  # k - 1
        elif not descending and isinstance(b, Node) and not isinstance(a, Node):
            if same(a, vocab_size):
                offset, k = k, b  # V - k
    elif is_call(k, aten.rsub.Scalar) and not descending and same(k.args[1], vocab_size):
        offset, k = k, k.args[0]  # V - k, written k.rsub(V)
    if offset is None:
        at = "k - 1 of a descending sort" if descending else "V - k of an ascending sort"
        raise NoMatch(f"{pivot.name} does not gather at {at}")
    k_steps, k = _integer_steps(k)
    value = val(k)
    if not (isinstance(value, torch.Tensor) and not value.is_floating_point()):
        raise NoMatch(f"{pivot.name} gathers at a k that is not an integer tensor")
    if value.dtype == torch.bool or not one_per_row(value.shape, rows):
        raise NoMatch(f"{pivot.name} gathers at a k of shape {tuple(value.shape)}, not one per row")
    for node in (*steps, offset, *k_steps, pivot):
        walk.take(node)
    if sorted_values is not source:
        walk.take(sorted_values)
        take_outputs(walk, sort)
    return k


def _integer_steps(node) -> tuple[list[Node], object]:
    """Strip unsqueezes, views and integer casts (``.long()``) -> (the steps, what is under
    them)."""
    steps = []
    while is_call(node, aten.unsqueeze.default, *RESHAPES, *CONVERTS) and not (
        val(node).is_floating_point()
    ):
        steps.append(node)
        node = node.args[0]
    return steps, node
