"""The pattern catalog: one module per sampling idiom, all registered on ``PASS``.

Two kinds of module:

* terminal idioms (``IDIOMS``) hold the idiom as users write it (``search``), its example
  inputs, the strict ``check`` that accepts a match and returns a ``SamplingMatch``, and
  the terminal op it is anchored on (``TARGET``);
* truncation masks (``MASKS``) hold the ``condition`` of a top-k / top-p / min-p mask on the
  LM-head chain, which every terminal idiom reaches through ``match_lm_head``.

What they share is split by concept: ``_walk.py`` (the walk and its predicates),
``_lm_head.py`` (the chain back to the matmul), ``_tails.py`` (softmax, noise, argmax,
multinomial), ``_truncation.py`` (the masks' shell) and ``_rewrite.py`` (the match result
and the one fused-op call). Adding an idiom means adding a module here and to a tuple below.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ..op import CPU_SWITCH, fp32_rewrite_switches
from . import (
    exact_top_k,
    exponential_race,
    greedy,
    gumbel,
    inverse_cdf,
    min_p_mask,
    mixed_greedy,
    multinomial,
    sample_logits,
    sorted_top_p,
    top_k_mask,
    top_p_mask,
    tp_gather,
)
from ._rewrite import PASS, SamplingMatch, SamplingSite, recording, register
from ._truncation import CONDITIONS

# Tried in this order on a shared anchor: the noisy argmax idioms before greedy.
IDIOMS = (
    mixed_greedy,
    sample_logits,
    exact_top_k,
    sorted_top_p,
    multinomial,
    exponential_race,
    gumbel,
    greedy,
)
# (min-p before top-p: transformers 4.x's min-p scatters a sorted mask back, as top-p does,
# and min-p's condition declines what is not its own, where top-p's explains its refusal)
MASKS = (top_k_mask, min_p_mask, top_p_mask)

for _idiom in IDIOMS:
    for _target in getattr(_idiom, "TARGETS", (_idiom.TARGET,)):
        register(_idiom.IDIOM, _target, _idiom.check, sampling=_idiom is not greedy)
CONDITIONS.extend(mask.condition for mask in MASKS)
# Sampling forms known and left alone, with their reason (a silent miss is a bug).
REFUSED = (inverse_cdf,)
for _refused in REFUSED:
    register(_refused.IDIOM, _refused.TARGET, _refused.check)

__all__ = [
    "IDIOMS",
    "REFUSED",
    "apply",
    "MASKS",
    "PASS",
    "SamplingMatch",
    "SamplingSite",
    "recording",
    "source_hash",
]


def apply(graph) -> None:
    """Run the catalog on ``graph``, with the gathers of vocabulary-sharded logits lifted
    around it (``tp_gather``), so that every idiom also matches after a TP gather."""
    gathers = tp_gather.lift(graph)
    try:
        PASS.apply(graph)
    finally:
        tp_gather.finish(graph, gathers)


def source_hash() -> str:
    """Hash of the catalog's source: a new pattern set must not reuse cached graphs."""
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    # (a switch that changes what the catalog rewrites is part of it)
    digest.update(f"tp truncation on cuda: {tp_gather.TRUNCATION_ON_CUDA}".encode())
    digest.update(f"rewrite off cuda: {os.environ.get(CPU_SWITCH) == '1'}".encode())
    digest.update(f"fp32 heads on cuda: {fp32_rewrite_switches()}".encode())
    return digest.hexdigest()
