"""Issue 34's self-check: public projects' samplers, op for op (from their sources, as of
2026-11), one decode step behind an LM head, compiled with backend="flashsampling" on the
CPU (FLASHSAMPLING_CPU=1). Prints, per program, fused or left alone (with the reason), a
two-sample chi-square per row of the compiled draws against the eager program's (2000 each),
and where a logprob is returned, the relative error at the rows where both drew the same
token. "OK" marks the expected outcome (programs that need what the op drops are expected
left alone). Usage: python benchmarks/public_samplers.py [function names]
(about 15 minutes on two busy cores)."""

import logging
import os
import sys

if {"-h", "--help"} & set(sys.argv[1:]):
    print(__doc__)
    sys.exit(0)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # a checkout
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("FLASHSAMPLING_CPU", "1")
import numpy as np
import torch
import torch.nn.functional as F
from scipy import stats
from torch._dynamo.utils import counters
from transformers import (
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

from flashsampling_inductor.graph_pass import SITES

# The programs the tests already type op for op, from one definition (tests/ is a package).
from tests.test_public_filters import litgpt_sample, xt_top_k, xt_top_p
from tests.test_serving_samplers import (  # noqa: E402
    CB,
    apply_top_k_top_p,
    random_sample,
    sglang_sample_from_probs,
)
from tests.test_top_p_min_p import sample_top_p

torch.manual_seed(0)
V, D = 64, 16
W = torch.randn(V, D) * 0.7
LM = torch.nn.Linear(D, V, bias=False)
LM.weight.data = W.clone()


# ---------------- the corpus ----------------
# 1. vLLM v1 Sampler (mixed greedy, apply_top_k_top_p, race), no logprobs
def vllm_sample(logits, T, k, p):
    greedy = logits.argmax(dim=-1).view(-1)
    logits = logits.div_(T.unsqueeze(dim=1))
    logits = apply_top_k_top_p(logits, k, p)
    probs = logits.softmax(dim=-1, dtype=torch.float32)
    sampled = random_sample(probs)
    return torch.where(T < 1e-5, greedy, sampled)


def vllm(h, T, k, p):
    logits = LM(h).to(torch.float32)
    return vllm_sample(logits, T, k, p)


# 2. vLLM with raw logprobs (gather_logprobs: the token's logprob and rank)
def vllm_logprobs(h, T, k, p):
    logits = LM(h)
    raw_logprobs = logits.log_softmax(dim=-1, dtype=torch.float32)
    tokens = vllm_sample(logits.to(torch.float32), T, k, p).long()
    token_ids = tokens.unsqueeze(-1)
    token_logprobs = raw_logprobs.gather(-1, token_ids)
    ranks = (raw_logprobs >= token_logprobs).sum(-1)
    return tokens, token_logprobs, ranks


# 2b. vLLM-style with raw logprobs only (no rank)
def vllm_logprob_only(h, T, k, p):
    logits = LM(h)
    raw_logprobs = logits.log_softmax(dim=-1, dtype=torch.float32)
    tokens = vllm_sample(logits.to(torch.float32), T, k, p).long()
    return tokens, raw_logprobs.gather(-1, tokens.unsqueeze(-1))


# 3. SGLang torch-native sampler
def sglang(h, T, k, p, min_p):
    logits = LM(h)
    logits.div_(T.view(-1, 1))
    return sglang_sample_from_probs(torch.softmax(logits, dim=-1), k, p, min_p)


# 4. TGI: Sampling with a torch.Generator (per request seed)
GEN = torch.Generator().manual_seed(0)


def tgi(h, T):
    scores = LM(h)
    scores = scores.div_(T.unsqueeze(1))
    probs = torch.nn.functional.softmax(scores, -1)
    logprobs = torch.log_softmax(scores, -1)
    q = torch.empty_like(probs).exponential_(1, generator=GEN)
    next_ids = probs.div_(q).argmax(-1)
    return next_ids, torch.gather(logprobs, 1, next_ids.view(-1, 1)).view(-1)


# 5. transformers generate (sample), Qwen3 settings via the real warpers
WARPERS = LogitsProcessorList(
    [TemperatureLogitsWarper(0.6), TopKLogitsWarper(20), TopPLogitsWarper(0.95)]
)


def hf_generate(h, ids):
    next_token_logits = LM(h)[:, -1, :].to(copy=True, dtype=torch.float32)
    next_token_scores = WARPERS(ids, next_token_logits)
    probs = F.softmax(next_token_scores, dim=-1)
    return torch.multinomial(probs, num_samples=1).squeeze(1)


# 6. transformers generate with min-p (Gemma 3 / Qwen3 recommended), T then min-p
WARPERS_MINP = LogitsProcessorList([TemperatureLogitsWarper(0.8), MinPLogitsWarper(0.1)])


def hf_min_p(h, ids):
    scores = WARPERS_MINP(ids, LM(h)[:, -1, :].float())
    return torch.multinomial(F.softmax(scores, dim=-1), num_samples=1).squeeze(1)


# 7. transformers continuous batching warpers (T 0.7, top-k 50, top-p 0.9: the tests' CB)
# + return_logprobs (model_runner._sample)


def hf_cb(h, args):
    scores = LM(h)[None]  # [1, rows, V]
    logits_2d = scores.view(-1, V)
    for proc, a in zip(CB, args, strict=True):
        logits_2d = proc(logits_2d, a)
    scores = logits_2d.view(1, -1, V)
    probs = F.softmax(scores[0], dim=-1)
    next_tokens = torch.multinomial(probs, num_samples=1)
    logprobs = probs.gather(dim=1, index=next_tokens).squeeze(-1).log()
    return next_tokens.squeeze(-1), logprobs


def cb_args(T, k, p):
    st = torch.zeros(3, T.numel(), dtype=torch.int32)
    st[0] = T.float().view(torch.int32)
    st[1] = k.int()
    st[2] = p.float().view(torch.int32)
    return st


# 8. Gemma reference sampler (gemma_pytorch model.Sampler)
def gemma(h, T, p, k):
    logits = LM(h)
    logits.div_(T.unsqueeze(dim=1))
    probs = torch.softmax(logits, dim=-1, dtype=torch.float)
    probs_sort, probs_idx = torch.sort(probs, dim=-1, descending=True)
    probs_sum = torch.cumsum(probs_sort, dim=-1)
    top_ps_mask = (probs_sum - probs_sort) > p.unsqueeze(dim=1)
    probs_sort = torch.where(top_ps_mask, 0, probs_sort)
    top_ks_mask = torch.arange(probs_idx.shape[-1]).expand(probs_idx.shape[0], -1) >= k.unsqueeze(
        dim=1
    )
    probs_sort = torch.where(top_ks_mask, 0, probs_sort)
    probs_sort.div_(probs_sort.sum(dim=-1, keepdim=True))
    probs = torch.gather(probs_sort, dim=-1, index=torch.argsort(probs_idx, dim=-1))
    return torch.multinomial(probs, num_samples=1, replacement=True).squeeze(dim=-1)


# 9. Llama (llama generation.py) sample_top_p
def llama(h):
    logits = LM(h)[:, -1]
    probs = torch.softmax(logits / 0.6, dim=-1)
    return sample_top_p(probs, 0.9).reshape(-1)


# 10. Mistral (mistral-inference generate.sample)
def mistral(h):
    logits = LM(h)[:, -1, :]
    probs = torch.softmax(logits / 0.7, dim=-1)
    return sample_top_p(probs, 0.8).reshape(-1)


# 11. DeepSeek-V3 generate.sample
def deepseek(h):
    logits = LM(h)[:, -1]
    logits = logits / max(0.6, 1e-5)
    probs = torch.softmax(logits, dim=-1)
    return probs.div_(torch.empty_like(probs).exponential_(1)).argmax(dim=-1)


# 12. torchtune generation.sample (top-k, race, .to(int))
def torchtune(h):
    logits = LM(h)[:, -1]
    logits = logits / max(0.8, 1e-5)
    v, _ = torch.topk(logits, min(10, logits.size(-1)))
    pivot = v.select(-1, -1).unsqueeze(-1)
    logits = torch.where(logits < pivot, -float("Inf"), logits)
    probs = torch.nn.functional.softmax(logits, dim=-1)
    q = torch.empty_like(probs).exponential_(1)
    return torch.argmax(probs / q, dim=-1, keepdim=True).to(dtype=torch.int)


# 13. litgpt generate.sample (1-D logits, top-k scatter, top-p; the race under compile,
# multinomial in eager: the same distribution)
def litgpt(h):
    return litgpt_sample(LM(h), temperature=0.8, top_k=20, top_p=0.9)


# 14. x-transformers (top_k filter + gumbel_sample)
def xt_log(t, eps=1e-20):
    return t.clamp(min=eps).log()


def xtransformers(h):
    logits = LM(h)[:, -1]
    filtered = xt_top_k(logits)
    noise = torch.zeros_like(filtered).uniform_(0, 1)
    g = -xt_log(-xt_log(noise))
    return ((filtered / max(0.9, 1e-10)) + g).argmax(dim=-1, keepdim=True)


# 15. x-transformers top_p + multinomial
def xtransformers_top_p(h):
    logits = LM(h)[:, -1]
    probs = F.softmax(xt_top_p(logits) / 1.0, dim=-1)
    return torch.multinomial(probs, 1)


# 16. nanoGPT generate
def nanogpt(idx_h):
    logits = LM(idx_h)
    logits = logits[:, -1, :] / 0.8
    v, _ = torch.topk(logits, min(200 // 10, logits.size(-1)))
    logits[logits < v[:, [-1]]] = -float("Inf")
    probs = F.softmax(logits, dim=-1)
    return torch.multinomial(probs, num_samples=1)


# 17. gpt-fast generate.sample
def gpt_fast(h):
    logits = LM(h)[0, -1]
    logits = logits / max(0.8, 1e-5)
    v, _ = torch.topk(logits, min(20, logits.size(-1)))
    pivot = v.select(-1, -1).unsqueeze(-1)
    logits = torch.where(logits < pivot, -float("Inf"), logits)
    probs = torch.nn.functional.softmax(logits, dim=-1)
    q = torch.empty_like(probs).exponential_(1)
    return torch.argmax(probs / q, dim=-1, keepdim=True).to(dtype=torch.int), probs


def gpt_fast_tokens_only(h):
    return gpt_fast(h)[0]


# 18. minGPT generate
def mingpt(h):
    logits = LM(h)
    logits = logits[:, -1, :] / 1.0
    v, _ = torch.topk(logits, 10)
    logits[logits < v[:, [-1]]] = -float("Inf")
    probs = F.softmax(logits, dim=-1)
    return torch.multinomial(probs, num_samples=1)


# 19. Megatron-LM text_generation sampling.sample (top-p)
def megatron(h):
    logits = LM(h).clone()
    logits.div_(0.9)
    sorted_logits, sorted_indices = torch.sort(logits, descending=True)
    cumulative_probs = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    filter_ = cumulative_probs > 0.9
    filter_[:, 1:] = filter_[:, :-1].clone()
    filter_[..., 0] = 0
    filter_ = filter_.scatter(1, sorted_indices, filter_)
    logits.masked_fill_(filter_, float("-Inf"))
    probs = logits.softmax(dim=-1)
    samples = torch.multinomial(probs, num_samples=1).view(-1)
    return torch.clamp(samples, min=0, max=V - 1)


# 20. RL rollout (TRL / CleanRL style): Categorical sample + log_prob
def rl_categorical(h):
    logits = LM(h)
    dist = torch.distributions.Categorical(logits=logits)
    action = dist.sample()
    return action, dist.log_prob(action)


# 21. Qwen (transformers generate, top_k=20, top_p=0.8) with the processed logprob
# (log_softmax of the warped scores, as compute_transition_scores reads it)
WARPERS_QWEN = LogitsProcessorList(
    [TemperatureLogitsWarper(0.7), TopKLogitsWarper(20), TopPLogitsWarper(0.8)]
)


def qwen_scores(h, ids):
    scores = WARPERS_QWEN(ids, LM(h)[:, -1, :].float())
    probs = F.softmax(scores, dim=-1)
    tok = torch.multinomial(probs, num_samples=1)
    return tok.squeeze(1), scores.log_softmax(-1).gather(-1, tok).squeeze(1)


# negatives: typical-p, repetition penalty
WARPERS_TYP = LogitsProcessorList([TemperatureLogitsWarper(0.8), TypicalLogitsWarper(0.9)])


def hf_typical(h, ids):
    scores = WARPERS_TYP(ids, LM(h)[:, -1, :].float())
    return torch.multinomial(F.softmax(scores, dim=-1), num_samples=1).squeeze(1)


REP = RepetitionPenaltyLogitsProcessor(1.3)


def hf_repetition(h, ids):
    scores = REP(ids, LM(h)[:, -1, :].float()) / 0.7
    return torch.multinomial(F.softmax(scores, dim=-1), num_samples=1).squeeze(1)


B = 3
H2 = torch.randn(B, D)
H3 = torch.randn(B, 5, D)
H1 = torch.randn(1, 5, D)
IDS = torch.randint(0, V, (B, 7))
T = torch.tensor([0.0, 0.8, 1.2])
TS = torch.tensor([0.9, 0.8, 1.2])
K = torch.tensor([5, 64, 10])
P = torch.tensor([0.9, 1.0, 0.7])
MINP = torch.tensor([0.05, 0.0, 0.1])
CORPUS = [
    # name, fn, args, expect ("fused"/"refused")
    ("vLLM Sampler", vllm, (H2, T, K, P), "fused"),
    (
        "vLLM Sampler + logprobs (gather_logprobs: logprob and rank)",
        vllm_logprobs,
        (H2, T, K, P),
        "refused",
    ),
    ("vLLM-style + raw logprob (no rank)", vllm_logprob_only, (H2, T, K, P), "fused"),
    ("SGLang torch-native", sglang, (H2, TS, K, P, MINP), "fused"),
    ("TGI Sampling (generator) + logprobs", tgi, (H2, TS), "refused"),
    ("transformers generate (Qwen3 warpers)", hf_generate, (H3, IDS), "fused"),
    ("transformers generate min-p", hf_min_p, (H3, IDS), "fused"),
    ("transformers CB warpers + return_logprobs", hf_cb, (H2, cb_args(TS, K, P)), "fused"),
    ("Gemma reference sampler", gemma, (H2, TS, P, K), "fused"),
    ("Llama sample_top_p", llama, (H3,), "fused"),
    ("Mistral sample", mistral, (H3,), "fused"),
    ("DeepSeek-V3 sample", deepseek, (H3,), "fused"),
    ("torchtune sample", torchtune, (H3,), "fused"),
    ("litgpt sample", litgpt, (H1,), "fused"),
    ("x-transformers top_k + gumbel_sample", xtransformers, (H3,), "fused"),
    ("x-transformers top_p + multinomial", xtransformers_top_p, (H3,), "fused"),
    ("nanoGPT generate", nanogpt, (H3,), "fused"),
    ("gpt-fast sample (returns probs)", gpt_fast, (H1,), "refused"),
    ("gpt-fast sample tokens only", gpt_fast_tokens_only, (H1,), "fused"),
    ("minGPT generate", mingpt, (H3,), "fused"),
    ("Megatron-LM sample top-p", megatron, (H2,), "fused"),
    ("RL Categorical sample + log_prob", rl_categorical, (H2,), "fused"),
    ("Qwen generate + processed logprob", qwen_scores, (H3, IDS), "fused"),
    ("transformers typical-p", hf_typical, (H3, IDS), "refused"),
    ("transformers repetition penalty", hf_repetition, (H3, IDS), "refused"),
]


def tokens_of(out):
    return (out[0] if isinstance(out, tuple) else out).reshape(-1)


def big_args(fn, args, n):
    if args[0].shape[0] != B:
        return None
    out = []
    for a in args:
        if a.dtype == torch.int32:  # the CB warpers' int32 storage
            out.append(cb_args(*(x.repeat_interleave(n) for x in (TS, K, P))))
        else:
            out.append(a.repeat_interleave(n, 0) if a.dim() else a)
    return out


def check(name, fn, args, expect, n=2000):
    torch._dynamo.reset()
    counters.clear()
    sites = []
    tok = SITES.set(sites)
    rargs = big_args(fn, args, n)
    try:
        with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):
            compiled = torch.compile(fn, backend="flashsampling", dynamic=False)
            c = compiled(*[a.clone() for a in (rargs or args)])
    finally:
        SITES.reset(tok)
    fused = sum(counters["flashsampling"].values()) > 0
    reasons = [s.reason for s in sites if not s.rewritten]
    status = "FUSED" if fused else "left alone"
    mark = "OK " if (status == "FUSED") == (expect == "fused") else "XX "
    line = f"{mark}{name:58s} {status:10s} {dict(counters['flashsampling'])} {reasons[:1]}"
    bad = []
    try:
        if rargs is not None:
            with torch.no_grad():
                e = fn(*[a.clone() for a in rargs])
            ct, et = tokens_of(c).view(B, n), tokens_of(e).view(B, n)
            for r in range(B):
                table = np.stack(
                    [
                        np.bincount(ct[r].numpy(), minlength=V),
                        np.bincount(et[r].numpy(), minlength=V),
                    ]
                )
                table = table[:, table.sum(0) > 0]
                if table.shape[1] > 1:
                    pv = stats.chi2_contingency(table)[1]
                    if pv < 1e-4:
                        bad.append((r, round(pv, 6)))
            if isinstance(c, tuple) and len(c) > 1 and isinstance(e, tuple):
                # logprobs at the compiled tokens: the eager program's own table at those tokens
                lp_c = c[1].reshape(-1).double()
                # rows where both drew the same token: compare values
                same_tok = tokens_of(c) == tokens_of(e)
                if same_tok.any():
                    diff = (lp_c[same_tok] - e[1].reshape(-1).double()[same_tok]).abs()
                    rel = (
                        (diff / e[1].reshape(-1).double()[same_tok].abs().clamp_min(1e-6))
                        .max()
                        .item()
                    )
                    line += f" logprob rel err {rel:.1e}"
                    if rel > 1e-4:
                        bad.append(("logprob", rel))
        else:  # one row per call: many calls of the compiled step
            cs, es = [], []
            for _ in range(300):
                with torch.no_grad():
                    cs.append(int(tokens_of(compiled(*args))[0]))
                    es.append(int(tokens_of(fn(*args))[0]))
            table = np.stack([np.bincount(cs, minlength=V), np.bincount(es, minlength=V)])
            table = table[:, table.sum(0) > 0]
            if table.shape[1] > 1:
                pv = stats.chi2_contingency(table)[1]
                if pv < 1e-4:
                    bad.append((0, pv))
    except Exception as err:
        bad.append(("error", repr(err)[:200]))
    print(line, "| dist:", "ok" if not bad else bad, flush=True)
    return fused, bad


if __name__ == "__main__":
    logging.getLogger("flashsampling_inductor").setLevel(logging.ERROR)
    sel = sys.argv[1:]
    res = []
    for name, fn, args, expect in CORPUS:
        if sel and fn.__name__ not in sel:
            continue
        try:
            res.append((name, expect, *check(name, fn, args, expect)))
        except Exception as err:
            print(f"!! {name}: {type(err).__name__}: {str(err)[:300]}", flush=True)
    print("fused:", sum(r[2] for r in res), "of", len(res))
