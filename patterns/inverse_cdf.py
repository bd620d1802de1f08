"""Inverse-CDF sampling, ``searchsorted(probs.cumsum(-1), u)`` with ``u`` from the RNG: a
sampling form the pass knows and leaves to stock Inductor, so that it is warned about (with
its reason) rather than missed in silence.

Not rewritten because the program's draw is not exactly softmax's: it depends on the
rounding of its own fp32 cumsum, and a ``u`` at or above the last cumulative value (which
rounding can put below 1) returns index V, outside the vocabulary. The fused op would draw
from the exact distribution and never return V: another program. ``torch.multinomial`` or
the exponential race draw the same distribution and are fused.
"""

from __future__ import annotations

import torch

from ._rewrite import SamplingMatch, reads_random
from ._walk import NoMatch, Walk

IDIOM = "inverse_cdf"
TARGET = torch.ops.aten.searchsorted.Tensor


def check(walk: Walk) -> SamplingMatch | None:
    if not reads_random(walk.terminal):
        return None  # (a bucketize of values that draw nothing)
    raise NoMatch(
        "inverse-CDF sampling (searchsorted of random numbers in a cumulative sum) is left"
        " to stock Inductor: its draw follows the program's own cumsum rounding, and a u at"
        " or above the last cumulative value gives index V; torch.multinomial or the"
        " exponential race draw that distribution fused"
    )
