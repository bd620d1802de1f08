"""``torch.multinomial(softmax(logits / T), n)``: HF ``generate``, nanoGPT, Mistral.

The softmax may be ``F.softmax``, ``Tensor.softmax``, ``softmax(dtype=torch.float32)`` or
``log_softmax(...).exp()``; ``n > 1`` draws need ``replacement=True`` (the fused op draws
with replacement; without it the draws are not independent). Top-k / top-p masks on the
logits (``_truncation.py``) ride along.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._lm_head import match_lm_head
from ._rewrite import SamplingMatch
from ._tails import match_softmax, multinomial_draws
from ._walk import NoMatch, Walk
from .sorted_top_p import match_sorted_back, sorted_back_reason

IDIOM = "multinomial"
TARGET = torch.ops.aten.multinomial.default


def search(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    """The idiom as users write it (nanoGPT ``generate``)."""
    logits = F.linear(hidden, weight)[:, -1, :] / temperature
    probs = F.softmax(logits, dim=-1)
    return torch.multinomial(probs, num_samples=1)


def example_inputs() -> tuple:
    """Arguments ``search`` is traced with in the tests."""
    return torch.randn(3, 5, 24), torch.randn(1000, 24), 0.8


def check(walk: Walk) -> SamplingMatch:
    multinomial = walk.terminal
    num_samples = multinomial_draws(multinomial)
    probs = walk.take(multinomial.args[0])
    try:
        logits = match_softmax(walk, probs)
    except NoMatch:
        # (the Gemma reference sampler: sorted probabilities zeroed, put back in token order)
        found = match_sorted_back(walk, probs, num_samples)
        if found is not None:
            return found
        reason = sorted_back_reason(probs)
        if reason is None:
            raise
        raise NoMatch(reason) from None
    return SamplingMatch.of(match_lm_head(walk, logits), num_samples=num_samples)
