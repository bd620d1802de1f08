"""``return_logprobs`` at real size on a GPU: V = 151936 (Qwen3), D = 4096, bf16.

Run with ``pytest -m gpu tests/test_gpu_logprobs.py`` on a CUDA machine (skipped elsewhere).
Each call's log-probabilities, at the tokens it drew, against float64 ``log_softmax`` of
the fp32 logits (tests/test_logprobs.py says what "raw" and "processed" are); and a logprob
reader compiled with backend="flashsampling" (tests/test_logprob_readers.py at V = 64)
becoming the op's logprob output at that size.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters
from torch._inductor.utils import run_and_get_code

from flashsampling_inductor import fused_sample
from flashsampling_inductor.reference import reference_logits

from .gpu_problems import CUDA, VOCAB, masked_bias, per_row, temperature_rows
from .sampling_oracle import make_exact_problem, make_problem
from .test_logprobs import ATOL, RTOL, expected_logprobs
from .test_serving_samplers import apply_top_k_top_p, random_sample

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


# --- logprob readers compiled with backend="flashsampling" -----------------------------------
def vllm_raw_logprobs(h, temperature, k, p, weight, reader="dtype"):
    """vLLM's Sampler with its default raw logprobs: greedy and sampled rows, per-row top-k
    (``p`` None: top-p on bf16 logits is refused for its ties, top_p_mask.py), the race; the
    log-softmax of the bf16 logits in fp32, read at the drawn token."""
    logits = F.linear(h, weight)
    if reader == "dtype":
        raw_logprobs = logits.log_softmax(dim=-1, dtype=torch.float32)
    else:
        raw_logprobs = torch.log_softmax(logits.float(), dim=-1)
    logits = logits.to(torch.float32)
    greedy = logits.argmax(dim=-1).view(-1)
    logits = logits.div_(temperature.unsqueeze(dim=1))
    probs = apply_top_k_top_p(logits, k, p).softmax(dim=-1, dtype=torch.float32)
    tokens = torch.where(temperature < 1e-5, greedy, random_sample(probs)).long()
    return tokens, raw_logprobs.gather(-1, tokens.unsqueeze(-1))


def processed_logprobs(h, temperature, k, p, weight):
    """The sampler's own probabilities (temperature, per-row top-k / top-p), gathered at the
    drawn token and logged, as transformers' continuous batching returns them."""
    logits = F.linear(h, weight).float() / temperature[:, None]
    probs = apply_top_k_top_p(logits, k, p).softmax(dim=-1)
    tokens = torch.multinomial(probs, num_samples=1)
    return tokens, probs.gather(-1, tokens).log()


def compiled_reader(step, idiom: str, h, temperature, k, p, weight, **options):
    """-> (tokens [B], logprobs [B]) of ``step`` compiled with the FlashSampling backend,
    which must have become ONE fused call writing no [B, V] buffer."""
    torch._dynamo.reset()
    counters.clear()

    def program(h, temperature, k, p):
        return step(h, temperature, k, p, weight, **options)

    with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):
        compiled = torch.compile(program, backend="flashsampling", dynamic=False)
        (tokens, logprobs), (code, *_) = run_and_get_code(compiled, h, temperature, k, p)
    assert dict(counters["flashsampling"]) == {idiom: 1}
    assert "fused_sample_logprobs" in code
    assert f"{h.shape[0]}, {weight.shape[0]}" not in code  # no [B, V] buffer in the step
    return tokens.reshape(-1), logprobs.reshape(-1)


def reader_errors(logprobs: torch.Tensor, expected: torch.Tensor) -> str:
    error = (logprobs.double() - expected).abs()
    relative = error / expected.abs().clamp_min(1e-30)
    return f"max abs {error.max().item():.2e}, max rel {relative.max().item():.2e}"


def reader_rows(batch: int, vocab: int, device: torch.device):
    """[B] temperature (every fourth row greedy), top-k (V: off) and top-p (1.0: off)."""
    temperature = torch.linspace(0.5, 1.5, batch, device=device)
    temperature[::4] = 0.0
    k = torch.tensor([vocab, 20, 50, min(1000, vocab)], device=device).repeat(batch)[:batch]
    p = torch.tensor([1.0, 0.9, 0.5, 0.95], device=device).repeat(batch)[:batch]
    return temperature, k, p


def check_raw_reader(h, weight, reader="dtype"):
    temperature, k, _ = reader_rows(h.shape[0], weight.shape[0], h.device)
    tokens, logprobs = compiled_reader(
        vllm_raw_logprobs, "mixed_greedy", h, temperature, k, None, weight, reader=reader
    )
    logits = F.linear(h, weight).float()  # the program's bf16 logits, exactly
    assert ((tokens >= 0) & (tokens < weight.shape[0])).all()
    greedy = temperature == 0
    row_max = logits.max(dim=-1).values
    assert torch.equal(logits[greedy].gather(-1, tokens[greedy, None])[:, 0], row_max[greedy])
    expected = logits.double().log_softmax(-1).gather(-1, tokens[:, None])[:, 0]
    print(f"raw ({reader}) B={h.shape[0]} V={weight.shape[0]}:", reader_errors(logprobs, expected))
    torch.testing.assert_close(logprobs.double(), expected, rtol=RTOL, atol=ATOL)


def check_processed_reader(h, weight):
    temperature, k, p = reader_rows(h.shape[0], weight.shape[0], h.device)
    temperature[::4] = 1.0  # (a processed logprob of greedy rows is refused: no greedy rows)
    tokens, logprobs = compiled_reader(
        processed_logprobs, "multinomial", h, temperature, k, p, weight
    )
    logits = F.linear(h, weight).float()
    expected = expected_logprobs(
        logits, tokens[:, None], "processed", temperature, top_k=k, top_p=p
    )[:, 0]
    assert torch.isfinite(expected).all()  # every token drawn is one the program keeps
    print(f"processed B={h.shape[0]} V={weight.shape[0]}:", reader_errors(logprobs, expected))
    torch.testing.assert_close(logprobs.double(), expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("reader", ["dtype", "float"])
def test_gpu_compiled_raw_logprob_reader(reader):
    """vLLM's sampler with raw logprobs (``log_softmax(dtype=float32)`` or of ``.float()``),
    greedy rows among the sampled, compiled at V = 151936 with bf16 weights: ONE fused call,
    its logprobs against float64 ``log_softmax`` of the same bf16 logits."""
    h, weight = make_exact_problem(64, VOCAB, 4096, torch.bfloat16, device=CUDA)
    check_raw_reader(h, weight, reader)


def test_gpu_compiled_processed_logprob_reader():
    """``probs.gather(-1, tokens).log()`` after temperature and per-row top-k / top-p (fp32
    weights: top-p of bf16 logits is refused)."""
    h, weight = make_exact_problem(64, VOCAB, 4096, torch.float32, device=CUDA)
    check_processed_reader(h, weight)
