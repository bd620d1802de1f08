"""Pure-PyTorch reference of the fused sampler: the CPU path and the oracle of the tests.

It draws exactly the noise the Triton kernel draws (the same Philox4x32-10 stream and the
same uniform -> Gumbel map, written here with int64 tensor ops instead of uint32 registers),
so on the same seed the kernel and the reference pick the same tokens, except where two
perturbed scores are closer than the rounding of the fp32 matmul (the kernel and
``torch.matmul`` sum over D in different orders) or of the GPU's approximate log2 and
division, which move the noise by a few ulp.

The noise contract, shared with ``sampling_kernel.py``:

* key: the 64-bit seed, split into (low 32 bits, high 32 bits);
* counter: ``(vocab_index // 4, row_counter, sample_index, 0)``; ``row_counter`` is the row
  index for a scalar seed and 0 for per-row seeds, so a row's noise depends only on its own
  seed and never on its position in the batch;
* word ``vocab_index % 4`` of the Philox output is that token's 32 random bits, so one Philox
  evaluation serves four neighbouring tokens;
* the bits become Gumbel noise through ``bits_to_log2_gumbel`` below (base-2 units, shifted
  by a constant no argmax can see), finite for every input, with 32 bits of resolution in
  both tails; the score of a token is ``logit + (T * ln 2) * noise``.
"""

from __future__ import annotations

import math

import torch

from .params import SamplingParams

__all__ = [
    "bits_to_gumbel",
    "bits_to_log2_gumbel",
    "gumbel_noise",
    "philox4x32",
    "gumbel_argmax",
    "min_p_bound",
    "reference_candidates",
    "reference_fused_sample",
    "reference_logits",
    "reference_sample_logits",
    "softcap_logits",
    "token_logprobs",
    "truncation_keep",
    "truncation_threshold",
]

PHILOX_ROUND_A = 0xD2511F53
PHILOX_ROUND_B = 0xCD9E8D57
PHILOX_KEY_A = 0x9E3779B9
PHILOX_KEY_B = 0xBB67AE85
PHILOX_ROUNDS = 10
_U32 = 0xFFFFFFFF
LN2 = math.log(2.0)
INV_LN2 = 1.0 / LN2
LN_LN2 = math.log(LN2)
# -log2(1 - s) = (2 / ln 2) atanh(t), t = s / (2 - s), and atanh(t) / t is the sum of
# t**(2k) / (2k + 1): seven terms are exact to fp32 for t <= 1/3.
ATANH_LOG2_SERIES = tuple(2.0 * INV_LN2 / (2 * k + 1) for k in range(7))


def _mulhilo32(a: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32 bits of ``a * m`` for uint32 values held in int64 tensors.

    The 64-bit product can overflow int64, so multiply by the 16-bit halves of ``m``.
    """
    m_hi, m_lo = m >> 16, m & 0xFFFF
    p_lo = a * m_lo
    t = a * m_hi + (p_lo >> 16)
    return t >> 16, ((t & 0xFFFF) << 16) | (p_lo & 0xFFFF)


def philox4x32(c0, c1, c2, c3, k0, k1, rounds: int = PHILOX_ROUNDS):
    """Philox4x32 (Salmon et al., SC'11) on int64 tensors holding uint32 values."""
    for _ in range(rounds):
        hi_b, lo_b = _mulhilo32(c2, PHILOX_ROUND_B)
        hi_a, lo_a = _mulhilo32(c0, PHILOX_ROUND_A)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0 = (k0 + PHILOX_KEY_A) & _U32
        k1 = (k1 + PHILOX_KEY_B) & _U32
    return c0, c1, c2, c3


def bits_to_log2_gumbel(bits: torch.Tensor) -> torch.Tensor:
    """Map 32 random bits (uint32 values in an int64 tensor) to Gumbel noise in base-2 units.

    Returns ``(g - ln ln 2) / ln 2`` for a standard Gumbel g: the kernel works with base-2
    logarithms (one hardware instruction each), and a constant shift of every score in a
    row cannot change its argmax. ``scores = logits + (T * ln 2) * noise`` is then the
    Gumbel-max score ``logits + T * g`` up to that per-row constant.

    ``u = (bits + 0.5) / 2**32`` lies strictly inside (0, 1). Instead of rounding u to fp32
    (which turns values near 1 into exactly 1.0 and the noise into +inf), take the distance
    to the nearer end, ``small = min(u, 1 - u)``, which fp32 holds to full relative
    precision, and form the exponential variate ``E2 = -log2(u)`` from it: ``-log2(small)``
    in the lower half, and in the upper half, where ``1 - small`` would lose small's low bits
    (and a fast hardware log2 is only absolutely accurate), no log at all:
    ``-log(1 - s) = 2 atanh(t)`` with ``t = s / (2 - s) <= 1/3``, whose odd series is exact to
    fp32 after seven terms. The far tail, which decides the winners, keeps 32 bits of
    resolution. The result ``-log2(E2)`` is finite for every input (in [-5.05, 32.47]).
    """
    upper = bits >= 0x80000000
    mirrored = torch.where(upper, _U32 - bits, bits)
    small = (mirrored.to(torch.float32) + 0.5) * 2.0**-32
    t = small / (2.0 - small)
    t2 = t * t
    series = torch.full_like(t2, ATANH_LOG2_SERIES[-1])
    for coefficient in reversed(ATANH_LOG2_SERIES[:-1]):
        series = series * t2 + coefficient
    expo2 = torch.where(upper, t * series, -torch.log2(small))
    return -torch.log2(expo2)


def bits_to_gumbel(bits: torch.Tensor) -> torch.Tensor:
    """The standard Gumbel variate that ``bits_to_log2_gumbel`` encodes (for tests and docs)."""
    return bits_to_log2_gumbel(bits) * LN2 - LN_LN2


def gumbel_noise(
    seed_lo: torch.Tensor,
    seed_hi: torch.Tensor,
    row_counter: torch.Tensor,
    sample_index: int,
    vocab_size: int,
    vocab_start: int = 0,
) -> torch.Tensor:
    """Base-2 Gumbel noise [B, vocab_size] fp32 (``bits_to_log2_gumbel``) for one sample
    index, of the vocabulary indices ``vocab_start .. vocab_start + vocab_size - 1`` (a
    tensor-parallel shard draws the noise of its global indices).

    seed_lo, seed_hi and row_counter are [B] int64.
    """
    device = row_counter.device
    first_quad, stop = vocab_start // 4, vocab_start + vocab_size
    quad = torch.arange(first_quad, (stop + 3) // 4, device=device, dtype=torch.int64)[None, :]
    k0, k1, rc = seed_lo[:, None], seed_hi[:, None], row_counter[:, None]
    zero = torch.zeros_like(quad)
    words = torch.broadcast_tensors(*philox4x32(quad, rc, zero + sample_index, zero, k0, k1))
    # Word w of quad q is the bits of token 4 * q + w.
    skip = vocab_start - 4 * first_quad
    bits = torch.stack(words, dim=-1).flatten(1)[:, skip : skip + vocab_size]
    return bits_to_log2_gumbel(bits)


def split_seed(seed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 seed tensor -> (low 32 bits, high 32 bits) as non-negative int64 tensors."""
    return seed & _U32, (seed >> 32) & _U32


def truncation_keep(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor | None = None,
    top_p_whole_row: bool = False,
) -> torch.Tensor:
    """Which tokens top-k, then top-p, then min-p keep: bool [B, V]. The one statement of the
    math.

    ``logits`` [B, V] fp32 with NaN already -inf; ``temperature`` / ``top_p`` / ``min_p`` [B]
    fp32, ``top_k`` [B] int64. Top-k keeps ``l >= kth``, the k-th largest value counting
    repeats (every token tied with it stays, as ``scores < topk(scores, k)[..., -1, None]``
    removes; a row with fewer than k finite tokens keeps them all); 0 or k >= V is off. Top-p
    keeps a top-k survivor iff the mass of ``softmax(l / T)`` over the survivors carried by
    tokens with a strictly larger l is < p, so the token that crosses p and its ties stay
    (without top-k: over the whole row). Min-p keeps a survivor iff
    ``softmax(l / T) >= min_p * max softmax(l / T)``, i.e. ``l >= max + T * log(min_p)``
    (computed so, in fp32: the row's maximum, which top-k and top-p always keep, stays).
    p = 1, min_p = 0 and greedy rows (T = 0, whose argmax no truncation moves) are off.
    With ``top_p_whole_row`` top-p's masses are of the whole row's softmax, not the
    survivors' (SGLang's torch-native sampler and the Gemma reference sampler cut the
    nucleus of the whole row and top-k's first k by rank): a survivor is kept iff the mass
    of the whole row above it is < p.
    Masses and the min-p bound are fp32, so a token within rounding of a boundary may go
    either way (a near-tie, as in the kernel).
    """
    sorted_desc = logits.sort(dim=-1, descending=True).values
    threshold = truncation_threshold(
        sorted_desc, logits.shape[1], temperature, top_k, top_p, min_p,
        top_p_whole_row=top_p_whole_row,
    )  # fmt: skip
    return logits >= threshold


def truncation_threshold(
    sorted_desc: torch.Tensor,
    vocab_size: int,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor | None = None,
    repeats: torch.Tensor | None = None,
    top_p_whole_row: bool = False,
) -> torch.Tensor:
    """[B, 1] fp32: the smallest score ``truncation_keep`` keeps, from the row's scores
    sorted in descending order, [B, L]. ``repeats`` [B, L] (int64, default 1): how many
    tokens of the row each entry stands for, so that a list of distinct entries with counts
    (``tp.py``: the ranks' top-k values, plus the ties the ranks did not send) gives the
    threshold of the row they describe; it must hold the row's top k with their counts and
    every token it keeps. ``vocab_size``: the row's V (k >= V is off)."""
    # No host sync: k is read through a gather, never as a Python number.
    k_on = (top_k > 0) & (top_k < vocab_size)
    if repeats is None:
        position = top_k.clamp(1, vocab_size) - 1
    else:  # the first entry whose running count reaches k
        position = (repeats.cumsum(-1) < top_k[:, None]).sum(-1)
    position = position.clamp(max=sorted_desc.shape[1] - 1)
    kth = sorted_desc.gather(1, position[:, None])
    threshold = torch.where(k_on[:, None], kth, float("-inf"))
    p_on = (top_p < 1.0) & (temperature > 0)
    # The survivors are a prefix of sorted_desc; weights exp2((l - max) * log2(e) / T), with
    # the row's maximum (even +inf) weighing 1 and -inf nothing.
    inv_temperature = INV_LN2 / torch.where(temperature > 0, temperature, 1.0)
    row_max = sorted_desc[:, :1]
    weights = torch.exp2((sorted_desc - row_max) * inv_temperature[:, None])
    weights = torch.where(sorted_desc == row_max, 1.0, weights)
    # (the whole row: every finite token weighs, top-k's cut is applied by the maximum below;
    # above a survivor only survivors lie, so its mass above is the same either way)
    weighed = threshold if not top_p_whole_row else torch.full_like(threshold, float("-inf"))
    weights = torch.where((sorted_desc >= weighed) & (sorted_desc > float("-inf")), weights, 0.0)
    if repeats is not None:
        weights = weights * repeats
    # (an entry standing for n tied tokens: the last of them that starts below p starts no
    # later than the first, and all carry its value, so the entry's own start decides)
    larger_mass = weights.cumsum(-1) - weights  # mass before each position, non-decreasing
    total = weights.sum(-1, keepdim=True)
    crossing = (larger_mass < top_p[:, None] * total).sum(-1).clamp(min=1) - 1
    nucleus = sorted_desc.gather(1, crossing[:, None])
    threshold = torch.where(p_on[:, None], torch.maximum(threshold, nucleus), threshold)
    if min_p is not None:
        threshold = torch.maximum(
            threshold, min_p_bound(row_max[:, 0], temperature, min_p)[:, None]
        )
    return threshold


def min_p_bound(row_max: torch.Tensor, temperature: torch.Tensor, min_p: torch.Tensor):
    """[B] fp32: the smallest score min-p keeps, ``max + T * log(min_p)`` (-inf where min-p
    is off: min_p = 0 or a greedy row). The kernel computes the same two fp32 operations."""
    on = (min_p > 0) & (temperature > 0)
    log_min_p = torch.log(torch.where(on, min_p, 1.0))
    return torch.where(on, row_max + temperature * log_min_p, float("-inf"))


def softcap_logits(logits: torch.Tensor, softcap: float) -> torch.Tensor:
    """Gemma 2's final soft-capping ``tanh(l / softcap) * softcap`` of fp32 logits (0: off).
    As ``torch.tanh``, a -inf logit becomes ``-softcap``: the program's distribution."""
    if softcap == 0.0:
        return logits
    return torch.tanh(logits / softcap) * softcap


def reference_sample_logits(
    logits: torch.Tensor, params: SamplingParams
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Sample [B, num_samples] token ids from materialized logits [B, V] (any float dtype,
    scored in fp32): the soft-cap (``softcap_logits``), truncation (``truncation_keep``),
    then Gumbel-max with the noise of the module docstring. Scores are ``logits + T * gumbel``
    up to a per-row constant, the same argmax as ``logits / T + gumbel`` for T > 0 and plain
    argmax for T = 0; NaN counts as -inf, and a row with nothing finite returns token 0 as
    ``torch.argmax`` does. With ``params.logprobs`` also each token's log-probability
    [B, num_samples] fp32 (``token_logprobs``).
    """
    batch = logits.shape[0]
    raw = logits.float()
    scores = softcap_logits(raw, params.softcap)
    scores = scores.masked_fill(scores.isnan(), float("-inf"))
    rows = params.rows(batch, logits.device)
    if params.truncates:
        keep = truncation_keep(
            scores, rows.temperature, rows.top_k, rows.top_p, rows.min_p,
            top_p_whole_row=params.top_p_whole_row,
        )  # fmt: skip
        scores = scores.masked_fill(~keep, float("-inf"))
    tokens = gumbel_argmax(
        scores, rows.temperature, rows.seed, params.per_row_seed, params.num_samples
    )[1]
    if params.logprobs is None:
        return tokens
    drawn_from = raw if params.logprobs == "raw" else scores
    return tokens, token_logprobs(drawn_from, tokens, rows.temperature, params.logprobs)


def token_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: torch.Tensor, mode: str
) -> torch.Tensor:
    """[B, num_samples] fp32: the log-probability of each token ``tokens`` [B, num_samples]
    (int64) under the row's distribution. "raw": ``log_softmax(logits)`` of the raw fp32
    logits [B, V], the temperature ignored (vLLM's default). "processed": ``log_softmax(
    logits / T)`` of the scores actually sampled (soft-capped, truncated ones -inf), and 0.0
    (the log of probability 1) on greedy rows (T = 0), whose argmax is drawn for certain.
    NaN counts as -inf; a row with nothing finite gives NaN, as ``log_softmax`` does."""
    logits = logits.masked_fill(logits.isnan(), float("-inf"))
    if mode == "raw":
        return torch.log_softmax(logits, dim=-1).gather(1, tokens)
    if mode != "processed":
        raise ValueError(f"logprobs must be 'raw' or 'processed', got {mode!r}")
    greedy = temperature == 0
    scaled = logits / torch.where(greedy, 1.0, temperature)[:, None]
    logprobs = torch.log_softmax(scaled, dim=-1).gather(1, tokens)
    return torch.where(greedy[:, None], 0.0, logprobs)


def gumbel_argmax(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    seed: torch.Tensor,
    per_row_seed: bool,
    num_samples: int,
    vocab_start: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row and sample, the best perturbed score [B, num_samples] fp32 and its vocabulary
    index [B, num_samples] int64 (ties to the lowest) of fp32 ``logits`` [B, V'] holding the
    vocabulary indices ``vocab_start ..`` (a tensor-parallel shard draws the noise of its
    global indices and returns them). ``temperature`` [B] fp32, ``seed`` [B] int64."""
    batch, vocab_size = logits.shape
    seed_lo, seed_hi = split_seed(seed)
    if per_row_seed:
        row_counter = torch.zeros(batch, dtype=torch.int64, device=logits.device)
    else:
        row_counter = torch.arange(batch, dtype=torch.int64, device=logits.device)
    best_scores, best_indices = [], []
    for sample_index in range(num_samples):
        noise = gumbel_noise(seed_lo, seed_hi, row_counter, sample_index, vocab_size, vocab_start)
        scores = logits + (temperature * LN2)[:, None] * noise
        scores = scores.masked_fill(scores.isnan(), float("-inf"))
        index = scores.argmax(dim=-1, keepdim=True)
        best_scores.append(scores.gather(-1, index))
        best_indices.append(index + vocab_start)
    return torch.cat(best_scores, dim=-1), torch.cat(best_indices, dim=-1)


def reference_logits(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    logits_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """The scores the sampler draws from: fp32 ``hidden @ weight.T + bias``, rounded to
    ``logits_dtype`` when given, [B, V] fp32."""
    logits = hidden.float() @ weight.float().T
    if bias is not None:
        logits = logits + bias.float()
    if logits_dtype is not None:
        logits = logits.to(logits_dtype).float()
    return logits


def reference_fused_sample(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, params: SamplingParams
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Sample [B, num_samples] token ids from softmax((hidden @ weight.T + bias) / temperature)
    after top-k / top-p (and with ``params.logprobs`` their log-probabilities); ``params`` as
    validated and normalised by ``op.fused_sample``."""
    return reference_sample_logits(
        reference_logits(hidden, weight, bias, params.logits_dtype), params
    )


def reference_candidates(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    temperature: torch.Tensor,
    seed: torch.Tensor,
    per_row_seed: bool,
    num_samples: int,
    logits_dtype: torch.dtype | None = None,
    vocab_start: int = 0,
    softcap: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A tensor-parallel shard's candidates (``gumbel_argmax``): ``weight`` [V', D] holds the
    vocabulary rows ``vocab_start .. vocab_start + V' - 1`` (``bias`` [V'] the same rows),
    so the best of all shards' candidates is the token the whole vocabulary draws.
    ``temperature`` [B] fp32, ``seed`` [B] int64, ``softcap`` as in ``SamplingParams``."""
    logits = softcap_logits(reference_logits(hidden, weight, bias, logits_dtype), softcap)
    logits = logits.masked_fill(logits.isnan(), float("-inf"))
    return gumbel_argmax(logits, temperature, seed, per_row_seed, num_samples, vocab_start)
