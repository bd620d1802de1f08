"""Samplers compiled on their own, on logits the graph is given (nano-vllm's compiled
``Sampler``, vLLM's sampler as a function of the logits, a serving engine's sampling step):
no LM-head matmul in the graph, so the pass rewrites the chain into ONE ``sample_logits``
call, which reads the logits once. Each keeps, row by row, the distribution the program
defines (chi-square against float64); what the op cannot take is left alone with its
reason."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

from flashsampling_inductor import explain

from .catalog_checks import assert_left_alone, chi_square_p, min_p_probs, top_k_probs
from .graph_capture import graph_after_pass
from .test_serving_samplers import (
    _SAMPLING_EPS,
    apply_min_p,
    apply_top_k_top_p,
    per_row_probs,
    random_sample,
)

B, V, N = 4, 64, 4000
torch.manual_seed(0)
LOGITS = torch.randn(B, V) * 2.0  # fp32 values
LOGITS_BF16 = LOGITS.bfloat16()
T_ROWS = torch.tensor([0.7, 1.0, 0.0, 1.3])  # row 2 greedy where the program says so
K_ROWS = torch.tensor([5, 64, 3, 10])
P_ROWS = torch.tensor([0.9, 0.5, 1.0, 0.8])


# --- the programs, op for op ------------------------------------------------------------
def nano_vllm(logits, temperatures):  # nano-vllm's Sampler.forward (bf16 logits in)
    logits = logits.float().div_(temperatures.unsqueeze(dim=1))
    probs = torch.softmax(logits, dim=-1)
    return probs.div_(torch.empty_like(probs).exponential_(1).clamp_min_(1e-10)).argmax(dim=-1)


def vllm_top_k(logits, temperature, k):  # vLLM's Sampler, bf16 logits, top-k only
    greedy_sampled = logits.argmax(dim=-1).view(-1)
    logits = logits.to(torch.float32).div_(temperature.unsqueeze(dim=1))
    logits = apply_top_k_top_p(logits, k, None)
    random_sampled = random_sample(logits.softmax(dim=-1, dtype=torch.float32))
    return torch.where(temperature < _SAMPLING_EPS, greedy_sampled, random_sampled)


def vllm_min_p(logits, temperature, min_p):
    logits = logits.to(torch.float32).div_(temperature.unsqueeze(dim=1))
    return random_sample(apply_min_p(logits, min_p).softmax(dim=-1, dtype=torch.float32))


def top_k_top_p_fp32(logits, temperature, k, p):  # fp32 logits, not written back
    logits = apply_top_k_top_p(logits / temperature.unsqueeze(1), k, p)
    return random_sample(logits.softmax(dim=-1, dtype=torch.float32))


def last_position(logits):  # [B, S, V] logits of a model, the last position's drawn
    return torch.multinomial(F.softmax(logits[:, -1, :] / 0.7, dim=-1), 1)


def with_logprob(logits):
    tokens = torch.multinomial(F.softmax(logits.float(), dim=-1), 1)
    return tokens, torch.log_softmax(logits.float(), dim=-1).gather(-1, tokens)


# --- one sample_logits call, nothing of the chain left ------------------------------------
@pytest.mark.parametrize(
    "fn, args, idiom",
    [
        pytest.param(nano_vllm, (LOGITS_BF16, T_ROWS + 0.1), "exponential_race", id="nano-vllm"),
        pytest.param(vllm_top_k, (LOGITS_BF16, T_ROWS, K_ROWS), "mixed_greedy", id="vllm-k"),
        pytest.param(
            vllm_min_p, (LOGITS_BF16, T_ROWS + 0.1, P_ROWS / 4), "exponential_race", id="vllm-min-p"
        ),  # fmt: skip
        pytest.param(
            top_k_top_p_fp32,
            (LOGITS, T_ROWS + 0.1, K_ROWS, P_ROWS),
            "exponential_race",
            id="top-k-top-p",
        ),  # fmt: skip
        pytest.param(
            last_position,
            (LOGITS.view(B, 1, V).expand(B, 3, V),),
            "multinomial",
            id="last-position",
        ),  # fmt: skip
    ],
)
def test_a_sampler_of_given_logits_becomes_one_sample_logits_call(fn, args, idiom):
    graph, rewrites = graph_after_pass(fn, *args)
    assert rewrites == {idiom: 1}, graph
    assert graph.count("flashsampling.sample_logits") == 1, graph
    for left in ("sort", "topk", "_softmax", "exponential", "argmax", "multinomial", "cumsum"):
        left = f"aten.{left}."
        assert left not in graph, graph
    assert "fused_sample" not in graph and "aten.mm" not in graph, graph


def _draws(fn, *args, idiom):
    torch._dynamo.reset()
    counters.clear()
    rows = [a.repeat_interleave(N, 0) if isinstance(a, torch.Tensor) else a for a in args]
    with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):
        out = torch.compile(fn, backend="flashsampling")(*rows)
    assert dict(counters["flashsampling"]) == {idiom: 1}
    return out


def _check_rows(tokens, probs, greedy=None):
    for r in range(B):
        drawn = tokens[r * N : (r + 1) * N]
        if greedy is not None and greedy[r]:
            assert (drawn == probs[r].argmax()).all(), r
        else:
            assert chi_square_p(drawn, probs[r]) > 1e-4, r


def test_nano_vllm_keeps_every_rows_distribution():
    torch.manual_seed(1)
    t = T_ROWS + 0.1
    tokens = _draws(nano_vllm, LOGITS_BF16, t, idiom="exponential_race")
    _check_rows(tokens, torch.softmax(LOGITS_BF16.double() / t[:, None].double(), -1))


def test_vllm_top_k_with_greedy_rows_keeps_every_rows_distribution():
    torch.manual_seed(2)
    tokens = _draws(vllm_top_k, LOGITS_BF16, T_ROWS, K_ROWS, idiom="mixed_greedy")
    greedy = T_ROWS < _SAMPLING_EPS
    probs = torch.stack([
        top_k_probs(row / (t if t > 0 else 1.0), int(k))
        for row, t, k in zip(LOGITS_BF16.double(), T_ROWS, K_ROWS, strict=True)
    ])  # fmt: skip
    _check_rows(tokens, probs, greedy)


def test_vllm_min_p_keeps_every_rows_distribution():
    torch.manual_seed(3)
    t, min_p = T_ROWS + 0.1, P_ROWS / 4
    tokens = _draws(vllm_min_p, LOGITS_BF16, t, min_p, idiom="exponential_race")
    probs = torch.stack([
        min_p_probs(row / tr, float(m))
        for row, tr, m in zip(LOGITS_BF16.double(), t.double(), min_p, strict=True)
    ])  # fmt: skip
    _check_rows(tokens, probs)


def test_top_k_top_p_on_fp32_logits_keeps_every_rows_distribution():
    torch.manual_seed(4)
    t = T_ROWS + 0.1
    tokens = _draws(top_k_top_p_fp32, LOGITS, t, K_ROWS, P_ROWS, idiom="exponential_race")
    _check_rows(tokens, per_row_probs(LOGITS, t, K_ROWS, P_ROWS, torch.zeros(B, dtype=bool)))


def test_the_drawn_tokens_logprobs_are_the_programs():
    torch.manual_seed(5)
    tokens, logprobs = _draws(with_logprob, LOGITS_BF16, idiom="multinomial")
    expected = torch.log_softmax(LOGITS_BF16.float(), -1).repeat_interleave(N, 0)
    torch.testing.assert_close(logprobs, expected.gather(-1, tokens), rtol=1e-5, atol=1e-5)
    _check_rows(tokens, torch.softmax(LOGITS_BF16.double(), -1))


# --- near misses ----------------------------------------------------------------------------
def in_place_on_fp32(logits, temperatures):  # .float() of fp32 is the caller's own tensor
    logits = logits.float().div_(temperatures.unsqueeze(dim=1))
    return random_sample(torch.softmax(logits, dim=-1))


def with_bias(logits, bias):
    return torch.multinomial(F.softmax(logits + bias, dim=-1), 1)


def argmax_only(logits):
    return logits.argmax(dim=-1)


@pytest.mark.parametrize(
    "fn, args, reason",
    [
        pytest.param(
            in_place_on_fp32,
            (LOGITS, T_ROWS + 0.1),
            "written back into the input",
            id="written-back",
        ),  # fmt: skip
        pytest.param(
            with_bias, (LOGITS, torch.randn(V)), "added to the logits the graph is given", id="bias"
        ),  # fmt: skip
        pytest.param(argmax_only, (LOGITS,), "not from an LM-head matmul", id="greedy"),
    ],
)
def test_near_miss_is_left_alone(fn, args, reason):
    assert_left_alone(fn, *args, reason=reason)


def test_a_negative_temperature_on_given_logits_fails_loudly():
    """-logits would cost one more pass over the given logits: a T < 0 (which no sampler in
    the catalog passes) fails the call, as 0, inf and NaN do, instead of being folded."""
    torch._dynamo.reset()
    compiled = torch.compile(nano_vllm, backend="flashsampling")
    assert compiled(LOGITS_BF16, T_ROWS + 0.1).shape == (B,)
    with torch.no_grad(), pytest.raises(RuntimeError, match="of logits the graph is given"):
        compiled(LOGITS_BF16, torch.tensor([0.7, -1.0, 0.5, 1.0]))


def test_explain_names_the_given_logits_fused():
    (site,) = explain(nano_vllm, LOGITS_BF16, T_ROWS + 0.1)
    assert site.rewritten and site.idiom == "exponential_race", site
