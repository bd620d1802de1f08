"""``top_p_whole_row``: top-p measured on the whole row's mass, next to a top-k cut (the order
of SGLang's torch-native sampler and the Gemma reference sampler), against its float64
contract, pathwise (the candidates, the fallback's patched and full passes, the
log-probability of the kept set) and with the flag's effect shown.

The contract, as those samplers write it on sorted probabilities: a token is kept iff it is
a top-k survivor (``l >= the k-th largest l``) and the whole row's ``softmax(l / T)`` mass of
the tokens with a strictly larger ``l`` is < p.
"""

from __future__ import annotations

import pytest
import torch

from flashsampling_inductor import fused_sample, sample_logits
from flashsampling_inductor.dispatch import SampleConfig, triton_fused_sample
from flashsampling_inductor.params import SamplingParams

from .sampling_oracle import DEVICE, contract_keep, make_exact_problem
from .test_truncation import exact_logits, per_row_grid
from .test_truncation_candidates import FULL, PATCH, masked_problem

# fp32 masses of ~1000 terms err by < 1e-6: rows farther than this from p cannot flip.
MARGIN = 1e-5


def whole_row_keep(logits: torch.Tensor, temperature: float, top_k: int, top_p: float):
    """The contract for one row [V] in float64 -> (bool [V], the top-p decision's margin)."""
    logits = logits.double()
    keep = torch.ones_like(logits, dtype=torch.bool)
    if 0 < top_k < logits.shape[-1]:
        keep = logits >= torch.topk(logits, top_k)[0][-1]
    margin = float("inf")
    if top_p < 1.0 and temperature > 0:
        probabilities = torch.softmax(logits / temperature, 0)
        larger = (logits[None, :] > logits[:, None]).double() @ probabilities
        keep = keep & (larger < top_p)
        margin = float((larger[probabilities > 0] - top_p).abs().min())
    return keep, margin


def contract_tokens(logits, temperature, top_k, top_p, seed, num_samples):
    """Plain Gumbel-max (the reference) from logits the float64 contract truncated: what the
    op must draw on the same seed. Asserts every row's top-p decision is clear of rounding."""
    rows = []
    for row, t, k, p in zip(
        logits, temperature.tolist(), top_k.tolist(), top_p.tolist(), strict=True
    ):
        keep, margin = whole_row_keep(row.cpu(), t, k, p)
        assert margin > MARGIN, (t, k, p, margin)
        rows.append(row.masked_fill(~keep.to(row.device), float("-inf")))
    return sample_logits(
        torch.stack(rows), temperature=temperature, seed=seed, num_samples=num_samples,
        impl="torch",
    )  # fmt: skip


def small_grid():
    """[B] top_k, top_p, temperature: k in {2, 20, 200, V} x p in {0.5, 0.95}, temperatures
    cycling through 0.7, 1.3 and 0 (greedy rows): 8 rows, a third of ``per_row_grid``'s (the
    interpreter's cost is per row)."""
    grid = [(k, p) for k in (2, 20, 200, 1000) for p in (0.5, 0.95)]
    top_k = torch.tensor([k for k, _ in grid], device=DEVICE)
    top_p = torch.tensor([p for _, p in grid], device=DEVICE)
    temperature = torch.tensor([0.7, 1.3, 0.0], device=DEVICE).repeat(len(grid))[: len(grid)]
    return top_k, top_p, temperature


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_per_row_knobs_draw_the_whole_row_contract(impl):
    """The (k, p) grid (``small_grid``), per-row temperatures with greedy rows, per-row seeds,
    two samples, a masked bias."""
    top_k, top_p, temperature = small_grid()
    batch = len(top_k)
    hidden, weight, bias, seed = masked_problem(batch)
    tokens = fused_sample(
        hidden, weight, bias=bias, temperature=temperature, top_k=top_k, top_p=top_p,
        seed=seed, num_samples=2, impl=impl, top_p_whole_row=True,
    )  # fmt: skip
    expected = contract_tokens(
        exact_logits(hidden, weight, bias), temperature, top_k, top_p, seed, 2
    )
    assert torch.equal(tokens, expected)


def test_candidates_and_fallback_draw_the_whole_row_contract(overflowed):
    """Small tiles, so that rows go through the candidates, the fallback's patched pass and
    its full one: the whole row's mass comes from stage 1's partials in the first two and
    from the recomputed row in the last; every row draws the contract's tokens."""
    top_k, top_p, temperature = per_row_grid()
    batch = len(top_k)
    hidden, weight, bias, seed = masked_problem(batch)
    params = SamplingParams(
        temperature, 1.0, seed, 0, 2, None, top_k, 0, top_p, 1.0, top_p_whole_row=True
    )
    tokens = triton_fused_sample(hidden, weight, bias, params, SampleConfig(32, 16, 64))
    expected = contract_tokens(
        exact_logits(hidden, weight, bias), temperature, top_k, top_p, seed, 2
    )
    assert torch.equal(tokens, expected)
    (flags,) = overflowed
    assert set(flags.tolist()) == {0, FULL, PATCH}, flags


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_the_whole_row_nucleus_is_not_the_survivors(impl):
    """Rows where the two orders keep different sets (top-k 8, p = 0.1, T = 2: the whole row
    weighs far more than its 8 survivors): the processed log-probability of each drawn token
    is that of the whole-row kept set, not the survivors' order's."""
    hidden, weight = make_exact_problem(4, 1000, 64, seed=3)
    logits = exact_logits(hidden, weight).cpu()
    tokens, logprobs = fused_sample(
        hidden, weight, temperature=2.0, top_k=8, top_p=0.1, seed=9, impl=impl,
        top_p_whole_row=True, return_logprobs="processed",
    )  # fmt: skip
    for row, token, logprob in zip(logits, tokens[:, 0].cpu(), logprobs[:, 0].cpu(), strict=True):
        keep, margin = whole_row_keep(row, 2.0, 8, 0.1)
        survivors = contract_keep(row, 2.0, 8, 0.1)
        assert margin > MARGIN and not torch.equal(keep, survivors)
        scaled = row.double() / 2.0
        expected = torch.log_softmax(scaled.masked_fill(~keep, float("-inf")), 0)[token]
        other = torch.log_softmax(scaled.masked_fill(~survivors, float("-inf")), 0)[token]
        assert abs(float(logprob) - float(expected)) < 1e-5
        assert abs(float(logprob) - float(other)) > 0.01
    if impl == "triton":  # (sample_logits on the same logits: the same tokens)
        drawn = sample_logits(
            exact_logits(hidden, weight), temperature=2.0, top_k=8, top_p=0.1, seed=9,
            impl=impl, top_p_whole_row=True,
        )  # fmt: skip
        assert torch.equal(drawn, tokens)


def test_the_flag_must_be_a_bool():
    hidden, weight = make_exact_problem(2, 100, 16)
    with pytest.raises(TypeError, match="top_p_whole_row must be a bool"):
        fused_sample(hidden, weight, top_p=0.9, top_p_whole_row=1)
    with pytest.raises(TypeError, match="top_p_whole_row must be a bool"):
        sample_logits(torch.zeros(2, 10, device=DEVICE), top_p=0.9, top_p_whole_row="yes")
