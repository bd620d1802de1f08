"""Gumbel-argmax: ``argmax(logits / T - log(-log(U)))``: hand-written samplers.

Accepted spellings of the noise: ``- log(-log(U))``, ``+ (-log(-log(U)))``, with ``eps``
added inside the logs or the values clamped from below there at eps <= 1e-9
(x-transformers' ``log(t.clamp(min=1e-20))``: ``_tails.MAX_NOISE_CLAMP``), or with
``E = exponential_()`` in place of ``-log(U)`` (which is also
what Inductor's ``apply_gumbel_max_trick`` makes of the exponential race).

The noisy scores may be scaled as a whole, ``argmax((logits + G) / T)``: a positive scale
does not move the argmax, so that is Gumbel-max at temperature 1 (the noise is scaled with
the logits). A negative or zero constant, or a tensor (whose sign the pass cannot know),
is refused: ``argmax(-(l + G))`` draws no sample of ``softmax(l)``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.fx import Node

from ._lm_head import match_lm_head
from ._rewrite import SamplingMatch
from ._tails import argmax_keepdim, check_noise_clamp, match_noise, strip_noise_clamp
from ._walk import NoMatch, Walk, constant, is_call, strip_converts, val

IDIOM = "gumbel"
aten = torch.ops.aten
TARGET = aten.argmax.default


def search(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    """The idiom as users write it."""
    logits = F.linear(hidden, weight)
    u = torch.rand_like(logits)
    return torch.argmax(logits / temperature - torch.log(-torch.log(u)), dim=-1)


def example_inputs() -> tuple:
    """Arguments ``search`` is traced with in the tests."""
    return torch.randn(3, 24), torch.randn(1000, 24), 0.8


def check(walk: Walk) -> SamplingMatch | None:
    scores, scales = strip_converts(walk, walk.terminal.args[0]), []
    while is_call(scores, aten.div.Tensor, aten.mul.Tensor):
        scales.append(scores)
        scores = strip_converts(walk, _scaled(scores))
    logits = _perturbed_logits(walk, scores)
    if logits is None:
        return None
    for scale in scales:
        _check_positive(scale)
        walk.take(scale)
    walk.take(scores)
    keepdim = argmax_keepdim(walk)
    return SamplingMatch.of(match_lm_head(walk, logits), keep_dim=keepdim)


def _scaled(scale: Node) -> Node:
    """The tensor operand of ``x / c`` or ``x * c`` (either order for ``*``): the one with
    the shape of the scores."""
    a, b = scale.args
    if scale.target == aten.mul.Tensor and isinstance(b, Node):
        if not isinstance(a, Node) or val(a).dim() < val(b).dim():
            return b
    return a


def _check_positive(scale: Node) -> None:
    a, b = scale.args
    factor = b if _scaled(scale) is a else a
    value = None if isinstance(factor, Node) else constant(factor)
    if value is None:
        raise NoMatch(
            f"{scale.name} scales the noisy scores by a tensor: argmax((l + G) / T) is a"
            " sample of softmax(l) only for T > 0, which the pass cannot check"
        )
    if isinstance(factor, bool) or not 0.0 < value < math.inf:
        raise NoMatch(
            f"{scale.name} scales the noisy scores by {factor}: argmax((l + G) / T) is a"
            " sample of softmax(l) only for a positive finite T"
        )


def _perturbed_logits(walk: Walk, scores: Node) -> Node | None:
    """``logits + G`` or ``logits - log(E)`` -> ``logits``; None if there is no such noise."""
    shape = val(scores)
    if is_call(scores, aten.sub.Tensor) and "alpha" not in scores.kwargs:
        logits, log_noise = scores.args
        return logits if _log_exponential(walk, log_noise, shape) else None
    if is_call(scores, aten.add.Tensor) and "alpha" not in scores.kwargs:
        for logits, gumbel in (scores.args, scores.args[::-1]):
            if is_call(gumbel, aten.neg.default) and _log_exponential(walk, gumbel.args[0], shape):
                walk.take(gumbel)
                return logits
    return None


def _log_exponential(walk: Walk, node, shape) -> bool:
    """``log(E)`` or ``log(E + eps)`` with ``E`` Exp(1) noise."""
    if not is_call(node, aten.log.default):
        return False
    noise, clamp_eps = strip_noise_clamp(walk, node.args[0])
    if is_call(noise, aten.add.Tensor) and isinstance(noise.args[1], float):
        if not 0.0 <= noise.args[1] <= 1e-3:
            return False
        walk.take(noise)
        noise = noise.args[0]
    if not match_noise(walk, noise, shape):
        return False
    check_noise_clamp(clamp_eps)
    walk.take(node)
    return True
