"""``return_logprobs`` at real size on a GPU: V = 151936 (Qwen3), D = 4096, bf16.

Run with ``pytest -m gpu tests/test_gpu_logprobs.py`` on a CUDA machine (skipped elsewhere).
Each call's log-probabilities, at the tokens it drew, against float64 ``log_softmax`` of
the fp32 logits (tests/test_logprobs.py says what "raw" and "processed" are).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from flashsampling_inductor import fused_sample
from flashsampling_inductor.reference import reference_logits

from .gpu_problems import CUDA, VOCAB, masked_bias, per_row, temperature_rows
from .sampling_oracle import make_exact_problem, make_problem
from .test_logprobs import ATOL, RTOL, expected_logprobs

pytestmark = pytest.mark.gpu


@dataclasses.dataclass(frozen=True)
class GpuCase:
    batch: int
    mode: str
    exact: bool = True  # make_exact_problem: logits exact in fp32 in any summation order
    temperature: str | float = 0.9  # "rows": [B] in 0.5 .. 1.5 with greedy rows
    num_samples: int = 1
    bias: bool = False
    logits_dtype: torch.dtype | None = None
    softcap: float | None = None
    top_k: int | str | None = None  # "rows": [B] cycling 0 (off), 20, 50, 1000
    top_p: float | str | None = None  # "rows": [B] cycling 1.0, 0.9, 0.5, 0.95
    min_p: float | None = None


GPU_CASES = [
    pytest.param(GpuCase(1, "raw"), id="b1-raw"),
    pytest.param(
        GpuCase(64, "processed", temperature="rows", num_samples=2, bias=True),
        id="b64-processed-rows-greedy-ns2-bias",
    ),
    pytest.param(GpuCase(64, "raw", exact=False), id="b64-raw-random"),
    pytest.param(
        GpuCase(256, "raw", logits_dtype=torch.bfloat16, bias=True), id="b256-raw-logits-bf16"
    ),
    pytest.param(GpuCase(64, "processed", top_k=50, top_p=0.9), id="b64-processed-top-k-p"),
    pytest.param(
        GpuCase(64, "processed", temperature="rows", top_k="rows", top_p="rows", min_p=0.05),
        id="b64-processed-per-row-truncation",
    ),
    pytest.param(GpuCase(1, "raw", top_p=0.9, softcap=30.0), id="b1-raw-top-p-softcap"),
]


def _knob(value, batch: int, cycle: list):
    return per_row(cycle, batch) if value == "rows" else value


def _arguments(case: GpuCase) -> dict:
    problem = make_exact_problem if case.exact else make_problem
    hidden, weight = problem(case.batch, VOCAB, 4096, torch.bfloat16, device=CUDA)
    temperature = temperature_rows(case.batch) if case.temperature == "rows" else case.temperature
    return dict(
        hidden=hidden,
        weight=weight,
        bias=masked_bias() if case.bias else None,
        temperature=temperature,
        seed=1234,
        num_samples=case.num_samples,
        logits_dtype=case.logits_dtype,
        softcap=case.softcap,
        top_k=_knob(case.top_k, case.batch, [0, 20, 50, 1000]),
        top_p=_knob(case.top_p, case.batch, [1.0, 0.9, 0.5, 0.95]),
        min_p=case.min_p,
    )


@pytest.mark.parametrize("case", GPU_CASES)
def test_gpu_logprobs_match_float64(case):
    arguments = _arguments(case)
    tokens, logprobs = fused_sample(**arguments, impl="triton", return_logprobs=case.mode)
    plain = fused_sample(**arguments, impl="triton")
    assert torch.equal(tokens, plain)  # asking for logprobs changes no token
    logits = reference_logits(
        arguments["hidden"], arguments["weight"], arguments["bias"], case.logits_dtype
    )
    temperature = torch.as_tensor(arguments["temperature"], device=CUDA).float()
    expected = expected_logprobs(
        logits, tokens, case.mode, temperature.expand(case.batch), softcap=case.softcap,
        top_k=arguments["top_k"], top_p=arguments["top_p"], min_p=arguments["min_p"],
    )  # fmt: skip
    assert torch.isfinite(expected).all()
    # Random bf16 problems: the kernel's fp32 logits and torch's sum D = 4096 products in
    # other orders, an fp32 rounding of logits up to ~10 apart.
    atol = ATOL if case.exact else 2e-5
    torch.testing.assert_close(logprobs.double(), expected, rtol=RTOL, atol=atol)


def test_gpu_logprobs_in_a_cuda_graph():
    """Captured once, replayed: the eager tokens and log-probabilities (no host sync)."""
    arguments = _arguments(GpuCase(64, "processed", top_k=50))
    arguments["seed"] = torch.arange(64, device=CUDA) * 7919 + 5
    tokens, logprobs = fused_sample(**arguments, return_logprobs="processed")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured_tokens, captured_logprobs = fused_sample(**arguments, return_logprobs="processed")
    captured_tokens.fill_(-1)
    captured_logprobs.fill_(0.5)
    graph.replay()
    assert torch.equal(captured_tokens, tokens)
    torch.testing.assert_close(captured_logprobs, logprobs)
