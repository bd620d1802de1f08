"""Device code both stage-1 kernels and the truncation kernels share, and nothing else.

Philox4x32-10 and the bits -> Gumbel map (the noise contract of ``reference.py``, which
draws exactly the same stream with torch ops), logits rounding and soft-capping, the
order-preserving int32 keys that top-k / top-p / min-p select on, and the per-row knob and
seed loads. Imports nothing of this package, so ``sampling_kernel.py``, ``hopper_kernel.py``
and ``truncation_kernel.py`` each import from here and never from each other's device code.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

__all__ = [
    "INV_LN2",
    "KEY_MINUS_INF",
    "KEY_PAD",
    "LN2",
    "LOGPROB_CODES",
    "TL_DTYPES",
    "any_row_truncates",
    "await_previous_kernel",
    "bits_to_log2_gumbel",
    "drawn_logprob",
    "gumbel_tile",
    "is_hopper",
    "key_low_bits",
    "key_value",
    "knob_per_row",
    "masked_gumbel_chunk",
    "mass_rows",
    "ordered_key",
    "pdl_launch",
    "philox4x32",
    "restore_low_bits",
    "rows_for_tma",
    "round_logits",
    "row_log_mass",
    "row_mass",
    "softcap_logits",
    "row_seeds",
    "tile_log_mass",
    "tile_mass",
    "tile_sum_below",
    "tma_compatible",
    "token_gumbel",
    "truncates",
    "truncating_rows",
]

PHILOX_ROUND_A = tl.constexpr(0xD2511F53)
PHILOX_ROUND_B = tl.constexpr(0xCD9E8D57)
PHILOX_KEY_A = tl.constexpr(0x9E3779B9)
PHILOX_KEY_B = tl.constexpr(0xBB67AE85)
PHILOX_ROUNDS = tl.constexpr(10)
TWO_POW_MINUS_32 = tl.constexpr(2.3283064365386963e-10)
TWO_POW_MINUS_33 = tl.constexpr(1.1641532182693481e-10)
INV_LN2 = tl.constexpr(1.4426950408889634)
# (2 / ln 2) / (2k + 1): the series of -log2(1 - s) in t = s / (2 - s) (reference.py).
ATANH_LOG2_0 = tl.constexpr(2.0 * 1.4426950408889634)
ATANH_LOG2_1 = tl.constexpr(2.0 * 1.4426950408889634 / 3)
ATANH_LOG2_2 = tl.constexpr(2.0 * 1.4426950408889634 / 5)
ATANH_LOG2_3 = tl.constexpr(2.0 * 1.4426950408889634 / 7)
ATANH_LOG2_4 = tl.constexpr(2.0 * 1.4426950408889634 / 9)
ATANH_LOG2_5 = tl.constexpr(2.0 * 1.4426950408889634 / 11)
ATANH_LOG2_6 = tl.constexpr(2.0 * 1.4426950408889634 / 13)
LN2 = tl.constexpr(0.6931471805599453)
# The kernels' LOGPROBS constexpr for ``SamplingParams.logprobs`` (0: none, the kernels as
# they compile without log-probabilities).
LOGPROB_CODES = {None: 0, "raw": 1, "processed": 2}
# A logits dtype (``SamplingParams.logits_dtype``) as the kernels' LOGITS_DTYPE.
TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


@triton.jit
def mul_wide(a, MULTIPLIER: tl.constexpr, FAST: tl.constexpr):
    """High and low 32 bits of the uint32 product a * MULTIPLIER (a Philox round constant)."""
    if FAST:
        # One wide multiply (IMAD.WIDE.U32) instead of separate high and low ones. The noise
        # is bound by instruction issue (alone it runs at ~80% of an H200 SM's issue rate),
        # and Philox is mostly these multiplies: with the division below, 28% fewer noise
        # instructions (benchmarks/probes/kernel_sass.py). The constant is an immediate operand, so
        # no tensor is built here and the Gluon kernel (hopper_kernel.py) can call this too.
        if MULTIPLIER == PHILOX_ROUND_A:
            return tl.inline_asm_elementwise(
                "{ .reg .b64 p; mul.wide.u32 p, $2, 0xD2511F53; mov.b64 {$1, $0}, p; }",
                "=r,=r,r", [a], dtype=(tl.uint32, tl.uint32), is_pure=True, pack=1,
            )  # fmt: skip
        else:
            tl.static_assert(MULTIPLIER == PHILOX_ROUND_B)
            return tl.inline_asm_elementwise(
                "{ .reg .b64 p; mul.wide.u32 p, $2, 0xCD9E8D57; mov.b64 {$1, $0}, p; }",
                "=r,=r,r", [a], dtype=(tl.uint32, tl.uint32), is_pure=True, pack=1,
            )  # fmt: skip
    else:
        return tl.umulhi(a, MULTIPLIER), a * MULTIPLIER


@triton.jit
def philox4x32(c0, c1, c2, c3, k0, k1, FAST: tl.constexpr):
    """Philox4x32-10 on uint32 tensors; the same rounds as ``reference.philox4x32``."""
    for _ in tl.static_range(PHILOX_ROUNDS):
        hi_b, lo_b = mul_wide(c2, PHILOX_ROUND_B, FAST)
        hi_a, lo_a = mul_wide(c0, PHILOX_ROUND_A, FAST)
        c0 = hi_b ^ c1 ^ k0
        c2 = hi_a ^ c3 ^ k1
        c1 = lo_b
        c3 = lo_a
        k0 = k0 + PHILOX_KEY_A
        k1 = k1 + PHILOX_KEY_B
    return c0, c1, c2, c3


@triton.jit
def fast_log2(x, FAST: tl.constexpr):
    if FAST:
        # One MUFU instruction instead of libdevice's polynomial: relative error < 2**-22, but
        # only absolute near x = 1, so it never takes an argument whose log must be small.
        return tl.inline_asm_elementwise(
            "lg2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        return tl.log2(x)


@triton.jit
def fast_divide(x, y, FAST: tl.constexpr):
    if FAST:
        # A hardware reciprocal and one Newton step on the quotient (within an ulp or so):
        # four instructions where the IEEE-style division's range checks and rescaling take
        # about eight; y here is always in [1.5, 2].
        reciprocal = tl.inline_asm_elementwise(
            "rcp.approx.ftz.f32 $0, $1;", "=r,r", [y], dtype=tl.float32, is_pure=True, pack=1
        )
        quotient = x * reciprocal
        return tl.fma(tl.fma(-y, quotient, x), reciprocal, quotient)
    else:
        return x / y


@triton.jit
def bits_to_log2_gumbel(bits, FAST_MATH: tl.constexpr):
    """32 random bits -> Gumbel noise in base-2 units, finite for every input.

    The same steps as ``reference.bits_to_log2_gumbel``: work with the distance of u to the
    nearer end of (0, 1), so u never rounds to 1.0, and in the upper half take -log(1 - s)
    as 2 atanh(s / (2 - s)), a short polynomial, so the far tail that decides the winners
    stays accurate where a log of a number near 1 would not be.
    """
    upper = bits >= 0x80000000
    mirrored = tl.where(upper, ~bits, bits)
    # (mirrored + 0.5) / 2**32 in one fused multiply-add: the product is exact, so this is
    # the reference's value to the bit, one instruction fewer.
    small = mirrored.to(tl.float32) * TWO_POW_MINUS_32 + TWO_POW_MINUS_33
    t = fast_divide(small, 2.0 - small, FAST_MATH)
    t2 = t * t
    # -log2(1 - s) = t * (2 / ln 2) * (1 + t2 / 3 + t2**2 / 5 + ...), Horner from the top.
    series = t2 * ATANH_LOG2_6 + ATANH_LOG2_5
    series = series * t2 + ATANH_LOG2_4
    series = series * t2 + ATANH_LOG2_3
    series = series * t2 + ATANH_LOG2_2
    series = series * t2 + ATANH_LOG2_1
    series = series * t2 + ATANH_LOG2_0
    expo2 = tl.where(upper, t * series, -fast_log2(small, FAST_MATH))
    return -fast_log2(expo2, FAST_MATH)


@triton.jit
def gumbel_tile(
    quad_offsets,
    row_counter,
    sample_index,
    k0,
    k1,
    FAST_MATH: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """Base-2 Gumbel noise [BLOCK_B, BLOCK_V] for vocab indices 4 * quad_offsets + (0..3).

    One Philox evaluation yields four words; interleave them so word w lands on vocab
    index 4 * quad + w, the layout ``reference.gumbel_noise`` defines.
    """
    c0 = tl.broadcast_to(quad_offsets[None, :], (BLOCK_B, BLOCK_V // 4))
    c1 = tl.broadcast_to(row_counter[:, None], (BLOCK_B, BLOCK_V // 4))
    c2 = tl.full((BLOCK_B, BLOCK_V // 4), sample_index, tl.uint32)
    c3 = tl.zeros((BLOCK_B, BLOCK_V // 4), tl.uint32)
    r0, r1, r2, r3 = philox4x32(c0, c1, c2, c3, k0, k1, FAST_MATH)
    g0 = bits_to_log2_gumbel(r0, FAST_MATH)
    g1 = bits_to_log2_gumbel(r1, FAST_MATH)
    g2 = bits_to_log2_gumbel(r2, FAST_MATH)
    g3 = bits_to_log2_gumbel(r3, FAST_MATH)
    return tl.reshape(tl.join(tl.join(g0, g2), tl.join(g1, g3)), (BLOCK_B, BLOCK_V))


@triton.jit
def round_to_bf16(x):
    """fp32 -> the nearest bf16 value (ties to even), kept in fp32; NaN stays NaN.

    Written with integer ops because the Triton interpreter truncates fp32 -> bf16 casts.
    """
    bits = x.to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return tl.where(x == x, rounded.to(tl.float32, bitcast=True), x)


@triton.jit
def round_logits(logits, LOGITS_DTYPE: tl.constexpr):
    """fp32 logits rounded to LOGITS_DTYPE (None: unchanged), kept in fp32."""
    if LOGITS_DTYPE == tl.bfloat16:
        return round_to_bf16(logits)
    elif LOGITS_DTYPE is not None:
        return logits.to(LOGITS_DTYPE).to(tl.float32)
    else:
        return logits


@triton.jit
def softcap_logits(logits, softcap, INTERPRETER: tl.constexpr):
    """Gemma 2's soft-cap ``tanh(l / softcap) * softcap`` in fp32 (``reference.softcap_logits``;
    -inf becomes -softcap, NaN stays NaN). The interpreter has no libdevice: there tanh is
    taken in fp64 and rounded once, which is what torch's fp32 tanh gives up to an ulp."""
    scaled = logits / softcap
    if INTERPRETER:
        decay = tl.exp(-2.0 * tl.abs(scaled.to(tl.float64)))
        magnitude = ((1.0 - decay) / (1.0 + decay)).to(tl.float32)
        capped = tl.where(scaled < 0, -magnitude, magnitude)
    else:
        capped = libdevice.tanh(scaled)
    return capped * softcap


# Order-preserving int32 keys of fp32 scores: a < b as floats iff key(a) < key(b) as int32,
# with NaN read as -inf and -0.0 as +0.0 (they compare equal as floats, so they must tie).
# KEY_PAD, below every score, marks "no candidate".
KEY_PAD = tl.constexpr(-2147483648)
KEY_MINUS_INF = tl.constexpr(-2139095041)  # key(-inf) = 0xFF800000 ^ 0x7FFFFFFF


@triton.jit
def ordered_key(values):
    values = tl.where(values == values, values, float("-inf"))
    values = tl.where(values == 0.0, 0.0, values)
    bits = values.to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


@triton.jit
def restore_low_bits(keys, LOW_BITS: tl.constexpr):
    """Keys whose bits below LOW_BITS were cleared (or never searched), completed. Logits
    rounded to a narrower float keep their low fp32 mantissa bits zero (16 for bf16), so a
    key's low bits are its sign's: zeros for scores >= 0, ones below (``ordered_key`` flips a
    negative score's bits). KEY_PAD stays KEY_PAD."""
    if LOW_BITS > 0:
        keys = keys | tl.where((keys < 0) & (keys != KEY_PAD), (1 << LOW_BITS) - 1, 0)
    return keys


@triton.jit
def key_value(keys):
    """The fp32 score of an ordered key (inverse of ``ordered_key``)."""
    bits = tl.where(keys < 0, keys ^ 0x7FFFFFFF, keys)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def knob_per_row(ptr, row, scalar, MODE: tl.constexpr, DTYPE: tl.constexpr):
    """A "scalar or per-row" knob of one row as DTYPE: MODE 1 a 0-d tensor, 2 a [B] tensor,
    any other the scalar argument."""
    if MODE == 1:
        return tl.load(ptr).to(DTYPE)
    elif MODE == 2:
        return tl.load(ptr + row).to(DTYPE)
    else:
        return tl.full((), scalar, DTYPE)


@triton.jit
def rows_knob(ptr, rows, row_mask, off, MODE: tl.constexpr):
    """A per-row knob of the tile's ``rows`` (those in ``row_mask``; the others get ``off``):
    MODE 1 a 0-d tensor, 2 a [B] tensor, any other the scalar ``off``."""
    if MODE == 1:
        return tl.where(row_mask, tl.load(ptr), off)
    elif MODE == 2:
        return tl.load(ptr + rows, mask=row_mask, other=off)
    else:
        return tl.where(row_mask, off, off)


@triton.jit
def truncates(top_k, top_p, min_p, temperature, V):
    """Whether a row with these knobs is truncated: a sampled row (T > 0) with top-k on (0 <
    k < V), top-p on (p < 1) or min-p on (min_p > 0). Stage 2 reads the same conditions; a
    row they leave untruncated is drawn exactly by the plain Gumbel-max (greedy rows too,
    whose noise scale is 0)."""
    k_on = (top_k > 0) & (top_k < V)
    return (temperature > 0) & (k_on | (top_p < 1.0) | (min_p > 0.0))


@triton.jit
def truncating_rows(top_k_ptr, top_p_ptr, min_p_ptr, rows, row_mask, noise_scale, V,
                    TOP_K_MODE: tl.constexpr, TOP_P_MODE: tl.constexpr,
                    MIN_P_MODE: tl.constexpr):  # fmt: skip
    """Which of a tile's ``rows`` are truncated (``truncates``), from the knobs' tensors (a
    mode 0 knob is off: stage 1 reads knobs only where every scalar one is off); rows
    outside ``row_mask`` are not. ``noise_scale`` is T ln 2 per row. Both stage-1 kernels
    call it (the Gluon one with ``rows`` in its accumulators' row layout, which the loads
    take on)."""
    top_k = rows_knob(top_k_ptr, rows, row_mask, 0, TOP_K_MODE).to(tl.int64)
    top_p = rows_knob(top_p_ptr, rows, row_mask, 1.0, TOP_P_MODE).to(tl.float32)
    min_p = rows_knob(min_p_ptr, rows, row_mask, 0.0, MIN_P_MODE).to(tl.float32)
    return row_mask & truncates(top_k, top_p, min_p, noise_scale, V)


@triton.jit
def mass_rows(top_k_ptr, top_p_ptr, rows, row_mask, V, TOP_K_MODE: tl.constexpr,
              TOP_P_MODE: tl.constexpr):  # fmt: skip
    """Which of a tile's ``rows`` stage 2 takes top-p's whole-row mass for, from stage 1's
    per-tile partials (``row_mass``): top-p on and top-k off (with top-k on, the mass of its
    candidates is the row's). Knob modes as in ``truncating_rows``."""
    top_k = rows_knob(top_k_ptr, rows, row_mask, 0, TOP_K_MODE).to(tl.int64)
    top_p = rows_knob(top_p_ptr, rows, row_mask, 1.0, TOP_P_MODE).to(tl.float32)
    return row_mask & (top_p < 1.0) & ~((top_k > 0) & (top_k < V))


@triton.jit
def any_row_truncates(offsets, B, V, temperature_ptr, scalar_temperature, top_k_ptr, top_p_ptr,
                      min_p_ptr, TEMPERATURE_MODE: tl.constexpr, TOP_K_MODE: tl.constexpr,
                      TOP_P_MODE: tl.constexpr, MIN_P_MODE: tl.constexpr):  # fmt: skip
    """Per lane of ``offsets`` (0, 1, ..., in the caller's layout), 1 if one of the rows
    offsets[i], offsets[i] + len, ... below B is truncated (``truncates``), else 0: the
    caller's max says whether any row of the batch is. Knob and temperature modes as in the
    stage-1 kernels (temperature 3: greedy, nothing truncates)."""
    hit = (offsets < 0).to(tl.int32)
    if TEMPERATURE_MODE != 3:
        for start in range(0, B, offsets.shape[0]):
            rows = start + offsets
            mask = rows < B
            if TEMPERATURE_MODE == 0:
                temperature = tl.where(mask, scalar_temperature, 0.0)
            else:
                temperature = rows_knob(temperature_ptr, rows, mask, 0.0, TEMPERATURE_MODE)
            truncated = truncating_rows(
                top_k_ptr, top_p_ptr, min_p_ptr, rows, mask, temperature.to(tl.float32), V,
                TOP_K_MODE, TOP_P_MODE, MIN_P_MODE,
            )  # fmt: skip
            hit |= truncated.to(tl.int32)
    return hit


@triton.jit
def row_seeds(seed_ptr, row, seed_lo, seed_hi, SEED_MODE: tl.constexpr):
    """(Philox key halves, row counter) of one row, uint32 scalars; SEED_MODE 0: the scalar
    (seed_lo, seed_hi), 1: a 0-d int64 tensor, 2: per-row seeds (row counter 0, so a row's
    noise does not depend on its batch position)."""
    if SEED_MODE == 0:
        seed = seed_lo.to(tl.int64) | (seed_hi.to(tl.int64) << 32)
    elif SEED_MODE == 1:
        seed = tl.load(seed_ptr)
    else:
        seed = tl.load(seed_ptr + row)
    k0 = (seed & 0xFFFFFFFF).to(tl.uint32)
    k1 = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
    if SEED_MODE == 2:
        row_counter = tl.zeros((), tl.uint32)
    else:
        row_counter = row.to(tl.uint32)
    return k0, k1, row_counter


@triton.jit
def token_gumbel(index, row_counter, sample_index, k0, k1, FAST_MATH: tl.constexpr):
    """Base-2 Gumbel noise of the tokens ``index`` (int32 tensor) of one row and sample:
    word index % 4 of Philox at counter (index // 4, row_counter, sample_index, 0), as
    ``reference.gumbel_noise`` draws it (one evaluation per token here, not per quad)."""
    c0 = (index // 4).to(tl.uint32)
    c1 = tl.zeros_like(c0) + row_counter
    c2 = tl.full(c0.shape, sample_index, tl.uint32)
    c3 = tl.zeros_like(c0)
    r0, r1, r2, r3 = philox4x32(c0, c1, c2, c3, k0, k1, FAST_MATH)
    word = index % 4
    bits = tl.where(word == 0, r0, tl.where(word == 1, r1, tl.where(word == 2, r2, r3)))
    return bits_to_log2_gumbel(bits, FAST_MATH)


@triton.jit
def masked_gumbel_chunk(
    logits_ptr, threshold_ptr, temperature_ptr, seed_ptr, score_ptr, index_ptr,
    width, vocab_start, num_chunks, num_samples,
    SEED_MODE: tl.constexpr, FAST_MATH: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    """The program (row, chunk) of a Gumbel-max over materialized logits [B, width] (any
    float dtype, scored in fp32) masked below the row's threshold: for every sample the
    best ``logit + T ln2 g`` among the chunk's logits at or above it and its GLOBAL index
    (``vocab_start`` + column, ties to the lowest), with the noise ``reference.gumbel_argmax``
    draws for that index, stored at [row, sample, chunk] of score_ptr / index_ptr. NaN and
    masked logits count as -inf. SEED_MODE 1: a 0-d seed (the row in the counter), 2: [B]."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    row64 = row.to(tl.int64)
    offs = chunk * BLOCK_V + tl.arange(0, BLOCK_V)
    mask = offs < width
    logits = tl.load(logits_ptr + row64 * width + offs, mask=mask, other=float("-inf"))
    logits = logits.to(tl.float32)
    logits = tl.where(logits >= tl.load(threshold_ptr + row), logits, float("-inf"))
    noise_scale = tl.load(temperature_ptr + row) * LN2
    k0, k1, row_counter = row_seeds(seed_ptr, row, 0, 0, SEED_MODE)
    index = vocab_start + offs
    for sample_index in range(num_samples):
        noise = token_gumbel(index, row_counter, sample_index, k0, k1, FAST_MATH)
        scores = logits + noise_scale * noise
        best = tl.max(scores)
        best_index = tl.min(tl.where(scores == best, index, 2147483647))
        slot = (row64 * num_samples + sample_index) * num_chunks + chunk
        tl.store(score_ptr + slot, best)
        tl.store(index_ptr + slot, best_index)


@triton.jit
def tile_mass(values, inv_temperature):
    """Per row of a tile's fp32 ``values`` [ROWS, COLS] (NaN and columns past V already
    -inf): its maximum and the sum of ``exp2((v - max) * inv_temperature)`` ([ROWS] each;
    ``inv_temperature`` [ROWS] is log2(e) / T), the maximum (even +inf) weighing 1 and -inf
    nothing: the softmax(v / T) mass relative to the tile's maximum, which a later stage
    rescales to the row's (``row_mass``)."""
    tile_max = tl.max(values, axis=1)
    return tile_max, tile_sum_below(values, tile_max, inv_temperature)


@triton.jit
def tile_sum_below(values, tile_max, inv_temperature):
    """``tile_mass``'s sum, given the tile's maximum ``tile_max`` [ROWS] (found elsewhere)."""
    weights = tl.exp2((values - tile_max[:, None]) * inv_temperature[:, None])
    weights = tl.where(values == tile_max[:, None], 1.0, weights)
    weights = tl.where(values > float("-inf"), weights, 0.0)
    return tl.sum(weights, axis=1)


@triton.jit
def tile_log_mass(values, inv_temperature):
    """``tile_mass`` for log-probabilities, in fewer instructions a logit (a compute-bound
    stage 1 pays for each): a +inf value makes the sum NaN, as ``log_softmax`` gives, instead
    of weighing 1, and a row with no finite value gives (-inf, 0) through its shift alone."""
    tile_max = tl.max(values, axis=1)
    shift = tl.where(tile_max > float("-inf"), tile_max, 0.0)
    weights = tl.exp2((values - shift[:, None]) * inv_temperature[:, None])
    return tile_max, tl.sum(weights, axis=1)


@triton.jit
def row_mass(mass_ptr, num_tiles, top_value, inv_temperature, BLOCK: tl.constexpr):
    """The softmax(v / T) mass of a whole row relative to ``top_value`` (its maximum), from
    its per-tile (max, sum) partials (``tile_mass``) at ``mass_ptr`` [num_tiles, 2]."""
    total = tl.zeros((), tl.float32)
    offs = tl.arange(0, BLOCK)
    for start in range(0, num_tiles, BLOCK):
        mask = start + offs < num_tiles
        partial = mass_ptr + (start + offs) * 2
        tile_max = tl.load(partial, mask=mask, other=float("-inf"))
        tile_sum = tl.load(partial + 1, mask=mask, other=0.0)
        scale = tl.exp2((tile_max - top_value) * inv_temperature)
        scale = tl.where(tile_max == top_value, 1.0, scale)
        total += tl.sum(tl.where(tile_max > float("-inf"), tile_sum * scale, 0.0))
    return total


@triton.jit
def row_log_mass(mass_ptr, num_tiles, inv_temperature, BLOCK: tl.constexpr):
    """(the row's maximum, its mass relative to it) from per-tile partials (``row_mass``):
    the row's natural log-sum-exp of v / T is ``max / T + log(mass)``."""
    top_value = tl.full((), float("-inf"), tl.float32)
    offs = tl.arange(0, BLOCK)
    for start in range(0, num_tiles, BLOCK):
        mask = start + offs < num_tiles
        tile_max = tl.load(mass_ptr + (start + offs) * 2, mask=mask, other=float("-inf"))
        top_value = tl.maximum(top_value, tl.max(tile_max))
    return top_value, row_mass(mass_ptr, num_tiles, top_value, inv_temperature, BLOCK)


@triton.jit
def drawn_logprob(value, log_mass_ptr, num_tiles, temperature, LOGPROBS: tl.constexpr,
                  BLOCK: tl.constexpr):  # fmt: skip
    """The log-probability of a drawn token whose logit (LOGPROBS 1, "raw") or score (2,
    "processed") is ``value``, over the row whose per-tile partials stage 1 wrote at
    ``log_mass_ptr``: ``(value - max) / T - log(mass)`` with T = 1 for raw; 0.0 for a
    processed greedy row (T = 0: the argmax is drawn with probability 1)."""
    if LOGPROBS == 1:
        scale = tl.full((), 1.0, tl.float32)
    else:
        scale = 1.0 / tl.where(temperature > 0, temperature, 1.0)
    top_value, mass = row_log_mass(log_mass_ptr, num_tiles, scale * INV_LN2, BLOCK)
    logprob = (value - top_value) * scale - tl.log(mass)
    if LOGPROBS == 2:
        logprob = tl.where(temperature > 0, logprob, 0.0)
    return logprob


@triton.jit
def await_previous_kernel(PDL: tl.constexpr):
    """With PDL (a programmatic dependent launch, ``pdl_launch``): wait until the kernel
    before this one on the stream has finished and its writes are visible, then let the next
    one's programs be scheduled. First in the kernel, before any load or store of what the
    previous kernel writes, so the launch only overlaps this kernel's scheduling with the
    previous one's last programs. PDL == 2: the next one's programs may be scheduled first
    (they wait in turn for this one's end), so a chain of small kernels after a long one has
    its programs resident, waiting, by the time the long one ends."""
    if PDL == 2:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    elif PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


def pdl_launch(device: torch.device, trigger_first: bool = False) -> dict[str, bool | int]:
    """Keywords for a kernel that starts with ``await_previous_kernel(PDL)``: PDL and
    launch_pdl on sm_90 and later (Triton's launcher then marks the launch as a programmatic
    dependent, kept as such in a CUDA graph), else PDL off. Between the small kernels that
    follow stage 1 this saves part of each launch gap. FLASHSAMPLING_PDL=0 turns it off.
    ``trigger_first``: PDL 2 (the next kernel's programs scheduled before this one waits)."""
    if not _pdl_supported(device):
        return {"PDL": False}
    return {"PDL": 2 if trigger_first else True, "launch_pdl": True}


@functools.cache
def _pdl_supported(device: torch.device) -> bool:
    if os.environ.get("FLASHSAMPLING_PDL", "1") == "0" or device.type != "cuda":
        return False
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:
        return False
    return (
        "launch_pdl" in getattr(CUDAOptions, "__dataclass_fields__", {})
        and torch.cuda.get_device_capability(device)[0] >= 9
    )


@functools.cache
def is_hopper(device: torch.device) -> bool:
    # (a CUDA device without CUDA: offline tools such as benchmarks/probes/kernel_sass.py)
    return (
        device.type == "cuda"
        and torch.cuda.is_available()
        and torch.cuda.get_device_capability(device) == (9, 0)
    )


def rows_for_tma(hidden: torch.Tensor, block_rows: int) -> torch.Tensor:
    """``hidden`` with zero rows appended up to a multiple of ``block_rows``, for a TMA
    descriptor whose row boxes then never run past the tensor. The copy engine zero-fills a
    box that does, but such loads made stage 1 far slower: H200, D = 2048, B = 144, 128-row
    tiles, 444 us against 314 with the rows padded (and 332 at B = 256, whose boxes are all
    inside). The pad is one small copy (B x D); the kernels still mask rows >= B.
    """
    extra = -hidden.shape[0] % block_rows
    if extra == 0:
        return hidden
    return torch.nn.functional.pad(hidden, (0, 0, 0, extra))


def tma_compatible(hidden: torch.Tensor, weight: torch.Tensor) -> bool:
    """The copy engine wants 16-bit elements here, unit inner strides and 16-byte aligned
    rows; anything else takes the pointer path."""
    return all(
        t.dtype in (torch.bfloat16, torch.float16)
        and t.stride(1) == 1
        and t.stride(0) >= t.shape[1]
        and (t.stride(0) * t.element_size()) % 16 == 0
        and _address(t) % 16 == 0
        for t in (hidden, weight)
    )


def _address(t: torch.Tensor) -> int:
    # A fake tensor (ahead.py's dry run) has none: its allocation's, aligned, plus its offset
    # (the test Triton's TensorDescriptor makes of such a base).
    if type(t).__name__ == "FakeTensor":
        return t.storage_offset() * t.element_size()
    return t.data_ptr()


def key_low_bits(params) -> int:
    """How many low bits of every stage-1 key are fixed by its sign: logits rounded to bf16
    (fp16) keep 16 (13) low fp32 mantissa bits zero, so a key's are 0 for scores >= 0 and
    all ones below (``ordered_key`` flips a negative score's bits), and the searches for a
    k-th key or a nucleus bound skip them. A soft-cap after the rounding sets them: none."""
    if params.softcap > 0:
        return 0
    return {torch.bfloat16: 16, torch.float16: 13}.get(params.logits_dtype, 0)
