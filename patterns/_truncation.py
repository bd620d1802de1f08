"""The truncation masks: a step of the LM-head chain that sets the tail of the vocabulary to
-inf (top-k, top-p, min-p), found once here for every idiom that reaches it.

A mask is written ``masked_fill(x, remove, -inf)`` (aten: ``where(remove, -inf, x)``),
``torch.where(keep, x, -inf)`` or ``x[remove] = -inf`` (aten: ``index_put``). This module
matches that shell (``masking_shell``, which the sorted nucleus also uses for its zeroed
probabilities) and the ``-inf``; the condition is matched by the mask modules
(``top_k_mask``, ``top_p_mask``, ``min_p_mask``), registered in ``CONDITIONS``, and becomes
the op's ``top_k`` / ``top_p`` / ``min_p`` parameter: the truncation math itself lives in the
op, never here.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.fx import Node
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ._walk import (
    NoMatch,
    Walk,
    aten,
    constant,
    is_call,
    last_dim,
    one_per_row,
    same_shape,
    take_constant,
    val,
)

MASKING_OPS = (aten.where.self, aten.masked_fill.Scalar, aten.index_put.default)


@dataclass
class Mask:
    """``source`` with the tokens outside the top-k (or top-p, or min-p) set to -inf."""

    source: Node
    # a Python int, a node holding a SymInt, or a node of per-row k ([*rows] or [*rows, 1])
    top_k: int | Node | None = None
    top_p: float | Node | None = None  # a Python float, or a node of per-row p
    min_p: float | Node | None = None  # a Python float, or a node of per-row min_p
    # Exactly k tokens kept, the ties at the k-th value broken by a sort or ``torch.topk``
    # (the op keeps every tied token: equal only where ties have probability zero).
    exact_k: bool = False


# condition(walk, condition, source, removes) -> Mask, or None if it is not this mask's
# condition. ``removes``: True if the condition names the tokens set to -inf, False if it
# names the tokens kept.
Condition = Callable[[Walk, Node, Node, bool], "Mask | None"]
CONDITIONS: list[Condition] = []


def match_mask(walk: Walk, node: Node) -> Mask:
    """``node`` (one of ``MASKING_OPS``) as a truncation mask; NoMatch if it is not one."""
    source, condition, fill, removes = masking_shell(node, walk)
    if not _is_minus_inf(fill):
        raise NoMatch(f"{node.name} fills with {constant(fill)}, not -inf")
    for match in CONDITIONS:
        mask = match(walk, condition, source, removes)
        if mask is not None:
            walk.take(node)
            take_constant(walk, fill)
            return mask
    raise NoMatch(
        f"{node.name} sets tokens to -inf by a condition that is not top-k, top-p or min-p"
    )


def masking_shell(node: Node, walk: Walk | None = None) -> tuple[Node, Node, object, bool]:
    """``node`` (one of ``MASKING_OPS``) -> (source, condition, fill, removes): ``removes``
    is True if the condition names the tokens filled, False if it names the ones kept (a
    negated condition, ``x[~keep] = -inf``, is the condition it negates, the role flipped;
    ``walk`` owns the negation). NoMatch if it does not write one value through a boolean
    mask of ``source``'s shape."""
    if is_call(node, aten.index_put.default):
        source, indices, fill = node.args[:3]
        accumulate = node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate")
        if accumulate or len(indices) != 1 or not _full_bool_mask(indices[0], source):
            raise NoMatch(f"{node.name} writes through indices, not a boolean mask of the logits")
        condition, removes = indices[0], True
    elif is_call(node, aten.masked_fill.Scalar):
        source, condition, fill = node.args
        removes = True
    else:
        condition, a, b = node.args
        removes = constant(a) is not None  # where(remove, fill, x), else where(keep, x, fill)
        source, fill = (b, a) if removes else (a, b)
    if not _full_bool_mask(condition, source) or not same_shape(val(node).shape, val(source).shape):
        raise NoMatch(f"{node.name} masks with a condition of another shape than the logits")
    while is_call(condition, aten.bitwise_not.default, aten.logical_not.default):
        if walk is not None:
            walk.take(condition)
        condition, removes = condition.args[0], not removes
    return source, condition, fill, removes


def _is_minus_inf(node) -> bool:
    return constant(node) == -math.inf


def _full_bool_mask(condition, source: Node) -> bool:
    mask, shape = val(condition), val(source).shape
    return (
        isinstance(mask, torch.Tensor)
        and mask.dtype == torch.bool
        and one_per_row(mask.shape[:-1], shape[:-1])
        and same_shape(mask.shape[-1:], shape[-1:])
    )


def top_k_value(topk: Node) -> int | Node:
    """The ``k`` of ``torch.topk(x, k)`` over the last dim, largest first: a Python int or a
    node holding a SymInt, provably >= 1 (``topk(x, 0)`` keeps nothing; the op reads 0 as
    "off")."""
    k = topk.args[1]
    args = dict(zip(("dim", "largest"), topk.args[2:], strict=False), **topk.kwargs)
    if not last_dim(args.get("dim", -1), val(topk.args[0]).dim()):
        raise NoMatch(f"{topk.name} ranks along dim {args.get('dim')}, not the vocabulary dim")
    if not args.get("largest", True):
        raise NoMatch(f"{topk.name} takes the smallest values")
    size = val(k) if isinstance(k, Node) else k
    if isinstance(size, bool) or not isinstance(size, (int, torch.SymInt)):
        raise NoMatch(f"{topk.name} takes k = {k}, not an integer")
    if not statically_known_true(size >= 1):
        raise NoMatch(f"{topk.name} takes k = {size}, which is not provably >= 1")
    return k


def take_outputs(walk: Walk, node: Node) -> None:
    """Own a multi-output node and its ``getitem``s that nothing reads (dead outputs)."""
    walk.take(node)
    for user in node.users:
        if user.target is operator.getitem and not user.users:
            walk.take(user)


def sort_of(sorted_values: Node) -> Node | None:
    """The ``torch.sort`` whose values ``sorted_values`` are, maybe through masks written in
    sorted order (``logits_sort.masked_fill_(...)``); None if it is not sorted values."""
    node = sorted_values
    while is_call(node, *MASKING_OPS):
        node = masking_shell(node)[0]
    if is_call(node, operator.getitem) and node.args[1] == 0:
        if is_call(node.args[0], aten.sort.default, aten.sort.stable):
            return node.args[0]
    return None


def sort_direction(sort: Node, source: Node) -> bool:
    """-> ``descending`` of ``sort``, a sort of ``source`` over the vocabulary dim; NoMatch
    for a sort over another dim."""
    args = dict(zip(("dim", "descending"), sort.args[1:], strict=False), **sort.kwargs)
    if not last_dim(args.get("dim", -1), val(source).dim()):
        raise NoMatch(f"{sort.name} is not a sort over the vocabulary dim")
    return bool(args.get("descending", False))


def match_sorted(walk: Walk, scatter: Node) -> list[Mask]:
    """``s.scatter(-1, order, s)`` with ``s, order = x.sort(-1)`` masked in sorted order
    (vLLM's ``apply_top_k_top_p``, x-transformers' ``top_p``): every token written back to
    its place, so the result is ``x`` with the masks applied in token order. -> the masks,
    first applied first, the first one's ``source`` being ``x``; NoMatch if the scatter is
    not exactly that."""
    base, dim, order, src = scatter.args
    if src is not base:
        raise NoMatch(f"{scatter.name} scatters another tensor than the one it writes into")
    return _in_token_order(walk, scatter, base, dim, order, [])


def match_gathered(walk: Walk, gather: Node) -> list[Mask]:
    """``s.gather(-1, order.argsort(-1))`` with ``s, order = x.sort(-1)`` masked in sorted
    order (the Gemma reference sampler's way back): the inverse permutation reads every
    token from its sorted place, as ``match_sorted``'s scatter writes it there."""
    base, dim, inverse = gather.args[:3]
    argsort = inverse.args[0] if is_call(inverse, operator.getitem) else None
    if not (inverse.args[1:] == (1,) and is_call(argsort, aten.sort.default, aten.sort.stable)):
        raise NoMatch(f"{gather.name} gathers through something else than a sort's inverse order")
    order = argsort.args[0]
    if sort_direction(argsort, order):
        raise NoMatch(f"{gather.name} gathers through a descending argsort, not the inverse")
    return _in_token_order(walk, gather, base, dim, order, [inverse, argsort])


def _in_token_order(walk, back: Node, base, dim, order, steps: list[Node]) -> list[Mask]:
    """The masks on ``base``, values of ``x.sort(-1)`` masked in sorted order, that ``back``
    puts back in token order through ``order`` (the sort's indices, maybe inverted by
    ``steps``)."""
    if not (is_call(order, operator.getitem) and order.args[1] == 1):
        raise NoMatch(f"{back.name} puts values back through something else than a sort's indices")
    sort = order.args[0]
    if not is_call(sort, aten.sort.default, aten.sort.stable):
        raise NoMatch(f"{back.name} puts values back through something else than a sort's indices")
    if sort_of(base) is not sort:
        raise NoMatch(f"{back.name} puts back something else than {sort.name}'s values")
    if not last_dim(dim, val(base).dim()):
        raise NoMatch(f"{back.name} works along dim {dim}, not the vocabulary dim")
    sort_direction(sort, sort.args[0])
    masks, node = [], base
    while is_call(node, *MASKING_OPS):
        walk.take(node)
        mask = match_mask(walk, node)
        masks.insert(0, mask)
        node = mask.source
    if not masks:
        raise NoMatch(f"{back.name} puts the sorted values back unmasked")
    for step in (back, order, node, *steps):
        walk.take(step)
    take_outputs(walk, sort)
    masks[0].source = sort.args[0]
    return masks


def match_scattered(walk: Walk, scatter: Node) -> list[Mask]:
    """A ``scatter`` on the LM-head chain: masked sorted values written back in token order
    (``match_sorted``), or the top-k values written into a row of -inf,
    ``torch.full_like(x, -inf).scatter_(-1, i, v)`` with ``v, i = torch.topk(x, k)``
    (litgpt's ``sample``, x-transformers' ``top_k``): exactly k tokens kept, those
    ``torch.topk`` picks among the ties at the k-th value."""
    base, dim, index, src = scatter.args
    if not (is_call(index, operator.getitem) and is_call(index.args[0], aten.topk.default)):
        return match_sorted(walk, scatter)
    topk = index.args[0]
    source = topk.args[0]
    if not (index.args[1] == 1 and is_call(src, operator.getitem) and src.args[0] is topk):
        raise NoMatch(f"{scatter.name} writes something else than {topk.name}'s values")
    if src.args[1] != 0:
        raise NoMatch(f"{scatter.name} writes something else than {topk.name}'s values")
    if not _is_minus_inf(base) or not same_shape(val(base).shape, val(source).shape):
        raise NoMatch(f"{scatter.name} writes the top-k values into something else than -inf")
    if not last_dim(dim, val(source).dim()):
        raise NoMatch(f"{scatter.name} scatters along dim {dim}, not the vocabulary dim")
    k = top_k_value(topk)
    for node in (scatter, index, src):
        walk.take(node)
    take_constant(walk, base)
    take_outputs(walk, topk)
    return [Mask(source, top_k=k, exact_k=True)]
