"""The drawn token's logprob read beside the sampling (``patterns/_logprobs.py``): vLLM's
``log_softmax(logits).gather(-1, tokens)`` (raw), ``probs.gather(-1, tokens).log()`` and
``torch.log(probs).gather`` of the sampler's probabilities (processed), ``lp[arange(B),
tokens]``, and ``sample_logits(return_logprobs=...)``. Each becomes ONE
``fused_sample_logprobs`` call whose second output is the reader's value (against float64
``log_softmax`` at the drawn tokens); a program that reads anything else of the scores, or a
logprob the op does not give exactly, is left alone with the reason."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

import flashsampling_inductor as fs

from .catalog_checks import assert_left_alone, assert_one_fused_call, chi_square_p

B, D, V = 4, 16, 64
torch.manual_seed(0)
WEIGHT = torch.randn(V, D)
BIAS = torch.randn(V).masked_fill(torch.arange(V) % 7 == 0, -torch.inf)  # masked tokens
_SAMPLING_EPS = 1e-5


def raw_log_softmax(h, t):  # vLLM's default: raw logprobs of bf16 logits, in fp32
    logits = F.linear(h.bfloat16(), WEIGHT.bfloat16())
    raw = logits.log_softmax(dim=-1, dtype=torch.float32)
    probs = (logits.float() / t[:, None]).softmax(dim=-1)
    tokens = torch.multinomial(probs, num_samples=1)
    return tokens, raw.gather(-1, tokens)


def processed_probs(h, t):  # the sampler's own probabilities, gathered then logged
    probs = F.softmax(F.linear(h, WEIGHT, BIAS) / t[:, None], dim=-1)
    tokens = torch.multinomial(probs, num_samples=1)
    return tokens, probs.gather(-1, tokens).log()


def processed_log_of_probs(h, t):
    probs = F.softmax(F.linear(h, WEIGHT, BIAS) / t[:, None], dim=-1)
    tokens = torch.multinomial(probs, num_samples=1)
    return tokens, torch.log(probs).gather(-1, tokens)


def processed_top_k_race(h, t):  # log_softmax of the masked scores, indexed by arange
    logits = F.linear(h, WEIGHT) / t[:, None]
    kth = torch.topk(logits, 5)[0][..., -1, None]
    logits = logits.masked_fill(logits < kth, -torch.inf)
    probs = logits.softmax(-1)
    tokens = probs.div(torch.empty_like(probs).exponential_()).argmax(-1)
    return tokens, logits.log_softmax(-1)[torch.arange(tokens.shape[0]), tokens]


def exp_of_log_softmax(h, t):  # (moved from test_patterns' near misses: now fused)
    log_probs = torch.log_softmax(F.linear(h, WEIGHT), dim=-1)
    tokens = torch.multinomial(log_probs.exp(), 1)
    return tokens, log_probs.gather(-1, tokens)


def continuous_batching(h, t, k, p):  # transformers' ModelRunner._sample, return_logprobs
    scores = F.linear(h, WEIGHT)[None].view(-1, V)
    scores = scores / t[:, None]  # (the continuous-batching warpers: per-row tensors)
    kth = scores.sort(dim=-1, descending=True)[0].gather(-1, (k - 1)[:, None])
    scores = scores.masked_fill(scores < kth, -torch.inf).view(1, -1, V)
    probs = F.softmax(scores[0], dim=-1)
    tokens = torch.multinomial(probs, num_samples=1)
    return tokens.squeeze(-1), probs.gather(dim=1, index=tokens).squeeze(-1).log()


def categorical_log_prob(h, t):  # an RL rollout: Categorical(logits).sample() and log_prob
    distribution = torch.distributions.Categorical(logits=F.linear(h, WEIGHT))
    action = distribution.sample()
    return action, distribution.log_prob(action)


def vllm_sampler(h, temperature, k, p, rank=False):
    """vLLM's Sampler: raw logprobs, greedy rows, per-row top-k / top-p, the race."""
    logits = F.linear(h, WEIGHT)
    raw_logprobs = logits.log_softmax(dim=-1, dtype=torch.float32)
    logits = logits.to(torch.float32)
    greedy = logits.argmax(dim=-1).view(-1)
    logits = logits.div_(temperature.unsqueeze(dim=1))
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
    kth = logits_sort.gather(1, (logits_sort.size(1) - k.to(torch.long)).unsqueeze(dim=1))
    logits_sort.masked_fill_(logits_sort < kth, -float("inf"))
    probs_sum = torch.cumsum(logits_sort.softmax(dim=-1), dim=-1)
    top_p_mask = probs_sum <= 1 - p.unsqueeze(dim=1)
    top_p_mask[:, -1] = False
    logits_sort.masked_fill_(top_p_mask, -float("inf"))
    logits = logits_sort.scatter(dim=-1, index=logits_idx, src=logits_sort)
    probs = logits.softmax(dim=-1, dtype=torch.float32)
    q = torch.empty_like(probs).exponential_()
    sampled = probs.div_(q).argmax(dim=-1).view(-1)
    tokens = torch.where(temperature < _SAMPLING_EPS, greedy, sampled).long()
    token_logprobs = raw_logprobs.gather(-1, tokens.unsqueeze(-1))
    if rank:  # vLLM's gather_logprobs: the token's rank too
        return tokens, token_logprobs, (raw_logprobs >= token_logprobs).sum(-1)
    return tokens, token_logprobs


def sample_logits_processed(h, t):
    return fs.sample_logits(
        F.linear(h, WEIGHT), temperature=t, top_k=5, return_logprobs="processed"
    )


def sample_logits_raw(h, t):
    return fs.sample_logits(F.linear(h, WEIGHT, BIAS), temperature=t, return_logprobs="raw")


T_ROWS = torch.tensor([0.8, 0.0, 1.3, 0.5])
K_ROWS = torch.tensor([5, 64, 64, 3])
P_ROWS = torch.tensor([0.9, 1.0, 0.6, 1.0])
X = torch.randn(B, D)
T_SAMPLED = torch.tensor([0.8, 1.0, 1.3, 0.5])

FORMS = [
    pytest.param(raw_log_softmax, (X, T_SAMPLED), "multinomial", "raw", id="raw-log-softmax"),
    pytest.param(
        processed_probs, (X, T_SAMPLED), "multinomial", "processed", id="probs-gather-log"
    ),
    pytest.param(
        processed_log_of_probs, (X, T_SAMPLED), "multinomial", "processed", id="log-probs-gather"
    ),
    pytest.param(
        processed_top_k_race, (X, T_SAMPLED), "exponential_race", "processed", id="top-k-arange"
    ),
    pytest.param(exp_of_log_softmax, (X, T_SAMPLED), "multinomial", "raw", id="exp-log-softmax"),
    pytest.param(vllm_sampler, (X, T_ROWS, K_ROWS, P_ROWS), "mixed_greedy", "raw", id="vllm"),
    pytest.param(
        continuous_batching, (X, T_SAMPLED, K_ROWS, P_ROWS), "multinomial", "processed", id="hf-cb"
    ),
    pytest.param(categorical_log_prob, (X, T_SAMPLED), "multinomial", "raw", id="categorical"),
    pytest.param(
        sample_logits_processed, (X, T_SAMPLED), "sample_logits", "processed", id="sample-logits"
    ),
]


@pytest.mark.parametrize("fn, args, idiom, mode", FORMS)
def test_logprob_reader_becomes_the_ops_output(fn, args, idiom, mode):
    graph = assert_one_fused_call(fn, *args, idiom=idiom)
    (call,) = [line for line in graph.splitlines() if "target=torch.ops.flashsampling" in line]
    assert ("processed" in call) == (mode == "processed"), call  # ("raw": the default)
    for stock in ("aten.log.", "aten.gather", "aten.exp.", "aten.sort"):
        assert stock not in graph, graph


def _expected(fn, logits, t, tokens):
    """float64 logprobs of ``tokens`` as ``fn`` defines them (raw, or processed: the
    temperature, and for the top-k form its mask)."""
    logits = logits.double()
    if fn in (raw_log_softmax, vllm_sampler, sample_logits_raw):
        return logits.log_softmax(-1).gather(-1, tokens)
    scores = logits / t.double()[:, None]
    if fn in (processed_top_k_race, sample_logits_processed):
        kth = scores.topk(5).values[:, -1:]
        scores = scores.masked_fill(scores < kth, -torch.inf)
    return scores.log_softmax(-1).gather(-1, tokens)


@pytest.mark.parametrize(
    "fn, args",
    [
        (raw_log_softmax, (X, T_SAMPLED)),
        (processed_top_k_race, (X, T_SAMPLED)),
        (vllm_sampler, (X, T_ROWS, K_ROWS, P_ROWS)),
    ],
)
def test_logprobs_against_float64(fn, args):
    torch._dynamo.reset()
    counters.clear()
    n = 500
    args = tuple(a.repeat_interleave(n, 0) for a in args)
    with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):
        tokens, logprobs = torch.compile(fn, backend="flashsampling")(*args)
    assert sum(counters["flashsampling"].values()) == 1
    h, t = args[0], args[1]
    if fn is raw_log_softmax:
        logits = (h.bfloat16() @ WEIGHT.bfloat16().T).float()
    else:
        bias = BIAS if fn in (processed_probs, sample_logits_raw) else 0.0
        logits = h @ WEIGHT.T + bias
    tokens = tokens.reshape(-1, 1)
    expected = _expected(fn, logits, t, tokens)
    torch.testing.assert_close(
        logprobs.reshape(-1, 1).double(), expected, rtol=1e-5, atol=2e-6, check_dtype=False
    )
    assert torch.isfinite(logprobs).all()  # masked (-inf) tokens are never drawn
    if fn is vllm_sampler:  # the tokens keep each row's distribution (greedy rows: argmax)
        greedy = T_ROWS < _SAMPLING_EPS
        for r in range(B):
            drawn = tokens[r * n : (r + 1) * n, 0]
            scores = (X[r] @ WEIGHT.T).double()
            if greedy[r]:
                assert (drawn == scores.argmax()).all()
                continue
            scores = scores / T_ROWS[r]
            order = scores.sort(descending=True).values
            scores = scores.masked_fill(scores < order[K_ROWS[r] - 1], -torch.inf)
            probs = scores.softmax(-1)
            ascending = probs.sort().values.cumsum(-1)
            cut = probs.sort().values[(ascending <= 1 - P_ROWS[r]).sum()]
            probs = probs.masked_fill(probs < cut, 0.0)
            assert chi_square_p(drawn, probs / probs.sum()) > 1e-4, r


# --- near misses ----------------------------------------------------------------------------
def bf16_log_softmax(h, t):  # the log-softmax in bf16: another rounding than the op's
    logits = F.linear(h.bfloat16(), WEIGHT.bfloat16())
    tokens = torch.multinomial((logits.float() / t[:, None]).softmax(-1), 1)
    return tokens, logits.log_softmax(-1).gather(-1, tokens)


def processed_with_greedy_rows(h, temperature, k, p):  # log_softmax(l / T) of greedy rows
    logits = F.linear(h, WEIGHT)
    greedy = logits.argmax(dim=-1)
    scores = logits / temperature[:, None]
    probs = scores.softmax(-1)
    sampled = probs.div(torch.empty_like(probs).exponential_()).argmax(-1)
    tokens = torch.where(temperature < _SAMPLING_EPS, greedy, sampled)
    return tokens, scores.log_softmax(-1).gather(-1, tokens[:, None])


def vllm_with_rank(h, temperature, k, p):  # vLLM's gather_logprobs: the token's rank too
    return vllm_sampler(h, temperature, k, p, rank=True)


def raw_and_processed(h, t):
    logits = F.linear(h, WEIGHT)
    probs = (logits / t[:, None]).softmax(-1)
    tokens = torch.multinomial(probs, 1)
    return tokens, logits.log_softmax(-1).gather(-1, tokens), probs.gather(-1, tokens).log()


def before_the_tails_top_k(h, t):  # log_softmax of the scores before the sampler's top-k
    scores = F.linear(h, WEIGHT) / t[:, None]
    probs = scores.softmax(-1)
    values, indices = probs.topk(5)
    tokens = indices.gather(-1, torch.multinomial(values, 1))
    return tokens, scores.log_softmax(-1).gather(-1, tokens)


def other_tokens(h, t):  # the logprob of the argmax, not of the drawn token
    logits = F.linear(h, WEIGHT)
    tokens = torch.multinomial((logits / t[:, None]).softmax(-1), 1)
    return tokens, logits.log_softmax(-1).gather(-1, logits.argmax(-1, keepdim=True))


@pytest.mark.parametrize(
    "fn, args, reason",
    [
        pytest.param(bf16_log_softmax, (X, T_SAMPLED), "computed in torch.bfloat16", id="bf16"),
        pytest.param(raw_and_processed, (X, T_SAMPLED), "both raw and processed", id="both"),
        pytest.param(before_the_tails_top_k, (X, T_SAMPLED), "own truncation", id="tail-top-k"),
    ],
)
def test_other_reads_are_left_alone(fn, args, reason):
    assert_left_alone(fn, *args, reason=reason)
