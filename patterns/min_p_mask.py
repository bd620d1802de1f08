"""Min-p as transformers' ``MinPLogitsWarper`` writes it::

    probs = torch.softmax(scores, dim=-1)
    top_probs = probs.amax(dim=-1, keepdim=True)
    scaled_min_p = self.min_p * top_probs
    tokens_to_remove = probs < scaled_min_p
    k = min(self.min_tokens_to_keep, probs.shape[-1])
    sorted_indices = torch.topk(probs, k, dim=-1).indices
    tokens_to_remove.scatter_(-1, sorted_indices, False)
    scores = scores.masked_fill(tokens_to_remove, -float("Inf"))

as transformers 4.x wrote it (the form copied into many samplers)::

    top_probs, _ = probs.max(dim=-1, keepdim=True)
    tokens_to_remove = probs < self.min_p * top_probs
    sorted_indices = torch.argsort(scores, descending=True, dim=-1)
    sorted_indices_to_remove = torch.gather(tokens_to_remove, dim=-1, index=sorted_indices)
    sorted_indices_to_remove[..., : self.min_tokens_to_keep] = False
    indices_to_remove = sorted_indices_to_remove.scatter(
        1, sorted_indices, sorted_indices_to_remove
    )

and as samplers write it by hand (``probs.max(-1, keepdim=True).values``, no ``scatter_``,
``torch.where(probs >= min_p * top, logits, -inf)``). A token is kept iff its probability is
>= ``min_p`` times the row's largest, which is the op's ``min_p`` (``_truncation.py``):
transformers' order puts it after temperature, top-k and top-p, as the op does.

Checked literals: ``<`` for the removed tokens (``>=`` for the kept ones; ``<=`` drops
tokens at the threshold), ``min_p`` a Python float in [0, 1] or one per row (vLLM's
``min_p.unsqueeze(1)``, its values asserted in [0, 1] in the rewritten graph), the max over
the vocabulary dim of the very probabilities compared, the softmax of the very logits
masked, and the ``scatter_`` (or the sorted mask's ``[..., :1] = False`` through a
descending sort of the very logits masked) of ``min_tokens_to_keep == 1``, which keeps the
largest token, as the threshold does anyway. The comparison must run on fp32 probabilities:
on bf16/fp16 ones its rounding moves the threshold by far more than the op's fp32 comparison
of ``l / T >= max / T + log(min_p)`` (the two agree up to fp32 rounding at the threshold,
the documented near-ties).
"""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch.fx import Node

from ._tails import match_softmax
from ._truncation import Mask, take_outputs, top_k_value
from ._walk import (
    COPIES,
    RESHAPES,
    NoMatch,
    Walk,
    arguments,
    aten,
    constant,
    is_call,
    keepdim_of,
    knob_of_rows,
    last_dim,
    over_last_dim,
    strip_converts,
    take_zero,
    val,
    writes_zero,
)

IDIOM = "min_p_mask"

# probs OP threshold, for each comparison written as (probs, threshold) or (threshold, probs).
_COMPARISONS = {
    aten.lt.Tensor: ("<", ">"),
    aten.gt.Tensor: (">", "<"),
    aten.le.Tensor: ("<=", ">="),
    aten.ge.Tensor: (">=", "<="),
}


def search(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    """The idiom as users write it (transformers' MinPLogitsWarper, then sampling)."""
    scores = F.linear(hidden, weight) / temperature
    probs = torch.softmax(scores, dim=-1)
    tokens_to_remove = probs < 0.1 * probs.amax(dim=-1, keepdim=True)
    tokens_to_remove.scatter_(-1, torch.topk(probs, 1, dim=-1).indices, False)
    scores = scores.masked_fill(tokens_to_remove, -float("Inf"))
    return torch.multinomial(F.softmax(scores, dim=-1), num_samples=1)


def example_inputs() -> tuple:
    """Arguments ``search`` is traced with in the tests."""
    return torch.randn(3, 24), torch.randn(1000, 24), 0.8


def condition(walk: Walk, condition: Node, source: Node, removes: bool) -> Mask | None:
    """``softmax(source) < min_p * max`` (removed) or ``>=`` (kept), maybe with the
    argmax scattered back to kept -> ``Mask(min_p=min_p)``; None if the condition does not
    compare the softmax of ``source`` with a multiple of its max."""
    probe = Walk(walk.terminal)
    keep_argmax = None
    if is_call(condition, aten.scatter.value):
        keep_argmax, condition = condition, condition.args[0]
    elif is_call(condition, aten.scatter.src):
        unsorted = _sorted_keeps_the_first(probe, condition, source)
        if unsorted is None or not removes:
            return None
        condition = unsorted
    if not is_call(condition, *_COMPARISONS):
        return None
    a, b = condition.args
    side, probs, min_p = 0, a, _min_p(probe, b, a)
    if min_p is None:
        side, probs, min_p = 1, b, _min_p(probe, a, b)
    if min_p is None:
        return None
    try:
        logits = strip_converts(probe, match_softmax(probe, probs))
    except NoMatch:
        return None  # a threshold on something else than the probabilities
    while is_call(logits, *COPIES):  # (``.softmax`` of a strided view copies it first)
        logits = strip_converts(probe, probe.take(logits).args[0])
    if logits is not source or probe.tail_rows:
        return None
    op = _COMPARISONS[condition.target][side]
    wanted = "<" if removes else ">="
    if op != wanted:
        role = "removes" if removes else "keeps"
        raise NoMatch(f"{condition.name} {role} p {op} min_p * max, where min-p {role} p {wanted}")
    if val(probs).dtype != torch.float32:
        raise NoMatch(
            f"{condition.name} compares {val(probs).dtype} probabilities with min_p * max: their"
            " rounding moves the threshold (the op compares fp32 logits)"
        )
    if keep_argmax is not None:
        _keeps_the_argmax(probe, keep_argmax, probs, removes)
    probe.take(condition)
    walk.owned += [node for node in probe.owned if node not in walk.owned]
    walk.leftovers += probe.leftovers
    return Mask(source, min_p=min_p)


def _min_p(walk: Walk, threshold, probs: Node) -> float | Node | None:
    """``min_p * probs.amax(-1, keepdim=True)`` (or ``probs.max(-1, keepdim=True).values``)
    -> min_p in [0, 1]; None if ``threshold`` is no multiple of the max of ``probs``."""
    if not is_call(threshold, aten.mul.Tensor):
        return None
    top, factor = threshold.args
    if not _row_max(top, probs):
        factor, top = threshold.args
        if not _row_max(top, probs):
            return None
    min_p = constant(factor)
    if isinstance(factor, Node) and min_p is None:
        min_p = _per_row(walk, factor, val(probs).shape[:-1])
    elif isinstance(factor, bool) or min_p is None or not 0.0 <= min_p <= 1.0:
        raise NoMatch(f"min_p = {factor} is outside [0, 1]")
    walk.take(threshold)
    if is_call(top, operator.getitem):
        take_outputs(walk, walk.take(top).args[0])
    else:
        walk.take(top)
    return min_p


def _per_row(walk: Walk, factor: Node, rows) -> Node:
    """``min_p[:, None]`` (vLLM's ``min_p.unsqueeze(1)``) -> the node of min_p, one float
    per row, or one for every row (0-d: a float argument that Dynamo made dynamic); its
    values are asserted in [0, 1] in the rewritten graph (``_rewrite.py``)."""
    steps, node = [], factor
    while is_call(node, aten.unsqueeze.default, *RESHAPES):
        steps.append(node)
        node = node.args[0]
    if not (knob_of_rows(val(node), rows) and len(rows) == 1):
        raise NoMatch(f"{factor.name} scales the max by a tensor that is not one min_p per row")
    for step in steps:
        walk.take(step)
    return node


def _row_max(top, probs: Node) -> bool:
    """``top`` is the max of ``probs`` over the vocabulary dim, one per row."""
    if is_call(top, operator.getitem) and top.args[1] == 0:
        reduction = top.args[0]
        if not is_call(reduction, aten.max.dim) or reduction.args[0] is not probs:
            return False
        args = arguments(reduction, "dim", "keepdim")
        return last_dim(args.get("dim"), val(probs).dim()) and args.get("keepdim") is True
    if not is_call(top, aten.amax.default) or top.args[0] is not probs:
        return False
    dims = top.args[1] if len(top.args) > 1 else top.kwargs.get("dim", [])
    if not over_last_dim(dims, keepdim_of(top), val(probs).dim()):
        raise NoMatch(f"{top.name} is not the max over the vocabulary dim, one per row")
    return True


def _keeps_the_argmax(walk: Walk, scatter: Node, probs: Node, removes: bool) -> None:
    """``removed.scatter_(-1, topk(probs, 1).indices, False)``: min_tokens_to_keep == 1,
    which keeps what the threshold keeps anyway (the largest token)."""
    _, dim, indices, value = scatter.args
    if not removes or value != 0:  # False
        raise NoMatch(f"{scatter.name} writes {value} into the mask, not False")
    if not (is_call(indices, operator.getitem) and indices.args[1] == 1):
        raise NoMatch(f"{scatter.name} scatters through something else than top-k indices")
    topk = indices.args[0]
    if not is_call(topk, aten.topk.default) or topk.args[0] is not probs:
        raise NoMatch(f"{scatter.name} scatters through something else than top-k indices")
    if not last_dim(dim, val(probs).dim()):
        raise NoMatch(f"{scatter.name} scatters along dim {dim}, not the vocabulary dim")
    k = top_k_value(topk)
    if k != 1:
        raise NoMatch(f"{topk.name} keeps the {k} most likely tokens: min_tokens_to_keep != 1")
    walk.take(scatter), walk.take(indices)
    take_outputs(walk, topk)


def _sorted_keeps_the_first(walk: Walk, scatter: Node, source: Node) -> Node | None:
    """transformers 4.x's ``min_tokens_to_keep``: the removal mask gathered into the order of
    a descending sort of the logits, its first entry set to False, scattered back -> the
    mask before it (for one token kept, the largest, which the threshold keeps anyway);
    None if ``scatter`` is not a scatter of such a gathered mask."""
    sorted_removed, dim, indices, src = scatter.args
    if src is not sorted_removed or not is_call(sorted_removed, aten.slice_scatter.default):
        return None
    gathered = sorted_removed.args[0]
    if not is_call(gathered, aten.gather.default) or gathered.args[2] is not indices:
        return None
    ndim = val(source).dim()
    if not (is_call(indices, operator.getitem) and indices.args[1] == 1):
        raise NoMatch(f"{scatter.name} scatters through something else than sorted indices")
    sort = indices.args[0]
    if not is_call(sort, aten.sort.default, aten.sort.stable) or sort.args[0] is not source:
        raise NoMatch(f"{scatter.name} keeps tokens in the order of another tensor's sort")
    sort_args = arguments(sort, "dim", "descending")
    if not (sort_args.get("descending") and last_dim(sort_args.get("dim", -1), ndim)):
        raise NoMatch(f"{sort.name} is not a descending sort over the vocabulary dim")
    if not (last_dim(dim, ndim) and last_dim(gathered.args[1], ndim)):
        raise NoMatch(f"{scatter.name} does not move the mask along the vocabulary dim")
    into = arguments(sorted_removed, "src", "dim", "start", "end", "step")
    zeros = into["src"]
    if not writes_zero(zeros):
        raise NoMatch(f"{sorted_removed.name} writes something else than False into the mask")
    if not (
        last_dim(into.get("dim", 0), ndim)
        and into.get("start") in (0, None)
        and into.get("step", 1) == 1
        and writes_zero(zeros, gathered, aten.slice.Tensor)
    ):
        raise NoMatch(f"{sorted_removed.name} does not write the first entries of the sorted mask")
    if into.get("end") != 1:
        raise NoMatch(
            f"{sorted_removed.name} keeps the {into.get('end')} most likely tokens:"
            " min_tokens_to_keep != 1"
        )
    for node in (scatter, sorted_removed, gathered, indices):
        walk.take(node)
    take_zero(walk, zeros)
    take_outputs(walk, sort)
    return gathered.args[0]
