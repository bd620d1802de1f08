"""``return_logprobs``: each drawn token's log-probability, against float64 ``log_softmax``.

"raw" is ``log_softmax`` of the logits the op samples from (after the bias and
``logits_dtype``, before soft-cap and temperature); "processed" is ``log_softmax(scores / T)``
over the tokens truncation keeps, 0.0 on greedy rows. Both are checked at the tokens the op
itself drew, so a near-tie between two tokens never matters here. Small shapes: the Triton
kernels run under the interpreter on CPU; tests/test_gpu_logprobs.py repeats the check at
V = 151936 on a GPU.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from flashsampling_inductor import dispatch, fused_sample, sample_logits, truncation_kernel
from flashsampling_inductor.params import SamplingParams
from flashsampling_inductor.reference import reference_logits, softcap_logits, truncation_keep

from .sampling_oracle import make_exact_problem, make_problem

# The kernels' cases run on CPU tensors under the interpreter. Where CUDA is, conftest.py
# leaves the interpreter off and Triton cannot take CPU pointers, so they are skipped there;
# tests/test_gpu_logprobs.py checks the kernels on the GPU at V = 151936 instead.
needs_interpreter = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1",
    reason="the kernels on CPU tensors need the Triton interpreter (GPU: test_gpu_logprobs.py)",
)
IMPLS = ["torch", pytest.param("triton", marks=needs_interpreter)]
FULL = truncation_kernel.OVERFLOW_FULL.value
PATCH = truncation_kernel.OVERFLOW_PATCH.value
# fp32 log-probabilities against float64: relative 1e-5, and an absolute floor for values
# near 0 (the log of a mass near 1 is good to a few fp32 ulps of 1).
RTOL, ATOL = 1e-5, 2e-6


def expected_logprobs(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    mode: str,
    temperature: torch.Tensor,
    *,
    softcap: float | None = None,
    top_k=None,
    top_p=None,
    min_p=None,
) -> torch.Tensor:
    """float64 log-probabilities of ``tokens`` [B, S] under fp32 ``logits`` [B, V], as the
    op defines them; the kept set is the reference's ``truncation_keep`` (fp32)."""
    batch, vocab_size = logits.shape
    if mode == "raw":
        return torch.log_softmax(logits.double(), dim=-1).gather(1, tokens)
    scores = softcap_logits(logits, softcap or 0.0)
    if any(knob is not None for knob in (top_k, top_p, min_p)):

        def rows(value, off, dtype):
            value = off if value is None else value
            return torch.as_tensor(value, dtype=dtype, device=logits.device).expand(batch)

        keep = truncation_keep(
            scores, temperature, rows(top_k, 0, torch.int64), rows(top_p, 1.0, torch.float32),
            rows(min_p, 0.0, torch.float32),
        )  # fmt: skip
        scores = scores.masked_fill(~keep, float("-inf"))
    greedy = temperature == 0
    scaled = scores.double() / torch.where(greedy, 1.0, temperature).double()[:, None]
    logprobs = torch.log_softmax(scaled, dim=-1).gather(1, tokens)
    return torch.where(greedy[:, None], 0.0, logprobs)


@dataclasses.dataclass(frozen=True)
class Case:
    batch: int = 4
    vocab_size: int = 600
    hidden_size: int = 32
    dtype: torch.dtype = torch.float32
    exact: bool = True  # logits exact in fp32 (make_exact_problem)
    temperature: float | str = 1.0  # "rows": [B] with greedy rows
    num_samples: int = 1
    bias: bool = False  # a bias with -inf (masked) tokens
    logits_dtype: torch.dtype | None = None
    softcap: float | None = None
    top_k: int | str | None = None  # "rows": a [B] tensor with 0 (off) rows
    top_p: float | str | None = None
    min_p: float | str | None = None


def _problem(case: Case):
    if case.exact:
        hidden, weight = make_exact_problem(
            case.batch, case.vocab_size, case.hidden_size, case.dtype, device=torch.device("cpu")
        )
    else:
        hidden, weight = make_problem(
            case.batch, case.vocab_size, case.hidden_size, case.dtype, device=torch.device("cpu")
        )
    bias = None
    if case.bias:
        bias = torch.linspace(-1.0, 1.0, case.vocab_size)
        bias[3::5] = float("-inf")
    return hidden, weight, bias


def _knobs(case: Case) -> dict:
    """The case's knobs; "rows" cycles per row through: top-p alone, top-k with min-p,
    all three, greedy, nothing (a plain row)."""
    batch = case.batch
    cycle = {
        "temperature": torch.tensor([0.6, 1.0, 1.7, 0.0, 0.9]),
        "top_k": torch.tensor([0, 5, 40, 0, 0]),
        "top_p": torch.tensor([0.5, 1.0, 0.9, 1.0, 1.0]),
        "min_p": torch.tensor([0.0, 0.2, 0.05, 0.0, 0.0]),
    }
    knobs = {}
    for name in ("temperature", "top_k", "top_p", "min_p"):
        value = getattr(case, name)
        knobs[name] = cycle[name].repeat(batch)[:batch] if value == "rows" else value
    return knobs


def _row_temperature(temperature, batch: int) -> torch.Tensor:
    return torch.as_tensor(temperature, dtype=torch.float32).expand(batch)


CASES = [
    pytest.param(Case(exact=False, temperature=0.7), id="fp32-random-t0.7"),
    pytest.param(Case(temperature="rows", num_samples=2, bias=True), id="rows-greedy-ns2-bias"),
    pytest.param(Case(dtype=torch.bfloat16, logits_dtype=torch.bfloat16), id="bf16-logits"),
    pytest.param(Case(temperature=0.0), id="greedy"),
    pytest.param(Case(softcap=2.0, temperature=0.8, bias=True), id="softcap-bias"),
]
TRUNCATION_CASES = {
    "top-p": Case(top_p=0.8),
    "min-p": Case(min_p=0.1, temperature=1.3),
    "k-p-min-p-bias": Case(top_k=50, top_p=0.9, min_p=0.05, bias=True),
    "per-row-knobs": Case(
        batch=5, top_k="rows", top_p="rows", min_p="rows", temperature="rows", num_samples=2
    ),
    "top-k-softcap": Case(top_k=10, softcap=3.0, temperature=0.7),
}
# The kernel's (slow under the interpreter): the per-row rows cover every knob's path, the
# soft-capped top-k the capped keys (test_merged_and_chunked_stage2_with_softcap "raw").
KERNEL_TRUNCATION_MODES = {"per-row-knobs": "processed", "top-k-softcap": "processed"}


def _check(case: Case, impl: str, mode: str, same_tokens: bool = True) -> None:
    hidden, weight, bias = _problem(case)
    knobs = _knobs(case)
    tokens, logprobs = fused_sample(
        hidden, weight, bias=bias, num_samples=case.num_samples, seed=7,
        logits_dtype=case.logits_dtype, softcap=case.softcap, impl=impl,
        return_logprobs=mode, **knobs,
    )  # fmt: skip
    assert logprobs.dtype == torch.float32 and logprobs.shape == tokens.shape
    if same_tokens:  # asking for logprobs changes no token
        plain = fused_sample(
            hidden, weight, bias=bias, num_samples=case.num_samples, seed=7,
            logits_dtype=case.logits_dtype, softcap=case.softcap, impl=impl, **knobs,
        )  # fmt: skip
        assert torch.equal(plain, tokens)
    logits = reference_logits(hidden, weight, bias, case.logits_dtype)
    temperature = _row_temperature(knobs["temperature"], case.batch)
    expected = expected_logprobs(
        logits, tokens, mode, temperature, softcap=case.softcap, top_k=knobs["top_k"],
        top_p=knobs["top_p"], min_p=knobs["min_p"],
    )  # fmt: skip
    assert torch.isfinite(expected).all()
    torch.testing.assert_close(logprobs.double(), expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("mode", ["raw", "processed"])
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", CASES)
def test_logprobs_match_float64(case, impl, mode):
    _check(case, impl, mode)


@pytest.mark.parametrize("mode", ["raw", "processed"])
@pytest.mark.parametrize("name", TRUNCATION_CASES)
def test_truncated_reference_logprobs_match_float64(name, mode):
    _check(TRUNCATION_CASES[name], "torch", mode)


@needs_interpreter
@pytest.mark.parametrize("name", KERNEL_TRUNCATION_MODES)
def test_truncated_kernel_logprobs_match_float64(name):
    _check(TRUNCATION_CASES[name], "triton", KERNEL_TRUNCATION_MODES[name], same_tokens=False)


@needs_interpreter
@pytest.mark.parametrize("mode, chunks", [("processed", 1), ("raw", 4)])
def test_kernel_logprobs_do_not_depend_on_tiles(mode, chunks):
    """Many narrow tiles, the epilogue in one or four chunks: log-probabilities as
    float64's."""
    from flashsampling_inductor.dispatch import SampleConfig, triton_fused_sample

    hidden, weight = make_exact_problem(3, 250, 32, torch.float32, device=torch.device("cpu"))
    temperature = torch.tensor([0.0, 0.8, 1.3])
    params = SamplingParams(temperature, 1.0, None, 11, 1, logprobs=mode)
    config = SampleConfig(16, 64, 32, epilogue_chunks=chunks)
    tokens, logprobs = triton_fused_sample(hidden, weight, None, params, config)
    expected = expected_logprobs(hidden @ weight.T, tokens, mode, temperature)
    torch.testing.assert_close(logprobs.double(), expected, rtol=RTOL, atol=ATOL)


def test_masked_row_gives_nan_as_log_softmax():
    """A row whose every token is masked: token 0 and NaN, as ``log_softmax`` gives."""
    hidden, weight = make_exact_problem(2, 300, 32, torch.float32, device=torch.device("cpu"))
    bias = torch.zeros(300)
    bias[:] = float("-inf")
    for impl in ["torch", "triton"] if os.environ.get("TRITON_INTERPRET") == "1" else ["torch"]:
        tokens, logprobs = fused_sample(
            hidden, weight, bias=bias, seed=1, impl=impl, return_logprobs="raw"
        )
        assert tokens.eq(0).all() and logprobs.isnan().all()


@pytest.mark.parametrize("mode", ["raw", "processed"])
def test_sample_logits_logprobs(mode):
    """``sample_logits`` returns what ``fused_sample`` returns on the same logits."""
    hidden, weight = make_exact_problem(4, 300, 32, torch.float32, device=torch.device("cpu"))
    temperature = torch.tensor([0.0, 0.5, 1.0, 2.0])
    knobs = dict(temperature=temperature, top_k=30, num_samples=2, seed=5, return_logprobs=mode)
    tokens, logprobs = sample_logits(hidden @ weight.T, **knobs)
    fused_tokens, fused_logprobs = fused_sample(hidden, weight, impl="torch", **knobs)
    assert torch.equal(tokens, fused_tokens)
    torch.testing.assert_close(logprobs, fused_logprobs)
    expected = expected_logprobs(hidden @ weight.T, tokens, mode, temperature, top_k=30)
    torch.testing.assert_close(logprobs.double(), expected, rtol=RTOL, atol=ATOL)


def test_compiled_call_returns_logprobs():
    """torch.compile(fullgraph=True) of a function that asks for logprobs: one custom op
    call with two outputs, the eager result."""
    hidden, weight = make_exact_problem(3, 300, 32, torch.float32, device=torch.device("cpu"))
    temperature = torch.tensor([0.0, 0.7, 1.2])

    def step(hidden, weight, temperature):
        tokens, logprobs = fused_sample(
            hidden, weight, temperature=temperature, top_p=0.9, seed=3,
            return_logprobs="processed",
        )  # fmt: skip
        return tokens, logprobs

    compiled = torch.compile(step, fullgraph=True)
    tokens, logprobs = compiled(hidden, weight, temperature)
    eager_tokens, eager_logprobs = step(hidden, weight, temperature)
    assert torch.equal(tokens, eager_tokens)
    torch.testing.assert_close(logprobs, eager_logprobs)


def test_arguments():
    hidden, weight = make_exact_problem(2, 100, 32, torch.float32, device=torch.device("cpu"))
    with pytest.raises(ValueError, match="return_logprobs"):
        fused_sample(hidden, weight, return_logprobs="log")
    with pytest.raises(ValueError, match="return_logprobs"):
        sample_logits(hidden @ weight.T, return_logprobs=True)
    tokens, logprobs = fused_sample(hidden[:0], weight, num_samples=2, return_logprobs="raw")
    assert tokens.shape == logprobs.shape == (0, 2) and logprobs.dtype == torch.float32
    assert isinstance(fused_sample(hidden, weight, seed=1), torch.Tensor)
    tokens, logprobs = torch.ops.flashsampling.fused_sample_logprobs(
        hidden, weight, None, None, 1.0, None, 1, 1, None, "torch", logprobs="raw"
    )
    assert tokens.shape == logprobs.shape == (2, 1)
    with pytest.raises(ValueError, match="return_logprobs"):
        torch.ops.flashsampling.fused_sample_logprobs(
            hidden, weight, None, None, 1.0, None, 1, 1, None, "torch", logprobs="other"
        )


@needs_interpreter
def test_truncation_paths(overflowed):
    """Per-row k, p and T on 16-wide tiles, two samples, a masked bias, "processed" (the
    survivors' mass): a row with its top 20 in the first tiles draws from those tiles
    recomputed (OVERFLOW_PATCH), a flat top-p 0.9 row from the whole recomputed row
    (OVERFLOW_FULL) and an ordinary row from the candidates: float64's log-probabilities.
    hidden = the logits, weight = I: the kernel's logits are exact."""
    from flashsampling_inductor.dispatch import SampleConfig, triton_fused_sample

    vocab_size = 400
    logits = torch.linspace(-2, 2, 3 * vocab_size).reshape(3, vocab_size)
    logits[0, :40] = 5.0 + torch.arange(40) / 64
    logits[1] = torch.arange(vocab_size) % 7 / 8
    logits[2] = -(torch.arange(vocab_size) % 10).float() + torch.arange(vocab_size) / 1024
    bias = torch.zeros(vocab_size)
    bias[7::11] = float("-inf")
    temperature = torch.tensor([1.0, 1.0, 0.7])
    top_k, top_p = torch.tensor([20, 0, 20]), torch.tensor([1.0, 0.9, 1.0])
    params = SamplingParams(
        temperature, 1.0, None, 9, 2, None, top_k, 0, top_p, 1.0, logprobs="processed"
    )
    tokens, logprobs = triton_fused_sample(
        logits, torch.eye(vocab_size), bias, params, SampleConfig(16, 16, 64)
    )
    (flags,) = overflowed
    assert flags.tolist() == [PATCH, FULL, 0]
    expected = expected_logprobs(
        logits + bias, tokens, "processed", temperature, top_k=top_k, top_p=top_p
    )
    torch.testing.assert_close(logprobs.double(), expected, rtol=RTOL, atol=ATOL)


@needs_interpreter
def test_merged_and_chunked_stage2_with_softcap(monkeypatch, overflowed):
    """Top-k 20 with per-row top-p after a soft-cap, "raw": stage 2 over groups of merged
    tiles, reading its candidates (and the fallback its tokens) in chunks of 64, as at
    V = 151936; the drawn tokens' raw logits are recomputed (the candidates are capped)."""
    from flashsampling_inductor.dispatch import SampleConfig, triton_fused_sample

    monkeypatch.setattr(truncation_kernel, "STAGE2_LANES", 64)
    monkeypatch.setattr(dispatch, "MERGE_GROUPS", 4)
    monkeypatch.setattr(dispatch, "MERGE_KEEP", 8)
    merges = []
    merge = truncation_kernel._merge
    monkeypatch.setattr(truncation_kernel, "_merge", lambda *args: merges.append(1) or merge(*args))
    cpu = torch.device("cpu")
    hidden, weight = make_exact_problem(4, 256, 64, seed=5, device=cpu)
    temperature = torch.tensor([0.7, 1.3, 0.0, 1.0])
    top_p = torch.tensor([1.0, 0.9, 1.0, 0.5])
    params = SamplingParams(
        temperature, 1.0, None, 9, 2, None, None, 20, top_p, 1.0, softcap=2.0, logprobs="raw"
    )
    tokens, logprobs = triton_fused_sample(hidden, weight, None, params, SampleConfig(16, 16, 64))
    (flags,) = overflowed
    assert merges and bool(flags.any()) and not bool(flags.all()), flags
    expected = expected_logprobs(reference_logits(hidden, weight, None), tokens, "raw", temperature)
    torch.testing.assert_close(logprobs.double(), expected, rtol=RTOL, atol=ATOL)
