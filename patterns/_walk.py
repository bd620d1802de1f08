"""The walk over the aten graph: what a match owns, why it stops, and the small predicates.

Every idiom's check walks back from its terminal node (``aten.multinomial``,
``aten.argmax``, ...) and ``take``s each node it consumes. A walk raises ``NoMatch`` with the
reason as soon as one step is not one it can prove safe: an intermediate read by another
node, a reduction over another dim, a dtype or device the op does not take, an op it does
not know. Once the walk is complete, ``check_private`` proves that nothing outside the match
reads what the rewrite erases.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from types import MappingProxyType

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx import Node
from torch.fx.experimental.symbolic_shapes import statically_known_true

aten, prims = torch.ops.aten, torch.ops.prims
INT64_MAX = 2**63 - 1

CONVERTS = (prims.convert_element_type.default, aten._to_copy.default)
COPIES = (aten.clone.default, aten.alias.default)
RESHAPES = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)
SQUEEZES = (aten.squeeze.dim, aten.squeeze.dims)
ROW_OPS = (
    aten.select.int,
    aten.slice.Tensor,
    aten.index.Tensor,
    aten.unsqueeze.default,
    aten.permute.default,  # one that keeps the vocabulary dim last (``row_op`` checks)
    *SQUEEZES,
    *RESHAPES,
)

# The meta key on the nodes of a tensor-parallel gather the pass left alone: why
# (``tp_gather.lift``); an idiom that refuses a chain fed by such a node gives that reason.
TP_GATHER_NOT_LIFTED = "flashsampling_tp_not_lifted"


class NoMatch(Exception):
    """A step of the chain that cannot be proved safe to rewrite; the message says why."""


class ReadOutside(NoMatch):
    """``Walk.check_private``'s refusal: ``node``, which the match would consume, is read
    outside it too (``_rewrite`` cuts the LM-head chain there and tries again)."""

    def __init__(self, message: str, node: Node):
        super().__init__(message)
        self.node = node


# The nodes of the LM-head chain that the check running now takes as logits the graph is
# given, each with why (read outside the match): ``match_lm_head`` stops there, as at a graph
# input, and the rewrite samples what they hold (``_rewrite._check_cutting``).
GIVEN_LOGITS: ContextVar[Mapping[Node, str]] = ContextVar(
    "flashsampling_given_logits", default=MappingProxyType({})
)


@dataclass
class Walk:
    """The nodes a match consumes. All but the terminal must be read only inside the match."""

    terminal: Node
    owned: list[Node] = field(default_factory=list)
    tail_rows: list[Node] = field(default_factory=list)  # row selections after the softmax
    leftovers: list[Node] = field(default_factory=list)  # erased too, if nothing else reads them
    # Nodes read outside that the rewrite replaces (the drawn tokens' logprobs, _logprobs.py).
    outputs: list[Node] = field(default_factory=list)

    def take(self, node: Node) -> Node:
        if node not in self.owned:
            self.owned.append(node)
        return node

    def check_private(self) -> None:
        inside = set(self.owned) | {self.terminal} | set(self.outputs)
        for node in self.owned:
            outside = [user for user in node.users if user not in inside]
            if not outside:
                continue
            user = outside[0]
            if is_call(user, aten.copy_.default) and user.args[0].op == "placeholder":
                raise ReadOutside(
                    f"{node.name} is written back into the input {user.args[0].name} (an"
                    " in-place op on a tensor the caller passed in, read after the call)",
                    node,
                )
            raise ReadOutside(f"{node.name} is also read by {user.name}", node)


def val(node):
    return node.meta.get("val") if isinstance(node, Node) else None


def is_call(node, *targets) -> bool:
    return isinstance(node, Node) and node.op == "call_function" and node.target in targets


def same(a, b) -> bool:
    return statically_known_true(a == b)


def to_the_end(end, size) -> bool:
    """A slice's ``end`` reaches past ``size``: ``x[..., k:]`` (the max int64, which a
    symbolic size cannot be proved below) or any end provably >= ``size``."""
    return end is not None and (end == INT64_MAX or statically_known_true(end >= size))


def same_shape(a, b) -> bool:
    return len(a) == len(b) and all(map(same, a, b))


def one_per_row(shape, rows) -> bool:
    """``shape`` is ``rows`` (one value per row), or may be: a dim that differs from its row
    dim only by another symbol (Dynamo gives each input's dynamic batch its own, and a mask
    written with ``x[mask] = v`` never unifies them). The rewrite checks such a knob's rows
    when the graph runs (``_rewrite._truncation``), as the program's own ops would fail."""
    return len(shape) == len(rows) and all(
        same(a, b) or not statically_known_true(a != b) for a, b in zip(shape, rows, strict=True)
    )


def slice_args(node: Node, first: int = 1) -> tuple:
    """``aten.slice.Tensor``'s (dim, start, end, step) from ``node.args[first:]`` (a
    ``slice_scatter``'s from 2), the defaults filled in: (0, None, None, 1)."""
    args = node.args[first:]
    return (*args, *(0, None, None, 1)[len(args) :])


def last_dim(dim, ndim: int) -> bool:
    return isinstance(dim, int) and ndim > 0 and dim % ndim == ndim - 1


def arguments(node: Node, *names: str) -> dict:
    """``node``'s arguments after the first, by name (positional or keyword)."""
    return dict(zip(names, node.args[1:], strict=False), **node.kwargs)


def keepdim_of(reduction: Node):
    return reduction.args[2] if len(reduction.args) > 2 else reduction.kwargs.get("keepdim")


def over_last_dim(dims, keepdim, ndim: int) -> bool:
    return keepdim is True and len(dims) == 1 and last_dim(dims[0], ndim)


def knob_of_rows(value, rows) -> bool:
    """``value`` is a float knob that the rows read: one per row (``[*rows]``) or one for all
    (0-d: a Python float that Dynamo made dynamic, once its value changed between calls,
    reaches the graph as a 0-d CPU tensor)."""
    return (
        isinstance(value, torch.Tensor)
        and value.is_floating_point()
        and (value.dim() == 0 or one_per_row(value.shape, rows))
    )


def strip_converts(walk: Walk, node: Node) -> Node:
    """Skip dtype casts between float dtypes (``.float()``, ``softmax(dtype=...)``)."""
    while is_call(node, *CONVERTS) and val(node).is_floating_point():
        node = walk.take(node).args[0]
    return node


def constant(node) -> float | None:
    """The value of a Python number or of a constant tensor made in the graph, all of whose
    elements equal it (``scalar_tensor``, ``full``, ``full_like``, a lifted one-element
    ``torch.tensor`` literal); None otherwise."""
    if isinstance(node, (bool, int, float)):
        return float(node)
    if is_call(node, aten.scalar_tensor.default):
        return constant(node.args[0])
    if is_call(node, aten.full.default, aten.full_like.default):
        return constant(node.args[1])
    if is_call(node, aten.lift_fresh_copy.default, *CONVERTS, *COPIES):
        return constant(node.args[0])
    if isinstance(node, Node) and node.op == "get_attr":
        module = node.graph.owning_module
        tensor = getattr(module, node.target, None) if module is not None else None
        if isinstance(tensor, torch.Tensor) and tensor.numel() == 1:
            # The pass runs under the graph's fake mode; the constant is a real tensor.
            with unset_fake_temporarily():
                return float(tensor.item())
    return None


def writes_zero(src, target: Node | None = None, view=None) -> bool:
    """``src``, what a ``select_scatter`` / ``slice_scatter`` writes, is 0 (False) everywhere:
    aten's ``copy`` or ``fill`` with 0 of a ``view`` node (``select``/``slice``) of ``target``
    (torch <= 2.14), or a ``full`` of 0 (torch 2.15 decomposes ``mask[..., 0] = False`` so;
    the scatter itself requires its shape to be the written region's)."""
    if is_call(src, aten.full.default):
        return constant(src) == 0
    if not (is_call(src, aten.copy.default, aten.fill.Scalar) and constant(src.args[1]) == 0):
        return False
    return target is None or (is_call(src.args[0], view) and src.args[0].args[0] is target)


def take_zero(walk: Walk, src: Node) -> None:
    """Own what ``writes_zero`` accepted."""
    walk.take(src)
    if not is_call(src, aten.full.default):
        walk.take(src.args[0])
        take_constant(walk, src.args[1])


def take_constant(walk: Walk, node) -> None:
    """Own a constant made in the graph; the lifted tensor it reads (a ``get_attr``) goes
    with it unless something else reads that."""
    if isinstance(node, Node) and node.op == "call_function":
        walk.take(node)
        walk.leftovers.extend(a for a in node.all_input_nodes if a.op == "get_attr")
