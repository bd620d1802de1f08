"""``explain(fn, *args, **kwargs)``: which sampling ops the pass rewrote in ``fn``, and why not.

It compiles ``fn`` with ``backend="flashsampling"`` and runs it once on the arguments, with
the FX graph cache and the AOTAutograd cache bypassed, so the pass runs and decides even
where a cached graph would otherwise be loaded without it. The result lists every sampling
site of every graph Dynamo made of ``fn``: the terminal op, the idiom that rewrote it or
the first one whose check refused it, and the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from .backend import flashsampling_backend

__all__ = ["Explanation", "explain", "recording"]


class Explanation(list):
    """A list of ``patterns.SamplingSite`` (op, node, idiom, rewritten, reason), printed one
    line per site. ``cache_hits``: graphs that ``recording`` saw loaded from Inductor's caches
    (the pass did not run on them, so they add no site)."""

    cache_hits: int = 0

    def __str__(self) -> str:
        if not self:
            return "flashsampling: no sampling op in the compiled graphs"
        fused = sum(site.rewritten for site in self)
        lines = [f"flashsampling: {fused} of {len(self)} sampling op(s) fused"]
        return "\n".join(lines + [f"  {site}" for site in self])


def explain(fn: Callable, *args: Any, **kwargs: Any) -> Explanation:
    """Compile ``fn`` with the FlashSampling backend, call it on ``args``/``kwargs`` and
    return, per sampling op of the compiled graphs, whether the pass rewrote it and why not.

    ``fn`` runs once (its tokens are drawn and dropped). Compiling for ``explain`` does not
    reuse or replace the compiled code of earlier ``torch.compile`` calls of ``fn``.
    """
    # Imported here, as backend.py does: the package's eager op should not load Inductor.
    from .graph_pass import SITES

    sites = Explanation()

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        return flashsampling_backend(gm, example_inputs)

    token = SITES.set(sites)
    try:
        with (
            torch._inductor.config.patch(fx_graph_cache=False),
            torch._functorch.config.patch(enable_autograd_cache=False),
        ):
            torch.compile(fn, backend=backend)(*args, **kwargs)
    finally:
        SITES.reset(token)
    return sites


@contextmanager
def recording() -> Iterator[Explanation]:
    """Collect the sampling sites of every graph compiled with the FlashSampling backend inside
    the block (``torch.compile`` compiles on a function's first call), with the caches left
    as they are: a graph loaded from them counts in ``cache_hits`` instead. A graph the pass
    left a sampling op unfused in is never cached, so a hit is one whose sampling was fused,
    or left stock on purpose off CUDA (``op.why_not_fused_on``)."""
    from torch._dynamo.utils import counters

    from .graph_pass import SITES

    def hits() -> int:
        return (
            counters["inductor"]["fxgraph_cache_hit"]
            + counters["aot_autograd"]["autograd_cache_hit"]
        )

    sites, before = Explanation(), hits()
    token = SITES.set(sites)
    try:
        yield sites
    finally:
        SITES.reset(token)
        sites.cache_hits = hits() - before
