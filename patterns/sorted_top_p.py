"""The hand-written nucleus on sorted probabilities, as Llama's reference ``sample_top_p``
(and xformers', and many samplers after them) writes it::

    probs = torch.softmax(logits / temperature, dim=-1)
    probs_sort, probs_idx = torch.sort(probs, dim=-1, descending=True)
    probs_sum = torch.cumsum(probs_sort, dim=-1)
    mask = probs_sum - probs_sort > p
    probs_sort[mask] = 0.0
    probs_sort.div_(probs_sort.sum(dim=-1, keepdim=True))
    next_token = torch.multinomial(probs_sort, num_samples=1)
    next_token = torch.gather(probs_idx, -1, next_token)

A token is dropped iff the mass sorted above it exceeds ``p``; the draw among the rest, read
back through the sort's indices, is the op's ``fused_sample(top_p=p)`` (``_rewrite.py``).
The renormalization is optional (``multinomial`` normalizes), the zeroing may be
``masked_fill`` or ``torch.where``. Checked literals: a descending sort over the vocabulary
dim of the probabilities, ``cumsum - sorted`` over the same sort, ``p`` a Python float in
(0, 1], the fill exactly 0, the gather along the vocabulary dim through the same sort's
indices, independent draws (``multinomial_draws``).

``> p`` keeps a token whose mass above equals ``p`` exactly, where the op (and ``>= p``)
drops it. Both compute that mass in fp32, the program by its cumsum and the op by its own
sum, so which side of ``p`` a token within a rounding of it lands on is a near-tie either
way; fp32 probabilities are required. Ties at the token crossing ``p``: the op keeps every
token tied with it, the sort keeps those it puts first, which agree unless two fp32 logits
tie (measure zero); logits rounded to bf16/fp16 tie often, so they are refused, as for
``top_p_mask``.
"""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch.fx import Node

from ._lm_head import match_lm_head
from ._rewrite import SamplingMatch
from ._tails import match_softmax, multinomial_draws, unnormalized
from ._truncation import MASKING_OPS, masking_shell, sort_of, take_outputs
from ._walk import (
    CONVERTS,
    NoMatch,
    Walk,
    arguments,
    aten,
    constant,
    is_call,
    last_dim,
    take_constant,
    val,
)
from .top_p_mask import per_row_p

IDIOM = "sorted_top_p"
TARGET = aten.gather.default


def search(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    """The idiom as users write it (Llama's ``sample_top_p``)."""
    probs = torch.softmax(F.linear(hidden, weight) / temperature, dim=-1)
    probs_sort, probs_idx = torch.sort(probs, dim=-1, descending=True)
    probs_sum = torch.cumsum(probs_sort, dim=-1)
    mask = probs_sum - probs_sort > 0.9
    probs_sort[mask] = 0.0
    probs_sort.div_(probs_sort.sum(dim=-1, keepdim=True))
    next_token = torch.multinomial(probs_sort, num_samples=1)
    return torch.gather(probs_idx, -1, next_token)


def example_inputs() -> tuple:
    """Arguments ``search`` is traced with in the tests."""
    return torch.randn(3, 24), torch.randn(1000, 24), 0.6


def check(walk: Walk) -> SamplingMatch | None:
    gather = walk.terminal
    tokens, dim, choice = gather.args[:3]
    cast = None
    if is_call(tokens, *CONVERTS):  # SGLang's ``probs_idx.to(torch.int32)``
        cast, tokens = tokens, tokens.args[0]
    if not (is_call(tokens, operator.getitem) and tokens.args[1] == 1):
        return None
    sort = tokens.args[0]
    if not is_call(sort, aten.sort.default, aten.sort.stable):
        return None
    if not is_call(choice, aten.multinomial.default):
        return None
    kept = unnormalized(walk, choice.args[0])
    if not is_call(kept, *MASKING_OPS):
        return None
    sorted_probs, condition, fill, removes = masking_shell(kept)
    if not (is_call(sorted_probs, operator.getitem) and sorted_probs.args[0] is sort):
        if sort_of(sorted_probs) is sort:
            raise NoMatch(_several_masks(kept))
        return None
    if cast is not None:
        raise NoMatch(f"{gather.name} gathers token ids cast to {val(cast).dtype}")
    if sorted_probs.args[1] != 0 or constant(fill) != 0.0:
        raise NoMatch(f"{kept.name} does not set the sorted probabilities outside p to 0")
    ndim = val(sorted_probs).dim()
    sort_args = arguments(sort, "dim", "descending")
    if not last_dim(sort_args.get("dim", -1), ndim) or not sort_args.get("descending", False):
        raise NoMatch(f"{sort.name} is not a descending sort over the vocabulary dim")
    if not last_dim(dim, ndim):
        raise NoMatch(f"{gather.name} gathers along dim {dim}, not the sorted dim")
    if val(sorted_probs).dtype != torch.float32:
        raise NoMatch(f"{sort.name} sorts {val(sorted_probs).dtype} probabilities, not fp32")
    top_p = _top_p(walk, condition, sorted_probs, removes)
    num_samples = multinomial_draws(choice)
    for node in (tokens, choice, kept, sorted_probs):
        walk.take(node)
    take_constant(walk, fill)
    take_outputs(walk, sort)
    head = match_lm_head(walk, match_softmax(walk, sort.args[0]))
    if head.top_p is not None or head.min_p is not None:
        raise NoMatch(f"{sort.name} sorts probabilities already truncated by top-p or min-p")
    if head.logits_dtype is not None:
        raise NoMatch(
            f"top-p on logits rounded to {str(head.logits_dtype)[6:]}: ties at the token"
            " crossing p are common there, and the op would keep all of them where the sort"
            " keeps those it puts first"
        )
    return SamplingMatch(head, num_samples=num_samples, top_k=head.top_k, top_p=top_p)


def _top_p(walk: Walk, condition, sorted_probs, removes: bool) -> float | Node:
    """``cumsum(sorted, -1) - sorted > p`` (or ``>= p``) for the tokens removed, ``<= p``
    (or ``< p``) for the tokens kept -> p in (0, 1]."""
    wanted = (
        (aten.gt.Scalar, aten.ge.Scalar, aten.gt.Tensor, aten.ge.Tensor)
        if removes
        else (aten.le.Scalar, aten.lt.Scalar, aten.le.Tensor, aten.lt.Tensor)
    )
    if not is_call(condition, *wanted):
        role = "removed" if removes else "kept"
        raise NoMatch(f"{condition.name} does not name the tokens {role} by their mass above")
    above, p = condition.args
    if not (
        is_call(above, aten.sub.Tensor)
        and "alpha" not in above.kwargs
        and above.args[1] is sorted_probs
        and is_call(above.args[0], aten.cumsum.default)
        and above.args[0].args[0] is sorted_probs
        and last_dim(above.args[0].args[1], val(sorted_probs).dim())
    ):
        raise NoMatch(f"{condition.name} does not compare the mass sorted above each token")
    if isinstance(p, Node):
        p = per_row_p(walk, p, val(sorted_probs).shape[:-1], descending=True)
    elif isinstance(p, bool) or not isinstance(p, (int, float)):
        raise NoMatch(f"{condition.name} compares with {p}, not a Python float")
    elif not 0.0 < p <= 1.0:
        raise NoMatch(f"top_p = {p} is outside (0, 1]")
    else:
        p = float(p)
    for node in (condition, above, above.args[0]):
        walk.take(node)
    return p


def sorted_back_reason(probs: Node) -> str | None:
    """Why probabilities zeroed in sorted order and put back in token order before the draw
    (the Gemma reference sampler: ``probs_sort`` masked, renormalized, then
    ``gather(probs_sort, -1, argsort(probs_idx))``) are refused; None if ``probs`` is not
    that. The op truncates logits (-inf), not probabilities: only its own order of masks
    (top-k, then top-p measured on the survivors) is one it can draw."""
    node = probs
    if is_call(node, aten.div.Tensor) and is_call(node.args[1], aten.sum.dim_IntList):
        node = node.args[0]
    if not is_call(node, aten.gather.default, aten.scatter.src):
        return None
    kept = node.args[0]
    while is_call(kept, aten.div.Tensor) and is_call(kept.args[1], aten.sum.dim_IntList):
        kept = kept.args[0]
    if not is_call(kept, *MASKING_OPS):
        return None
    try:
        source = masking_shell(kept)[0]
    except NoMatch:
        return None
    if sort_of(source) is None and not is_call(source, *MASKING_OPS):
        return None
    if is_call(source, *MASKING_OPS) and "rank k" in _several_masks(kept):
        return (
            f"{node.name} puts back in token order probabilities that a nucleus measured on"
            " the whole row's mass and a top-k cut by rank zeroed in sorted order (the Gemma"
            " reference sampler): the op cannot draw that distribution, it measures top-p on"
            " the top-k survivors"
        )
    return (
        f"{node.name} puts back in token order probabilities zeroed in sorted order: the op"
        " recognizes such masks on the logits (-inf, scattered back), not on probabilities"
    )


def _several_masks(kept) -> str:
    """Why a chain of masks on the sorted probabilities is refused (SGLang's torch-native
    sampler, the Gemma reference's): the op measures top-p on the top-k survivors, these
    programs on the whole row."""
    positional = False
    node = kept
    while is_call(node, *MASKING_OPS):
        source, condition, _, _ = masking_shell(node)
        positional |= any(
            is_call(n, aten.arange.default, aten.arange.start, torch.ops.prims.iota.default)
            for n in (condition, *getattr(condition, "all_input_nodes", ()))
            for n in (n, *getattr(n, "all_input_nodes", ()))
        )
        node = source
    if positional:
        return (
            f"{kept.name} zeroes sorted probabilities past rank k next to a nucleus measured"
            " on the whole row's mass: the op measures top-p on the top-k survivors"
        )
    return f"{kept.name} zeroes the sorted probabilities by several masks"
