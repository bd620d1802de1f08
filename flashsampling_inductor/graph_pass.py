"""The FlashSampling graph pass: the pattern catalog as one Inductor ``CustomGraphPass``.

It runs on ``joint_custom_pre_pass``: the aten graph right after AOT tracing, functional and
decomposed (softmax is amax/sub/exp/sum/div there, ``exponential_`` is ``rand`` + ``log``),
and the same on the torch versions we support (the post-grad graph is not). The user's own
pass on that hook, if any, runs after ours.

A sampling op fed by an LM-head matmul that the pass leaves alone is reported once per
compiled graph at WARNING, with the reason the walk computed. Such a graph is kept out of
Inductor's caches (``uuid()`` turns None once the pass has seen a miss, and the FX graph
cache and AOTAutograd cache skip graphs whose custom pass cannot name itself), so every
compilation of it runs the pass again and warns again: a compiled step that is served from
the caches is one whose sampling sites were all rewritten, or, off CUDA, left stock on
purpose (the fused op runs its slower PyTorch reference there; ``FLASHSAMPLING_CPU=1``, part
of the catalog's hash, rewrites them anyway). Those are said once per graph at INFO.
"""

from __future__ import annotations

import contextvars
import hashlib
import logging
from collections import deque
from collections.abc import Callable

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch._inductor.fx_passes.post_grad import remove_noop_ops
from torch.fx import Node

from . import patterns
from .op import compile_ahead_in_background
from .patterns import SamplingSite

__all__ = ["FlashSamplingPass"]

log = logging.getLogger("flashsampling_inductor")

# Where ``explain`` collects the sites of the graphs it compiles (None: nobody asks).
SITES: contextvars.ContextVar[list[SamplingSite] | None] = contextvars.ContextVar(
    "flashsampling_sites", default=None
)
_MATMULS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)


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
        self.missed = False

    def __call__(self, graph: torch.fx.Graph) -> None:
        # Views and casts that do nothing would otherwise interrupt the chains.
        remove_noop_ops(graph)
        with patterns.recording() as decisions:
            patterns.apply(graph)
        for node in graph.nodes:
            # (its kernels then compile while Inductor compiles the rest of the graph)
            compile_ahead_in_background(node)
        # A terminal that feeds another site's terminal (the multinomial inside
        # exact_top_k's gather), or that another rewrite consumed, is no site of its own.
        sites = [
            (node, site)
            for node, site in decisions.items()
            if site.rewritten
            or not (getattr(node, "_erased", False) or any(u in decisions for u in node.users))
        ]
        missed = [
            site
            for node, site in sites
            if not site.rewritten and not site.off_cuda and site.sampling and _reads_a_matmul(node)
        ]
        if off_cuda := [site for _, site in sites if site.off_cuda]:
            log.info("flashsampling: %s", off_cuda[0].reason)
        if missed:
            self.missed = True
            log.warning(
                "flashsampling: %d sampling op(s) of this compiled graph left unfused, run as"
                " stock Inductor compiles them:\n  %s",
                len(missed),
                "\n  ".join(map(str, missed)),
            )
        collected = SITES.get()
        if collected is not None:
            collected.extend(site for _, site in sites)
        if self.then is not None:
            self.then(graph)

    def uuid(self) -> str | None:
        """Changes with the pattern catalog and the chained pass; None (no caching) if the
        chained pass cannot say what it is, or once this pass has left a sampling op unfused
        (so its warning is given again whenever the graph is compiled)."""
        if self.missed:
            return None
        then = None
        if self.then is not None:
            then = self.then.uuid() if isinstance(self.then, CustomGraphPass) else None
            if then is None:
                return None
        key = f"{patterns.source_hash()}:{_own_source_hash()}:{then}"
        return hashlib.sha256(key.encode()).hexdigest()


def _reads_a_matmul(node: Node, limit: int = 256) -> bool:
    """True if an ``mm``/``addmm`` is among the ``limit`` nodes nearest to ``node`` that it
    depends on (breadth first: the LM head, not the model's first layer)."""
    seen, frontier = {node}, deque([node])
    while frontier and len(seen) < limit:
        current = frontier.popleft()
        if current.op == "call_function" and current.target in _MATMULS:
            return True
        for source in current.all_input_nodes:
            if source not in seen:
                seen.add(source)
                frontier.append(source)
    return False


def _own_source_hash() -> str:
    with open(__file__, "rb") as source:
        return hashlib.sha256(source.read()).hexdigest()
