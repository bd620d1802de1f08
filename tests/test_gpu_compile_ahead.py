"""A call's kernels compiled ahead, in parallel (flashsampling_inductor/ahead.py): the dry run
allocates nothing on the GPU, launches nothing and draws nothing from the generator, so
the first call's tokens are the ones a call without it makes; a compiled step's call is
compiled ahead by the graph pass and gives the eager op's tokens. GPU only
(``pytest -m gpu``)."""

from __future__ import annotations

import collections
import importlib
import os
import threading
import time

import pytest
import torch
import torch.nn.functional as F
import triton
from torch._dynamo.utils import counters

from flashsampling_inductor import ahead, dispatch, fused_sample, launch, op

pytestmark = pytest.mark.gpu

KNOBS = {
    "plain": {},
    "top_k": {"top_k": 50},
    "top_k_top_p_rows": {"top_k": 20, "top_p": torch.tensor([0.95, 1.0, 0.5]).repeat(3)},
    "softcap_raw_logprobs": {"top_k": 50, "softcap": 30.0, "return_logprobs": "raw"},
}


def _inputs(rows=9):
    torch.manual_seed(0)
    hidden = torch.randn(rows, 256, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(3000, 256, device="cuda", dtype=torch.bfloat16)
    return hidden, weight


@pytest.mark.parametrize("knobs", KNOBS.values(), ids=KNOBS.keys())
def test_gpu_dry_run_touches_nothing(monkeypatch, knobs):
    hidden, weight = _inputs()
    knobs = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in knobs.items()}
    calls = []
    original = op._fused_sample_run
    monkeypatch.setattr(op, "_fused_sample_run", lambda *a: calls.append(a) or original(*a))
    fused_sample(hidden, weight, temperature=0.8, num_samples=2, **knobs)
    args = calls[0]  # (the real call's; a dry run of it may follow, on fakes)
    monkeypatch.setattr(op, "_fused_sample_run", original)
    kinds = ahead._real_kinds((*args[:6], ahead.seed_class(args[6]), *args[7:]))
    torch.cuda.synchronize()
    allocated, rng = torch.cuda.memory_allocated(), torch.cuda.get_rng_state()
    torch.cuda.reset_peak_memory_stats()
    ahead._dry_run(op._fused_sample_run, kinds)
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() == allocated
    assert torch.equal(torch.cuda.get_rng_state(), rng)


@pytest.mark.parametrize("knobs", KNOBS.values(), ids=KNOBS.keys())
def test_gpu_first_call_tokens_equal_later_calls(monkeypatch, knobs):
    hidden, weight = _inputs()
    knobs = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in knobs.items()}
    monkeypatch.setattr(ahead, "_kinds_seen", set())
    monkeypatch.setattr(ahead, "MODE", "first")
    torch.manual_seed(1)
    first = fused_sample(hidden, weight, temperature=0.8, num_samples=2, **knobs)
    assert ahead._kinds_seen, "the first call did not compile ahead"
    monkeypatch.setattr(ahead, "MODE", "0")
    torch.manual_seed(1)
    again = fused_sample(hidden, weight, temperature=0.8, num_samples=2, **knobs)
    torch.testing.assert_close(first, again, rtol=0, atol=0)


@pytest.mark.parametrize("knobs", [{}, {"top_k": 50, "top_p": 0.9}], ids=["plain", "top_k_top_p"])
def test_gpu_sample_logits_without_waiting_draws_on_the_reference_until_compiled(
    monkeypatch, knobs
):
    """hf generate's prompt token: the first call of a kind draws on the reference and starts
    the kernels' compile behind it; once that has ended, the kernels draw, the same tokens;
    ``sample_logits`` itself waits for its kernels and draws them too."""
    torch.manual_seed(0)
    logits = (5 * torch.randn(7, 3001, device="cuda")).bfloat16()
    monkeypatch.setattr(ahead, "_kinds_seen", set())
    monkeypatch.setattr(ahead, "_started_by_compiled", {})
    monkeypatch.setattr(ahead, "MODE", "1")
    on_kernels = []
    original = dispatch.triton_sample_logits

    def counted(logits, *args):
        if type(logits) is torch.Tensor:  # (not the compile ahead's dry run, on fakes)
            on_kernels.append(1)
        return original(logits, *args)

    monkeypatch.setattr(dispatch, "triton_sample_logits", counted)
    call = dict(temperature=0.7, seed=11, num_samples=2, **knobs)
    first = op.sample_logits_without_waiting(logits, **call)
    assert not on_kernels, "the first call waited for the kernels"
    ahead.wait_for_background_compiles()
    assert torch.equal(op.sample_logits_without_waiting(logits, **call), first)
    assert on_kernels == [1]
    assert torch.equal(op.sample_logits(logits, **call), first)
    assert torch.equal(op.sample_logits(logits, impl="torch", **call), first)


def test_gpu_compiled_step_is_compiled_ahead_by_the_pass(monkeypatch):
    """transformers' top-k warper and multinomial, compiled: the pass starts the rewritten
    call's compile in the background, and the first run waits for it."""
    hidden, weight = _inputs(rows=5)
    monkeypatch.setattr(ahead, "_kinds_seen", set())
    monkeypatch.setattr(ahead, "MODE", "1")
    torch._dynamo.reset()
    counters.clear()

    def step(hidden, weight):
        scores = F.linear(hidden, weight) / 0.7
        indices_to_remove = scores < torch.topk(scores, 50)[0][..., -1, None]
        scores = scores.masked_fill(indices_to_remove, -float("Inf"))
        return torch.multinomial(F.softmax(scores, dim=-1), num_samples=1)

    with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):
        tokens = torch.compile(step, backend="flashsampling", dynamic=False)(hidden, weight)
    assert sum(counters["flashsampling"].values()) == 1
    assert tokens.shape == (5, 1)
    # (1: the first run found the pass's kind; 2: it compiled its own kind ahead again)
    print(f"kinds compiled ahead: {len(ahead._kinds_seen)}")
    assert ahead._kinds_seen, "the pass started no compile"
    assert not launch._pending


def test_gpu_children_compile_into_the_cache(monkeypatch, tmp_path):
    """``FLASHSAMPLING_COMPILE_AHEAD_IN=processes``: the children compile every kernel of the
    call, and build its launcher, into this process's Triton cache directory, where the first
    launch finds them (it compiles nothing, so it writes nothing there), and they take no GPU
    memory."""
    from triton.runtime import jit

    for name in ahead._KERNEL_MODULES:  # (their keys as in a new process, then settled as
        try:  # the parent settles them)
            module = importlib.import_module(f"flashsampling_inductor.{name}")
        except ImportError:
            continue
        for function in [v for v in vars(module).values() if isinstance(v, jit.JITFunction)]:
            monkeypatch.setattr(function, "hash", None)
            monkeypatch.setattr(function, "used_global_vals", {})
    ahead._settle_cache_keys()
    hidden, weight = _inputs()
    calls = []
    original = op._fused_sample_run
    monkeypatch.setattr(op, "_fused_sample_run", lambda *a: calls.append(a) or original(*a))
    monkeypatch.setattr(ahead, "MODE", "0")
    fused_sample(hidden, weight, temperature=0.8, top_k=50)
    monkeypatch.setattr(op, "_fused_sample_run", original)
    launched = []
    real_launch = launch._launch_by_triton
    monkeypatch.setattr(
        launch, "_launch_by_triton", lambda k, *rest: launched.append(k) or real_launch(k, *rest)
    )
    monkeypatch.setattr(launch, "_compiled", {})
    original(*calls[0])
    kernels = {kernel.fn.__name__ for kernel in launched}
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    # Inductor points TRITON_PTXAS_PATH at torch's own ptxas when it first compiles in this
    # process, after this process's compiles have cached the version of Triton's (the key's):
    # a ptxas that says another version, as torch's did when this test failed after the
    # file's other tests (H200, torch 2.11). The children key their compiles as this process.
    from triton.backends.nvidia import compiler

    major, minor = torch.cuda.get_device_capability()
    real_ptxas = compiler.get_ptxas(major * 10 + minor).path
    print(  # (what made the children's keys differ before the fix, on the record)
        f"TRITON_PTXAS_PATH before this test: {os.environ.get('TRITON_PTXAS_PATH')!r}, "
        f"ptxas {real_ptxas}, this process's key's version "
        f"{compiler.get_ptxas_version(major * 10 + minor).splitlines()[-1:]}"
    )
    other_ptxas = tmp_path.parent / "ptxas_saying_another_version"
    other_ptxas.write_text(
        f'#!/bin/sh\n[ "$1" = --version ] && echo "another ptxas" \nexec {real_ptxas} "$@"\n'
    )
    other_ptxas.chmod(0o755)
    monkeypatch.setenv("TRITON_PTXAS_PATH", str(other_ptxas))
    args = calls[0]
    kinds = ahead._real_kinds((*args[:6], ahead.seed_class(args[6]), *args[7:]))
    children = threading.Thread(target=ahead._compile_in_children, args=(original, [kinds]))
    free_before, free_least = torch.cuda.mem_get_info()[0], None
    children.start()
    while children.is_alive():  # (a CUDA context a child made would take GPU memory)
        free = torch.cuda.mem_get_info()[0]
        free_least = free if free_least is None else min(free_least, free)
        time.sleep(0.05)
    print(f"GPU memory the children took at most: {(free_before - free_least) / 2**20:.0f} MiB")
    assert free_before - free_least < 256 * 2**20
    cubins = {path.stem for path in tmp_path.rglob("*.cubin")}
    launchers = list(tmp_path.rglob("__triton_launcher*"))
    print(f"children compiled {sorted(cubins)}, {len(launchers)} launchers; launched {kernels}")
    assert kernels <= cubins
    triton_version = tuple(int(part) for part in triton.__version__.split(".")[:2])
    if triton_version <= (3, 6):  # (a C launcher per kernel; newer Tritons have one for all)
        assert len(launchers) >= len(kernels)
    written = {path for path in tmp_path.rglob("*") if path.is_file()}
    for kernel in set(launched):  # (as in a new process: Triton's cache on disk only)
        monkeypatch.setattr(kernel, "device_caches", collections.defaultdict(kernel.create_binder))
    monkeypatch.setattr(launch, "_compiled", {})
    original(*calls[0])
    new = sorted({p.name for p in tmp_path.rglob("*") if p.is_file() and p not in written})
    if new:
        why = _why_compiled_again(tmp_path, written, launched)
        pytest.fail(f"compiled again here: {new}\n{why}")


def _why_compiled_again(cache, written, launched) -> str:
    """What differs between a kernel's compile in the children and its compile here (its
    metadata's fields, and its source key here and in a new process), for the failure's
    message."""
    import json
    import subprocess
    import sys

    lines = []
    for path in cache.rglob("*.json"):
        if path in written or path.name.startswith("__grp__"):
            continue
        here = json.loads(path.read_text())
        for before in (p for p in written if p.name == path.name):
            child = json.loads(before.read_text())
            differ = {k: (child.get(k), here.get(k)) for k in child.keys() | here.keys()}
            differ = {k: v for k, v in differ.items() if v[0] != v[1]}
            lines.append(f"{path.stem}: (children's, here) {differ}")
    names = sorted({kernel.fn.__name__ for kernel in launched})
    modules = {kernel.fn.__name__: kernel.fn.__module__ for kernel in launched}
    code = (
        "import importlib; from flashsampling_inductor import ahead; ahead._settle_cache_keys()\n"
        f"for name, module in {modules!r}.items():\n"
        "    print(name, getattr(importlib.import_module(module), name).cache_key)"
    )
    fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    here_keys = {kernel.fn.__name__: kernel.cache_key for kernel in launched}
    lines.append(f"source keys here {[here_keys[n] for n in names]}")
    lines.append(f"in a new process: {fresh.stdout.strip()!r} {fresh.stderr[-500:]!r}")
    return "\n".join(lines)
