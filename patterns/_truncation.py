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
    same_shape,
    take_constant,
    val,
)

MASKING_OPS = (aten.where.self, aten.masked_fill.Scalar, aten.index_put.default)


@dataclass
class Mask:
    """``source`` with the tokens outside the top-k (or top-p, or min-p) set to -inf."""

    source: Node
    top_k: int | Node | None = None  # a Python int, or a node holding a SymInt
    top_p: float | None = None
    min_p: float | None = None


# condition(walk, condition, source, removes) -> Mask, or None if it is not this mask's
# condition. ``removes``: True if the condition names the tokens set to -inf, False if it
# names the tokens kept.
Condition = Callable[[Walk, Node, Node, bool], "Mask | None"]
CONDITIONS: list[Condition] = []


def match_mask(walk: Walk, node: Node) -> Mask:
    """``node`` (one of ``MASKING_OPS``) as a truncation mask; NoMatch if it is not one."""
    source, condition, fill, removes = masking_shell(node)
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


def masking_shell(node: Node) -> tuple[Node, Node, object, bool]:
    """``node`` (one of ``MASKING_OPS``) -> (source, condition, fill, removes): ``removes``
    is True if the condition names the tokens filled, False if it names the ones kept.
    NoMatch if it does not write one value through a boolean mask of ``source``'s shape."""
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
    return source, condition, fill, removes


def _is_minus_inf(node) -> bool:
    return constant(node) == -math.inf


def _full_bool_mask(condition, source: Node) -> bool:
    mask = val(condition)
    return (
        isinstance(mask, torch.Tensor)
        and mask.dtype == torch.bool
        and same_shape(mask.shape, val(source).shape)
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
