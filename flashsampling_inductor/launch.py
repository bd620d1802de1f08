"""Launching Triton kernels with less host time.

``kernel[grid](*args, **kwargs)`` spends most of an eager call's host time on CUDA: on the
GPU machines (triton 3.6) a launch of stage 1 took ~150 us of Python and a launch of the TP
exchange ~80 us, more than the kernels' own GPU time at small batches. Most of it is
Triton's per-call work before the launcher: binding the arguments, computing the cache key,
re-checking the globals the kernel read. ``launch`` does that work once per specialization
and then calls the compiled kernel's launcher directly, as Inductor's generated code does.

A specialization is what Triton specializes a compiled kernel on, read here from the
arguments without Triton: each tensor's dtype and 16-byte alignment, each int's size class,
whether it is 1 and whether it divides by 16, each descriptor's block shape and layout,
and the constexpr and launch-option keywords. The key is at least as fine as Triton's own,
so a cached kernel is never launched on arguments it was not compiled for; an argument of
another kind takes Triton's own path. ``FLASHSAMPLING_FAST_LAUNCH=0`` turns it off.
"""

from __future__ import annotations

import os

import torch

__all__ = ["launch"]

try:  # Triton >= 3.4 keeps the launch hooks in its knobs
    from triton import knobs as _knobs

    _RUNTIME = _knobs.runtime
except ImportError:  # (older Triton: always its own path)
    _RUNTIME = None

_ENABLED = os.environ.get("FLASHSAMPLING_FAST_LAUNCH", "1") != "0" and _RUNTIME is not None
_compiled: dict[tuple, object] = {}


def launch(kernel, grid: tuple[int, ...], *args, **kwargs) -> None:
    """``kernel[grid](*args, **kwargs)``; every argument of the kernel's signature given
    (positionally first, then by keyword), launch options (num_warps, ...) as keywords."""
    device = _cuda_device(args)
    key = _key(kernel, device, args, kwargs) if _ENABLED and device is not None else None
    compiled = None if key is None else _compiled.get(key)
    if compiled is None:
        compiled = kernel[grid](*args, **kwargs)
        if key is not None and compiled is not None:
            _compiled[key] = compiled
        return
    values = [*args, *(kwargs[name] for name in kernel.arg_names[len(args) :])]
    stream = torch._C._cuda_getCurrentRawStream(device)
    grid_0, grid_1, grid_2 = (*grid, 1, 1)[:3]
    metadata = compiled.launch_metadata(grid, stream, *values)
    compiled.run(
        grid_0, grid_1, grid_2, stream, compiled.function, compiled.packed_metadata, metadata,
        _RUNTIME.launch_enter_hook, _RUNTIME.launch_exit_hook, *values,
    )  # fmt: skip


def _cuda_device(args) -> int | None:
    """The current CUDA device when the first tensor argument is on it (Triton launches on
    the current device), else None."""
    for arg in args:
        if isinstance(arg, torch.Tensor):
            if not arg.is_cuda or arg.device.index != torch.cuda.current_device():
                return None
            return arg.device.index
    return None


def _key(kernel, device: int, args, kwargs) -> tuple | None:
    """The specialization key of a call, or None where an argument is of a kind not read
    here (Triton's own path then)."""
    if len(args) + sum(name in kwargs for name in kernel.arg_names) != len(kernel.arg_names):
        return None  # (an argument left to its default: Triton's own path binds it)
    key = [kernel, device]
    for arg in args:
        part = _argument_key(arg)
        if part is None:
            return None
        key.append(part)
    for name, value in kwargs.items():
        part = _argument_key(value) if isinstance(value, torch.Tensor) else value
        key.append((name, part))
    try:
        hash(tuple(key))
    except TypeError:
        return None
    return tuple(key)


def _argument_key(arg):
    if arg is None:
        return ("none",)
    if isinstance(arg, torch.Tensor):
        return ("tensor", arg.dtype, arg.data_ptr() % 16 == 0)
    if isinstance(arg, bool):
        return ("bool", arg)
    if isinstance(arg, int):
        size = "i32" if -(2**31) <= arg < 2**31 else "i64" if -(2**63) <= arg < 2**63 else "u64"
        return ("int", size, arg == 1, arg % 16 == 0)
    if isinstance(arg, float):
        return ("float",)
    base = getattr(arg, "base", None)
    if isinstance(base, torch.Tensor) and hasattr(arg, "block_shape"):  # a TMA descriptor
        return (
            "descriptor",
            type(arg),
            base.dtype,
            base.data_ptr() % 16 == 0,
            tuple(arg.block_shape),
            tuple(stride % 16 == 0 for stride in arg.strides),
            tuple(size % 16 == 0 for size in arg.shape),
            getattr(arg, "layout", None),
            getattr(arg, "padding", None),
            getattr(arg, "round_f32_to_tf32", None),
        )
    return None
