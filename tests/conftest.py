"""Test session set-up: the Triton interpreter on machines without CUDA, and device markers.

``TRITON_INTERPRET`` must be in the environment before ``triton`` is first imported (the
``@triton.jit`` decorator reads it), so it is set here, at the top of the first module
pytest imports; ``import torch`` does not import triton.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# A pattern check that raises (other than its NoMatch refusals) fails the test, where users
# get a warning and the site left unfused (patterns/_rewrite.py).
os.environ.setdefault("FLASHSAMPLING_STRICT", "1")
# Off CUDA the pass leaves sampling stock by default (the fused op's CPU path is slower);
# the suite runs on CPUs too, so it asks for the rewrite there (test_explain.py checks the
# default). Subprocesses (TP ranks, compile checks) inherit it.
os.environ.setdefault("FLASHSAMPLING_CPU", "1")
os.environ.setdefault("FLASHSAMPLING_FP32", "1")  # (fp32 LM heads on CUDA rewritten too)

import pytest  # noqa: E402


def _patch_the_language_once_per_launch():
    """Triton's interpreter re-patches triton.language (inspect.getmembers over tl, tl.tensor,
    tl.math) on every call of a @triton.jit device function, though the kernel's launch
    has already patched the same modules and the repeat changes nothing: close to half of
    the interpreter's time in a truncating call (the min-p grid of test_truncation_stage2:
    26.9 -> 15.1 s of CPU time). Within a launch, a device function whose language modules
    the launch has patched skips the repeat. Nothing else changes; a Triton without these
    internals runs as it is."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter

        patch_lang, launch = interpreter._patch_lang, interpreter.GridExecutor.__call__
        empty_scope = interpreter._LangPatchScope
    except (ImportError, AttributeError):
        return
    launches = []  # per launch in progress: the ids of the language modules it patched

    def patch_lang_once(fn):
        langs = {id(value) for value in fn.__globals__.values() if value is tl or value is tl.core}
        if launches and langs <= launches[-1]:
            return empty_scope()
        if launches:
            launches[-1].update(langs)
        return patch_lang(fn)

    def launch_patching_once(self, *args, **kwargs):
        launches.append(set())
        try:
            return launch(self, *args, **kwargs)
        finally:
            launches.pop()

    interpreter._patch_lang = patch_lang_once
    interpreter.GridExecutor.__call__ = launch_patching_once


if os.environ.get("TRITON_INTERPRET") == "1":
    _patch_the_language_once_per_launch()


# The files that take longest on a CPU, longest first (CI's per-test times, 2026-11-29).
# ./dev.sh test hands whole files to one pytest-xdist worker per core in collection order
# (--dist loadfile --no-loadscope-reorder): the long ones start first, so that none starts
# last and leaves the other cores idle. Files not named follow in their usual order.
LONGEST_FILES = (
    "test_truncation.py",
    "test_truncation_stage2.py",
    "test_truncation_candidates.py",
    "test_statistics.py",
    "test_min_p_softcap.py",
    "test_sample_logits_kernels.py",
    "test_tp_pass.py",
    "test_truncation_key_search.py",
    "test_hf.py",
    "test_tp.py",
    "test_logprobs.py",
    "test_graph_pass.py",
    "test_hf_batching.py",
    "test_fused_sample.py",
    "test_compile_ahead.py",
    "test_noise.py",
    "test_patterns.py",
)


def pytest_collection_modifyitems(config, items):
    """Run the longest files first; skip ``gpu`` tests without CUDA and ``multigpu`` tests
    with fewer than two GPUs."""
    rank = {name: position for position, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: files stay whole
    gpu_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_multigpu = pytest.mark.skip(reason="needs at least two CUDA GPUs")
    for item in items:
        if "gpu" in item.keywords and gpu_count == 0:
            item.add_marker(skip_gpu)
        if "multigpu" in item.keywords and gpu_count < 2:
            item.add_marker(skip_multigpu)


@pytest.fixture
def overflowed(monkeypatch):
    """The overflow code of every row, per fused call, as stage 2 left them for the
    fallback: 0 (stage 2 drew the row), OVERFLOW_FULL or OVERFLOW_PATCH."""
    from torch._subclasses.fake_tensor import FakeTensor

    from flashsampling_inductor import truncation_kernel

    codes = []
    launch = truncation_kernel.launch_fallback

    def record(hidden, weight, bias, params, temperature_mode, out, overflow, *rest):
        # (a CUDA-graph capture cannot copy to the host: its flags are not recorded; nor
        # are a compile-ahead dry run's, whose tensors are fake: ahead.py)
        capturing = overflow.is_cuda and torch.cuda.is_current_stream_capturing()
        if not (capturing or isinstance(overflow, FakeTensor)):
            codes.append(overflow.clone().cpu())
        return launch(hidden, weight, bias, params, temperature_mode, out, overflow, *rest)

    monkeypatch.setattr(truncation_kernel, "launch_fallback", record)
    return codes
