"""Greedy and sampled rows in one batch, as serving engines write it (vLLM's ``Sampler``)::

    greedy_sampled = logits.argmax(dim=-1).view(-1)
    logits = logits.div_(temperature.unsqueeze(dim=1))
    ...                                         # top-k / top-p, then any sampling idiom
    sampled = torch.where(temperature < _SAMPLING_EPS, greedy_sampled, random_sampled)

Each row takes the argmax of its logits where the condition holds and the sampled token
elsewhere: the op's temperature 0 on those rows, which reads no noise and ignores the
truncation there (no truncation moves an argmax). So the whole step is ONE call: the
sampled branch's idiom, its per-row temperature replaced by 0 on the greedy rows
(``SamplingMatch.greedy_rows``). The condition may be any boolean per row (``T < eps``,
``T == 0``, a request's flag); the program's temperature on the greedy rows (vLLM puts -1
there, to avoid a division by zero) is never read, as in the program, whose sampled token
there is dropped.

Checked: the greedy branch is an ``argmax`` over the vocabulary dim of the raw logits of
the very LM-head chain the sampled branch reads (the same matmul, row selections, bias and
soft-cap, nothing else: no temperature, no mask between them), the two branches have the
output's shape, and the condition is one boolean per row. The sampled branch is matched by
its own idiom, with all of its checks; a refusal there is this site's reason.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.fx import Node

from . import exact_top_k, exponential_race, gumbel, multinomial, sample_logits, sorted_top_p
from ._lm_head import match_lm_head
from ._rewrite import SamplingMatch
from ._tails import argmax_keepdim
from ._walk import ROW_OPS, NoMatch, Walk, aten, is_call, same_shape, val

IDIOM = "mixed_greedy"
TARGET = aten.where.self
_SAMPLED = (sample_logits, exact_top_k, sorted_top_p, multinomial, exponential_race, gumbel)


def search(hidden: torch.Tensor, weight: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """The idiom as users write it (vLLM's ``Sampler.sample``, top-k / top-p left out)."""
    logits = F.linear(hidden, weight)
    greedy = logits.argmax(dim=-1).view(-1)
    probs = (logits / temperature.unsqueeze(1)).softmax(dim=-1)
    q = torch.empty_like(probs).exponential_()
    sampled = probs.div_(q).argmax(dim=-1).view(-1)
    return torch.where(temperature < 1e-5, greedy, sampled)


def example_inputs() -> tuple:
    """Arguments ``search`` is traced with in the tests."""
    return torch.randn(3, 24), torch.randn(1000, 24), torch.tensor([0.0, 0.7, 1.3])


def check(walk: Walk) -> SamplingMatch | None:
    where = walk.terminal
    condition, a, b = where.args
    greedy_side = _greedy_argmax(a)
    greedy_branch, sampled_branch = a, b
    if greedy_side is None:
        greedy_side, greedy_branch, sampled_branch = _greedy_argmax(b), b, a
        greedy_rows_when = False
    else:
        greedy_rows_when = True
    if greedy_side is None or not isinstance(sampled_branch, Node):
        return None
    sampled, sampled_steps = _strip_rows(sampled_branch)
    idioms = [i for i in _SAMPLED if is_call(sampled, i.TARGET)]
    if not idioms:
        return None
    out = val(where)
    for branch in (greedy_branch, sampled_branch):
        if not same_shape(val(branch).shape, out.shape) or val(branch).dtype != torch.int64:
            raise NoMatch(f"{where.name} mixes tokens of another shape or dtype than its output")
    mask = val(condition)
    if not (isinstance(mask, torch.Tensor) and mask.dtype == torch.bool):
        raise NoMatch(f"{where.name} picks rows by a {type(mask).__name__}, not a boolean tensor")
    if out.dim() not in (1, 2) or (out.dim() == 2 and out.shape[1] != 1):
        raise NoMatch(f"{where.name} returns {tuple(out.shape)} tokens, not one per row")
    if not same_shape(mask.shape, out.shape):
        raise NoMatch(f"{where.name} picks rows by a condition of shape {tuple(mask.shape)}")
    found = None
    for idiom in idioms:
        inner = Walk(sampled)
        found = idiom.check(inner)
        if found is not None:
            break
    if found is None:
        return None
    if found.num_samples != 1:
        raise NoMatch(f"{sampled.name} draws {found.num_samples} samples per row")
    _same_chain(where, greedy_side, found, inner)
    for node in (*sampled_steps, sampled, *inner.owned):
        walk.take(node)
    walk.leftovers += inner.leftovers
    walk.tail_rows += inner.tail_rows
    found.greedy_rows = condition
    found.greedy_rows_when = greedy_rows_when
    found.out_dim = out.dim()
    return found


def _strip_rows(node: Node) -> tuple[Node, list[Node]]:
    """``x.view(-1)``, ``x.squeeze(1)``, ... -> (x, the steps)."""
    steps = []
    while is_call(node, *ROW_OPS):
        steps.append(node)
        node = node.args[0]
    return node, steps


def _greedy_argmax(branch) -> tuple[Node, list[Node]] | None:
    """The ``argmax`` a branch of the ``where`` reads through row views, with those views;
    None if the branch is no argmax of scores free of noise."""
    if not isinstance(branch, Node):
        return None
    argmax, steps = _strip_rows(branch)
    if not is_call(argmax, aten.argmax.default):
        return None
    for noisy in (exponential_race, gumbel):
        try:
            if noisy.check(Walk(argmax)) is not None:
                return None  # the sampled branch, not the greedy one
        except NoMatch:
            return None  # noise it cannot rewrite: still not greedy
    return argmax, steps


def _same_chain(where: Node, greedy, found: SamplingMatch, inner: Walk) -> None:
    """The greedy argmax reads the raw logits of the chain the sampled branch reads."""
    argmax, steps = greedy
    probe = Walk(argmax)
    argmax_keepdim(probe)
    head = match_lm_head(probe, argmax.args[0], greedy=True)
    sampled = found.lm_head
    on_the_chain = set(inner.owned)
    if any(node not in on_the_chain for node in probe.owned):
        raise NoMatch(
            f"{argmax.name} reads other scores than the raw logits of the sampled branch's LM head"
        )
    if (head.hidden, head.weight, head.bias, head.softcap, head.logits_dtype) != (
        sampled.hidden,
        sampled.weight,
        sampled.bias,
        sampled.softcap,
        sampled.logits_dtype,
    ):
        raise NoMatch(f"{argmax.name} reads other logits than the sampled branch")
    if probe.tail_rows or head.row_ops != sampled.row_ops:
        raise NoMatch(f"{argmax.name} reads other rows than the sampled branch")
    for node in (*steps, argmax):
        inner.take(node)
