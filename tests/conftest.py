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

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """Skip ``gpu`` tests without CUDA and ``multigpu`` tests with fewer than two GPUs."""
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
    from flashsampling_inductor import truncation_kernel

    codes = []
    launch = truncation_kernel.launch_fallback

    def record(hidden, weight, bias, params, temperature_mode, out, overflow, *rest):
        # (a CUDA-graph capture cannot copy to the host: its flags are not recorded)
        if not (overflow.is_cuda and torch.cuda.is_current_stream_capturing()):
            codes.append(overflow.clone().cpu())
        return launch(hidden, weight, bias, params, temperature_mode, out, overflow, *rest)

    monkeypatch.setattr(truncation_kernel, "launch_fallback", record)
    return codes
