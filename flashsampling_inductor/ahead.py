"""Compiling a fused call's Triton kernels before their first launch, all at once.

A truncating call launches up to five kernels at every call (stage 1, the merge, stage 2, the
fallback's logits and its stage 2 passes: no host sync decides which it needs), and Triton
compiled each at its first launch, one after the other: 23 s of a 60 s first ``generate`` on an H200
(Qwen3-1.7B shape, B = 1, top-k 50), after Inductor's ~30 s on the step
(benchmarks/profile_first_call.py). Here they compile in parallel, in threads
(``launch.compile_ahead``), from a dry run of the call's host code on fake tensors
(``FakeTensorMode``: shapes, strides and dtypes without memory, and no kernel of any kind):
each ``launch`` in it only compiles. The kernels take the same path on fakes as on the real
tensors because the host code makes no host sync: what it launches depends on shapes, dtypes
and knobs, never on values. On the same H200 profile the op's compiles then ran in parallel
behind Inductor's and the first call took 44.6 s (54.0 s without, stock 45.7 s; docs/hf.md).

Two moments start one:

* the graph pass, once it has rewritten a call (``in_background``): the call's shapes are
  known then, so the dry run runs in a thread of its own while Inductor compiles the rest of
  the step; the first launch waits for it (``launch.wait_for_compiles``);
* a call's first run (``before_first_run``) for a kind of call not compiled ahead yet
  (shapes, strides, alignment, dtypes, the knobs that choose kernels): eager calls, graphs
  loaded from a cache, shapes the pass did not know.

A dry run that fails (an op that needs a tensor's values, a compile that fails) is dropped:
the kernels it did not compile compile at their first launch, as without it. A fake tensor
has no address: its allocation's is taken as aligned, as the caching allocator's are, and
a view's as its offset says. ``FLASHSAMPLING_COMPILE_AHEAD=0`` turns both off, ``=first``
keeps only the second. On a host with at least ``_PROCESSES_FROM_CPUS`` CPUs the graph
pass's dry run compiles in child processes, into Triton's on-disk cache, then here, where it
finds them: Triton's compiles in threads hold the GIL that Inductor's compile of the rest of
the step needs (on an H200 host the fused first generate at B = 8 took 48.8 s so, 42.4 s with
children, stock 40.2 s; docs/hf.md). ``FLASHSAMPLING_COMPILE_AHEAD_IN=threads`` or
``=processes`` chooses either. The children start when the backend is handed a graph that
may sample (``prestart``), so that their imports are done when the pass hands them the call.
A graph with a dynamic batch (a step that met a second batch size) is compiled ahead for the
call it is compiled for (its sizes' hints). Once a graph's first run shows that its compile
is over, the same children go on, at a lower priority, with its call at the batch sizes of
``FLASHSAMPLING_COMPILE_AHEAD_BATCHES`` (their kernels are variants of their own; a static
graph's call resized by its batch-sized tensors), which a first run of such a size waits for
and a later graph of such a call loads instead of starting children: the second and third
batch sizes of a ``generate`` find their kernels compiled (H200, fresh caches, stock and
fused started together, B = 1 -> 16 -> 64 in one process: 43.2 / 57.4 / 1.4 s fused against
43.1 / 58.2 / 1.3 s stock; docs/hf.md). Under the backend the pass's calls are handed to the
compile ahead once Inductor's joint graph passes have ended (``hand_off``, from the backend's
inner compile), not in the pass: at B = 1 fused's first call was 1.6 s under stock's on
average over three pairs, 2.0 s over it with the hand-off in the pass
(``FLASHSAMPLING_COMPILE_AHEAD_HANDOFF=now``; docs/hf.md).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import logging
import os
import pickle
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from . import launch as _launch

__all__ = [
    "backend_hands_off", "before_first_run", "compiled", "hand_off", "in_background",
    "prestart", "wait_for_background_compiles",
]  # fmt: skip

log = logging.getLogger("flashsampling_inductor")

# "1" (default): both moments, "first": a call's first run only, "0": off.
MODE = os.environ.get("FLASHSAMPLING_COMPILE_AHEAD", "1")
# When the graph pass's calls are handed to their compile ahead: "late" (default), once
# Inductor's joint graph passes have ended (``hand_off``, from the backend's inner compile,
# where the backend compiles: ``backend_hands_off``); "now", in the pass. With "now" the
# fused runs' joint passes took 1.0-2.6 s longer than stock's, the main thread stalling
# 100-250 ms at a time from the moment the pass handed the children the call, and the
# children ended 4-6 s before Inductor did, so the call can come later. H200, B = 1, fresh
# caches, stock and fused started together, three pairs each, alternated: fused - stock
# -4.5 / -3.6 / +3.4 s late, +0.3 / +1.6 / +4.0 s now (docs/hf.md).
HANDOFF = os.environ.get("FLASHSAMPLING_COMPILE_AHEAD_HANDOFF", "late")
# Where the graph pass's dry run compiles: "threads" of this process, or "processes":
# _PROCESSES children that each compile a share of its kernels into Triton's on-disk cache,
# where the first launch here finds them (no lock shared with Inductor's compile). Children
# by default where the CPUs are there for them: each imports torch and compiles, a CPU each
# for seconds, beside Inductor's compile workers.
_PROCESSES = 4
_PROCESSES_FROM_CPUS = 8


def _cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # (not on Linux)
        return os.cpu_count() or 1


WORKERS = os.environ.get(
    "FLASHSAMPLING_COMPILE_AHEAD_IN",
    "processes" if _cpus() >= _PROCESSES_FROM_CPUS else "threads",
)
# The modules that hold @triton.jit functions (_settle_cache_keys).
_KERNEL_MODULES = (
    "sampling_device", "sampling_kernel", "truncation_kernel", "hopper_kernel",
    "hopper_swap_kernel", "knob_check", "exchange", "tp_truncation",
)  # fmt: skip
_CHILD_TIMEOUT_S = 300  # (a child's compiles take seconds; one that hangs is given up on)
_IDLE_CHILD_S = 900  # (a prestarted child whose call never comes: prestart)
# Batch sizes whose kernels a graph's call compiles ahead too, in the children that compiled
# its own, at a lower priority, once the graph has compiled (its first run): so that the
# next batch size's graph finds them (``in_background``); "" turns it off. Powers of two,
# and 33 and 193 (stage 2's views not 16-byte aligned, in the Gluon stage 1's range and
# above it): every variant of stage 2 and of the Gluon stage 1 from 2 to 256 rows at
# D = 2048, top-k 50 on Hopper (30 compiles, ~15 s of four children on an H200 host; CPU
# dry runs); the Triton stage 1 and the fallback's logits specialize on more (B % 16).
# Started during the graph's compile instead (an earlier form, opt-in), they made the
# second batch size's first call 10.9 s longer (H200, 08:06 UTC).
_OTHER_BATCHES = tuple(
    int(rows)
    for rows in os.environ.get(
        "FLASHSAMPLING_COMPILE_AHEAD_BATCHES", "2,4,8,16,32,33,64,128,193,256"
    ).split(",")
    if rows.strip()
)
_OTHER_BATCHES_NICE = 10  # (their children yield the CPU to this process's own work)
_DONE, _FAILED = b"compiled", b"failed"  # (what a child says when its first runs are done)
_GO = b"go"  # (what a child waits for before the calls of other batch sizes)
# Children done with a call's own kernels that wait for its first run (the end of its
# graph's compile) to go on with other batch sizes': their stdin.
_held_children: list = []
# Children started ahead of the next dry run in processes (prestart), with their error files.
_waiting_children: list = []
_children_lock = threading.Lock()
# Gluon's TMA descriptor checks its base's address, which a fake tensor gives as 0 with a
# deprecation warning meant for user code; the dry run knows it has no address.
warnings.filterwarnings(
    "ignore", "Accessing the data pointer of FakeTensor", module=r"triton\.experimental\.gluon"
)

# The graph pass's calls not handed to their compile ahead yet (HANDOFF "late"): (run, args).
_not_handed_off: list[tuple] = []
# Set while the backend compiles (``backend_hands_off``): only then does someone hand off
# late; the pass set on stock Inductor by hand hands its calls off in the pass.
_backend_compiling = threading.local()
_kinds_seen: set[tuple] = set()
_kinds_lock = threading.Lock()
_background: ThreadPoolExecutor | None = None
# The compiles ahead that ``compiled`` started, by kind: their ends.
_started_by_compiled: dict[tuple, Future] = {}
# Children compiling other batch sizes' kernels, or that did: (those kinds, the future of
# their end). Kept: a later graph whose call is one of them loads their kernels.
_other_batches_running: list[tuple[list, Future]] = []


class _TensorKind(tuple):
    """What the kernels specialize on of a tensor, and what its fake needs: (shape, stride,
    dtype, 16-byte aligned). (A tuple: the key is made at every call.)"""


def before_first_run(run: Callable, args: tuple) -> None:
    """Compile ahead the kernels of ``run(*args)`` (a fused op's implementation with its
    flat arguments, real tensors, the first on the call's CUDA device) if no call of its kind
    was compiled ahead before. (A few us a call: the key.)"""
    if MODE == "0" or _launch.compiling_ahead():
        return
    if _not_handed_off:  # (a graph whose compile did not reach Inductor's inner compile)
        hand_off()
    if _held_children:  # (a compiled graph's first run: its compile is over)
        _release_held_children()
    kinds = _real_kinds(args)
    if kinds in _kinds_seen:  # (the path of every call but the first of its kind)
        return
    _launch.wait_for_compiles()  # (one started by the graph pass may be this kind)
    if _held_children:  # (that pass's children, done while this waited)
        _release_held_children()
    for running in _compiling_in_children(kinds):  # (wait rather than compile twice)
        running.result()
    if not torch.cuda.is_current_stream_capturing() and _claim(kinds):
        _dry_run(run, kinds)


def compiled(run: Callable, args: tuple) -> bool:
    """Whether the kernels of ``run(*args)`` (real tensors, as ``before_first_run``) are
    compiled: False while a compile ahead that this started for its kind runs, and at the
    first call of a kind no compile has seen, whose compile it then starts in the background
    (``WORKERS``); True once that has ended, and for a kind another moment compiles (its
    first launch waits for that). For a caller that has another way to make the call and
    would rather take it than wait for compiles: hf generate's prompt token, drawn once per
    ``generate`` on the reference until the kernels are ready. With ``MODE`` "0": True (the
    first launch compiles, as without this)."""
    if MODE == "0" or _launch.compiling_ahead():
        return True
    kinds = _real_kinds(args)
    started = _started_by_compiled.get(kinds)
    if started is not None:
        return started.done()
    if not _claim(kinds):
        return True
    global _background
    if _background is None:
        _background = ThreadPoolExecutor(1, thread_name_prefix="flashsampling-compile-ahead")
    job = _dry_run_in_processes if WORKERS == "processes" else _dry_run
    started = _background.submit(job, run, kinds)
    _started_by_compiled[kinds] = started
    _launch.wait_before_launching(started)
    return False


def in_background(run: Callable, args: tuple) -> None:
    """Start compiling the kernels of ``run(*args)`` in a thread of its own (its compiles in
    ``WORKERS``); ``args`` hold fake tensors (a graph's ``meta["val"]``) or real ones, the
    first on the call's CUDA device, read here and not kept (with ``HANDOFF`` "late": kept,
    and read, at ``hand_off``). A symbolic size is read as its hint, its size in the call
    being compiled (a step compiled again with a dynamic batch for a new batch size
    compiles that size's kernels here, behind Inductor); calls with a size that has none
    are left to ``before_first_run``."""
    if MODE != "1":
        return
    if HANDOFF == "late" and getattr(_backend_compiling, "on", False):
        _not_handed_off.append((run, args))
        return
    _start_in_background(run, args)


@contextlib.contextmanager
def backend_hands_off():
    """While the backend compiles a graph: the pass keeps its calls for ``hand_off``, which
    the backend's inner compile calls (``HANDOFF`` "late")."""
    before = getattr(_backend_compiling, "on", False)
    _backend_compiling.on = True
    try:
        yield
    finally:
        _backend_compiling.on = before


def hand_off() -> None:
    """Start the compiles ahead of the calls the graph pass kept for later (``HANDOFF``
    "late"): the backend calls it as Inductor's inner compile starts (the joint graph
    passes have ended), and a first run calls it for any left."""
    while True:
        try:
            run, args = _not_handed_off.pop(0)
        except IndexError:  # (all handed off, here or in another thread)
            return
        try:  # (never fails, as in the pass: at worst nothing is compiled ahead)
            _start_in_background(run, args)
        except Exception as error:
            log.debug("flashsampling: not compiled ahead (%r)", error, exc_info=True)


def _start_in_background(run: Callable, args: tuple) -> None:
    """``in_background``'s work: the call's kinds, its dry run started in a thread."""
    try:
        kinds = _fake_kinds(args)
    except _NotStatic:
        return
    if not _claim(kinds):
        return
    global _background
    if _background is None:
        _background = ThreadPoolExecutor(1, thread_name_prefix="flashsampling-compile-ahead")
    others = _other_batches(args, kinds) if WORKERS == "processes" else []
    if (covering := _compiling_in_children(kinds)) and not others:
        # (another batch size's children compile this call's kernels: no new children)
        job = functools.partial(_dry_run_after, covering)
    elif WORKERS == "processes":
        job = functools.partial(_dry_run_in_processes, others=others)
    else:
        job = _dry_run
    _launch.wait_before_launching(_background.submit(job, run, kinds))


def wait_for_background_compiles() -> None:
    """Wait until this process's compiles ahead have ended, the other batch sizes' in
    children included (released now if they were held): for a timing after a first call,
    which should not share the CPUs with them (~15 s of four children after a graph's first
    run)."""
    _launch.wait_for_compiles()
    _release_held_children()
    for _, running in list(_other_batches_running):
        running.result()


def _other_batches(args: tuple, kinds: tuple) -> list[tuple]:
    """The kinds of this call at each of ``_OTHER_BATCHES`` rows (the kernels of another
    batch size are variants of their own: on Hopper a stage 1 and stage 2 of their own from
    33 rows on, 14 s to compile at B = 64 after B = 1 and 16 on an H100), less those seen or
    being compiled. A graph with a dynamic batch (a step that met a second batch size) has
    them from its batch's symbol; a static one (a step's first batch size, B = 1 included)
    from its batch-sized tensors (``_static_batch_kinds``), so that a second batch size
    finds its kernels compiled."""
    try:
        _batch_symbol(args)
        kinds_at = functools.partial(_fake_kinds, args)
    except _NotStatic:
        kinds_at = functools.partial(_static_batch_kinds, kinds)
    others = []
    for rows in _OTHER_BATCHES:
        try:
            other = kinds_at(batch=rows)
        except _NotStatic:
            continue
        if other == kinds or other in _kinds_seen or other in others:
            continue
        if not _compiling_in_children(other):
            others.append(other)
    return others


def _static_batch_kinds(kinds: tuple, batch: int) -> tuple:
    """``kinds`` (a call of a static graph) with ``batch`` rows: every tensor whose first
    size is the first argument's (the batch) gets ``batch`` rows, its strides those of a
    contiguous tensor if it was one, else as they were (a row of a larger tensor: its first
    stride does not depend on the batch). A guess: a tensor that only happens to have the
    batch's size is resized too, and a wrong kind only compiles kernels no call launches."""
    rows = kinds[1][0][0]
    resized = []
    for kind in kinds:
        if isinstance(kind, _TensorKind) and len(kind[0]) and kind[0][0] == rows:
            shape, stride, dtype, aligned = kind
            new_shape = torch.Size((batch, *shape[1:]))
            if stride == _contiguous_strides(shape):
                stride = _contiguous_strides(new_shape)
            kind = _TensorKind((new_shape, stride, dtype, aligned))
        resized.append(kind)
    return tuple(resized)


def _contiguous_strides(shape: torch.Size) -> tuple:
    strides, step = [], 1
    for extent in reversed(shape):
        strides.append(step)
        step *= max(extent, 1)
    return tuple(reversed(strides))


def _compiling_in_children(kinds: tuple) -> list[Future]:
    """The ends of the children compiling ``kinds`` as another batch size's call."""
    return [running for others, running in list(_other_batches_running) if kinds in others]


def _dry_run_after(covering: list[Future], run: Callable, kinds: tuple) -> None:
    """``_dry_run`` once the children compiling ``kinds`` (for another batch size's call)
    have ended: it loads their kernels from the cache (and compiles any they did not
    leave) so that the first launch finds them loaded."""
    _release_held_children()  # (this graph's compile would wait for them otherwise)
    for running in covering:
        running.result()
    _settle_cache_keys()
    _dry_run(run, kinds)


def _claim(kinds: tuple) -> bool:
    """True for the first caller with this kind of call, which then compiles it ahead."""
    if kinds[0].type != "cuda":
        return False
    with _kinds_lock:
        if kinds in _kinds_seen:
            return False
        _kinds_seen.add(kinds)
        return True


def _dry_run(run: Callable, kinds: tuple, share: tuple[int, int] = (0, 1)) -> bool:
    """-> whether it ran to its end (else the kernels it did not compile compile at their
    first launch)."""
    return _dry_runs(run, [kinds], share)


def _dry_runs(run: Callable, calls: list[tuple], share: tuple[int, int] = (0, 1)) -> bool:
    """The dry runs of ``run`` with each of ``calls`` (kinds), their launches compiled as
    one dry run's (each specialization of a kernel once); -> whether all ran to their end."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    ran = True
    try:
        with FakeTensorMode(), _launch.compile_ahead(share=share):
            for device, *kinds in calls:
                try:
                    run(*(_fake(k, device) if isinstance(k, _TensorKind) else k for k in kinds))
                except Exception as error:
                    log.debug("flashsampling: not compiled ahead (%r)", error, exc_info=True)
                    ran = False
    except Exception as error:
        log.debug("flashsampling: kernels not compiled ahead (%r)", error, exc_info=True)
        return False
    return ran


def _dry_run_in_processes(run: Callable, kinds: tuple, others: list[tuple] = ()) -> None:
    """``_dry_run`` in ``_PROCESSES`` children, each compiling a share of the launches into
    Triton's cache directory (this process's, passed on); when all have done so, ``_dry_run``
    here, which finds their kernels in that cache (a file read each) and compiles any that
    a child did not leave there, so that the first launch finds every kernel loaded. The
    children then go on, at a lower priority, with the calls of kinds ``others``, which
    nothing waits for but a first run of their kind (``before_first_run``)."""
    running = _compile_in_children(run, [kinds], others)
    if running:
        _other_batches_running.append((list(others), _reap_in_background(running)))
    # (here, not before the children: this thread then holds the GIL while Inductor waits
    # for its compile workers, not during the joint graph passes)
    _settle_cache_keys()
    _dry_run(run, kinds)


def _settle_cache_keys() -> None:
    """Compute the Triton cache key of every ``@triton.jit`` function of this package that
    has none yet, each after those it calls. Triton 3.6 adds a callee's global constants to
    its caller's key before it computes the callee's key, so a kernel's key depended on the
    keys the process had computed before: a child and this process gave the truncating stage
    2 different keys, and its first launch here compiled it again. Callees first, a key is
    the one it has with every callee known, in any process (newer Tritons: as anyway)."""
    from triton.runtime import jit

    callable_type = getattr(jit, "JITCallable", jit.JITFunction)
    done: set[int] = set()

    def settle(function) -> None:
        if id(function) in done:
            return
        done.add(id(function))
        for callee in _callees(function, callable_type):
            settle(callee)
        try:
            function.cache_key  # noqa: B018 (computed and kept by Triton)
        except Exception:  # (e.g. one that calls interpreted functions: never launched)
            pass

    for name in _KERNEL_MODULES:  # (all of them, in both processes: the same keys)
        try:
            module = importlib.import_module(f"{__package__}.{name}")
        except Exception:  # (e.g. no Gluon in this Triton: its kernels are not launched)
            continue
        for value in list(vars(module).values()):
            if isinstance(value, callable_type):
                settle(value)


def _callees(function, callable_type) -> list:
    """The jit functions ``function``'s source names (by name or dotted path from its
    globals), as Triton's dependency finder resolves them."""
    import ast

    try:
        tree = function.parse()
        scope = {**function.fn.__globals__, **inspect.getclosurevars(function.fn).nonlocals}
    except (AttributeError, OSError, TypeError):
        return []
    found = []
    for node in ast.walk(tree):
        path = []
        while isinstance(node, ast.Attribute):
            path.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            continue
        value = scope.get(node.id)
        for attribute in reversed(path):
            value = getattr(value, attribute, None)
        if isinstance(value, callable_type) and value is not function:
            found.append(value)
    return found


def prestart() -> None:
    """Start the children of the next ``_dry_run_in_processes`` now, where the compile ahead
    compiles in processes: each imports torch and this package and settles its cache keys
    (seconds of a CPU each) and then waits for its share of a call, so that the call's
    compiles start as soon as the graph pass has rewritten it. The backend calls it before
    Inductor compiles a CUDA graph (Dynamo has traced it; the pass runs after AOT's trace).
    Children that get no call end after ``_IDLE_CHILD_S``. (On an H100 host the children
    took 27 s from the pass to their last compile at B = 8, the first launch waiting 1.9 s
    for them: their start was on that path.)"""
    if MODE != "1" or WORKERS != "processes":
        return
    if _other_batches_running:
        return  # (children compiled other batch sizes' calls, likely this graph's: none idle)
    with _children_lock:
        if _usable(_waiting_children):
            return
        _end(_waiting_children)
        _waiting_children[:] = _start_children()


def _usable(children: list) -> bool:
    """Whether prestarted ``children`` can take a call: all still waiting, for this
    process's Triton cache directory."""
    return len(children) == _PROCESSES and all(
        process.poll() is None and cache == _triton_cache_dir() for process, _, cache in children
    )


def _triton_cache_dir() -> str | None:
    import triton

    try:
        return triton.knobs.cache.dir
    except AttributeError:  # (older Triton: its cache directory from the environment alone)
        return os.environ.get("TRITON_CACHE_DIR")


def _start_children() -> list:
    """``_PROCESSES`` children waiting for their job on stdin: (process, a file for its
    errors, the Triton cache directory it compiles into)."""
    environment = dict(os.environ)
    cache = _triton_cache_dir()
    if cache is not None:
        environment["TRITON_CACHE_DIR"] = cache
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    environment["PYTHONPATH"] = os.pathsep.join(
        [package_parent, *filter(None, [environment.get("PYTHONPATH")])]
    )
    code = "from flashsampling_inductor import ahead; ahead.child()"
    children = []
    try:
        for _ in range(_PROCESSES):
            errors = tempfile.TemporaryFile()
            children.append(
                (
                    subprocess.Popen(
                        [sys.executable, "-c", code], stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE, stderr=errors, env=environment,
                    ),
                    errors,
                    cache,
                )
            )  # fmt: skip
    except OSError as error:
        log.debug("flashsampling: kernels not compiled ahead (%r)", error, exc_info=True)
    return children


def _end(children: list) -> None:
    for process, errors, _ in children:
        if process.poll() is None:
            process.kill()
            process.wait()
        errors.close()
        process.stdout.close()
    children.clear()


def _compile_in_children(run: Callable, calls: list[tuple], later: list[tuple] = ()) -> list:
    """The dry runs of ``run`` with each of ``calls`` (kinds) in children, each compiling a
    share of their launches; returns when each has done so, with the children that then go
    on with ``later`` (at niceness ``_OTHER_BATCHES_NICE``: ``_reap`` them)."""
    with _children_lock:  # (the prestarted ones, if they are all still waiting)
        children = list(_waiting_children)
        _waiting_children.clear()
    if not _usable(children):
        _end(children)
        children = _start_children()
    try:
        jobs = [
            pickle.dumps((run, calls, (index, len(children)), later, _ptxas_versions(calls))).hex()
            for index in range(len(children))
        ]
    except (pickle.PicklingError, TypeError, AttributeError) as error:
        log.debug("flashsampling: kernels not compiled ahead (%r)", error, exc_info=True)
        jobs = [""] * len(children)  # (an empty line: the children end)
    for (process, _, _), job in zip(children, jobs, strict=True):
        try:
            process.stdin.write(job.encode() + b"\n")
            process.stdin.flush()
            if not later:
                process.stdin.close()
        except OSError as error:  # (a child that ended: its share compiles in the parent)
            log.debug("flashsampling: kernels not compiled ahead (%r)", error, exc_info=True)
    import select

    running = []
    for child in children:
        process = child[0]
        ready = select.select([process.stdout], [], [], _CHILD_TIMEOUT_S)[0]
        said = process.stdout.readline().strip() if ready else b""
        if said in (_DONE, _FAILED) and later:  # (a failure: its exit code says so, later)
            running.append(child)
            continue
        if said == b"" and process.poll() is None:  # (it hangs: never seen)
            process.kill()
        if later:
            _close_quietly(process.stdin)
        _wait_for(child)
    with _children_lock:
        _held_children.extend(process.stdin for process, _, _ in running)
    return running


def _release_held_children() -> None:
    """Let the held children go on with other batch sizes' calls (``_held_children``)."""
    with _children_lock:
        held = list(_held_children)
        _held_children.clear()
    for stdin in held:
        with contextlib.suppress(OSError, ValueError):  # (one that ended)
            stdin.write(_GO + b"\n")
        _close_quietly(stdin)


def _close_quietly(stream) -> None:
    with contextlib.suppress(OSError, ValueError):
        stream.close()


def _ptxas_versions(calls: list[tuple]) -> dict:
    """This process's ptxas version for the architecture of each CUDA device of ``calls``,
    as Triton's cache key reads it: once per process (``get_ptxas_version`` is cached), so
    that it stays the version of the ptxas of its first compile after Inductor sets
    ``TRITON_PTXAS_PATH`` (to torch's own ptxas, where its first kernels compile in this
    process). A child started after that would read the other ptxas's version, and every
    kernel it compiled would have a key of its own, compiled again here at its first launch
    (tests/test_gpu_compile_ahead.py, after a compiled step's test)."""
    versions = {}
    try:
        from triton.backends.nvidia import compiler

        for device in {call[0] for call in calls if call[0].type == "cuda"}:
            major, minor = torch.cuda.get_device_capability(device)
            arch = major * 10 + minor
            versions[arch] = compiler.get_ptxas_version(arch)
    except Exception as error:  # (no NVIDIA backend or ptxas: the child reads its own)
        log.debug("flashsampling: ptxas version not read (%r)", error, exc_info=True)
    return versions


def _use_ptxas_versions(versions: dict) -> None:
    """In a child: key the compiles with the parent's ptxas versions (``_ptxas_versions``)."""
    if not versions:
        return
    try:
        from triton.backends.nvidia import compiler
    except Exception:  # (no NVIDIA backend: nothing compiles for CUDA here)
        return
    own = compiler.get_ptxas_version
    compiler.get_ptxas_version = lambda arch=80: versions.get(arch) or own(arch)


def _reap_in_background(children: list) -> Future:
    """``_reap`` in a daemon thread (held children wait for this process's first run, which
    may never come: its exit must not wait for them; they end with it): its end."""
    ended: Future = Future()

    def reap() -> None:
        try:
            _reap(children)
        finally:
            ended.set_result(None)

    threading.Thread(target=reap, name="flashsampling-compile-ahead-end", daemon=True).start()
    return ended


def _reap(children: list) -> None:
    """Wait for ``children`` (those going on with other batch sizes) to end."""
    for child in children:
        _wait_for(child)


def _wait_for(child: tuple) -> None:
    """Wait for ``child`` to end (an hour at most), logging what it said if it failed."""
    process, errors, _ = child
    try:
        failed = process.wait(timeout=3600)
    except subprocess.TimeoutExpired:
        process.kill()
        failed = process.wait()
    if failed:
        _log_errors(errors)
    errors.close()
    process.stdout.close()


def _log_errors(errors) -> None:
    errors.seek(0)
    log.debug(
        "flashsampling: kernels not compiled ahead (%s)",
        errors.read()[-2000:].decode(errors="replace"),
    )


def child() -> None:
    """A child of ``_compile_in_children``: its dry runs from the line its parent writes to
    its stdin (the call, the kinds of each run, the share of the launches to compile, the
    kinds of the runs after, pickled, in hex), after the imports and the cache keys, which
    it does while it waits for that line; it says on stdout when it has done the first
    runs, then does the later ones at a lower priority."""
    from torch._subclasses import fake_tensor

    # A fake CUDA tensor allocates a real one first, for autograd (a CUDA context, hundreds
    # of MB of the GPU per child); a dry run has no backward, and compiling needs no context.
    fake_tensor.init_gpu_context = lambda device: None
    _no_stream_queries()
    threading.Thread(target=_end_with, args=(os.getppid(),), daemon=True).start()
    _settle_cache_keys()  # (the keys the parent's launches will compute: _settle_cache_keys)
    import select

    if not select.select([sys.stdin], [], [], _IDLE_CHILD_S)[0]:
        sys.exit(0)  # (prestarted for a call that never came)
    job = sys.stdin.readline().strip()
    if not job:
        sys.exit(0)  # (the parent ended, or ended this child, before it had a call)
    run, calls, share, later, ptxas_versions = pickle.loads(bytes.fromhex(job))
    _use_ptxas_versions(ptxas_versions)
    log.addHandler(logging.StreamHandler())  # (to the file the parent reads when it fails)
    log.setLevel(logging.DEBUG)
    said = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # (anything else written to stdout goes to the errors' file)
    ran = _dry_runs(run, calls, share)
    said.write((_DONE if ran else _FAILED) + b"\n")
    said.close()
    # (the other batch sizes once the parent's graph has compiled: until then they would
    # take CPUs from its compile, 10 s longer at B = 16 on an H200 host)
    if later and sys.stdin.readline().strip() == _GO.decode():
        os.nice(_OTHER_BATCHES_NICE)
        ran = _dry_runs(run, later, share) and ran
    sys.exit(0 if ran else 1)


def _end_with(parent: int) -> None:
    """End this child when ``parent`` has ended (its compiles are for that process only;
    one left running takes a CPU from the next process on the host)."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def _no_stream_queries() -> None:
    """Triton asks for the current CUDA stream before it knows that a launch only compiles,
    and torch's first stream query makes the process's CUDA context (H200: 524 MiB of the
    GPU, each child, until it ends). A child never launches: any stream will do."""
    try:
        from triton.runtime import driver

        driver.active.get_current_stream = lambda device=None: 0
    except Exception:  # (no GPU driver: nothing here would make a context)
        pass


class _NotStatic(Exception):
    pass


def _real_kinds(args: tuple) -> tuple:
    """The key of a call: its device, then per argument what the kernels' choice and
    specialization read (tensors: ``_TensorKind``; floats: ``_float_class``)."""
    return (
        args[0].device,
        *[
            _TensorKind((arg.shape, arg.stride(), arg.dtype, arg.data_ptr() % 16 == 0))
            if isinstance(arg, torch.Tensor)
            else _float_class(arg) if type(arg) is float else arg
            for arg in args
        ],
    )  # fmt: skip


def _fake_kinds(args: tuple, batch: int | None = None) -> tuple:
    """``_real_kinds`` of a graph's arguments (fake tensors, which have no address); with
    ``batch``, those of the same call with that many rows (the first argument's first size,
    a symbol: ``_batch_symbol``)."""
    rows = None if batch is None else (_batch_symbol(args), batch)
    size = functools.partial(_size, batch=rows)
    return (args[0].device, *[_fake_kind(arg, size) for arg in args])


def _fake_kind(value, size: Callable):
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        value = size(value)
    if type(value) is float:
        return _float_class(value)
    if not isinstance(value, torch.Tensor):
        return value
    shape = torch.Size(size(extent) for extent in value.shape)
    stride = tuple(size(step) for step in value.stride())
    # (an allocation is 16-byte aligned; a view is where its offset says)
    aligned = size(value.storage_offset()) * value.element_size() % 16 == 0
    return _TensorKind((shape, stride, value.dtype, aligned))


def _size(value, batch: tuple | None = None):
    """A symbolic size's value in the call being compiled (its hint: a graph compiled with a
    dynamic batch is compiled for a call of some batch, the one that runs first), or with
    ``batch`` (the batch's symbol, a number of rows) in a call of that batch; a number as it
    is; ``_NotStatic`` where there is none (a size only known at run time)."""
    if not isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return value
    if batch is not None and isinstance(value, torch.SymInt):
        import sympy

        symbol, rows = batch
        expression = value.node.expr.xreplace({symbol: sympy.Integer(rows)})
        shape_env = value.node.shape_env
        hints = getattr(shape_env, "backed_var_to_val", None) or shape_env.var_to_val
        try:
            return int(expression.xreplace({free: hints[free] for free in expression.free_symbols}))
        except (KeyError, TypeError) as error:
            raise _NotStatic from error
    hint = getattr(value.node, "hint", None)
    if hint is None or isinstance(hint, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise _NotStatic
    return hint


def _batch_symbol(args: tuple):
    """The symbol of the call's batch (its first argument's first size), or ``_NotStatic``
    where that size is not a symbol of its own."""
    rows = args[0].shape[0]
    expression = getattr(getattr(rows, "node", None), "expr", None)
    if expression is None or not getattr(expression, "is_Symbol", False):
        raise _NotStatic
    return expression


def _fake(kind: _TensorKind, device: torch.device) -> torch.Tensor:
    """A fake tensor of ``kind`` on ``device`` (inside a FakeTensorMode); one element past
    its storage's start where it is not aligned."""
    from torch._prims_common import compute_required_storage_length

    shape, stride, dtype, aligned = kind
    offset = 0 if aligned else 1
    length = compute_required_storage_length(shape, stride, offset)
    return torch.empty(length, dtype=dtype, device=device).as_strided(shape, stride, offset)


def _float_class(value: float) -> float:
    """A float of ``value``'s class: the host code compares knobs with 0 and 1 only
    (greedy, top-p and min-p off, soft-cap off)."""
    if value in (0.0, 1.0) or value != value:
        return value
    return 0.5 if 0.0 < value < 1.0 else (2.0 if value > 1.0 else -1.0)


def seed_class(seed: int) -> int:
    """A host seed of ``seed``'s class: the kernels take its two 32-bit halves
    unspecialized, typed by size (i32 below 2**31, else i64)."""
    seed_u64 = seed % 2**64
    low = 0 if seed_u64 & 0xFFFFFFFF < 2**31 else 2**31
    high = 0 if seed_u64 >> 32 < 2**31 else 2**31
    representative = high << 32 | low
    return representative - 2**64 if representative >= 2**63 else representative


def bind(function: Callable, args: tuple, kwargs: dict) -> tuple:
    """``function``'s arguments in order, defaults filled in."""
    bound = inspect.signature(function).bind(*args, **kwargs)
    bound.apply_defaults()
    return tuple(bound.arguments.values())
