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
from scipy import stats
from torch._dynamo.utils import counters

from flashsampling_inductor import explain

from . import test_logprob_readers as readers
from . import test_serving_samplers as serving
from .catalog_checks import (
    assert_left_alone,
    chi_square_p,
    graph_and_sites,
    min_p_probs,
    top_k_probs,
)
from .graph_capture import graph_after_pass
from .test_logit_transforms import softcapped_logits_returned
from .test_logit_transforms import x as transform_x
from .test_logprob_readers import (
    T_SAMPLED,
    other_tokens,
    processed_with_greedy_rows,
    vllm_with_rank,
)
from .test_logprob_readers import X as reader_x
from .test_patterns import hidden, logits_returned
from .test_serving_samplers import (
    _SAMPLING_EPS,
    apply_min_p,
    apply_top_k_top_p,
    greedy_after_temperature,
    greedy_of_other_logits,
    per_row_probs,
    random_sample,
)

SERVING_KNOBS = (serving.T_ROWS, serving.K_ROWS, serving.P_ROWS)
READER_KNOBS = (readers.T_ROWS, readers.K_ROWS, readers.P_ROWS)

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
        ),
        pytest.param(
            top_k_top_p_fp32,
            (LOGITS, T_ROWS + 0.1, K_ROWS, P_ROWS),
            "exponential_race",
            id="top-k-top-p",
        ),
        pytest.param(
            last_position,
            (LOGITS.view(B, 1, V).expand(B, 3, V),),
            "multinomial",
            id="last-position",
        ),
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


def _draws(fn, *args, idiom, repeat=True):
    torch._dynamo.reset()
    counters.clear()
    rows = [a.repeat_interleave(N, 0) if repeat else a for a in args]
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


def test_an_in_place_division_of_the_callers_logits_is_kept_and_the_draw_fused():
    """nano-vllm's sampler on fp32 logits: ``.float()`` is the caller's own tensor, which
    ``div_`` divides in place (stock Inductor fails to compile this on the CPU: KeyError in
    its C++ codegen). The division stays, written back; the draw reads what it wrote."""
    torch.manual_seed(6)
    t = (T_ROWS + 0.1).repeat_interleave(N, 0)
    logits = LOGITS.repeat_interleave(N, 0)
    graph, rewrites = graph_after_pass(nano_vllm, logits.clone(), t)
    assert rewrites == {"exponential_race": 1} and "aten.copy_" in graph, graph
    assert graph.count("flashsampling.sample_logits") == 1, graph
    tokens = _draws(nano_vllm, logits, t, idiom="exponential_race", repeat=False)
    assert torch.equal(logits, LOGITS.repeat_interleave(N, 0) / t[:, None])
    _check_rows(tokens, torch.softmax(LOGITS.double() / (T_ROWS + 0.1)[:, None].double(), -1))


# --- logits the graph holds anyway: read outside the sampling too -----------------------
@pytest.mark.parametrize(
    "fn, args, idiom, kept",
    [
        # the matmul's logits returned
        pytest.param(logits_returned, (hidden(B, 24),), "multinomial", "aten.mm", id="returned"),
        # soft-capped logits returned: cut after the cap, so the tanh stays
        pytest.param(
            softcapped_logits_returned,
            (transform_x,),
            "multinomial",
            "aten.tanh",
            id="softcapped-returned",
        ),
        # the argmax's logprob read from the logits: the draw fused, that read stock
        pytest.param(
            other_tokens, (reader_x, T_SAMPLED), "multinomial", "aten.argmax", id="argmax-logprob"
        ),
    ],
)
def test_logits_read_elsewhere_are_sampled_where_they_are(fn, args, idiom, kept):
    graph, rewrites = graph_after_pass(fn, *args)
    assert rewrites == {idiom: 1}, graph
    assert graph.count("flashsampling.sample_logits") == 1 and kept in graph, graph
    assert "fused_sample" not in graph and "aten.multinomial" not in graph, graph


@pytest.mark.parametrize(
    "fn, args, reason",
    [
        pytest.param(
            greedy_of_other_logits,
            (serving.x, *SERVING_KNOBS),
            "vocabulary dim",
            id="greedy-of-half-the-row",
        ),
        pytest.param(
            greedy_after_temperature,
            (serving.x, *SERVING_KNOBS),
            "by a tensor",
            id="greedy-after-T",
        ),
        pytest.param(
            processed_with_greedy_rows,
            (reader_x, *READER_KNOBS),
            "greedy rows",
            id="processed-logprob-of-greedy-rows",
        ),
        pytest.param(
            vllm_with_rank,
            (reader_x, *READER_KNOBS),
            "the drawn token's logprob alone",
            id="logprob-rank",
        ),
    ],
)
def test_a_mix_left_stock_keeps_its_draw_fused_on_the_logits_it_reads(fn, args, reason):
    """vLLM-style greedy rows or logprob reads the op cannot take: ``mixed_greedy`` refuses
    (and says why), and the sampled branch, whose logits the refused part reads, becomes one
    ``sample_logits`` call on them; the greedy argmax and the reads stay stock."""
    graph, rewrites, sites = graph_and_sites(fn, *args)
    assert rewrites == {"exponential_race": 1}, graph
    assert graph.count("flashsampling.sample_logits") == 1 and "aten.where" in graph, graph
    assert any(not site.rewritten and reason in site.reason for site in sites), sites


def test_returned_logits_keep_the_distribution():
    """(V = 1000 here: the tokens expected fewer than 5 times a row are counted as one cell,
    where a chi-square over each would not hold)"""
    torch.manual_seed(7)
    h = hidden(B, 24)
    tokens, logits = _draws(logits_returned, h, idiom="multinomial")
    with torch.no_grad():
        assert torch.equal(logits, logits_returned(h.repeat_interleave(N, 0))[1])
    with torch.no_grad():
        probs = torch.softmax(logits_returned(h)[1].double(), -1)
    for r in range(B):
        rare = probs[r] * N < 5
        counts = torch.bincount(tokens[r * N : (r + 1) * N].flatten(), minlength=probs.shape[1])
        observed = torch.cat([counts[~rare], counts[rare].sum()[None]]).numpy()
        expected = torch.cat([probs[r][~rare], probs[r][rare].sum()[None]]).numpy() * N
        assert stats.chisquare(observed, expected).pvalue > 1e-4, r


# --- near misses ----------------------------------------------------------------------------
def probs_returned(logits):
    probs = torch.softmax(logits.float(), dim=-1)
    return probs, (probs / torch.empty_like(probs).exponential_()).argmax(dim=-1)


def with_bias(logits, bias):
    return torch.multinomial(F.softmax(logits + bias, dim=-1), 1)


def argmax_only(logits):
    return logits.argmax(dim=-1)


@pytest.mark.parametrize(
    "fn, args, reason",
    [
        pytest.param(probs_returned, (LOGITS,), "also read by", id="probs-returned"),
        pytest.param(with_bias, (LOGITS, torch.randn(V)), "added to the logits", id="bias"),
        pytest.param(argmax_only, (LOGITS,), "stock Inductor reads once too", id="greedy"),
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
