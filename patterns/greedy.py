"""Greedy decoding: ``argmax(lm_head(h), -1)``, as a fused argmax that writes no logits.

``logits_dtype`` is the dtype of the matmul's output, so ties break as ``torch.argmax`` on
the program's bf16/fp16 logits does. ``argmax(softmax(logits))`` is the same argmax and is
accepted too; a scale by a positive constant changes nothing and is dropped, a tensor
temperature (which may hold 0) is refused, and top-k / top-p masks (which always keep the
largest logit) are dropped.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._lm_head import match_lm_head
from ._rewrite import SamplingMatch
from ._tails import argmax_keepdim, match_softmax
from ._walk import NoMatch, Walk

IDIOM = "greedy"
TARGET = torch.ops.aten.argmax.default


def search(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The idiom as users write it."""
    return torch.argmax(F.linear(hidden, weight), dim=-1)


def example_inputs() -> tuple:
    """Arguments ``search`` is traced with in the tests."""
    return torch.randn(3, 24), torch.randn(1000, 24)


def check(walk: Walk) -> SamplingMatch:
    keepdim = argmax_keepdim(walk)
    scores = walk.terminal.args[0]
    probe = Walk(walk.terminal)
    try:
        scores = match_softmax(probe, scores)
        walk.owned += probe.owned
    except NoMatch:
        pass  # the argmax of the logits themselves
    head = match_lm_head(walk, scores, greedy=True)
    if head.weight is None:
        raise NoMatch(
            f"{head.given}: an argmax of logits that exist anyway, which stock Inductor reads"
            " once too"
        )
    return SamplingMatch.of(head, keep_dim=keepdim)
