"""The FlashSampling graph pass: the pattern catalog as one Inductor ``CustomGraphPass``.

It runs on ``joint_custom_pre_pass``: the aten graph right after AOT tracing, functional and
decomposed (softmax is amax/sub/exp/sum/div there, ``exponential_`` is ``rand`` + ``log``),
and the same on the torch versions we support (the post-grad graph is not). The user's own
pass on that hook, if any, runs after ours.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch._inductor.fx_passes.post_grad import remove_noop_ops

from . import patterns

__all__ = ["FlashSamplingPass"]

log = logging.getLogger("flashsampling_inductor")


class FlashSamplingPass(CustomGraphPass):
    """Rewrite every LM-head-then-sampling chain of the graph into one ``fused_sample`` call.

    Args:
        then: the pass that was on ``joint_custom_pre_pass`` before (a ``CustomGraphPass``, a
            plain callable or None); it runs after the rewrite.
    """

    def __init__(self, then: Callable[[torch.fx.Graph], None] | None = None) -> None:
        if isinstance(then, (list, tuple)):
            raise TypeError("chain one pass; combine several into one CustomGraphPass first")
        self.then = then

    def __call__(self, graph: torch.fx.Graph) -> None:
        if torch._inductor.config.fallback_random:
            # The program asked for eager's random numbers; the fused op draws its own.
            log.debug("flashsampling: fallback_random is set, no rewrite")
        else:
            # Views and casts that do nothing would otherwise interrupt the chains.
            remove_noop_ops(graph)
            patterns.PASS.apply(graph)
        if self.then is not None:
            self.then(graph)

    def uuid(self) -> str | None:
        """Changes with the pattern catalog and the chained pass; None (no caching) if the
        chained pass cannot say what it is."""
        then = None
        if self.then is not None:
            then = self.then.uuid() if isinstance(self.then, CustomGraphPass) else None
            if then is None:
                return None
        key = f"{patterns.source_hash()}:{_own_source_hash()}:{then}"
        return hashlib.sha256(key.encode()).hexdigest()


def _own_source_hash() -> str:
    with open(__file__, "rb") as source:
        return hashlib.sha256(source.read()).hexdigest()
