"""Compile a function with ``backend="flashsampling"`` and keep the aten graph after the pass.

A chained ``joint_custom_pre_pass`` records the graph the FlashSampling pass left and then
stops the compilation, so graph tests pay for tracing only, not for C++/Triton codegen.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters
from torch._inductor.custom_graph_pass import CustomGraphPass

import flashsampling_inductor  # noqa: F401  (registers the backend)

try:  # the graph tests' TestCase: expected graphs written inline (assertExpectedInline)
    from expecttest import TestCase  # noqa: F401  (re-exported)
except ImportError:  # (the GPU machines lack it and run only the gpu-marked tests, none of
    from unittest import TestCase  # noqa: F401  which compares a graph; CI installs it)


class _Stop(Exception):
    pass


class _Record(CustomGraphPass):
    def __init__(self) -> None:
        self.graph: torch.fx.Graph | None = None

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.graph = graph
        raise _Stop

    def uuid(self) -> None:
        return None  # never cache: the compilation is cut short


def graph_after_pass(
    fn, *args, dynamic=None, backend="flashsampling", **options
) -> tuple[str, dict[str, int]]:
    """-> (the aten graph after the pass, as text; rewrites per idiom).

    ``backend="inductor"`` gives the graph stock Inductor sees, before the pass.
    """
    torch._dynamo.reset()
    counters.clear()
    record = _Record()
    options = {"joint_custom_pre_pass": record, **options}
    compiled = torch.compile(fn, backend=backend, fullgraph=True, dynamic=dynamic, options=options)
    with pytest.raises(Exception) as stopped, torch.no_grad():
        compiled(*args)
    if record.graph is None:
        raise stopped.value
    return str(record.graph).strip(), dict(counters["flashsampling"])
