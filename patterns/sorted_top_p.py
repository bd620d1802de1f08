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

SGLang's torch-native sampler (``top_k_top_p_min_p_sampling_from_probs_torch``) zeroes the
sorted probabilities by several masks, each per row::

    probs_sort, probs_idx = probs.sort(dim=-1, descending=True)
    probs_sum = torch.cumsum(probs_sort, dim=-1)
    probs_sort[torch.arange(0, V).view(1, -1) >= top_ks.view(-1, 1)] = 0.0
    probs_sort[(probs_sum - probs_sort) > top_ps.view(-1, 1)] = 0.0
    probs_sort[probs_sort < (probs_sort[:, 0] * min_ps).view(-1, 1)] = 0.0   # when asked
    sampled_index = torch.multinomial(probs_sort, num_samples=1)
    return torch.gather(probs_idx.to(torch.int32), dim=1, index=sampled_index).view(-1)

The rank mask keeps the first k (``top_k_mask``'s rank form: exactly k), the nucleus is
measured on the whole row's cumulative mass (a cumsum of the unmasked, or only zeroed,
sorted probabilities): with a rank mask in the chain that is the op's ``top_p_whole_row``,
whichever mask comes first, since both keep a prefix of the sorted row. Min-p compares with
the first sorted probability, the row's largest (no mask removes it). The int32 ids come
back as int32.
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
from ._truncation import MASKING_OPS, masking_shell, sort_direction, sort_of, take_outputs
from ._walk import (
    CONVERTS,
    NoMatch,
    Walk,
    arguments,
    aten,
    constant,
    is_call,
    knob_of_rows,
    last_dim,
    one_per_row,
    take_constant,
    val,
)
from .top_k_mask import rank_in_sorted_order
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
    chain, sorted_probs = _zeroing_masks(kept)
    if not (is_call(sorted_probs, operator.getitem) and sorted_probs.args == (sort, 0)):
        return None
    if cast is not None and val(cast).dtype not in (torch.int32, torch.int64):
        raise NoMatch(f"{gather.name} gathers token ids cast to {val(cast).dtype}")
    if not last_dim(dim, val(sorted_probs).dim()):
        raise NoMatch(f"{gather.name} gathers along dim {dim}, not the sorted dim")
    num_samples = multinomial_draws(choice)
    for node in (tokens, choice, *([] if cast is None else [cast])):
        walk.take(node)
    found = _sorted_match(walk, sort, chain, sorted_probs, num_samples)
    found.out_dtype = None if cast is None else val(cast).dtype
    return found


def match_sorted_back(walk: Walk, probs: Node, num_samples: int) -> SamplingMatch | None:
    """The Gemma reference sampler's draw: the sorted probabilities zeroed by the chain's
    masks (``_chain_knobs``), maybe renormalized, put back in token order by
    ``gather(-1, argsort(probs_idx))`` and drawn by ``multinomial``; None if ``probs`` is not
    that."""
    node = unnormalized(walk, probs)
    if not is_call(node, aten.gather.default):
        return None
    base, dim, inverse = node.args[:3]
    argsort = inverse.args[0] if is_call(inverse, operator.getitem) else None
    if not (inverse.args[1:] == (1,) and is_call(argsort, aten.sort.default, aten.sort.stable)):
        return None
    order = argsort.args[0]
    if not (is_call(order, operator.getitem) and order.args[1] == 1):
        return None
    sort = order.args[0]
    if not is_call(sort, aten.sort.default, aten.sort.stable) or sort_direction(argsort, order):
        return None
    kept = unnormalized(walk, base)
    if not is_call(kept, *MASKING_OPS):
        return None
    chain, sorted_probs = _zeroing_masks(kept)
    if not (is_call(sorted_probs, operator.getitem) and sorted_probs.args == (sort, 0)):
        return None
    if not last_dim(dim, val(sorted_probs).dim()):
        raise NoMatch(f"{node.name} gathers along dim {dim}, not the sorted dim")
    for step in (node, inverse, order):
        walk.take(step)
    take_outputs(walk, argsort)
    return _sorted_match(walk, sort, chain, sorted_probs, num_samples)


def _sorted_match(walk: Walk, sort, chain, sorted_probs, num_samples: int) -> SamplingMatch:
    """The fused call of sorted probabilities zeroed by ``chain`` (``_zeroing_masks``)."""
    for node, _, fill, _ in chain:
        if constant(fill) != 0.0:
            raise NoMatch(f"{node.name} does not set the sorted probabilities outside p to 0")
    ndim = val(sorted_probs).dim()
    sort_args = arguments(sort, "dim", "descending")
    if not last_dim(sort_args.get("dim", -1), ndim) or not sort_args.get("descending", False):
        raise NoMatch(f"{sort.name} is not a descending sort over the vocabulary dim")
    if val(sorted_probs).dtype != torch.float32:
        raise NoMatch(f"{sort.name} sorts {val(sorted_probs).dtype} probabilities, not fp32")
    top_k, top_p, min_p = _chain_knobs(walk, chain, sorted_probs)
    for node in (*(node for node, *_ in chain), sorted_probs):
        walk.take(node)
    for _, _, fill, _ in chain:
        take_constant(walk, fill)
    take_outputs(walk, sort)
    head = match_lm_head(walk, match_softmax(walk, sort.args[0]))
    if head.top_p is not None or head.min_p is not None:
        raise NoMatch(f"{sort.name} sorts probabilities already truncated by top-p or min-p")
    if head.top_k is not None and top_k is not None:
        raise NoMatch(f"{sort.name} sorts probabilities already truncated by top-k")
    if head.logits_dtype is not None:
        raise NoMatch(
            f"top-p on logits rounded to {str(head.logits_dtype)[6:]}: ties at the token"
            " crossing p are common there, and the op would keep all of them where the sort"
            " keeps those it puts first"
        )
    return SamplingMatch(
        head, num_samples=num_samples, top_k=head.top_k if top_k is None else top_k,
        top_p=top_p, min_p=min_p, top_p_whole_row=top_k is not None and top_p is not None,
    )  # fmt: skip


def _zeroing_masks(kept: Node) -> tuple[list, Node]:
    """The masks that zero the sorted probabilities, last first, as (node, condition, fill,
    removes), and what the first of them masks."""
    chain, node = [], kept
    while is_call(node, *MASKING_OPS):
        source, condition, fill, removes = masking_shell(node)
        chain.append((node, condition, fill, removes))
        node = source
    return chain, node


def _chain_knobs(walk: Walk, chain: list, sorted_probs: Node):
    """The knobs of the chain's masks on the sorted probabilities: at most one top-p (the mass
    above each token, ``cumsum - sorted``), one top-k by rank (``top_k_mask``'s rank form)
    and one min-p against the first sorted probability, in any order (each keeps a prefix of
    the sorted row). -> (top_k, top_p, min_p), None where absent; a top-p is required."""
    top_k = top_p = min_p = None
    for node, condition, _, removes in reversed(chain):
        source = masking_shell(node)[0]
        ranked = rank_in_sorted_order(walk, condition, source, removes)
        if ranked is not None:
            if top_k is not None:
                raise NoMatch(f"{node.name} is a second top-k mask")
            top_k = ranked.top_k
            continue
        first_max = _min_p_of_first(walk, condition, sorted_probs, removes)
        if first_max is not None:
            if min_p is not None:
                raise NoMatch(f"{node.name} is a second min-p mask")
            min_p = first_max
            continue
        if top_p is not None:
            raise NoMatch(f"{node.name} is a second top-p mask")
        top_p = _top_p(walk, condition, sorted_probs, removes)
    if top_p is None:
        raise NoMatch(f"{chain[0][0].name} zeroes sorted probabilities without a top-p mask")
    return top_k, top_p, min_p


def _zeroed(node, sorted_probs: Node) -> bool:
    """``node`` is ``sorted_probs`` or it with some entries set to 0 (no renormalization)."""
    chain, base = _zeroing_masks(node)
    return base is sorted_probs and all(constant(fill) == 0.0 for _, _, fill, _ in chain)


def _min_p_of_first(walk: Walk, condition, sorted_probs: Node, removes: bool):
    """``x < (x0[:, 0] * min_p)[:, None]`` (SGLang's, removed; ``>=`` kept), x and x0 the
    sorted probabilities maybe zeroed, whose first entry is the row's largest: min_p, a
    Python float in [0, 1] or a per-row tensor; None if the condition is not that."""
    wanted = aten.lt.Tensor if removes else aten.ge.Tensor
    if not is_call(condition, wanted):
        return None
    probs, threshold = condition.args
    if not _zeroed(probs, sorted_probs):
        return None
    steps, node = [], threshold
    while is_call(node, aten.unsqueeze.default, aten.view.default, aten.reshape.default):
        steps.append(node)
        node = node.args[0]
    if not is_call(node, aten.mul.Tensor):
        return None
    first, min_p = node.args
    if not (is_call(first, aten.select.int) and first.args[1:] in ((1, 0), (-1, 0))):
        first, min_p = min_p, first
    if not (is_call(first, aten.select.int) and first.args[1:] in ((1, 0), (-1, 0))):
        return None
    if not _zeroed(first.args[0], sorted_probs) or val(sorted_probs).dim() != 2:
        return None
    rows = val(sorted_probs).shape[:-1]
    if isinstance(min_p, Node):
        if not knob_of_rows(val(min_p), rows):
            raise NoMatch(f"{condition.name} compares with a min_p that is not one per row")
    elif isinstance(min_p, bool) or not isinstance(min_p, (int, float)) or not 0 <= min_p <= 1:
        raise NoMatch(f"{condition.name} compares with min_p = {min_p}, not one in [0, 1]")
    if not one_per_row(val(threshold).shape, (*rows, 1)):
        raise NoMatch(f"{condition.name} compares with a threshold of another shape than a row's")
    for step in (condition, *steps, node, first):
        walk.take(step)
    return min_p if isinstance(min_p, Node) else float(min_p)


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
    # (the subtrahend and the cumsum's input may have entries zeroed by the chain's other
    # masks: those entries are removed anyway, and no other entry's mass above changes)
    if not (
        is_call(above, aten.sub.Tensor)
        and "alpha" not in above.kwargs
        and _zeroed(above.args[1], sorted_probs)
        and is_call(above.args[0], aten.cumsum.default)
        and _zeroed(above.args[0].args[0], sorted_probs)
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
    are refused where ``match_sorted_back`` did not take them (a scatter back, a gather
    through something else than the sort's inverse order); None if ``probs`` is not that."""
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
    return (
        f"{node.name} puts back in token order probabilities zeroed in sorted order, by other"
        " means than gather(-1, argsort(the sort's indices)) (the Gemma reference sampler's,"
        " which is fused)"
    )
