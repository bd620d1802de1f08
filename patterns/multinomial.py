"""``torch.multinomial(softmax(logits / T), n)``: HF ``generate``, nanoGPT, Mistral.

The softmax may be ``F.softmax``, ``Tensor.softmax``, ``softmax(dtype=torch.float32)`` or
``log_softmax(...).exp()``; ``n > 1`` draws need ``replacement=True`` (the fused op draws
with replacement; without it the draws are not independent).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._chain import LMHead, NoMatch, Walk, match_lm_head, match_softmax

IDIOM = "multinomial"
TARGET = torch.ops.aten.multinomial.default


def search(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    """The idiom as users write it (nanoGPT ``generate``)."""
    logits = F.linear(hidden, weight)[:, -1, :] / temperature
    probs = F.softmax(logits, dim=-1)
    return torch.multinomial(probs, num_samples=1)


def check(walk: Walk) -> tuple[LMHead, int, bool]:
    multinomial = walk.terminal
    names = ("num_samples", "replacement")
    args = dict(zip(names, multinomial.args[1:], strict=False), **multinomial.kwargs)
    num_samples, replacement = args["num_samples"], args.get("replacement", False)
    if args.get("generator") is not None:
        raise NoMatch("it draws from a user's torch.Generator")
    if not isinstance(num_samples, int) or num_samples < 1:
        raise NoMatch(f"num_samples={num_samples} is not a positive Python int")
    if num_samples > 1 and not replacement:
        raise NoMatch("it draws several samples without replacement")
    logits = match_softmax(walk, walk.take(multinomial.args[0]))
    return match_lm_head(walk, logits), num_samples, True
