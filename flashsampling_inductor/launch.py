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

Inside ``compile_ahead`` (a dry run of a call's host code, ``ahead.py``) ``launch``
launches nothing: it starts compiling its kernel in a worker thread (Triton's
AsyncCompileMode), then building its launcher, and leaving waits for them all. A dry
run in a thread of its own is registered with ``wait_before_launching``: until it ends,
every ``launch`` waits for it first (else Triton 3.6 compiles the kernel a second time, and
newer ones find the compile's placeholder in the kernel's cache).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import torch

__all__ = [
    "compile_ahead", "compiling_ahead", "launch", "wait_before_launching", "wait_for_compiles",
]  # fmt: skip

try:  # Triton >= 3.4 keeps the launch hooks in its knobs
    from triton import knobs as _knobs

    _RUNTIME = _knobs.runtime
except ImportError:  # (older Triton: always its own path)
    _RUNTIME = None

_ENABLED = os.environ.get("FLASHSAMPLING_FAST_LAUNCH", "1") != "0" and _RUNTIME is not None
_compiled: dict[tuple, object] = {}
# Inside compile_ahead: its record of the dry run's launches (else None).
_compiling_ahead: contextvars.ContextVar[_DryRun | None] = contextvars.ContextVar(
    "flashsampling_compiling_ahead", default=None
)
_pending: list[Future] = []
_pending_lock = threading.Lock()


def launch(kernel, grid: tuple[int, ...], *args, **kwargs) -> None:
    """``kernel[grid](*args, **kwargs)``; every argument of the kernel's signature given
    (positionally first, then by keyword), launch options (num_warps, ...) as keywords."""
    if (dry_run := _compiling_ahead.get()) is not None:
        specialization = _dry_key(kernel, args, kwargs)
        if specialization in dry_run.seen:  # (another call's of the dry run, or this one's)
            return
        dry_run.seen.add(specialization)
        if dry_run.launches % dry_run.share[1] == dry_run.share[0]:
            dry_run.kernels.add(kernel)
            _compile_only(kernel, grid, args, kwargs)
        dry_run.launches += 1
        return
    if _pending:
        wait_for_compiles()
    device = _cuda_device(args)
    key = _key(kernel, device, args, kwargs) if _ENABLED and device is not None else None
    compiled = None if key is None else _compiled.get(key)
    if compiled is None:
        compiled = _launch_by_triton(kernel, grid, args, kwargs)
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


class _DryRun:
    """What ``compile_ahead`` records: the kernels it started compiling, the
    specializations it has seen (``_dry_key``) and how many; it compiles the launches of a
    new specialization whose ordinal is ``share[0]`` modulo ``share[1]``."""

    def __init__(self, share: tuple[int, int]) -> None:
        self.kernels: set = set()
        self.seen: set = set()
        self.launches = 0
        self.share = share
        self.pool: ThreadPoolExecutor | None = None


@contextlib.contextmanager
def compile_ahead(threads: int = 8, share: tuple[int, int] = (0, 1)):
    """Within: ``launch`` starts compiling its kernel in a pool of ``threads`` (Triton's
    AsyncCompileMode) and launches nothing; leaving waits for every compile. A compile that
    fails leaves nothing in the kernel's cache: that kernel compiles at its first launch (and
    raises there), as without this. ``share`` (index, count): only every count-th launch
    from the index-th on compiles (one of count processes that split a dry run's
    compiles)."""
    from triton.runtime._async_compile import AsyncCompileMode

    dry_run = _DryRun(share)
    token = _compiling_ahead.set(dry_run)
    try:
        with ThreadPoolExecutor(threads, thread_name_prefix="flashsampling-compile") as pool:
            dry_run.pool = pool
            with AsyncCompileMode(pool, ignore_errors=True):
                yield
    finally:
        _compiling_ahead.reset(token)
        _drop_placeholders(dry_run.kernels)


def _launch_by_triton(kernel, grid, args, kwargs):
    return kernel[grid](*args, **kwargs)


def _compile_only(kernel, grid, args, kwargs) -> None:
    compiling = kernel.warmup(
        *map(_mock, args), grid=grid, **{k: _mock(v) for k, v in kwargs.items()}
    )
    dry_run = _compiling_ahead.get()
    if dry_run is not None and dry_run.pool is not None and hasattr(compiling, "future"):
        dry_run.pool.submit(_build_launcher, compiling.future)


def _build_launcher(compile_job: Future) -> None:
    """Build the launcher of the kernel ``compile_job`` compiles, into Triton's cache: up to
    Triton 3.6 each kernel's launcher is C code of its own, which the first launch compiles
    with the C compiler (about a second each, in the launching thread) unless the cache holds
    it. Any error is left for the first launch to raise."""
    try:
        compiled = compile_job.result()
        from triton.runtime import driver

        driver.active.launcher_cls(compiled.src, compiled.metadata)
    except Exception:  # (the first launch builds it, as without this)
        pass


def compiling_ahead() -> bool:
    return _compiling_ahead.get() is not None


def wait_before_launching(job: Future) -> None:
    """Make every ``launch`` wait for ``job`` (a dry run in another thread) until it ends."""
    with _pending_lock:
        _pending.append(job)


def wait_for_compiles() -> None:
    """Wait for every dry run registered with ``wait_before_launching``."""
    while _pending:
        with _pending_lock:
            job = _pending[0] if _pending else None
        if job is None:
            return
        job.result()  # (the dry run catches its own errors)
        with _pending_lock:
            if _pending and _pending[0] is job:
                _pending.pop(0)


def _drop_placeholders(kernels) -> None:
    """Remove from ``kernels``' caches the placeholders of compiles that did not finish
    (newer Tritons than 3.6 put one there while a compile runs): a launch would re-raise a failed
    compile's error there; without it, it compiles as usual."""
    from triton.runtime._async_compile import FutureKernel

    for kernel in kernels:
        for device_cache in getattr(kernel, "device_caches", {}).values():
            cache = device_cache[0]
            for key in [key for key, value in cache.items() if isinstance(value, FutureKernel)]:
                del cache[key]


class _MockPointer:
    """A tensor argument as Triton's warmup specializes it: its dtype and whether its
    address is 16-byte aligned (a fake tensor has no address; an allocation is aligned and a
    view is where its offset says)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.dtype = tensor.dtype
        self._address = tensor.storage_offset() * tensor.element_size() % 16

    def data_ptr(self) -> int:
        return self._address


def _dry_key(kernel, args, kwargs):
    """A dry run's launch as ``_key`` keys it (positional arguments by their class, keywords,
    the constexprs, by value), from fake tensors (their dtype and alignment); a new object
    where an argument is not hashable (a launch of its own)."""

    def part(arg):
        if isinstance(arg, torch.Tensor):
            return ("tensor", arg.dtype, _MockPointer(arg).data_ptr() == 0)
        if isinstance(arg, (bool, int, float)) or arg is None:
            return _argument_key(arg)
        if isinstance(getattr(arg, "base", None), torch.Tensor):  # (a TMA descriptor)
            try:
                fields = {k: v for k, v in vars(arg).items() if k != "base"}
                return (type(arg), part(arg.base), repr(fields))
            except TypeError:
                return object()
        return arg

    keywords = tuple(
        (name, part(value) if isinstance(value, torch.Tensor) else value)
        for name, value in kwargs.items()
    )
    key = (kernel, tuple(map(part, args)), keywords)
    try:
        hash(key)
    except TypeError:
        return object()
    return key


def _mock(arg):
    return _MockPointer(arg) if isinstance(arg, torch.Tensor) else arg


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
