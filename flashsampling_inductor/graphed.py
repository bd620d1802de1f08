"""Eager calls of the fused kernels replayed from CUDA graphs of their own.

Outside a CUDA graph every call of ``fused_sample`` launches two to six Triton kernels from
Python, and the host's work for them (arguments, specialization keys, buffers: 0.2-0.9 ms
a call on the H200 machines' host, where the kernels take 10-200 us) sets the pace of an
eager loop or of a step that ``torch.compile`` runs without CUDA graphs (its default mode):
there a fused step was slower than stock Inductor's own sampling kernels (session 19,
``benchmarks/probes/default_mode_step.py``). So a kind of call seen ``CAPTURE_AFTER`` times
is captured once in a CUDA graph; later calls of that kind copy their tensor inputs into the
graph's buffers, replay it and return copies of its outputs: three to eight launches of
small copies and one graph launch, whatever the kernels.

A kind is everything the captured kernels depend on: the function, the device,
each copied input's shape, strides and dtype (their values are copied at every call; a
misaligned view is not graphed, so the graph's kernels are the call's), each pinned input's
address and layout (the LM-head weight and bias, and ``sample_logits``' logits: read where
they are, as a CUDA graph does, so a loop that writes its logits into the same buffer
replays one graph and copies nothing), and every non-tensor argument (temperature, top-k,
... given as Python numbers; an int seed). Nothing in the calls reads a tensor's value on
the host (no host sync anywhere on the sampling path), so a replay computes what a call
would: the same tokens (``tests/test_gpu_graphed.py``). A capture that fails leaves that
kind to run as it is, with a warning.

Not graphed: calls under CUDA graph capture (the caller's graph holds them), on another
stream than the device's default one (CUDA graph trees warm up on a stream of their own,
with the thread's allocations sent to their pool), inside ``ahead``'s dry run, with fake or
subclassed tensors, off the current CUDA device, or off CUDA. Inference mode is part of the
kind (a graph's buffers made in it take no in-place copy outside it); inputs are copied
without autograd recording. ``FLASHSAMPLING_EAGER_GRAPHS=0`` turns it off. At most
``MAX_GRAPHS`` graphs live at once (each holds its call's buffers); the least recently used
goes first.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
from collections.abc import Callable, Sequence

import torch

from . import launch

__all__ = ["CAPTURE_AFTER", "MAX_GRAPHS", "replay_or_run"]

ENABLED = os.environ.get("FLASHSAMPLING_EAGER_GRAPHS", "1") != "0"
CAPTURE_AFTER = 3  # (the first calls compile the kernels and build their launchers)
MAX_GRAPHS = 8
_SEEN_MAX = 4096

_graphs: collections.OrderedDict[tuple, _Graph] = collections.OrderedDict()
_seen: collections.Counter[tuple] = collections.Counter()
_lock = threading.Lock()
log = logging.getLogger("flashsampling_inductor")


class _Graph:
    """One captured call: its graph, the buffers it reads (copied inputs) and its outputs."""

    def __init__(self, graph: torch.cuda.CUDAGraph, inputs: list, outputs) -> None:
        self.graph = graph
        self.inputs = inputs
        self.outputs = outputs

    def replay(self, copied: Sequence[torch.Tensor | None]):
        with torch.no_grad():  # (an input that requires grad: nothing to record)
            for buffer, value in zip(self.inputs, copied, strict=True):
                if buffer is not None:
                    buffer.copy_(value)
        self.graph.replay()
        if isinstance(self.outputs, tuple):
            return tuple(output.clone() for output in self.outputs)
        return self.outputs.clone()


def replay_or_run(
    name: str,
    run: Callable,
    copied: Sequence[torch.Tensor | None],
    pinned: Sequence[torch.Tensor | None],
    scalars: tuple,
):
    """``run(*copied)``, replayed from a CUDA graph once this kind of call has been seen
    ``CAPTURE_AFTER`` times. ``name``: which function ``run`` calls; ``copied``: tensors whose
    values the call reads (copied into the graph's buffers at each replay); ``pinned``:
    tensors ``run`` reads where they are (their address is part of the kind); ``scalars``:
    every other argument of that function, hashable."""
    key = _kind(name, copied, pinned, scalars)
    if key is None:
        return run(*copied)
    entry = _graphs.get(key)
    if entry is not None:
        _graphs.move_to_end(key)
        return entry.replay(copied)
    with _lock:
        if len(_seen) > _SEEN_MAX:
            _seen.clear()
        _seen[key] += 1
        capture = _seen[key] >= CAPTURE_AFTER
    if not capture or not _can_capture():
        return run(*copied)
    try:
        entry = _capture(run, copied, key[-1])  # (the kind ends with the device)
    except Exception as error:  # (never fail a call that runs without a graph)
        log.warning("flashsampling: this call is not replayed from a CUDA graph (%r)", error)
        with _lock:
            _seen[key] = -(10**9)  # (never tried again)
        return run(*copied)
    with _lock:
        _seen.pop(key, None)
        _graphs[key] = entry
        while len(_graphs) > MAX_GRAPHS:
            _graphs.popitem(last=False)
    return entry.replay(copied)


def clear() -> None:
    """Drop every captured graph (their buffers go back to the caching allocator)."""
    with _lock:
        _graphs.clear()
        _seen.clear()


def _kind(name, copied, pinned, scalars) -> tuple | None:
    """The key of a call that may be graphed, or None (run it as it is)."""
    if not ENABLED:
        return None
    tensors = [t for t in (*copied, *pinned) if t is not None]
    if not tensors or any(type(t) is not torch.Tensor or not t.is_cuda for t in tensors):
        return None
    device = tensors[0].device
    if device.index != torch.cuda.current_device() or any(t.device != device for t in tensors):
        return None  # (the launches go to the current device)
    parts: list = [name, scalars]
    for tensor in copied:
        if tensor is None:
            parts.append(None)
            continue
        if tensor.data_ptr() % 16:
            return None  # (a misaligned view: the graph's buffer would not be, nor its kernels)
        if any(
            stride == 0 and size > 1
            for size, stride in zip(tensor.shape, tensor.stride(), strict=True)
        ):
            return None  # (an expanded tensor: no buffer of its strides can be copied into)
        parts.append((tuple(tensor.shape), tensor.stride(), tensor.dtype))
    for tensor in pinned:
        if tensor is None:
            parts.append(None)
            continue
        parts.append((tensor.data_ptr(), tuple(tensor.shape), tensor.stride(), tensor.dtype))
    stream = torch.cuda.current_stream(device).cuda_stream
    if stream != torch.cuda.default_stream(device).cuda_stream:
        # (torch.compile's CUDA graph trees run their warm-up on a stream of their own with
        # every allocation of the thread sent to their pool, where a graph's buffers made
        # here would be overwritten: so only calls on the default stream are graphed)
        return None
    if torch.cuda.is_current_stream_capturing():
        return None
    if launch.compiling_ahead():
        return None
    # (a graph's buffers made in inference mode take no in-place copy outside it)
    parts.append(torch.is_inference_mode_enabled())
    parts.append(device)
    return tuple(parts)


def _can_capture() -> bool:
    return not launch._pending  # (a dry run still compiling: its kernels would compile inside)


def _capture(run, copied, device: torch.device) -> _Graph:
    """Capture ``run`` on buffers shaped as ``copied`` (warmed up once on a side stream, as
    torch.cuda.graph asks). Thread-local capture: the compile-ahead threads may touch CUDA
    meanwhile. ``copied`` may be empty (every input pinned)."""
    with torch.no_grad():
        inputs = [
            None if t is None else torch.empty_strided(t.shape, t.stride(), dtype=t.dtype,
                                                       device=device).copy_(t)
            for t in copied
        ]  # fmt: skip
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        run(*inputs)
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        outputs = run(*inputs)
    return _Graph(graph, inputs, outputs)
