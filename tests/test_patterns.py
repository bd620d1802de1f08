"""Every idiom of the catalog, written as public projects write it, becomes one fused call;
every near miss is left alone. Graph-level checks only (fast): see test_graph_pass.py for
the compiled programs' distributions."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from flashsampling_inductor.patterns import IDIOMS

from .graph_capture import graph_after_pass

B, T, D, V = 3, 5, 24, 1000
torch.manual_seed(0)
LM_HEAD = nn.Linear(D, V, bias=False)
LM_HEAD_BIAS = nn.Linear(D, V)
EMBEDDING = nn.Embedding(V, D)  # tied: logits = h @ embedding.weight.T
LM_HEAD_BIAS_BF16 = nn.Linear(D, V, dtype=torch.bfloat16)
LM_HEAD_FP64 = nn.Linear(D, V, dtype=torch.float64)


def hidden(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


# --- multinomial ----------------------------------------------------------------------------
def nanogpt(x, temperature=0.8):
    logits = LM_HEAD(x)
    logits = logits[:, -1, :] / temperature
    probs = F.softmax(logits, dim=-1)
    return torch.multinomial(probs, num_samples=1)


def hf_generate(h):
    logits = LM_HEAD_BIAS_BF16(h[:, -1:, :])
    next_token_logits = logits[:, -1, :].to(copy=True, dtype=torch.float32)
    next_token_scores = next_token_logits / 0.7
    probs = nn.functional.softmax(next_token_scores, dim=-1)
    return torch.multinomial(probs, num_samples=1).squeeze(1)


def softmax_dtype_per_row_temperature(h, temperature):
    logits = F.linear(h, LM_HEAD.weight.half())
    probs = (logits / temperature[:, None]).softmax(-1, dtype=torch.float32)
    return probs.multinomial(1)


def log_softmax_exp_tensor_temperature(h, temperature):
    logits = LM_HEAD(h).float()
    return torch.multinomial(torch.log_softmax(logits / temperature, dim=-1).exp(), 1)


def several_samples(h):
    return torch.multinomial(torch.softmax(LM_HEAD_BIAS(h), -1), 4, replacement=True)


def batch_one_tied(h):
    probs = torch.softmax(h @ EMBEDDING.weight.T / 1.3, dim=-1)
    return torch.multinomial(probs, 1)


def index_last_token(x):
    logits = LM_HEAD(x)[:, [-1], :]
    return torch.multinomial(F.softmax(logits, dim=-1).squeeze(1), 1)


def inverse_temperature(h):
    probs = torch.softmax(LM_HEAD(h) * (1 / 0.6), dim=-1)
    return torch.multinomial(probs, 1)


def in_place_temperature(x, temperature):
    logits = LM_HEAD(x[:, -1])
    logits.div_(temperature.unsqueeze(-1))
    return torch.multinomial(logits.softmax(dim=-1), num_samples=1)


# --- exponential race -----------------------------------------------------------------------
def gpt_fast(x, temperature=0.9):
    logits = LM_HEAD(x)[0, -1]
    probs = torch.nn.functional.softmax(logits / max(temperature, 1e-5), dim=-1)
    q = torch.empty_like(probs).exponential_(1)
    return torch.argmax(probs / q, dim=-1, keepdim=True).to(dtype=torch.int)


def vllm(h):
    probs = LM_HEAD_BIAS(h).softmax(dim=-1, dtype=torch.float32)
    q = torch.empty_like(probs)
    q.exponential_()
    return probs.div_(q).argmax(dim=-1).view(-1)


def torchtune_bf16(x):
    logits = F.linear(x[:, -1], EMBEDDING.weight.bfloat16()).float() / 0.7
    probs = torch.nn.functional.softmax(logits, dim=-1)
    q = torch.empty_like(probs).exponential_(1)
    return torch.argmax(probs / q, dim=-1, keepdim=True).to(dtype=torch.int)


# --- Gumbel ---------------------------------------------------------------------------------
def gumbel(h):
    logits = LM_HEAD(h)
    return torch.argmax(logits / 0.8 - torch.log(-torch.log(torch.rand_like(logits))), -1)


def gumbel_eps(h):
    logits = LM_HEAD_BIAS(h).float()
    u = torch.rand(logits.shape)
    g = -torch.log(-torch.log(u + 1e-10) + 1e-10)
    return (logits + g).argmax(dim=-1, keepdim=True)


def gumbel_exponential_log(h, temperature):
    logits = LM_HEAD(h) / temperature
    return (logits - torch.empty_like(logits).exponential_().log()).argmax(-1)


# --- greedy ---------------------------------------------------------------------------------
def greedy_last_token(x):
    return torch.argmax(LM_HEAD(x)[:, -1, :], dim=-1)


def greedy_bf16_bias(h):
    return LM_HEAD_BIAS_BF16(h).argmax(-1, keepdim=True)


def greedy_batch_one(h):
    return torch.argmax(h @ EMBEDDING.weight.T)


# --- truncation masks (their idiom modules have their own tests) ---------------------------
def top_k(h):
    logits = LM_HEAD(h)
    v, _ = torch.topk(logits, 10)
    logits = logits.masked_fill(logits < v[:, [-1]], float("-inf"))
    return torch.multinomial(torch.softmax(logits, -1), 1)


def top_k_keep_form(h):  # keeps x >= kth, the pivot a view of the last value
    logits = LM_HEAD(h).float() / 0.9
    kth = logits.topk(10, dim=-1).values[:, -1].view(-1, 1)
    keep = logits >= kth
    return torch.multinomial(
        torch.where(keep, logits, torch.full_like(logits, -torch.inf)).softmax(-1), 1
    )


def greedy_top_k(h):  # the mask keeps the argmax: dropped
    logits = LM_HEAD(h)
    v, _ = torch.topk(logits, 10)
    return torch.argmax(logits.masked_fill(logits < v[:, [-1]], float("-inf")), -1)


t_rows = torch.rand(B) + 0.5
POSITIVE = [
    pytest.param(nanogpt, (hidden(B, T, D),), "multinomial", id="nanogpt"),
    pytest.param(hf_generate, (hidden(B, T, D, dtype=torch.bfloat16),), "multinomial", id="hf"),
    pytest.param(
        softmax_dtype_per_row_temperature,
        (hidden(B, D, dtype=torch.half), t_rows),
        "multinomial",
        id="softmax-dtype-fp16-per-row-T",
    ),
    pytest.param(
        log_softmax_exp_tensor_temperature,
        (hidden(B, D), torch.tensor(0.7)),
        "multinomial",
        id="log-softmax-exp-0d-T",
    ),
    pytest.param(several_samples, (hidden(B, D),), "multinomial", id="num-samples-4"),
    pytest.param(batch_one_tied, (hidden(D),), "multinomial", id="1d-tied-embedding"),
    pytest.param(index_last_token, (hidden(B, T, D),), "multinomial", id="index-[-1]"),
    pytest.param(inverse_temperature, (hidden(B, D),), "multinomial", id="times-inverse-T"),
    pytest.param(
        in_place_temperature, (hidden(B, T, D), t_rows), "multinomial", id="div_-per-row-T"
    ),
    pytest.param(gpt_fast, (hidden(1, T, D),), "exponential_race", id="gpt-fast"),
    pytest.param(vllm, (hidden(B, D),), "exponential_race", id="vllm"),
    pytest.param(
        torchtune_bf16, (hidden(B, T, D, dtype=torch.bfloat16),), "exponential_race", id="tune"
    ),
    pytest.param(gumbel, (hidden(B, D),), "gumbel", id="gumbel"),
    pytest.param(gumbel_eps, (hidden(B, D),), "gumbel", id="gumbel-eps"),
    pytest.param(
        gumbel_exponential_log, (hidden(B, D), t_rows[:, None]), "gumbel", id="gumbel-exp-log"
    ),
    pytest.param(greedy_last_token, (hidden(B, T, D),), "greedy", id="greedy-last-token"),
    pytest.param(
        greedy_bf16_bias, (hidden(B, D, dtype=torch.bfloat16),), "greedy", id="greedy-bf16"
    ),
    pytest.param(greedy_batch_one, (hidden(D),), "greedy", id="greedy-1d"),
    pytest.param(top_k, (hidden(B, D),), "multinomial", id="top-k-mask"),
    pytest.param(top_k_keep_form, (hidden(B, D),), "multinomial", id="top-k-keep-form"),
    pytest.param(greedy_top_k, (hidden(B, D),), "greedy", id="greedy-top-k-mask-dropped"),
]


@pytest.mark.parametrize("fn, args, idiom", POSITIVE)
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_idiom_becomes_one_fused_call(fn, args, idiom, dynamic):
    graph, rewrites = graph_after_pass(fn, *args, dynamic=dynamic)
    assert rewrites == {idiom: 1}, graph
    assert graph.count("flashsampling.fused_sample") == 1
    for materializes_logits in ("aten.mm", "aten.addmm", "multinomial", "argmax", "amax"):
        assert materializes_logits not in graph, graph


def test_gumbel_max_trick_form_is_rewritten():
    """Inductor's pre-grad ``apply_gumbel_max_trick`` turns the race into Gumbel-argmax."""
    _, rewrites = graph_after_pass(vllm, hidden(B, D), apply_gumbel_max_trick=True)
    assert sum(rewrites.values()) == 1


# --- near misses: left exactly as they are --------------------------------------------------
def logits_returned(h):
    logits = LM_HEAD(h)
    return torch.multinomial(torch.softmax(logits, -1), 1), logits


def probs_returned(x):  # gpt-fast's sample() returns the probs too
    probs = torch.softmax(LM_HEAD(x)[:, -1] / 0.8, dim=-1)
    q = torch.empty_like(probs).exponential_(1)
    return torch.argmax(probs / q, dim=-1, keepdim=True), probs


def noise_reused(h):
    logits = LM_HEAD(h)
    g = -torch.log(-torch.log(torch.rand_like(logits)))
    return torch.argmax(logits + g, -1), g.mean()


def softmax_over_batch(h):
    return torch.multinomial(torch.softmax(LM_HEAD(h), dim=0).T, 1)


def without_replacement(h):
    return torch.multinomial(torch.softmax(LM_HEAD(h), -1), 2)


def shared_noise(h):
    logits = LM_HEAD(h)
    g = -torch.log(-torch.log(torch.rand(V)))  # one draw for all rows: correlated rows
    return torch.argmax(logits + g, -1)


def bias_after_temperature(h):  # softmax(l / T + b) is not softmax((l + b) / T)
    return torch.multinomial(torch.softmax(LM_HEAD(h) / 0.7 + LM_HEAD_BIAS.bias, -1), 1)


def argmax_over_batch(h):
    return torch.argmax(LM_HEAD(h), dim=0)


def fp64(h):
    return torch.multinomial(torch.softmax(LM_HEAD_FP64(h), -1), 1)


def greedy_tensor_temperature(h, temperature):
    return torch.argmax(LM_HEAD(h) / temperature, -1)


def generator_multinomial(h):
    return torch.multinomial(torch.softmax(LM_HEAD(h), -1), 1, generator=None)


NEGATIVE = [
    pytest.param(probs_returned, (hidden(B, T, D),), id="probs-returned"),
    pytest.param(noise_reused, (hidden(B, D),), id="noise-reused"),
    pytest.param(softmax_over_batch, (hidden(B, D),), id="softmax-dim-0"),
    pytest.param(without_replacement, (hidden(B, D),), id="n2-without-replacement"),
    pytest.param(shared_noise, (hidden(B, D),), id="noise-shared-across-rows"),
    pytest.param(argmax_over_batch, (hidden(B, D),), id="argmax-dim-0"),
    pytest.param(bias_after_temperature, (hidden(B, D),), id="bias-after-T"),
    pytest.param(fp64, (hidden(B, D, dtype=torch.float64),), id="fp64"),
    pytest.param(greedy_tensor_temperature, (hidden(B, D), torch.tensor(0.5)), id="argmax-div-T"),
]


@pytest.mark.parametrize("fn, args", NEGATIVE)
def test_near_miss_is_left_alone(fn, args):
    graph, rewrites = graph_after_pass(fn, *args)
    assert not rewrites, graph
    assert "fused_sample" not in graph


def test_fallback_random_turns_the_pass_off():
    graph, rewrites = graph_after_pass(nanogpt, hidden(B, T, D), fallback_random=True)
    assert not rewrites and "fused_sample" not in graph


@pytest.mark.parametrize("idiom", IDIOMS, ids=lambda idiom: idiom.IDIOM)
def test_each_catalog_entry_rewrites_its_own_search_function(idiom):
    """Every module's ``search`` (the idiom as users write it) becomes one fused call."""
    graph, rewrites = graph_after_pass(idiom.search, *idiom.example_inputs())
    assert rewrites == {idiom.IDIOM: 1}
    assert "fused_sample" in graph and "aten.mm" not in graph


def test_rows_selected_after_the_softmax_keep_the_output_shape():
    """``softmax(...).squeeze(1)`` selects rows after the softmax: the tokens take the same
    selection, so the compiled step returns eager's shape."""
    x = hidden(B, T, D)
    torch._dynamo.reset()
    with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):
        compiled = torch.compile(index_last_token, backend="flashsampling")(x)
    assert compiled.shape == index_last_token(x).shape == (B, 1)
