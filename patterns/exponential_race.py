"""``argmax(probs / Exp(1) noise)``: gpt-fast, torchtune, litgpt, vLLM.

``argmax(p / E) = argmax(log p - log E)`` and ``-log E`` is Gumbel noise, so this is
Gumbel-max sampling from ``probs``: exactly what the fused op draws, without the probs.
The form Inductor's pre-grad ``apply_gumbel_max_trick`` turns this into,
``argmax(logits - log(E))``, is matched by ``gumbel.py``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._chain import (
    LMHead,
    Walk,
    argmax_keepdim,
    is_call,
    match_lm_head,
    match_noise,
    match_softmax,
    strip_converts,
    val,
)

IDIOM = "exponential_race"
TARGET = torch.ops.aten.argmax.default


def search(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    """The idiom as users write it (gpt-fast ``multinomial_sample_one_no_sync``)."""
    probs = F.softmax(F.linear(hidden, weight) / temperature, dim=-1)
    q = torch.empty_like(probs).exponential_(1)
    return torch.argmax(probs / q, dim=-1, keepdim=True)


def check(walk: Walk) -> tuple[LMHead, int, bool] | None:
    race = strip_converts(walk, walk.terminal.args[0])
    if not is_call(race, torch.ops.aten.div.Tensor):
        return None
    probs, noise = race.args
    if not match_noise(walk, noise, val(race)):
        return None
    walk.take(race)
    keepdim = argmax_keepdim(walk)
    return match_lm_head(walk, match_softmax(walk, probs)), 1, keepdim
