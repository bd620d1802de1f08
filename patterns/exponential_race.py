"""``argmax(probs / Exp(1) noise)``: gpt-fast, torchtune, litgpt, vLLM.

``argmax(p / E) = argmax(log p - log E)`` and ``-log E`` is Gumbel noise, so this is
Gumbel-max sampling from ``probs``: exactly what the fused op draws, without the probs.
The form Inductor's pre-grad ``apply_gumbel_max_trick`` turns this into,
``argmax(logits - log(E))``, is matched by ``gumbel.py``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._lm_head import match_lm_head
from ._rewrite import SamplingMatch
from ._tails import argmax_keepdim, match_noise, match_softmax
from ._walk import Walk, is_call, strip_converts, val

IDIOM = "exponential_race"
TARGET = torch.ops.aten.argmax.default


def search(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    """The idiom as users write it (gpt-fast ``multinomial_sample_one_no_sync``)."""
    probs = F.softmax(F.linear(hidden, weight) / temperature, dim=-1)
    q = torch.empty_like(probs).exponential_(1)
    return torch.argmax(probs / q, dim=-1, keepdim=True)


def example_inputs() -> tuple:
    """Arguments ``search`` is traced with in the tests."""
    return torch.randn(3, 24), torch.randn(1000, 24), 0.8


def check(walk: Walk) -> SamplingMatch | None:
    race = strip_converts(walk, walk.terminal.args[0])
    if not is_call(race, torch.ops.aten.div.Tensor):
        return None
    probs, noise = race.args
    if not match_noise(walk, noise, val(race)):
        return None
    walk.take(race)
    keepdim = argmax_keepdim(walk)
    head = match_lm_head(walk, match_softmax(walk, probs))
    return SamplingMatch.of(head, keep_dim=keepdim)
