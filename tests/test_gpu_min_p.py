"""Top-p alone, min-p and the soft-cap through the fused kernel at real size on a GPU:
V = 151936, bf16.

Run with ``pytest -m gpu tests/test_gpu_min_p.py`` on a CUDA machine (skipped elsewhere);
``benchmarks/gpu_check.py`` runs it with the other gpu tests. The statistical tests draw
2**24 (16.8M) tokens each.
"""

from __future__ import annotations

import pytest
import torch
from scipy import stats

from flashsampling_inductor import fused_sample, sample_logits

from .sampling_oracle import (
    ALPHA,
    assert_pathwise_equal,
    chi_square_power,
    make_exact_problem,
    warped_probabilities,
)

pytestmark = pytest.mark.gpu

VOCAB = 151936
CUDA = torch.device("cuda")


def row_knobs(batch: int):
    """Per-row p in {1, 0.9, 0.5}, min_p in {0, 0.05, 0.1, 0.3}, T in {0.7, 1.2, 0.6, 0}: no
    top-k, so top-p runs over the whole row."""
    top_p = torch.tensor([1.0, 0.9, 0.5], device=CUDA).repeat(batch)[:batch]
    min_p = torch.tensor([0.0, 0.05, 0.1, 0.3], device=CUDA).repeat(batch)[:batch]
    temperature = torch.tensor([0.7, 1.2, 0.6, 0.0, 1.0], device=CUDA).repeat(batch)[:batch]
    return top_p, min_p, temperature


@pytest.mark.parametrize("batch, hidden_size", [(1, 2048), (37, 4096), (256, 2048)])
@pytest.mark.parametrize("softcap", [None, 30.0], ids=["plain", "softcap30"])
def test_gpu_top_p_min_p_kernel_matches_reference_pathwise(batch, hidden_size, softcap):
    """Exact logits (multiples of 1/32), per-row p / min_p / T with greedy rows, per-row
    seeds, 2 samples, bf16-rounded logits: the fused kernel draws the reference's tokens up
    to documented noise near-ties (without a soft-cap; with one, the device tanh may differ
    from torch's by an ulp, so at most 1 draw in 1000 may differ), and sample_logits on the
    same logits draws the reference's."""
    hidden, weight = make_exact_problem(batch, VOCAB, hidden_size, device=CUDA)
    top_p, min_p, temperature = row_knobs(batch)
    seed = torch.arange(batch, device=CUDA) * 104729 + 11
    arguments = dict(
        temperature=temperature, top_p=top_p, min_p=min_p, softcap=softcap, seed=seed,
        num_samples=2, logits_dtype=torch.bfloat16,
    )  # fmt: skip
    tokens = fused_sample(hidden, weight, impl="triton", **arguments)
    expected = fused_sample(hidden, weight, impl="torch", **arguments)
    if softcap is None:
        assert_pathwise_equal(
            tokens, expected, hidden, weight, temperature=temperature, seed=seed,
            logits_dtype=torch.bfloat16,
        )  # fmt: skip
    else:
        assert int((tokens != expected).sum()) <= max(1, tokens.numel() // 1000)
    logits = (hidden.float() @ weight.float().T).bfloat16()
    arguments.pop("logits_dtype")
    assert torch.equal(sample_logits(logits, impl="torch", **arguments), expected)


@pytest.mark.parametrize("knobs", [{"top_p": 0.9}, {"min_p": 0.05}], ids=["top-p", "min-p"])
def test_gpu_a_flat_row_takes_the_exact_fallback(knobs):
    """Rows whose scores are nearly flat (logits / 100: the 0.9 nucleus and the min-p 0.05
    survivors are most of the vocabulary) overflow every tile; the fallback draws the
    reference's tokens."""
    hidden, weight = make_exact_problem(4, VOCAB, 2048, device=CUDA)
    weight = weight / 128
    arguments = dict(temperature=1.0, seed=5, num_samples=3, **knobs)
    tokens = fused_sample(hidden, weight, impl="triton", **arguments)
    expected = fused_sample(hidden, weight, impl="torch", **arguments)
    assert_pathwise_equal(tokens, expected, hidden, weight, temperature=1.0, seed=5)


def three_kinds_of_rows(batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact hidden / weight whose rows cycle through, for min-p 0.1: a model-like row (std
    ~5.7, a handful of survivors: stage 2 decides it), a row whose survivors are the ~300
    tokens 1000-1299 (more than 4 per stage-1 tile, but all in at most 6 tiles: the
    tile-level fallback), and a flat row (every token survives: the whole row is
    recomputed). (Top-p 0.9 would send the second kind to the whole-row fallback too: its
    stage 2 sees 24 of the 300 and cannot bound the nucleus's last key.)"""
    hidden, weight = make_exact_problem(batch, VOCAB, 2048, device=CUDA)
    # a row with hidden[:72] = 3: logit 18 +- 0.5 at tokens 1000-1299, below ~8 elsewhere
    weight[1000:1300, :64] = 3 / 32
    hidden[1::3] = 0
    hidden[1::3, :72] = 3
    hidden[2::3] = 0
    hidden[2::3, 100] = 1  # logits in {-3, ..., 3} / 32
    return hidden, weight


@pytest.mark.parametrize("batch", [3, 40, 200], ids=["B3-merged", "B40-merged", "B200"])
def test_gpu_stage2_patched_and_whole_row_fallbacks_in_one_batch(batch, overflowed):
    """One batch with rows stage 2 decides, rows the tile-level fallback patches and rows
    the whole-row fallback recomputes (all three codes seen): every row draws the
    reference's tokens, and so does a CUDA-graph replay of the same seeds."""
    from flashsampling_inductor import truncation_kernel

    hidden, weight = three_kinds_of_rows(batch)
    seed = torch.arange(batch, device=CUDA) * 7919 + 5
    arguments = dict(temperature=1.0, min_p=0.1, seed=seed, num_samples=2)
    expected = fused_sample(hidden, weight, impl="torch", **arguments)
    tokens = fused_sample(hidden, weight, impl="triton", **arguments)
    assert_pathwise_equal(tokens, expected, hidden, weight, temperature=1.0, seed=seed)
    (codes,) = overflowed
    kinds = {0, truncation_kernel.OVERFLOW_PATCH.value, truncation_kernel.OVERFLOW_FULL.value}
    assert set(codes.tolist()) == kinds, codes

    graph = torch.cuda.CUDAGraph()
    fused_sample(hidden, weight, impl="triton", **arguments)  # warm-up outside the capture
    with torch.cuda.graph(graph):
        out = fused_sample(hidden, weight, impl="triton", **arguments)
    out.fill_(-1)
    graph.replay()
    assert torch.equal(out, tokens)


@pytest.mark.parametrize(
    "top_p, min_p, temperature, softcap",
    [(0.9, 0.0, 0.6, 0.0), (1.0, 0.1, 1.0, 0.0), (0.95, 0.05, 0.8, 15.0)],
    ids=["top-p0.9-T0.6", "min-p0.1", "softcap15-top-p0.95-min-p0.05"],
)
def test_gpu_draws_follow_float64_warpers(top_p, min_p, temperature, softcap):
    """2**24 draws of one real-size row (256 rows with their own seeds, 65536 samples each)
    against transformers' warpers (soft-cap, temperature, top-p, min-p) in float64:
    chi-square at level ALPHA over the kept tokens, power 0.9 against a 0.6% relative bias
    (more cells than the kept tokens of these rows hold); no removed token drawn."""
    rows, samples = 256, 2**16
    n = rows * samples
    generator = torch.Generator().manual_seed(4)
    hidden = torch.randn(1, 2048, generator=generator).to(CUDA, torch.bfloat16)
    weight = (torch.randn(VOCAB, 2048, generator=generator) * 0.1).to(CUDA, torch.bfloat16)
    logits = (hidden.double() @ weight.double().T)[0].float()  # what the kernel must see
    target = warped_probabilities(logits.double().cpu(), temperature, 0, top_p, min_p, softcap)
    kept = target > 0
    assert 1 < int(kept.sum()) < 5000, int(kept.sum())
    assert chi_square_power(n, 0.006, int(kept.sum())) >= 0.9
    tokens = fused_sample(
        hidden.expand(rows, -1), weight, temperature=temperature, top_p=top_p, min_p=min_p,
        softcap=softcap or None, seed=torch.arange(rows, device=CUDA) + 1, num_samples=samples,
    )  # fmt: skip
    counts = torch.bincount(tokens.flatten(), minlength=VOCAB).double().cpu()
    assert counts[~kept].sum() == 0, counts[~kept].nonzero().flatten()[:10]
    p_value = stats.chisquare(counts[kept].numpy(), (target[kept] * n).numpy()).pvalue
    assert p_value > ALPHA, p_value


def test_gpu_top_p_min_p_under_cuda_graph_replays_fresh_draws():
    """Unseeded top-p + min-p + soft-cap captured in a CUDA graph: every replay draws new
    valid tokens (no host sync inside: capture would fail)."""
    hidden, weight = make_exact_problem(16, VOCAB, 2048, device=CUDA)
    min_p = torch.full((16,), 0.05, device=CUDA)

    def step():
        return fused_sample(hidden, weight, top_p=0.9, min_p=min_p, softcap=30.0, num_samples=4)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    graph.replay()
    first = out.clone()
    graph.replay()
    assert not torch.equal(first, out)
    assert bool(((out >= 0) & (out < VOCAB)).all())
