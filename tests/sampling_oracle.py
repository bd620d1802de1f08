"""Shared by the sampler tests: problem builders, the noise contract, and the pathwise check.

The pathwise check is the contract between the kernel and the reference: on the same seed
both draw the same Gumbel noise, so they pick the same token, except where two perturbed
scores are so close that the rounding of fp32 arithmetic may order them either way.
``assert_pathwise_equal`` allows exactly those near-ties, with the tolerance derived in its
docstring, and nothing else.
"""

from __future__ import annotations

import math

import torch
from scipy import stats

from flashsampling_inductor.reference import LN2, bits_to_log2_gumbel, philox4x32, split_seed

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
FP32_UNIT_ROUNDOFF = 2.0**-24
ALPHA = 1e-3  # significance level of every statistical test
_U32 = 0xFFFFFFFF


def chi_square_power(samples: int, relative_bias: float, cells: int, mass: float = 1.0) -> float:
    """Power of the chi-square goodness-of-fit test (df = cells - 1, level ALPHA) against
    cell probabilities p_i (1 +- relative_bias) on cells of total mass ``mass``, signs
    balanced so the mass is unchanged: the statistic is then noncentral chi-square with
    noncentrality n sum p_i delta**2 = n * mass * delta**2.
    """
    df = cells - 1
    critical = stats.chi2.ppf(1 - ALPHA, df)
    return float(stats.ncx2.sf(critical, df, samples * mass * relative_bias**2))


def head_and_tail_cells(
    values: torch.Tensor, probabilities: torch.Tensor, head: torch.Tensor, tail_bins: int
) -> torch.Tensor:
    """Sum ``values`` [V] into cells for a chi-square test: one per ``head`` token, and
    ``tail_bins`` bins of the other tokens, sorted by probability, with about equal mass."""
    tail = torch.ones(len(values), dtype=torch.bool)
    tail[head] = False
    tail_order = tail.nonzero().flatten()[probabilities[tail].argsort()]
    cumulative = probabilities[tail_order].cumsum(0) / probabilities[tail_order].sum()
    bin_of = (cumulative * tail_bins).ceil().clamp(1, tail_bins).long() - 1
    tail_cells = torch.zeros(tail_bins, dtype=values.dtype).index_add_(
        0, bin_of, values[tail_order]
    )
    return torch.cat([values[head], tail_cells])


def make_problem(
    batch: int,
    vocab_size: int,
    hidden_size: int,
    dtype: torch.dtype = torch.float32,
    *,
    logit_std: float = 3.0,
    strided: bool = False,
    seed: int = 0,
    device: torch.device = DEVICE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random hidden [B, D] and weight [V, D] whose logits have standard deviation ~logit_std.

    ``strided=True`` returns non-contiguous views: hidden with an element stride of 2, and
    weight in column-major order (a view of a [D, V] matrix), as a transposed tied embedding.
    """
    generator = torch.Generator().manual_seed(seed)
    weight_scale = logit_std / hidden_size**0.5
    if strided:
        hidden = torch.randn(batch, 2 * hidden_size, generator=generator)
        weight = torch.randn(hidden_size, vocab_size, generator=generator) * weight_scale
        hidden, weight = hidden.to(device, dtype)[:, ::2], weight.to(device, dtype).T
    else:
        hidden = torch.randn(batch, hidden_size, generator=generator)
        weight = torch.randn(vocab_size, hidden_size, generator=generator) * weight_scale
        hidden, weight = hidden.to(device, dtype), weight.to(device, dtype)
    return hidden, weight


def make_exact_problem(
    batch: int,
    vocab_size: int,
    hidden_size: int,
    dtype: torch.dtype = torch.bfloat16,
    *,
    seed: int = 0,
    device: torch.device = DEVICE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden and weight whose logits are exact in fp32 in any summation order.

    hidden holds integers in [-3, 3] and weight multiples of 1/32 in [-3/32, 3/32], all exact
    in bf16/fp16; every partial sum is a multiple of 1/32 below 2**10, so it needs at most
    15 significant bits and fp32 adds it exactly. The logits have standard deviation ~1 for
    D = 64, and the kernel and the reference must agree token for token, whatever the tiling.
    """
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randint(-3, 4, (batch, hidden_size), generator=generator)
    weight = torch.randint(-3, 4, (vocab_size, hidden_size), generator=generator) / 32
    return hidden.to(device, dtype), weight.to(device, dtype)


def row_keys(seed, batch: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The Philox key halves and row counter of every row, [B] int64 each, per the contract.

    A Python int or 0-d tensor seed keys every row with the same 64 bits and counts rows by
    their index; a [B] tensor keys row i with seed[i] and a row counter of 0.
    """
    if isinstance(seed, torch.Tensor) and seed.dim() == 1:
        seeds = seed.cpu()
        row_counter = torch.zeros(batch, dtype=torch.int64)
    else:
        bits = int(seed) % 2**64
        seeds = torch.full((batch,), bits - 2**64 if bits >= 2**63 else bits, dtype=torch.int64)
        row_counter = torch.arange(batch, dtype=torch.int64)
    seed_lo, seed_hi = split_seed(seeds)
    return seed_lo, seed_hi, row_counter


def row_temperatures(temperature, batch: int) -> torch.Tensor:
    """[B] float64 temperatures, rounded through fp32 as the op stores them."""
    if isinstance(temperature, torch.Tensor):
        return temperature.cpu().float().expand(batch).double()
    return torch.full((batch,), float(temperature), dtype=torch.float32).double()


def philox_bits(seed_lo, seed_hi, row_counter, sample_index, vocab_index) -> torch.Tensor:
    """The 32 random bits of (row, sample, token), elementwise over int64 index tensors."""
    zero = torch.zeros_like(vocab_index)
    words = philox4x32(
        vocab_index >> 2, row_counter + zero, sample_index + zero, zero, seed_lo, seed_hi
    )
    word = vocab_index & 3
    bits = words[3]
    for index in range(3):
        bits = torch.where(word == index, words[index], bits)
    return bits


def noise_at(seed, batch: int, rows, samples, tokens) -> torch.Tensor:
    """Reference base-2 Gumbel noise (fp32) of the given (row, sample, token) triples."""
    seed_lo, seed_hi, row_counter = row_keys(seed, batch)
    bits = philox_bits(seed_lo[rows], seed_hi[rows], row_counter[rows], samples, tokens)
    return bits_to_log2_gumbel(bits)


def assert_pathwise_equal(
    tokens: torch.Tensor,
    expected: torch.Tensor,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    temperature=1.0,
    seed,
    logits_dtype: torch.dtype | None = None,
) -> int:
    """Assert ``tokens`` (kernel) equal ``expected`` (reference) up to documented near-ties.

    Where the two disagree on (row, sample) with tokens k and r, recompute both perturbed
    scores ``s = logit + T ln2 g`` (g: the reference's base-2 Gumbel noise) in float64 from
    the fp64 logits, and require ``|s_k - s_r| <= tol_k + tol_r``, where ``tol`` bounds how
    far the fp32 score either implementation computes can lie from ``s``:

    * matmul: any fp32 summation order of a D-term dot product (products of bf16/fp16
      values are exact in fp32) errs by at most ``gamma_D * sum_d |h_d w_d|`` with
      ``gamma_D = D u / (1 - D u)``, u = 2**-24 (Higham, Accuracy and Stability, 3.1);
    * logits_dtype: rounding two logits that differ by less than an ulp of that dtype can
      give values one ulp apart, ``eps(dtype) * |logit|``;
    * the bias add, the product ``(T ln2) g``, the final add and up to 4 ulp of difference
      in the noise itself: ``8 u (|logit| + T ln2 |g|)``; plus ``T ln2 2**-21`` for a device
      log2 whose error is absolute near 1 (PTX lg2.approx: 2**-22 on [0.5, 2]) in the
      outer log of the noise.

    So a disagreement is accepted only if both scores are finite and the fp64 gap is below
    the sum of the two bounds: any real error (wrong noise, wrong token, masked or NaN token
    drawn) fails. Returns the number of near-ties accepted.
    """
    batch, vocab_size = hidden.shape[0], weight.shape[0]
    assert tokens.dtype == torch.int64, tokens.dtype
    assert tokens.shape == expected.shape, (tokens.shape, expected.shape)
    assert tokens.device == expected.device, (tokens.device, expected.device)
    tokens, expected = tokens.cpu(), expected.cpu()
    assert bool(((tokens >= 0) & (tokens < vocab_size)).all()), f"token out of [0, {vocab_size})"
    rows, samples = (tokens != expected).nonzero().unbind(1)
    if rows.numel() == 0:
        return 0
    temperatures = row_temperatures(temperature, batch)[rows]
    score_k, tol_k = _score_and_tolerance(
        hidden, weight, bias, temperatures, logits_dtype, seed, rows, samples, tokens[rows, samples]
    )
    score_r, tol_r = _score_and_tolerance(
        hidden,
        weight,
        bias,
        temperatures,
        logits_dtype,
        seed,
        rows,
        samples,
        expected[rows, samples],
    )
    gap = (score_k - score_r).abs()
    near_tie = score_k.isfinite() & score_r.isfinite() & (gap <= tol_k + tol_r)
    if not bool(near_tie.all()):
        bad = (~near_tie).nonzero().flatten()[:5]
        details = "\n".join(
            f"  row {rows[i].item()} sample {samples[i].item()}: kernel token "
            f"{tokens[rows[i], samples[i]].item()} (score {score_k[i].item():.9g}) vs reference "
            f"{expected[rows[i], samples[i]].item()} (score {score_r[i].item():.9g}); gap "
            f"{gap[i].item():.3g} > tolerance {(tol_k[i] + tol_r[i]).item():.3g}"
            for i in bad.tolist()
        )
        raise AssertionError(
            f"{int((~near_tie).sum())} of {tokens.numel()} draws differ beyond a near-tie:\n"
            + details
        )
    return int(rows.numel())


def _score_and_tolerance(
    hidden, weight, bias, temperatures, logits_dtype, seed, rows, samples, picked
):
    """fp64 perturbed score of token ``picked`` in (row, sample), and its error bound."""
    hidden_size = hidden.shape[1]
    # Gather the rows on the device first: a real-size weight is gigabytes in float64.
    h = hidden.detach()[rows.to(hidden.device)].cpu().double()
    w = weight.detach()[picked.to(weight.device)].cpu().double()
    logit = (h * w).sum(-1)
    gamma = hidden_size * FP32_UNIT_ROUNDOFF / (1 - hidden_size * FP32_UNIT_ROUNDOFF)
    tolerance = gamma * (h.abs() * w.abs()).sum(-1)
    if bias is not None:
        logit = logit + bias.detach()[picked.to(bias.device)].cpu().double()
    if logits_dtype is not None:
        logit = logit.to(logits_dtype).double()
        tolerance = tolerance + torch.finfo(logits_dtype).eps * logit.abs()
    noise = noise_at(seed, hidden.shape[0], rows, samples, picked).double()
    noise_scale = temperatures * LN2
    score = logit + noise_scale * noise
    score = score.masked_fill(score.isnan(), float("-inf"))
    rounding = 8 * FP32_UNIT_ROUNDOFF * (logit.abs() + noise_scale * noise.abs())
    tolerance = tolerance + rounding + noise_scale * 2.0**-21
    return score, tolerance


def warped_probabilities(
    logits: torch.Tensor,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    softcap: float = 0.0,
) -> torch.Tensor:
    """float64 [..., V] probabilities after transformers' warpers, in their order and forms:
    Gemma 2's soft-cap ``tanh(l / c) * c`` first, temperature, ``TopKLogitsWarper``
    (``scores < topk(scores, k)[..., -1, None]`` set to -inf), ``TopPLogitsWarper``
    (ascending sort, softmax, cumsum, ``<= 1 - p`` removed with the last token kept,
    scattered back), ``MinPLogitsWarper`` (softmax, ``probs < min_p * amax(probs)``
    removed, the largest token kept), then softmax. 0 / 1.0 / 0 are off; k >= V is off.

    Ties at the top-p boundary are ordered by the sort here; the op keeps them all, so tests
    with top-p use logits without ties where the mass crosses p."""
    scores = logits.double()
    if softcap > 0:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores / temperature
    if 0 < top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k)[0][..., -1, None]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, sorted_indices = torch.sort(scores, descending=False)
        cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        sorted_remove = cumulative <= (1 - top_p)
        sorted_remove[..., -1:] = False
        remove = sorted_remove.scatter(-1, sorted_indices, sorted_remove)
        scores = scores.masked_fill(remove, float("-inf"))
    if min_p > 0.0:
        probabilities = scores.softmax(dim=-1)
        remove = probabilities < min_p * probabilities.amax(dim=-1, keepdim=True)
        scores = scores.masked_fill(remove, float("-inf"))
    return scores.softmax(dim=-1)


def top_p_margin(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> float:
    """How far (in probability mass, float64) the top-p decision of the row [V] is from
    flipping: min over the top-k survivors of |mass of strictly larger survivors - p|. A
    pathwise comparison against fp32 masses is meaningful only where this is not tiny."""
    if top_p >= 1.0 or temperature == 0:
        return float("inf")
    probabilities = warped_probabilities(logits, temperature, top_k)
    values = logits.double()[probabilities > 0].unique()
    masses = torch.stack([probabilities[logits.double() > v].sum() for v in values])
    return float((masses - top_p).abs().min())


def min_p_margin(logits: torch.Tensor, temperature: float, min_p: float) -> float:
    """How far (in score units, float64) the min-p decision of the row [V] is from flipping:
    min over the finite scores of |l - (max + T log(min_p))|. The op computes that bound in
    fp32, so a pathwise comparison needs this well above the fp32 rounding of the scores
    (the maximum itself excepted at min_p = 1, where the bound is exact)."""
    if min_p <= 0.0 or temperature == 0:
        return float("inf")
    scores = logits.double()
    finite = scores[scores.isfinite()]
    bound = finite.max() + temperature * math.log(min_p)
    if min_p == 1.0:
        # log(1) = 0 exactly: the bound is the maximum in fp32 too, and its ties are kept.
        finite = finite[finite != bound]
    return float((finite - bound).abs().min()) if finite.numel() else float("inf")


def contract_keep(
    logits: torch.Tensor, temperature: float, top_k: int, top_p: float, min_p: float = 0.0
):
    """The op's contract for one row [V] of scores (soft-capped already), in float64, written
    from its definition: top-k keeps ``l >= the k-th largest l`` (repeats counted), top-p
    keeps a survivor iff the softmax(l / T) mass of survivors with a strictly larger l is
    < p, min-p keeps a survivor iff softmax(l / T) >= min_p * its largest. -> bool [V]."""
    logits = logits.double().masked_fill(logits.isnan(), float("-inf"))
    keep = torch.ones_like(logits, dtype=torch.bool)
    top_k = int(top_k)
    if 0 < top_k < logits.shape[-1]:
        keep = logits >= torch.topk(logits, top_k)[0][-1]
    if top_p < 1.0 and temperature > 0:
        probabilities = torch.softmax(logits.masked_fill(~keep, float("-inf")) / temperature, 0)
        larger = (logits[None, :] > logits[:, None]).double() @ probabilities
        keep = keep & (larger < top_p)
    if min_p > 0.0 and temperature > 0:
        probabilities = torch.softmax(logits.masked_fill(~keep, float("-inf")) / temperature, 0)
        keep = keep & (probabilities >= min_p * probabilities.max())
    return keep
