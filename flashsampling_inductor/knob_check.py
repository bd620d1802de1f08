"""One kernel that checks every per-row knob tensor of a call on the device.

``op.py`` checks CUDA knob tensors without a host sync: a device-side assert when the graph
or the eager call runs. Written with torch ops that is two to five small kernels per knob
(the comparisons, ``.all()``, the assert): with top-k, top-p, min-p and the temperature
as tensors, 16 launches, about 25 us of a CUDA-graph replay on an H200, more than the
sampling kernels' own difference between plain and off-valued knobs. This kernel checks
them all in one launch, whose own device-side assert (compiled in with Triton's ``debug``
option) stops the call with the call's message: one launch where a kernel and
``_assert_async`` were two (``FUSED_ASSERT``). Under CUDA graph capture the call's kernels run
inside ``checking``, which puts that launch on a branch of the graph beside them
(``CHECK_BESIDE``).
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from .launch import launch

__all__ = ["assert_knobs_valid", "checking"]

_BLOCK = 1024
_NAMES = ("temperature", "top_k", "top_p", "min_p")
# The verdict asserted inside the checking kernel (``tl.device_assert``, its message a
# constexpr): one launch a call. False: the kernel writes it and ``torch._assert_async``
# reads it, two launches (A/B runs; the CUDA assert then prints no message of ours). H200,
# D = 2048, B = 1 / 16 / 64, CUDA graphs: 2.3-3.1 us less a call, plain (a 0-d temperature)
# 148.4 / 150.2 / 153.3 -> 145.3 / 147.6 / 151.0 us, off-valued knobs 156.5 / 158.2 / 168.0
# -> 153.5 / 155.9 / 166.2 (bench_off_knobs_nvidia-h200_fused-assert_20261129-0036.csv).
FUSED_ASSERT = True
# Under CUDA graph capture ``checking`` launches the check on a stream of its own, forked before
# the call's kernels and joined after them: in the graph a branch beside stage 1, not a node
# before it, so the call's path loses the check's launch and its own time. Its assert still
# stops the context before anything after the call runs (the join waits for it), and long
# before stage 1 ends; the fused kernels take any knob value without reading out of bounds
# (calls on the reference check first). Eager calls check first too (their time is the
# host's). H200, bf16 logits, D = 2048, B = 1 /
# 16 / 64, us, before -> beside: 0-d knob tensors at their off values 153.6 / 154.5 / 167.8 ->
# 151.6 / 153.3 / 168.6 (plain 146.0 / 147.6 / 153.3), top-k 50 as a 0-d tensor 165.3 / 168.2 /
# 198.9 -> 163.5 / 167.1 / 197.0; D = 4096 0.2-0.6% faster in every cell
# (knob_check_beside_ab_h200_20261129-0753.txt, tokens equal).
CHECK_BESIDE = True

_side_streams: dict[torch.device, torch.cuda.Stream] = {}


@triton.jit
def _all_in_range(
    temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, ok_ptr,
    temperature_count, top_k_count, top_p_count, min_p_count,
    temperature_stride, top_k_stride, top_p_stride, min_p_stride, longest,
    BLOCK: tl.constexpr,
    MESSAGE: tl.constexpr = "",
):  # fmt: skip
    """Whether every given knob value is in its range (op.py's PerRowKnob rules: temperature
    finite and >= 0, top_k >= 0, top_p in (0, 1], min_p in [0, 1]; NaN is out): with a
    MESSAGE a device-side assert with it (compiled in only with Triton's ``debug`` option;
    ok_ptr None), else ok_ptr[0] = 1 or 0. A knob whose pointer is None is not read."""
    bad = tl.zeros((BLOCK,), tl.int32)
    offs = tl.arange(0, BLOCK)
    for start in range(0, longest, BLOCK):
        index = start + offs
        if temperature_ptr is not None:
            mask = index < temperature_count
            t = tl.load(temperature_ptr + index * temperature_stride, mask=mask, other=1.0)
            bad |= (mask & ~((t >= 0) & (t < float("inf")))).to(tl.int32)
        if top_k_ptr is not None:
            mask = index < top_k_count
            k = tl.load(top_k_ptr + index * top_k_stride, mask=mask, other=0)
            bad |= (mask & (k < 0)).to(tl.int32)
        if top_p_ptr is not None:
            mask = index < top_p_count
            p = tl.load(top_p_ptr + index * top_p_stride, mask=mask, other=1.0)
            bad |= (mask & ~((p > 0) & (p <= 1))).to(tl.int32)
        if min_p_ptr is not None:
            mask = index < min_p_count
            p = tl.load(min_p_ptr + index * min_p_stride, mask=mask, other=0.0)
            bad |= (mask & ~((p >= 0) & (p <= 1))).to(tl.int32)
    if MESSAGE != "":
        tl.device_assert(tl.max(bad) == 0, MESSAGE)
    else:
        tl.store(ok_ptr, 1 - tl.max(bad))


def assert_knobs_valid(knobs: dict[str, torch.Tensor], message: str) -> None:
    """A device-side assert, with ``message``, that every value of the CUDA tensors
    ``knobs`` (0-d or [B], of the names temperature, top_k, top_p, min_p) is in range, in one
    launch whatever their number (two without FUSED_ASSERT); no host sync."""
    device = next(iter(knobs.values())).device
    tensors = [knobs.get(name) for name in _NAMES]
    counts = [0 if t is None else t.numel() for t in tensors]
    strides = [0 if t is None or t.dim() == 0 else t.stride(0) for t in tensors]
    fused = FUSED_ASSERT
    # (where fused, nothing is written and nothing allocated: ``checking`` launches it on a
    # side stream during a capture, whose pool takes only the capturing stream's allocations)
    ok = None if fused else torch.empty(1, dtype=torch.int32, device=device)
    with torch.cuda.device(device):
        launch(
            _all_in_range, (1,), *tensors, ok, *counts, *strides, max(counts), BLOCK=_BLOCK,
            MESSAGE=message if fused else "",
            num_warps=4, **({"debug": True} if fused else {}),
        )  # fmt: skip
    if not fused:
        torch._assert_async(ok, message)


@contextlib.contextmanager
def checking(knobs: dict[str, torch.Tensor], message: str, beside: bool = True):
    """The context in which a call's kernels run after ``assert_knobs_valid(knobs, message)``:
    that check first or, with ``beside`` under CUDA graph capture (``CHECK_BESIDE``), on a
    side stream forked at entry and joined at exit, beside the kernels (which must then take
    any knob value without reading out of bounds: the fused kernels, not the reference's
    torch ops, whose own index asserts could fire first)."""
    device = next(iter(knobs.values())).device
    beside = beside and CHECK_BESIDE and FUSED_ASSERT
    with torch.cuda.device(device):
        capturing = torch.cuda.is_current_stream_capturing()
        if beside and not capturing and device not in _side_streams:
            # (made before any capture: a stream is not something to create inside one)
            _side_streams[device] = torch.cuda.Stream(device)
        beside = beside and capturing and device in _side_streams
        main = torch.cuda.current_stream()
        if beside:
            side = _side_streams[device]
            side.wait_stream(main)
            with torch.cuda.stream(side):
                assert_knobs_valid(knobs, message)
        else:
            assert_knobs_valid(knobs, message)
    try:
        yield
    finally:
        if beside:
            main.wait_stream(side)
