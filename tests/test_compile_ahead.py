"""Compiling a call's kernels ahead (flashsampling_inductor/ahead.py): the dry run on fake
tensors must launch exactly the kernels the real call launches, specialized alike, and
touch no memory; the graph pass's key of a call must be the one its first run computes, so
that the run does not compile it ahead a second time. Compiling itself needs a GPU
(tests/test_gpu_compile_ahead.py); here the interpreter's real runs are compared with dry
runs whose compiles are recorded instead."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.experimental.proxy_tensor import make_fx

from flashsampling_inductor import ahead, fused_sample, op
from flashsampling_inductor import launch as launch_module

B, V, D = 3, 200, 16

CALLS = {
    "plain": dict(temperature=0.8, num_samples=2),
    "top_k": dict(temperature=0.7, top_k=5),
    "top_k_top_p_rows": dict(top_k=4, top_p=torch.tensor([0.9, 1.0, 0.5])),
    # (per-row k, as hf.py passes it: the patched stage 2 too)
    "top_k_rows_min_p": dict(top_k=torch.tensor([5, 0, 3]), min_p=0.05),
    # (the dry run once faulted here: an index by the drawn tokens, which no kernel wrote)
    "softcap_raw_logprobs": dict(top_k=5, softcap=30.0, return_logprobs="raw"),
}


def _specialization(arg):
    """What Triton specializes a launch on, for real and fake tensors alike."""
    if isinstance(arg, torch.Tensor):
        offset = arg.storage_offset() * arg.element_size()
        address = offset if isinstance(arg, FakeTensor) else arg.data_ptr()
        return ("tensor", arg.dtype, address % 16 == 0)
    if isinstance(arg, bool) or not isinstance(arg, (int, float)):
        return arg
    if isinstance(arg, float):
        return "float"
    return ("int", arg == 1, arg % 16 == 0, -(2**31) <= arg < 2**31)


def _record(into):
    def record(kernel, grid, args, kwargs):
        into.append(
            (
                kernel,
                tuple(map(_specialization, args)),
                tuple(sorted((k, _specialization(v)) for k, v in kwargs.items())),
            )
        )

    return record


def _flat_call(monkeypatch, knobs, rows=B):
    """The flat arguments ``fused_sample`` hands its custom op, captured."""
    captured = []

    def capture(*args):
        captured.append(args)
        return original(*args)

    original = op._fused_sample_run
    monkeypatch.setattr(op, "_fused_sample_run", capture)
    torch.manual_seed(0)
    hidden, weight = torch.randn(rows, D), torch.randn(V, D)
    # (seed 48 specializes as the dry run's stand-in 0 does: the kernels take the seed
    # unspecialized, which _specialization does not know)
    fused_sample(hidden, weight, impl="triton", **{"seed": 48, **knobs})
    monkeypatch.setattr(op, "_fused_sample_run", original)
    return captured[0]


@pytest.mark.parametrize("knobs", CALLS.values(), ids=CALLS.keys())
def test_dry_run_compiles_what_the_call_launches(monkeypatch, knobs):
    args = _flat_call(monkeypatch, knobs)
    launched, compiled = [], []
    real_launch = launch_module._launch_by_triton

    def launch_and_record(kernel, grid, args, kwargs):
        _record(launched)(kernel, grid, args, kwargs)
        return real_launch(kernel, grid, args, kwargs)

    monkeypatch.setattr(launch_module, "_launch_by_triton", launch_and_record)
    monkeypatch.setattr(launch_module, "_compile_only", _record(compiled))
    out = op._fused_sample_run(*args)
    kinds = ahead._real_kinds((*args[:6], ahead.seed_class(args[6]), *args[7:]))
    ahead._dry_run(op._fused_sample_run, kinds)  # (its own errors are only logged)
    assert launched and sorted(compiled, key=repr) == sorted(launched, key=repr)
    # The dry run changed nothing the call reads.
    torch.testing.assert_close(op._fused_sample_run(*args), out, rtol=0, atol=0)


# The traced call of the two tests below (its seed a tensor, as a compiled step's).
KNOBS = dict(top_k=5, temperature=0.7, seed=torch.tensor(3))


# When the pass's calls are handed to their compile ahead (FLASHSAMPLING_COMPILE_AHEAD_HANDOFF):
# the tests of what it is handed check both.
HANDOFFS = ["now", "late"]


def _handing_off(monkeypatch, handoff: str) -> None:
    """``handoff`` as if the backend were compiling (only then is a late hand-off made)."""
    monkeypatch.setattr(ahead, "HANDOFF", handoff)
    monkeypatch.setattr(ahead._backend_compiling, "on", True, raising=False)


def _compiled_ahead_by_the_pass(monkeypatch, tracing_mode: str, handoff: str = "now") -> tuple:
    """The arguments the pass hands the compile ahead for a step traced with
    ``tracing_mode`` (fake tensors, their sizes symbolic with "symbolic"); with ``handoff``
    "late", handed later (``ahead.hand_off``: the backend's inner compile), outside the
    pass."""
    hidden, weight = torch.randn(B, D), torch.randn(V, D)

    def step(hidden, weight, seed):
        return fused_sample(hidden, weight, **{**KNOBS, "seed": seed}, impl="triton")

    graph = make_fx(step, tracing_mode=tracing_mode)(hidden, weight, KNOBS["seed"]).graph
    started = []
    monkeypatch.setattr(op, "_triton_interpreter_on", lambda: False)  # (as on a GPU)
    monkeypatch.setattr(ahead, "MODE", "1")
    _handing_off(monkeypatch, handoff)
    monkeypatch.setattr(ahead, "_start_in_background", lambda run, args: started.append(args))
    for node in graph.nodes:
        op.compile_ahead_in_background(node)
    if handoff == "late":
        assert not started and len(ahead._not_handed_off) == 1
        ahead.hand_off()
    monkeypatch.undo()
    assert len(started) == 1 and not ahead._not_handed_off
    return started[0]


def _real_call_kinds(monkeypatch, knobs: dict, **shape) -> tuple:
    """The key the first run of the real call with ``knobs`` makes."""
    real = _flat_call(monkeypatch, knobs, **shape)
    return ahead._real_kinds((*real[:6], ahead.seed_class(real[6]), *real[7:]))


@pytest.mark.parametrize("handoff", HANDOFFS)
def test_graph_key_is_the_first_runs(monkeypatch, handoff):
    """The pass's key of a traced call (fake tensors) equals the key its first run makes
    from the real tensors: the run then does not compile the call ahead again."""
    started = _compiled_ahead_by_the_pass(monkeypatch, "fake", handoff)
    assert ahead._fake_kinds(started) == _real_call_kinds(monkeypatch, KNOBS)


@pytest.mark.parametrize("handoff", HANDOFFS)
def test_first_launch_waits_for_the_background_compile(monkeypatch, handoff):
    """The pass's dry run runs in a thread of its own; the call's first launch waits until
    it has finished (Triton 3.9 keeps a compile in flight as a placeholder that cannot be
    launched). Handed off late, it starts at the hand-off."""
    args = _flat_call(monkeypatch, CALLS["top_k"])
    compiled, launched = [], []

    def slow_compile(kernel, grid, args, kwargs):
        time.sleep(0.05)
        compiled.append(threading.current_thread().name)

    real_launch = launch_module._launch_by_triton

    def launch_and_count(kernel, grid, args, kwargs):
        launched.append(len(compiled))
        return real_launch(kernel, grid, args, kwargs)

    monkeypatch.setattr(launch_module, "_compile_only", slow_compile)
    monkeypatch.setattr(launch_module, "_launch_by_triton", launch_and_count)
    monkeypatch.setattr(ahead, "MODE", "1")
    monkeypatch.setattr(ahead, "WORKERS", "threads")  # (the default on hosts of few CPUs)
    monkeypatch.setattr(ahead, "_claim", lambda kinds: True)  # (else CUDA calls only)
    _handing_off(monkeypatch, handoff)
    ahead.in_background(op._fused_sample_run, (*args[:6], 0, *args[7:]))
    if handoff == "late":
        assert not launch_module._pending and not compiled
        ahead.hand_off()
    assert launch_module._pending
    op._fused_sample_run(*args)
    assert not launch_module._pending
    assert len(compiled) == 4 and launched == [4] * 4  # (every launch after every compile)
    assert all(name.startswith("flashsampling-compile-ahead") for name in compiled)


def test_key_classes():
    # Host seeds: one kind per 32-bit halves' size classes (the kernels' i32 / i64).
    assert ahead.seed_class(5) == ahead.seed_class(123456) == 0
    assert ahead.seed_class(2**31) != ahead.seed_class(5)
    assert ahead.seed_class(-1) == ahead.seed_class(-5)
    # Floats: by how they compare with 0 and 1, all the host code reads of them.
    assert ahead._float_class(0.7) == ahead._float_class(0.9) != ahead._float_class(1.0)
    assert ahead._float_class(0.0) == 0.0 and ahead._float_class(30.0) == ahead._float_class(2.5)


def test_a_failed_compile_leaves_no_placeholder():
    """A compile that fails in the pool leaves the kernel's cache as it was: its first
    launch then compiles (and raises) as usual."""
    from triton.runtime._async_compile import FutureKernel

    class Kernel:
        device_caches = {0: ({"ok": 1, "failed": FutureKernel.__new__(FutureKernel)},)}

    launch_module._drop_placeholders([Kernel])
    assert list(Kernel.device_caches[0][0]) == ["ok"]


@pytest.mark.parametrize("index", [0, 1, 2])
def test_processes_split_the_launches(monkeypatch, index):
    """A child of ``FLASHSAMPLING_COMPILE_AHEAD_IN=processes`` compiles every third launch
    of the dry run from its index on, and launches nothing: the three compile each launch
    once."""
    args = _flat_call(monkeypatch, CALLS["top_k_top_p_rows"])
    launched, compiled = [], []
    real_launch = launch_module._launch_by_triton

    def launch_and_record(kernel, grid, args, kwargs):
        _record(launched)(kernel, grid, args, kwargs)
        return real_launch(kernel, grid, args, kwargs)

    monkeypatch.setattr(launch_module, "_launch_by_triton", launch_and_record)
    monkeypatch.setattr(launch_module, "_compile_only", _record(compiled))
    op._fused_sample_run(*args)
    kinds = ahead._real_kinds((*args[:6], ahead.seed_class(args[6]), *args[7:]))
    ahead._dry_run(op._fused_sample_run, kinds, share=(index, 3))
    assert len(launched) > 3 and compiled == launched[index::3]


def test_a_dry_run_compiles_each_specialization_once(monkeypatch):
    """Dry runs of several calls (other batch sizes) share their launches' compiles: a launch
    is compiled unless one of the same specialization was (its ints' classes, its tensors'
    dtypes and alignment, its keywords' values: the constexprs)."""
    compiled = []
    monkeypatch.setattr(launch_module, "_compile_only", lambda *launch: compiled.append(launch))
    kernel = object()
    with launch_module.compile_ahead(threads=1):
        x = torch.empty(8)
        launch_module.launch(kernel, (1,), x, 5, BLOCK=16)
        launch_module.launch(kernel, (2,), x, 7, BLOCK=16)  # (another grid, the same kernel)
        launch_module.launch(kernel, (1,), x, 5, BLOCK=32)
        launch_module.launch(kernel, (1,), x, 32, BLOCK=16)
        launch_module.launch(kernel, (1,), x[1:], 5, BLOCK=16)
    assert [(launch[2][1:], launch[3]) for launch in compiled] == [
        ((5,), {"BLOCK": 16}), ((5,), {"BLOCK": 32}), ((32,), {"BLOCK": 16}),
        ((5,), {"BLOCK": 16}),
    ]  # fmt: skip
    assert compiled[-1][2][0].storage_offset() == 1


def test_a_first_run_waits_for_children_compiling_its_kind(monkeypatch):
    """A first run of a batch size whose kernels children are compiling (the other batch
    sizes of a dynamic-batch graph) waits for them rather than compiling them again."""
    from concurrent.futures import Future

    args = _flat_call(monkeypatch, CALLS["top_k"])
    args = (*args[:6], ahead.seed_class(args[6]), *args[7:])
    running = Future()
    threading.Timer(0.1, running.set_result, (None,)).start()
    monkeypatch.setattr(ahead, "MODE", "1")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)  # (no CUDA)
    monkeypatch.setattr(ahead, "_other_batches_running", [([ahead._real_kinds(args)], running)])
    ahead.before_first_run(op._fused_sample_run, args)
    assert running.done()


def test_children_run_the_dry_run(monkeypatch, tmp_path):
    """The children, started ahead (``prestart``: the backend, before AOT), get the call and
    its kinds (pickled: the call by reference) and run it, say so, then run the calls of
    other batch sizes. (One child: each imports torch, seconds on a CPU.)"""
    import pathlib

    monkeypatch.setattr(ahead, "_PROCESSES", 1)
    monkeypatch.setattr(ahead, "MODE", "1")
    monkeypatch.setattr(ahead, "WORKERS", "processes")
    ahead.prestart()
    [(waiting, _, _)] = ahead._waiting_children
    ran, later = tmp_path / "ran", tmp_path / "later"
    cpu = torch.device("cpu")
    running = ahead._compile_in_children(pathlib.Path.touch, [(cpu, ran)], [(cpu, later)])
    assert ran.exists() and not ahead._waiting_children
    # (then the calls nothing waits for, which it runs after it has said it is done and
    # this process's graph has compiled: its first run releases it)
    assert [child[0] for child in running] == [waiting]
    time.sleep(1.0)
    assert not later.exists() and waiting.poll() is None
    ahead._release_held_children()
    ahead._reap(running)
    assert later.exists() and waiting.returncode == 0


@pytest.mark.parametrize("handoff", HANDOFFS)
def test_symbolic_sizes_are_read_as_the_calls(monkeypatch, handoff):
    """A graph with a dynamic batch (a step compiled again for a second batch size) is
    compiled ahead for the call it is compiled for: the pass's key of the traced call, its
    sizes read as their hints, is the key of that call's first run; and then for the batch
    sizes it may meet next."""
    started = _compiled_ahead_by_the_pass(monkeypatch, "symbolic", handoff)
    assert isinstance(started[0].shape[0], torch.SymInt)
    kinds = ahead._fake_kinds(started)
    assert kinds == _real_call_kinds(monkeypatch, KNOBS)
    # The kernels of other batch sizes, compiled ahead after its own: the same call's keys
    # at those sizes.
    monkeypatch.setattr(ahead, "_OTHER_BATCHES", (2, 8, 64))  # (opt-in)
    others = ahead._other_batches(started, kinds)
    assert [other[1][0][0] for other in others] == [2, 8, 64]
    assert _real_call_kinds(monkeypatch, KNOBS, rows=8) in others


def test_settled_cache_keys_do_not_depend_on_what_ran_before():
    """Triton 3.6 merges a callee's global constants into its caller's cache key before it
    computes the callee's key, so a kernel's key depended on the keys computed before it
    (a child's truncating stage 2 was not the parent's): ``_settle_cache_keys`` computes
    callees first, after which the key is the same whatever ran before. (In a process of its
    own: the interpreter's kernels have no cache key.)"""
    result = subprocess.run(
        [sys.executable, "-c", _SETTLED_KEYS_CHECK],
        env={**os.environ, "TRITON_INTERPRET": "0"}, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]


def test_every_kernel_module_has_its_keys_settled():
    """``_settle_cache_keys`` settles the modules of ``_KERNEL_MODULES`` only: a module of
    ``@triton.jit`` functions left out (the swapped kernel's was) keeps keys that depend on
    what ran before, and its kernels compiled by the children compile again here."""
    import importlib
    import pkgutil

    from triton.runtime import jit

    import flashsampling_inductor

    callable_type = getattr(jit, "JITCallable", jit.JITFunction)
    with_kernels = set()
    for module_info in pkgutil.iter_modules(flashsampling_inductor.__path__):
        module = importlib.import_module(f"flashsampling_inductor.{module_info.name}")
        for value in vars(module).values():
            if isinstance(value, callable_type) and value.fn.__module__ == module.__name__:
                with_kernels.add(module_info.name)
    assert with_kernels, "no @triton.jit function found"
    assert with_kernels <= set(ahead._KERNEL_MODULES), with_kernels - set(ahead._KERNEL_MODULES)


_SETTLED_KEYS_CHECK = """
import importlib
from triton.runtime import jit
from flashsampling_inductor import ahead

def update_hash_as_triton_3_6(self, func):
    self.used_global_vals.update(func.used_global_vals)
    self.hasher.update((func.cache_key + str(getattr(func, "noinline", False))).encode())

jit.DependenciesFinder._update_hash = update_hash_as_triton_3_6
names = ("sampling_device", "sampling_kernel", "truncation_kernel", "knob_check")
modules = [importlib.import_module(f"flashsampling_inductor.{name}") for name in names]
functions = [v for m in modules for v in vars(m).values() if isinstance(v, jit.JITFunction)]
kernel_modules = ahead._KERNEL_MODULES

def stage2_key(before=(), settle=True, order=kernel_modules):
    for function in functions:  # (as in a new process)
        function.hash, function.used_global_vals = None, {}
    for function in before:
        function.cache_key
    ahead._KERNEL_MODULES = order
    if settle:
        ahead._settle_cache_keys()
    return modules[2]._truncated_stage2.cache_key

stage1, check = modules[1]._sample_stage1, modules[3]._all_in_range
# The bug: a child (stage 2 alone) and the parent (stage 1 first) disagreed.
alone, after_stage1 = stage2_key(settle=False), stage2_key([stage1], settle=False)
assert alone != after_stage1
# Settled: a child, the parent (its knob check launched before), another order agree.
keys = {stage2_key(), stage2_key([check]), stage2_key(order=kernel_modules[::-1])}
assert len(keys) == 1 and not keys & {alone, after_stage1}, keys
"""


@pytest.mark.parametrize("handoff", HANDOFFS)
def test_a_static_graph_compiles_other_batch_sizes_ahead(monkeypatch, handoff):
    """A step's first graph is static (its batch a number; B = 1 included): its call's
    kinds at other batch sizes, compiled ahead once it has compiled, are those of the
    graph with a dynamic batch that the next batch size compiles, and of that size's first
    run, so that neither compiles them again."""
    static = _compiled_ahead_by_the_pass(monkeypatch, "fake", handoff)
    symbolic = _compiled_ahead_by_the_pass(monkeypatch, "symbolic", handoff)
    monkeypatch.setattr(ahead, "_OTHER_BATCHES", (1, 2, 8, 64))
    kinds = ahead._fake_kinds(static)
    others = ahead._other_batches(static, kinds)
    assert others == [ahead._fake_kinds(symbolic, batch=rows) for rows in (1, 2, 8, 64)]
    assert _real_call_kinds(monkeypatch, KNOBS, rows=8) in others
    # (a graph whose call another size's children compile starts none of its own)
    monkeypatch.setattr(ahead, "_other_batches_running", [(others, None)])
    assert ahead._compiling_in_children(ahead._fake_kinds(symbolic, batch=8)) == [None]
    assert ahead._other_batches(symbolic, ahead._fake_kinds(symbolic)) == []


def test_children_key_their_compiles_with_this_process_ptxas(monkeypatch):
    """A child keys its compiles with the parent's ptxas version (Triton reads it once per
    process; Inductor may point TRITON_PTXAS_PATH at another ptxas after that)."""
    compiler = pytest.importorskip("triton.backends.nvidia.compiler")
    own = compiler.get_ptxas_version
    monkeypatch.setattr(compiler, "get_ptxas_version", own)
    ahead._use_ptxas_versions({90: "the parent's"})
    assert compiler.get_ptxas_version(90) == "the parent's"
    assert ahead._ptxas_versions([(torch.device("cpu"), None)]) == {}


def test_a_timing_can_wait_for_the_background_compiles(monkeypatch):
    """``wait_for_background_compiles`` returns once the children compiling other batch
    sizes have ended."""
    from concurrent.futures import Future

    running = Future()
    threading.Timer(0.1, running.set_result, (None,)).start()
    monkeypatch.setattr(ahead, "_other_batches_running", [([], running)])
    ahead.wait_for_background_compiles()
    assert running.done()


@pytest.mark.parametrize(
    "handoff, expected",
    [
        ("now", ["pass rewrote", "handed off", "joint passes ended", "post-grad passes"]),
        ("late", ["pass rewrote", "joint passes ended", "handed off", "post-grad passes"]),
    ],
)
def test_when_the_backend_hands_off_the_calls(monkeypatch, handoff, expected):
    """The backend's compile hands the pass's call to the compile ahead after Inductor's joint
    graph passes and before its post-grad passes (``FLASHSAMPLING_COMPILE_AHEAD_HANDOFF=late``,
    the default), or with ``=now`` in the pass (then stopped: nothing after matters here)."""
    from flashsampling_inductor import graph_pass

    from .test_patterns import hidden, nanogpt

    events = []

    def rewritten(node):
        if node.target in op._FUSED_IMPLS:
            events.append("pass rewrote")
            ahead.in_background(op._fused_sample_run, (node.name,))

    def post_grad(graph):
        events.append("post-grad passes")
        raise RuntimeError("stop")

    monkeypatch.setattr(ahead, "MODE", "1")
    monkeypatch.setattr(ahead, "HANDOFF", handoff)
    monkeypatch.setattr(ahead, "_not_handed_off", [])
    monkeypatch.setattr(graph_pass, "compile_ahead_in_background", rewritten)
    monkeypatch.setattr(ahead, "_start_in_background", lambda *call: events.append("handed off"))
    options = {
        "joint_custom_post_pass": lambda graph: events.append("joint passes ended"),
        "post_grad_custom_pre_pass": post_grad,
    }  # (passes without a uuid: no cache skips the compile)
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed), torch.no_grad():
        torch.compile(nanogpt, backend="flashsampling", fullgraph=True, options=options)(
            hidden(3, 5, 24)
        )
    torch._dynamo.reset()
    assert events == expected and not ahead._not_handed_off


def test_a_first_run_hands_off_calls_left(monkeypatch):
    """A call the pass kept for a late hand-off that no inner compile handed off (a compile
    that stopped before it) is handed off at the first run."""
    args = _flat_call(monkeypatch, CALLS["top_k"])
    args = (*args[:6], ahead.seed_class(args[6]), *args[7:])
    started = []
    monkeypatch.setattr(ahead, "MODE", "1")
    _handing_off(monkeypatch, "late")
    monkeypatch.setattr(ahead, "_not_handed_off", [])
    monkeypatch.setattr(ahead, "_start_in_background", lambda run, args: started.append(args))
    monkeypatch.setattr(ahead, "_kinds_seen", {ahead._real_kinds(args)})  # (no dry run here)
    ahead.in_background(op._fused_sample_run, args)
    assert not started
    ahead.before_first_run(op._fused_sample_run, args)
    assert started == [args] and not ahead._not_handed_off


def test_a_failed_hand_off_fails_no_compile(monkeypatch):
    """A call whose compile ahead cannot start (here: no kinds) is dropped at the hand-off,
    as in the pass: the backend's compile goes on."""
    monkeypatch.setattr(ahead, "MODE", "1")
    _handing_off(monkeypatch, "late")
    monkeypatch.setattr(ahead, "_not_handed_off", [])
    ahead.in_background(op._fused_sample_run, ())
    ahead.hand_off()
    assert not ahead._not_handed_off


def test_the_pass_outside_the_backend_hands_off_in_the_pass(monkeypatch):
    """The pass set on stock Inductor by hand (no backend compiling, so no inner compile to
    hand off from): its calls go to the compile ahead at once, also with the late default."""
    started = []
    monkeypatch.setattr(ahead, "MODE", "1")
    monkeypatch.setattr(ahead, "HANDOFF", "late")
    monkeypatch.setattr(ahead, "_not_handed_off", [])
    monkeypatch.setattr(ahead, "_start_in_background", lambda run, args: started.append(args))
    ahead.in_background(op._fused_sample_run, ("call",))
    assert started == [("call",)] and not ahead._not_handed_off
    with ahead.backend_hands_off():
        ahead.in_background(op._fused_sample_run, ("later",))
    assert started == [("call",)] and ahead._not_handed_off == [(op._fused_sample_run, ("later",))]
