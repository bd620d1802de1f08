"""Top-k / top-p / min-p on the device: stage 2 of a truncating call and its exact fallback.

Stage 1 (``sampling_kernel._sample_stage1`` with ``TOP_M > 0``) leaves, per row and
vocabulary tile, the tile's ``m`` largest scores as order-preserving int32 keys with their
global indices, and the largest key it did NOT keep (``hidden_key``): no [B, V] logits, and
no noise for truncated rows. ``_merge_tiles`` first keeps each group of tiles' largest
candidates (64 groups of ~37 tiles keep 15 or 31 each; 32 groups for k in (64, 256]; what a
group leaves out joins its hidden key), so stage 2 sees 1024 or 2048 candidates instead of
tiles * m (up to 14244). Stage 2, one program per row, works on those only:

* top-k: the k-th largest candidate key by a search on the key bits (counting passes, no
  sort; only the bits below those the extreme candidates share, two a pass); survivors are
  the keys >= it, ties all kept;
* completeness: a tile whose hidden key is >= that threshold (and above -inf) may hide a
  survivor, so the row "overflows"; otherwise the candidates hold every survivor, and the
  threshold is the row's true k-th value (the k-th largest of a subset is <= the true one,
  and no hidden value reaches it);
* top-p: a second binary search for the largest key U0 whose strictly-larger mass
  ``sum exp2((l - max) log2(e) / T)`` is still >= p times the survivors' mass; kept iff the
  key is > U0. With top-k off the mass of the whole row comes from stage 1's per-tile
  (max, sum) partials, and a hidden key above U0 overflows;
* min-p: the bound ``max + T * log(min_p)`` (``reference.min_p_bound``): the row's maximum is
  always a candidate, so the bound is exact, and a hidden key at or above it (or above
  top-p's) overflows;
* then, per sample, Philox noise for the candidates only (the same counter and word as
  ``reference.gumbel_noise``) and Gumbel-max among the kept ones, ties to the lowest index.

Overflowing rows (rare: a tile holding more than m survivors) are resampled exactly without
a host sync, in kernels that always launch and return at once on rows without their flag.
Stage 2 records the row's floor (a key every kept token is at or above). When at most
PATCH_TILES tiles have a left-out key at or above it, only those tiles are recomputed and
stage 2 runs again over the per-tile candidates with those tiles' tokens in place of theirs
(``OVERFLOW_PATCH``); otherwise the row's logits are recomputed into a [B, V] scratch and
the same selection runs on all V tokens (``COMPLETE``, ``OVERFLOW_FULL``), where nothing
can hide.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import launch
from .params import SamplingParams
from .sampling_device import (
    INV_LN2,
    KEY_MINUS_INF,
    KEY_PAD,
    LN2,
    LOGPROB_CODES,
    await_previous_kernel,
    drawn_logprob,
    key_low_bits,
    key_value,
    knob_per_row,
    masked_gumbel_chunk,
    ordered_key,
    pdl_launch,
    restore_low_bits,
    round_logits,
    row_mass,
    row_seeds,
    softcap_logits,
    token_gumbel,
    truncates,
)

__all__ = [
    "launch_fallback",
    "launch_stage2",
    "masked_gumbel_argmax",
    "raw_logit_later",
]

_INT32_MAX = tl.constexpr(2147483647)
# Top-k survivors (k plus ties) up to this many are packed for top-p and the noise.
COMPACT_SLOTS = 2048
# The same where every row draws from the merged candidates (``_merge``: 2048 lanes at
# V = 151936), whose heaviest candidates, when fewer than this hold p of the mass, top-p
# searches and draws alone (``_top_p_bound``); at 2048 that pruning never runs there.
MERGED_COMPACT_SLOTS = 2048
# The fallback's stage 2 packs the tokens above a flagged row's proven floor (a nucleus of a
# few thousand tokens) into this many slots, one chunk of registers, when they fit.
FALLBACK_PACK_SLOTS = 16384
# Up to this many candidates (or, in the fallback, tokens) of a row stay in registers for
# the whole of stage 2 (32 a thread); more are read in chunks of it. (Tests lower it to run
# the chunked path, which real vocabularies take in the fallback, on small ones.)
STAGE2_LANES = 16384
# A flagged row's overflow code: the whole row recomputed (OVERFLOW_FULL) or only the tiles
# that may hide a kept token, at most PATCH_TILES of them (OVERFLOW_PATCH).
OVERFLOW_FULL = tl.constexpr(1)
OVERFLOW_PATCH = tl.constexpr(2)
PATCH_TILES = 16
# Stage 2 loads an untruncated row's first chunk of plain candidates before its knobs
# (``_stage2_row``), so such a row waits for one load less: on an H200 (D = 2048, off-valued
# knobs, eager profile) the truncating stage 2 took 2.4-2.5 us instead of 2.8-2.9 at B = 1
# and 16 (the plain stage 2: 1.9-2.1; bench_off_knobs_nvidia-h200_profile-new_20261128-0316).
PREFETCH_PLAIN = True
# Top-p's nucleus bound: searched from the weighed candidates' key range, two bits a pass
# (``_nucleus_bound``'s NARROW), or one bit a pass over all the bits the logits' dtype leaves.
# First narrowed only after a Python top-k, whose few survivors weigh: H200, D = 2048, whole
# calls over cuBLAS, top-k 50 + top-p 0.9 B = 1 / 16 / 64 / 96 / 128 1.073 / 1.065 / 1.073 /
# 1.208 / 1.208 -> 1.061 / 1.055 / 1.064 / 1.196 / 1.203; top-p alone, whose 2048 merged
# candidates all weigh, was 0.5-1.0% slower (truncation_ab_h200_20261128-1214), its pairs of
# bits then unrolled in straight-line code. Since the pairs run as a loop (``_pair_passes``)
# every call narrows it: top-p 0.9 alone, H200, D = 2048, B = 1 / 16,
# 169.7 / 176.7 -> 168.4 / 175.3 us; 0-d knob tensors off / top-k 50 even (stage2_loops_ab_
# h200_20261129-0114.txt, tokens equal; B = 64 not timed).
NUCLEUS_NARROW = True
# Stage 2's warps on up to 4096 lanes (merged candidates: 1024 or 2048). Four instead of eight
# were 4-6% slower (whole calls: top-p alone, top-k 50 + top-p, min-p at the B above; same
# run). Sixteen where Python knobs truncate without top-k (top-p / min-p alone, whose 2048
# merged candidates all weigh): H200, D = 2048, B = 1 / 16 / 32 / 48 / 64, top-p 0.9 1.091 /
# 1.083 / 1.145 / 1.126 / 1.112 -> 1.083 / 1.075 / 1.135 / 1.119 / 1.104, min-p 0.1 1.041 /
# 1.036 / 1.078 / 1.053 / 1.037 -> 1.036 / 1.033 / 1.074 / 1.048 / 1.033, even at 96 / 128
# rows; 0.5-1% slower after top-k 50 (truncation_ab_h200_20261128-1351).
STAGE2_WARPS = 8
STAGE2_WARPS_WITHOUT_TOP_K = 16
# ... up to this many rows (a program a row): above, 16-warp programs share the SMs and took
# stage 2 longer. H200, top-p 0.9 alone on bench_sampling's rows (bf16 logits), D = 2048,
# B = 160: stage 2 18.1 us with 16 warps, 11.3 with 8 (profile); whole calls 275.5 -> 266.4
# us, B = 224 384.2 -> 377.9; B = 64 177.9 against 179.4 (sweep_cells_ab_h200_20261128-1625).
# Again over cuBLAS, 16 -> 8 warps: D = 2048 B = 160 / 224 / 256 1.481 / 1.579 / 1.456 ->
# 1.427 / 1.552 / 1.409, D = 4096 B = 224 / 256 1.602 / 1.342 -> 1.548 / 1.298, D = 8192
# B = 224 / 256 1.263 / 1.092 -> 1.229 / 1.079 (B = 160 within noise); min-p D = 2048 B = 224
# even (-1644).
STAGE2_WARPS_WITHOUT_TOP_K_ROWS_MAX = 128
# The fallback's persistent grid: this many programs per SM at most.
FALLBACK_PROGRAMS_PER_SM = 2
# The kernels after stage 1 (merge, stage 2, the fallback's two), each a programmatic
# dependent of the one before (``pdl_launch``), let the next one's programs be scheduled
# before they wait for their own predecessor (PDL 2: ``await_previous_kernel``), so that the
# whole tail is resident, waiting, by the time stage 1 ends, instead of each kernel's
# programs being scheduled after the previous kernel's wait. H200, CUDA graphs, one process
# against False, tokens equal in every cell: D = 2048, 0-d knobs at their off values, B =
# 1 / 16 / 64, us, 159.9 / 161.7 / 172.4 -> 159.1 / 160.8 / 169.6 (plain 150.7 / 152.5 /
# 156.9), top-k 50 as 0-d tensors 190.2 / 190.3 / 210.1 -> 190.0 / 189.9 / 207.8; [B] knobs
# off at B = 16 / 64 162.9 / 174.2 -> 160.0 / 171.8, mixed 211.2 / 269.2 -> 211.1 / 268.0;
# D = 4096 off 292.5 / 295.3 / 317.8 -> 291.9 / 293.9 / 315.7, top-k 50 316.6 / 319.9 /
# 348.2 -> 316.1 / 319.5 / 348.8 (bench_off_knobs_nvidia-h200_ab2-*_20261128-141*.csv;
# round 1 at 13:48 alike). FLASHSAMPLING_PDL=0 turns PDL off altogether.
TAIL_TRIGGER_FIRST = True
# ... up to this many rows, where it was measured. (Programs resident and waiting take issue
# slots from the kernel they wait on: stage 1 signalling the merge's 1024 programs at B = 16
# cost top-k 50 4.3 us there. Above 64 rows the kernels' programs are many more, and
# stage 2 does real work while the fallback's would wait beside it: not measured.)
TAIL_TRIGGER_FIRST_ROWS_MAX = 64


def _tail_pdl(device: torch.device, batch: int) -> dict:
    return pdl_launch(device, TAIL_TRIGGER_FIRST and batch <= TAIL_TRIGGER_FIRST_ROWS_MAX)


@triton.jit
def _chunk_keys(key_ptr, index_ptr, start, n, packed, COMPLETE: tl.constexpr,
                BLOCK: tl.constexpr):  # fmt: skip
    """Keys (KEY_PAD past n) and global indices of candidates start..start+BLOCK of a row.
    COMPLETE: key_ptr holds the row's fp32 logits and the index is the position, or, once
    ``packed``, the logits above the row's floor and index_ptr their indices."""
    offs = start + tl.arange(0, BLOCK)
    mask = offs < n
    if COMPLETE:
        values = tl.load(key_ptr + offs, mask=mask, other=0.0)
        keys = tl.where(mask, ordered_key(values), KEY_PAD)
        index = offs
        if packed:
            index = tl.load(index_ptr + offs, mask=mask, other=0)
    else:
        keys = tl.load(key_ptr + offs, mask=mask, other=KEY_PAD)
        index = tl.load(index_ptr + offs, mask=mask, other=0)
    return keys, index


@triton.jit
def _count_at_least(key_ptr, index_ptr, n, bound, COMPLETE: tl.constexpr, BLOCK: tl.constexpr):
    """How many candidate keys are >= bound, read BLOCK at a time (the fallback's V tokens;
    fewer candidates stay in registers and are counted inline)."""
    count = 0
    for start in range(0, n, BLOCK):
        keys, _ = _chunk_keys(key_ptr, index_ptr, start, n, False, COMPLETE, BLOCK)
        count += tl.sum((keys >= bound).to(tl.int32))
    return count


@triton.jit
def _weights(keys, top_value, inv_temperature, survivor_bound):
    """exp2((l - max) log2(e) / T) of survivors (keys >= survivor_bound), the row maximum
    (even +inf) weighing 1, -inf and padding nothing: reference.truncation_keep's weights."""
    values = key_value(keys)
    weights = tl.exp2((values - top_value) * inv_temperature)
    weights = tl.where(values == top_value, 1.0, weights)
    return tl.where((keys >= survivor_bound) & (keys > KEY_MINUS_INF), weights, 0.0)


@triton.jit
def _mass_above(key_ptr, index_ptr, n, bound, top_value, inv_temperature, survivor_bound,
                COMPLETE: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    """The weight of the survivors whose key is > bound, read BLOCK at a time."""
    mass = 0.0
    for start in range(0, n, BLOCK):
        keys, _ = _chunk_keys(key_ptr, index_ptr, start, n, False, COMPLETE, BLOCK)
        weights = _weights(keys, top_value, inv_temperature, survivor_bound)
        mass += tl.sum(tl.where(keys > bound, weights, 0.0))
    return mass


@triton.jit
def _range_combine(lo0, hi0, n0, lo1, hi1, n1):
    return tl.minimum(lo0, lo1), tl.maximum(hi0, hi1), n0 + n1


@triton.jit
def _search_start(lo, hi, LOW_BITS: tl.constexpr):
    """Where a bitwise search for a key known to lie in [lo, hi] starts: the bits above the
    highest one in which lo and hi differ are the answer's too, so the search starts from lo
    with that bit and those below it cleared (in the biased domain key + 2**31, where int32
    order is unsigned order) and settles only them. Returns (start, top): the biased start
    (int64) and that highest bit (LOW_BITS - 1 when lo and hi differ in no searched bit).
    Candidates within an octave or two (std-5 rows: the top few per tile) leave about half
    of a bf16 search's 16 bits to settle."""
    one = tl.full((), 1, tl.int64)
    low = lo.to(tl.int64) + (one << 31)
    differ = low ^ (hi.to(tl.int64) + (one << 31))
    # (the highest bit of differ, < 2**32, from its exponent as a float64, which is exact:
    # a few instructions where a scan of the bits took ~50 of straight-line code)
    highest = (differ.to(tl.float64).to(tl.int64, bitcast=True) >> 52) - 1023
    top = tl.where(differ >= (one << LOW_BITS), highest, LOW_BITS - 1).to(tl.int32)
    shift = (top + 1).to(tl.int64)
    return (low >> shift) << shift, top


@triton.jit
def _pair_passes(top, LOW_BITS: tl.constexpr):
    """(the first pair's lower bit, how many pairs) of a two-bits-a-pass search from bit
    ``top`` down to LOW_BITS: the pairs (bit + 1, bit), bit = LOW_BITS + 2 j, at or below
    top, from the highest. A runtime loop over them: each pass's code once, not once per
    pair it might run. A stage-2 program runs its code once, so its straight-line code
    waits on instruction fetch: with the loops (and _search_start's scan of the bits gone)
    top-k 50's kernel is 1376 SASS instructions instead of 2864, and a row's draw after the
    search took 1.1 us instead of 3.1-3.9 (benchmarks/probes/stage2_phases.py, H200). Whole
    calls, H200, D = 2048, B = 1 / 16 / 64, us: top-k 50 160.9 / 170.3 / 173.0 -> 157.8 /
    162.8 / 168.3, top-k 50 + top-p 0.9 166.7 / 177.0 / 179.3 -> 162.4 / 167.6 / 171.1;
    top-p alone, min-p, off-valued knobs even; tokens equal (stage2_loops_ab_h200_
    20261129-*.txt)."""
    NUM_PAIRS: tl.constexpr = (33 - LOW_BITS) // 2
    first = tl.minimum(tl.maximum(top - LOW_BITS, 0) // 2, NUM_PAIRS - 1)
    return LOW_BITS + 2 * first, tl.where(top >= LOW_BITS, first + 1, 0)


@triton.jit
def _least_at_or_above(keys, exact, bound):
    """``bound`` unless a search met a trial ``exact`` that exactly k keys reach: then the
    least of those keys, which is the k-th largest (and the bound the passes left would have
    settled, low bits included), so the search stops there. (A tie at the k-th key never
    counts exactly k, so ties run every pass.) Distinct keys part after a few passes: with
    fp32 logits (24 key bits to settle, 12 two-bit passes) top-k 50's search in stage 2 took
    2.4 us a row instead of 4.6 (H200, D = 2048, std-5 rows), whole calls at B = 1 / 16 1.2-1.7%
    faster (top-k 50 159.6 / 163.0 -> 157.4 / 161.1 us, with top-p 0.9 164.2 / 167.8 -> 161.4
    / 165.4; min-p, whose merge searches one bit a pass, 0.2-0.5%); with bf16 logits (8 bits,
    4 passes) even; tokens equal (stage2_exact_exit_h200_20261129-0327.txt)."""
    if exact != KEY_PAD:
        bound = tl.min(tl.where(keys >= exact, keys, _INT32_MAX))
    return bound


@triton.jit
def _kth_key(keys, k, LOW_BITS: tl.constexpr, NARROW: tl.constexpr):
    """The largest key T with at least k of ``keys`` >= T: the k-th largest key (KEY_PAD when
    fewer than k are real), settled down to bit LOW_BITS, below which every key's bits are
    its sign's (``key_low_bits``: half the passes with bf16 logits). Counts are integers:
    exact. Without NARROW, one bit a pass from KEY_PAD = -2**31 up (so a trial never leaves
    the int32 range). With NARROW, only the bits below those the smallest real key and the
    largest share (``_search_start``), two a pass: a pass's three counts (keys >= bound +
    c * 2**bit, c = 1, 2, 3) are one int64 sum, 16 bits each, so it costs one reduction; ~5
    passes instead of 16 with bf16 logits. That pays in stage 2 (8 or 16 warps: H100, B = 64,
    top-k 256 9.1 -> 7.9 us) but not in the one-warp merge (5.6 -> 6.5-7.3 us), where a pass is
    cheap and the range reduction and the int64 counts are not. (Settling four bits a pass
    with a [lanes, 16] count cost the merge 2x: that 2-D reduction goes through shared
    memory.)"""
    one = tl.full((), 1, tl.int64)
    if NARROW:
        tl.static_assert(keys.shape[0] < 65536)  # (a count fits its 16 bits)
        real = keys > KEY_PAD
        lo, hi, num_real = tl.reduce(
            (tl.where(real, keys, _INT32_MAX), keys, real.to(tl.int32)), 0, _range_combine
        )
        bound, top = _search_start(lo, hi, LOW_BITS)
        # Pairs of bits (bit + 1, bit), from the highest down to LOW_BITS; those above top
        # stay lo's (and hi's).
        first_bit, num_pairs = _pair_passes(top, LOW_BITS)
        exact = tl.full((), KEY_PAD, tl.int32)  # (a trial that exactly k keys reach)
        pair = tl.zeros((), tl.int32)
        while (pair < num_pairs) & (exact == KEY_PAD):
            bit = (first_bit - 2 * pair).to(tl.int64)
            # (a trial past the int32 range, bit 32 set, is clamped above every key)
            trial = tl.minimum(bound + (one << bit) - (one << 31), _INT32_MAX).to(tl.int32)
            trial2 = tl.minimum(bound + (one << (bit + 1)) - (one << 31), _INT32_MAX).to(tl.int32)
            trial3 = tl.minimum(bound + 3 * (one << bit) - (one << 31), _INT32_MAX).to(tl.int32)
            counts = tl.sum(
                (keys >= trial).to(tl.int64)
                + ((keys >= trial2).to(tl.int64) << 16)
                + ((keys >= trial3).to(tl.int64) << 32)
            )
            count, count2, count3 = counts & 0xFFFF, (counts >> 16) & 0xFFFF, counts >> 32
            digit = (count >= k).to(tl.int64) + (count2 >= k).to(tl.int64)
            bound += (digit + (count3 >= k).to(tl.int64)) << bit
            exact = tl.where(count == k, trial, exact)
            exact = tl.where(count2 == k, trial2, exact)
            exact = tl.where(count3 == k, trial3, exact)
            pair += 1
        bound = tl.where(num_real >= k, bound - (one << 31), KEY_PAD).to(tl.int32)
        bound = _least_at_or_above(keys, exact, bound)
    else:
        bound = tl.full((), KEY_PAD, tl.int32)
        exact = tl.full((), KEY_PAD, tl.int32)
        i = tl.zeros((), tl.int32)
        while (i < 32 - LOW_BITS) & (exact == KEY_PAD):
            trial = (bound.to(tl.int64) + (one << (31 - i).to(tl.int64))).to(tl.int32)
            count = tl.sum((keys >= trial).to(tl.int32))
            bound = tl.where(count >= k, trial, bound)
            exact = tl.where(count == k, trial, exact)
            i += 1
        bound = _least_at_or_above(keys, exact, bound)
    return restore_low_bits(bound, LOW_BITS)


@triton.jit
def _add3(a0, b0, c0, a1, b1, c1):
    return a0 + a1, b0 + b1, c0 + c1


@triton.jit
def _nucleus_bound(keys, weights, total, top_p, LOW_BITS: tl.constexpr,
                   NARROW: tl.constexpr = False):  # fmt: skip
    """Top-p over candidates held in registers: the smallest kept key, i.e. the largest key
    T whose mass at or above it is still >= p * total, built bit by bit from KEY_PAD = -2**31
    up (so a trial never leaves the int32 range) down to bit LOW_BITS (``_kth_key``). One
    bit a pass keeps each pass's mass the same sum over the same lanes as the reference's.
    (Starting between the weighed candidates' extreme keys, as ``_kth_key`` does, cost top-p
    alone at B = 128 4 us more on an H100, one bit a pass.)

    With NARROW, as ``_kth_key``'s: only the bits below those the smallest and the largest
    weighed key share (``_search_start``; the bound lies between them, or is KEY_PAD when
    all of them weigh less than p * total), two a pass, whose three trial masses are one
    reduction of three sums (each sum as one bit a pass forms it; nested sums of weights
    >= 0 round monotonically, so the passing trials are a prefix): ~5 reductions instead of
    16 with bf16 logits (std-5 rows' top candidates lie within an octave or two)."""
    threshold = top_p * total
    one = tl.full((), 1, tl.int64)
    if NARROW:
        weighed = weights > 0
        # (one reduction: the weighed keys' range and their whole mass)
        lo, hi, whole = tl.reduce(
            (tl.where(weighed, keys, _INT32_MAX), tl.where(weighed, keys, KEY_PAD), weights),
            0, _range_combine,
        )  # fmt: skip
        bound, top = _search_start(lo, hi, LOW_BITS)
        first_bit, num_pairs = _pair_passes(top, LOW_BITS)
        for pair in range(num_pairs):
            bit = (first_bit - 2 * pair).to(tl.int64)
            # (a trial past the int32 range, bit 32 set, is clamped above every key)
            trial = tl.minimum(bound + (one << bit) - (one << 31), _INT32_MAX).to(tl.int32)
            trial2 = tl.minimum(bound + (one << (bit + 1)) - (one << 31), _INT32_MAX)
            trial3 = tl.minimum(bound + 3 * (one << bit) - (one << 31), _INT32_MAX)
            mass, mass2, mass3 = tl.reduce(
                (tl.where(keys >= trial, weights, 0.0),
                 tl.where(keys >= trial2.to(tl.int32), weights, 0.0),
                 tl.where(keys >= trial3.to(tl.int32), weights, 0.0)),
                0, _add3,
            )  # fmt: skip
            digit = (mass >= threshold).to(tl.int64)
            digit += (mass2 >= threshold).to(tl.int64)
            digit += (mass3 >= threshold).to(tl.int64)
            bound += digit << bit
        # The search over [lo, hi] finds what the search from KEY_PAD finds where lo's mass
        # (all of it) reaches p * total; else no trial passes there: KEY_PAD. (A threshold
        # <= 0, which no valid p gives, passes every trial there: the largest key.)
        bound = tl.where(whole >= threshold, bound - (one << 31), KEY_PAD)
        bound = tl.where(threshold > 0, bound, (one << 31) - (one << LOW_BITS)).to(tl.int32)
    else:
        bound = tl.full((), KEY_PAD, tl.int32)
        for i in range(32 - LOW_BITS):
            trial = (bound.to(tl.int64) + (one << (31 - i))).to(tl.int32)
            mass = tl.sum(tl.where(keys >= trial, weights, 0.0))
            bound = tl.where(mass >= threshold, trial, bound)
    return restore_low_bits(bound, LOW_BITS)


@triton.jit
def _heaviest(weights, LIMIT: tl.constexpr):
    """A mask of the heaviest candidates, about LIMIT of them at most: those above the
    power-of-two weight level below which a histogram of the weights' binary exponents
    (weights in [0, 1]) counts more than LIMIT. Only a guess: the caller counts and checks."""
    bucket = tl.minimum(tl.floor(-tl.log2(weights)), 63.0).to(tl.int32)
    cumulative = tl.cumsum(tl.histogram(bucket, 64), axis=0)
    # (weight 0 lands in bucket 63, which is never selected)
    fits = (cumulative <= LIMIT) & (tl.arange(0, 64) < 63)
    levels = tl.sum(fits.to(tl.int32))
    return weights > tl.exp2(-levels.to(tl.float32))


@triton.jit
def _pack(keys, index, select, count, pack, key_ptr, index_ptr, COMPACT: tl.constexpr):
    """The selected candidates (count of them) packed into the row's COMPACT slots and read
    back as [COMPACT] tensors (KEY_PAD past count) when ``pack``; all KEY_PAD otherwise,
    without the block-wide scan (about 14 us over 16384 lanes on an H100)."""
    small = tl.arange(0, COMPACT)
    small_keys = tl.full((COMPACT,), KEY_PAD, tl.int32)
    small_index = tl.zeros((COMPACT,), tl.int32)
    if pack:
        slot = tl.cumsum(select.to(tl.int32), axis=0) - 1
        tl.store(key_ptr + slot, keys, mask=select & (slot < COMPACT))
        tl.store(index_ptr + slot, index, mask=select & (slot < COMPACT))
        tl.debug_barrier()
        small_mask = small < tl.minimum(count, COMPACT)
        small_keys = tl.load(key_ptr + small, mask=small_mask, other=KEY_PAD)
        small_index = tl.load(index_ptr + small, mask=small_mask, other=0)
    return small_keys, small_index


@triton.jit
def _gumbel_winner(keys, index, keep_bound, noise_scale, row_counter, sample_index, k0, k1,
                   FAST_MATH: tl.constexpr, WITH_VALUE: tl.constexpr = False):  # fmt: skip
    """The best perturbed score among the kept candidates, its index (ties to the lowest)
    and, WITH_VALUE, its score (else the perturbed one again): the noise of
    reference.gumbel_noise, for these candidates only."""
    noise = token_gumbel(index, row_counter, sample_index, k0, k1, FAST_MATH)
    kept = (keys >= keep_bound) & (keys > KEY_PAD)
    scores = tl.where(kept, key_value(keys) + noise_scale * noise, float("-inf"))
    best = tl.max(scores)
    winner = tl.min(tl.where(scores == best, index, _INT32_MAX))
    value = best
    if WITH_VALUE:
        value = tl.max(tl.where(kept & (index == winner), key_value(keys), float("-inf")))
    return best, winner, value


@triton.jit
def _hiding_tiles(hidden_ptr, num_tiles, bound, out_ptr, LIMIT: tl.constexpr, BLOCK: tl.constexpr):
    """How many tiles' hidden keys are >= bound (and above -inf); the first LIMIT of them
    (tile numbers) written to out_ptr."""
    count = 0
    offs = tl.arange(0, BLOCK)
    for start in range(0, num_tiles, BLOCK):
        mask = start + offs < num_tiles
        hidden = tl.load(hidden_ptr + start + offs, mask=mask, other=KEY_PAD)
        hiding = (hidden >= bound) & (hidden > KEY_MINUS_INF) & mask
        slot = count + tl.cumsum(hiding.to(tl.int32), axis=0) - 1
        tl.store(out_ptr + slot, start + offs, mask=hiding & (slot < LIMIT))
        count += tl.sum(hiding.to(tl.int32))
    return count


@triton.jit
def _patched_keys(keys, index, n, row64, patch_tile_ptr, patch_count_ptr, patch_key_ptr,
                  patch_index_ptr, PATCH_TILES: tl.constexpr, PATCH_V: tl.constexpr,
                  BLOCK: tl.constexpr):  # fmt: skip
    """A patched row's candidates: stage 1's n per-tile ones (lanes below n), except those
    of the recomputed tiles, whose every token follows instead (lanes from n on)."""
    offs = tl.arange(0, BLOCK)
    count = tl.load(patch_count_ptr + row64)
    lane = tl.maximum(offs - n, 0)
    in_patch = (offs >= n) & (lane // PATCH_V < count)
    source = row64 * (PATCH_TILES * PATCH_V) + lane
    patch_keys = tl.load(patch_key_ptr + source, mask=in_patch, other=KEY_PAD)
    patch_index = tl.load(patch_index_ptr + source, mask=in_patch, other=0)
    tile = index // PATCH_V
    covered = offs < 0
    for j in tl.static_range(PATCH_TILES):
        listed = tl.load(patch_tile_ptr + row64 * PATCH_TILES + j)
        covered = covered | ((j < count) & (tile == listed))
    keys = tl.where(offs < n, tl.where(covered, KEY_PAD, keys), patch_keys)
    return keys, tl.where(offs < n, index, patch_index)


@triton.jit
def _merged_route(top_k, route_k_max, V):
    """Whether a row of a per-row k tensor takes stage 2's merged candidates (top-k off, or
    k <= route_k_max, which the groups hold; ``dispatch.merge_route_k_max``) rather than stage
    1's per-tile ones."""
    return (top_k <= route_k_max) | (top_k >= V)


@triton.jit(do_not_specialize=["scalar_temperature", "scalar_top_k", "scalar_top_p",
                               "scalar_min_p"])  # fmt: skip
def _merge_tiles(
    key_ptr, index_ptr, hidden_key_ptr, mass_ptr, temperature_ptr,
    top_k_ptr, top_p_ptr, min_p_ptr,
    merged_key_ptr, merged_index_ptr, merged_hidden_ptr, merged_mass_ptr,
    num_tiles, tiles_per_group, scalar_temperature, scalar_top_k, scalar_top_p, scalar_min_p,
    V, route_k_max,
    TEMPERATURE_MODE: tl.constexpr, HAS_MASS: tl.constexpr, TOP_M: tl.constexpr,
    KEEP: tl.constexpr, BLOCK: tl.constexpr, TILE_BLOCK: tl.constexpr,
    KEY_LOW_BITS: tl.constexpr, PDL: tl.constexpr,
    # ROUTED (a per-row k tensor): only the rows that stage 2 draws from the merged
    # candidates (``_merged_route``), and with PLAIN_ROWS (stage 1 left plain candidates for
    # untruncated rows) only the truncated ones of those; the others' programs return at once.
    ROUTED: tl.constexpr = False, PLAIN_ROWS: tl.constexpr = False,
    TOP_K_MODE: tl.constexpr = 0, TOP_P_MODE: tl.constexpr = 0, MIN_P_MODE: tl.constexpr = 0,
):  # fmt: skip
    """Program (row, group): the KEEP - 1 or fewer largest candidate keys of the group's
    tiles, those strictly above the KEEP-th largest (so ties there never need breaking),
    and the group's hidden key: the largest of its tiles' hidden keys and that KEEP-th key.
    Every token the group leaves out is at or below it, so stage 2's completeness proof
    holds over groups as over tiles. The tiles' mass partials merge into the group's."""
    await_previous_kernel(PDL)
    row = tl.program_id(0)
    group = tl.program_id(1)
    if ROUTED:
        top_k = knob_per_row(top_k_ptr, row, scalar_top_k, TOP_K_MODE, tl.int64)
        if not _merged_route(top_k, route_k_max, V):
            return
        if PLAIN_ROWS:
            temperature = knob_per_row(
                temperature_ptr, row, scalar_temperature, TEMPERATURE_MODE, tl.float32
            )
            top_p = knob_per_row(top_p_ptr, row, scalar_top_p, TOP_P_MODE, tl.float32)
            min_p = knob_per_row(min_p_ptr, row, scalar_min_p, MIN_P_MODE, tl.float32)
            if not truncates(top_k, top_p, min_p, temperature, V):
                return
    row64 = row.to(tl.int64)
    num_groups = tl.num_programs(1)
    first = group * tiles_per_group
    group_tiles = tl.minimum(tiles_per_group, num_tiles - first)
    offs = tl.arange(0, BLOCK)
    mask = offs < group_tiles * TOP_M
    source = row64 * num_tiles * TOP_M + first * TOP_M + offs
    keys = tl.load(key_ptr + source, mask=mask, other=KEY_PAD)
    index = tl.load(index_ptr + source, mask=mask, other=0)
    # The KEEP-th largest key (KEY_PAD when fewer are real).
    bound = _kth_key(keys, KEEP, KEY_LOW_BITS, False)
    keep = keys > bound
    slot = tl.cumsum(keep.to(tl.int32), axis=0) - 1
    target = row64 * num_groups * KEEP + group * KEEP
    tl.store(merged_key_ptr + target + slot, keys, mask=keep)
    tl.store(merged_index_ptr + target + slot, index, mask=keep)
    slots = tl.arange(0, KEEP)
    tl.store(merged_key_ptr + target + slots, KEY_PAD, mask=slots >= tl.sum(keep.to(tl.int32)))

    tiles = tl.arange(0, TILE_BLOCK)
    tile_mask = tiles < group_tiles
    tile_slot = row64 * num_tiles + first + tiles
    hidden = tl.load(hidden_key_ptr + tile_slot, mask=tile_mask, other=KEY_PAD)
    tl.store(merged_hidden_ptr + row64 * num_groups + group, tl.maximum(tl.max(hidden), bound))
    if HAS_MASS:
        temperature = knob_per_row(
            temperature_ptr, row, scalar_temperature, TEMPERATURE_MODE, tl.float32
        )
        inv_temperature = INV_LN2 / tl.where(temperature > 0, temperature, 1.0)
        tile_max = tl.load(mass_ptr + tile_slot * 2, mask=tile_mask, other=float("-inf"))
        tile_sum = tl.load(mass_ptr + tile_slot * 2 + 1, mask=tile_mask, other=0.0)
        group_max = tl.max(tile_max)
        scale = tl.exp2((tile_max - group_max) * inv_temperature)
        scale = tl.where(tile_max == group_max, 1.0, scale)
        group_sum = tl.sum(tl.where(tile_max > float("-inf"), tile_sum * scale, 0.0))
        merged = merged_mass_ptr + (row64 * num_groups + group) * 2
        tl.store(merged, group_max)
        tl.store(merged + 1, group_sum)


@triton.jit
def _draw_untruncated(
    plain_score_ptr, plain_index_ptr, plain_value_ptr, out_ptr, logprob_ptr, log_mass_ptr,
    row64, num_samples, num_plain_tiles, num_mass_tiles, temperature, prefetched,
    LOGPROBS: tl.constexpr, RAW_LOGIT_LATER: tl.constexpr, BLOCK: tl.constexpr,
    PLAIN_BLOCK: tl.constexpr, PREFETCHED: tl.constexpr,
):  # fmt: skip
    """A row that nothing truncates (or a greedy one), drawn from stage 1's plain candidates
    as the plain stage 2 draws it: per sample the best candidate of the row's tiles (with
    PREFETCHED, the first chunk of sample 0's are ``prefetched``, loaded before the knobs)."""
    plain_log_mass_ptr = log_mass_ptr
    if LOGPROBS > 0:
        plain_log_mass_ptr += row64 * num_mass_tiles * 2
    offs = tl.arange(0, PLAIN_BLOCK)
    for sample_index in range(num_samples):
        base = (row64 * num_samples + sample_index) * num_plain_tiles
        best = tl.full((), float("-inf"), tl.float32)
        best_index = tl.zeros((), tl.int32)
        best_value = tl.zeros((), tl.float32)
        for start in range(0, num_plain_tiles, PLAIN_BLOCK):
            mask = start + offs < num_plain_tiles
            if PREFETCHED:
                if (sample_index == 0) & (start == 0):
                    scores = prefetched
                else:
                    scores = tl.load(plain_score_ptr + base + start + offs, mask=mask,
                                     other=float("-inf"))  # fmt: skip
            else:
                scores = tl.load(plain_score_ptr + base + start + offs, mask=mask,
                                 other=float("-inf"))  # fmt: skip
            chunk_best, arg = tl.max(scores, axis=0, return_indices=True,
                                     return_indices_tie_break_left=True)  # fmt: skip
            index = tl.load(plain_index_ptr + base + start + arg)
            take = (chunk_best > best) | (start == 0)
            best = tl.where(take, chunk_best, best)
            best_index = tl.where(take, index, best_index)
            if LOGPROBS > 0:
                value = tl.load(plain_value_ptr + base + start + arg)
                best_value = tl.where(take, value, best_value)
        tl.store(out_ptr + row64 * num_samples + sample_index, best_index.to(tl.int64))
        if LOGPROBS > 0:
            logprob = _logprob_of(
                best_value, plain_log_mass_ptr, num_mass_tiles, temperature, LOGPROBS,
                RAW_LOGIT_LATER, BLOCK,
            )  # fmt: skip
            tl.store(logprob_ptr + row64 * num_samples + sample_index, logprob)


@triton.jit
def _top_candidate(key_ptr, index_ptr, row_keys, row_index, num_candidates,
                   SINGLE: tl.constexpr, COMPLETE: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    """The row's maximum key and, ties to the lowest index, its token (greedy rows' answer)."""
    top_key = tl.full((), KEY_PAD, tl.int32)
    top_index = tl.full((), _INT32_MAX, tl.int32)
    for start in range(0, num_candidates, BLOCK):
        if SINGLE:
            keys, index = row_keys, row_index
        else:
            keys, index = _chunk_keys(
                key_ptr, index_ptr, start, num_candidates, False, COMPLETE, BLOCK
            )
        chunk_top = tl.max(keys)
        chunk_index = tl.min(tl.where(keys == chunk_top, index, _INT32_MAX))
        better = (chunk_top > top_key) | ((chunk_top == top_key) & (chunk_index < top_index))
        top_key = tl.where(better, chunk_top, top_key)
        top_index = tl.where(better, chunk_index, top_index)
    return top_key, top_index


@triton.jit
def _pack_above_floor(
    key_ptr, index_ptr, num_candidates, floor_ptr, compact_value_ptr, compact_index_ptr,
    row, row64, top_key, top_value, temperature,
    COMPLETE: tl.constexpr, SINGLE: tl.constexpr, PACK: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """-> (key_ptr, index_ptr, num_candidates) to search, whether they are the packed tokens,
    and the row's mass (relative to its maximum) where they are.

    The fallback over V tokens read in chunks: every kept token (and, with top-k, every
    top-k survivor) is at or above the floor that stage 2 proved for the row when it flagged
    it, so when at most PACK tokens are, they are packed once (their logits and indices) and
    the searches below read that one chunk instead of all of V; the row's mass for top-p
    alone is summed on the way. Otherwise (a flat row) all of V is searched."""
    packed = top_key < KEY_PAD  # False
    row_total = tl.zeros((), tl.float32)
    if COMPLETE:
        if not SINGLE:
            floor = tl.load(floor_ptr + row)
            pack_value_ptr = compact_value_ptr + row64 * PACK
            pack_index_ptr = compact_index_ptr + row64 * PACK
            inv_t = INV_LN2 / tl.where(temperature > 0, temperature, 1.0)
            count = tl.zeros((), tl.int32)
            for start in range(0, num_candidates, BLOCK):
                keys, index = _chunk_keys(
                    key_ptr, index_ptr, start, num_candidates, False, COMPLETE, BLOCK
                )
                row_total += tl.sum(_weights(keys, top_value, inv_t, KEY_PAD))
                select = (keys >= floor) & (keys > KEY_PAD)
                slot = count + tl.cumsum(select.to(tl.int32), axis=0) - 1
                fits = select & (slot < PACK)
                tl.store(pack_value_ptr + slot, key_value(keys), mask=fits)
                tl.store(pack_index_ptr + slot, index, mask=fits)
                count += tl.sum(select.to(tl.int32))
            tl.debug_barrier()
            packed = count <= PACK
            if packed:
                key_ptr = pack_value_ptr
                index_ptr = pack_index_ptr
                num_candidates = count
    return key_ptr, index_ptr, num_candidates, packed, row_total


@triton.jit
def _top_k_bound(row_keys, key_ptr, index_ptr, num_candidates, top_k, k_on,
                 SINGLE: tl.constexpr, COMPLETE: tl.constexpr, KEY_LOW_BITS: tl.constexpr,
                 BLOCK: tl.constexpr):  # fmt: skip
    """Top-k: the largest key with at least k candidate keys >= it (``_kth_key``; over V
    tokens read in chunks, bit by bit from KEY_PAD = -2**31 up, so a trial never leaves the
    int32 range); KEY_PAD where top-k is off."""
    one = tl.full((), 1, tl.int64)
    survivor_bound = tl.full((), KEY_PAD, tl.int32)
    if k_on:
        if SINGLE:
            survivor_bound = _kth_key(row_keys, top_k, KEY_LOW_BITS, True)
        else:
            for i in range(32):
                trial = (survivor_bound.to(tl.int64) + (one << (31 - i))).to(tl.int32)
                count = _count_at_least(key_ptr, index_ptr, num_candidates, trial, COMPLETE, BLOCK)
                survivor_bound = tl.where(count >= top_k, trial, survivor_bound)
    return survivor_bound


@triton.jit
def _whole_row_mass(row_keys, mass_ptr, row64, num_tiles, top_value, inv_temperature, row_total,
                    HAS_MASS: tl.constexpr, COMPLETE: tl.constexpr, SINGLE: tl.constexpr,
                    BLOCK: tl.constexpr):  # fmt: skip
    """The whole row's mass (relative to its maximum): stage 1's per-tile partials, or in
    the fallback its V tokens (in registers with SINGLE, else summed by
    ``_pack_above_floor``)."""
    if COMPLETE:
        if SINGLE:
            total = tl.sum(_weights(row_keys, top_value, inv_temperature, KEY_PAD))
        else:
            total = row_total
    else:
        tl.static_assert(HAS_MASS, "top_p_whole_row needs stage 1's mass partials")
        total = row_mass(
            mass_ptr + row64 * num_tiles * 2, num_tiles, top_value, inv_temperature, BLOCK
        )
    return total


@triton.jit
def _top_p_bound(
    keep_bound, row_keys, row_index, small_keys, small_index, key_ptr, index_ptr,
    num_candidates, mass_ptr, compact_key_ptr, compact_index_ptr, row64, num_tiles,
    top_value, inv_temperature, survivor_bound, top_p, k_on, p_on, compact, packed, row_total,
    HAS_MASS: tl.constexpr, COMPLETE: tl.constexpr, SINGLE: tl.constexpr,
    COMPACT: tl.constexpr, KEY_LOW_BITS: tl.constexpr, BLOCK: tl.constexpr,
    NUCLEUS_NARROW: tl.constexpr = False, P_WHOLE_ROW: tl.constexpr = False,
):  # fmt: skip
    """Top-p: ``keep_bound`` raised to the nucleus bound where top-p is on; with it whether
    the heaviest candidates, packed (heavy_keys, heavy_index), hold every kept one.

    P_WHOLE_ROW (``top_p_whole_row``): the target is p times the whole row's mass, not the
    top-k survivors'. Above a survivor only survivors lie, so the masses searched are the
    same; where the survivors together weigh less than the target, no key reaches it and
    every survivor stays (the search's KEY_PAD)."""
    one = tl.full((), 1, tl.int64)
    heavy_packed = k_on & False
    heavy_keys = small_keys
    heavy_index = small_index
    if p_on:
        if P_WHOLE_ROW:  # (the target's mass, for whichever search runs below)
            whole_total = _whole_row_mass(
                row_keys, mass_ptr, row64, num_tiles, top_value, inv_temperature, row_total,
                HAS_MASS, COMPLETE, SINGLE, BLOCK,
            )  # fmt: skip
        # Stage 1's partials (HAS_MASS): top-p over the whole row (top-k off), whose mass
        # the candidates lack.
        if compact:
            small_weights = _weights(small_keys, top_value, inv_temperature, survivor_bound)
            small_total = tl.sum(small_weights)
            if P_WHOLE_ROW:
                small_total = whole_total
            keep_bound = _nucleus_bound(
                small_keys, small_weights, small_total, top_p, KEY_LOW_BITS, NUCLEUS_NARROW
            )
        elif SINGLE:
            weights = _weights(row_keys, top_value, inv_temperature, survivor_bound)
            total = tl.sum(weights)
            if HAS_MASS:
                if not COMPLETE:
                    if not k_on:
                        total = row_mass(
                            mass_ptr + row64 * num_tiles * 2, num_tiles, top_value,
                            inv_temperature, BLOCK,
                        )  # fmt: skip
            if P_WHOLE_ROW:
                total = whole_total
            if total > 0:
                if BLOCK > COMPACT:
                    # The nucleus is usually a few dozen tokens: when the heaviest candidates
                    # (at most COMPACT) already hold p of the mass, they are an upper set of
                    # the keys that decides the bound alone, so they are packed and searched
                    # on COMPACT lanes (and drawn there: see below).
                    heavy = _heaviest(weights, COMPACT)
                    num_heavy = tl.sum(heavy.to(tl.int32))
                    heavy_mass = tl.sum(tl.where(heavy, weights, 0.0))
                    pruned = (num_heavy <= COMPACT) & (heavy_mass >= top_p * total)
                    heavy_keys, heavy_index = _pack(
                        row_keys, row_index, heavy, num_heavy, pruned, compact_key_ptr,
                        compact_index_ptr, COMPACT,
                    )  # fmt: skip
                    heavy_packed = pruned
                    if pruned:
                        heavy_weights = _weights(heavy_keys, top_value, inv_temperature, KEY_PAD)
                        nucleus = _nucleus_bound(
                            heavy_keys, heavy_weights, total, top_p, KEY_LOW_BITS, NUCLEUS_NARROW
                        )
                    else:
                        nucleus = _nucleus_bound(
                            row_keys, weights, total, top_p, KEY_LOW_BITS, NUCLEUS_NARROW
                        )
                else:
                    nucleus = _nucleus_bound(
                        row_keys, weights, total, top_p, KEY_LOW_BITS, NUCLEUS_NARROW
                    )
                keep_bound = tl.maximum(keep_bound, nucleus)
        else:
            total = _mass_above(key_ptr, index_ptr, num_candidates, KEY_PAD, top_value,
                                inv_temperature, survivor_bound, COMPLETE, BLOCK)  # fmt: skip
            if HAS_MASS:
                if not COMPLETE:
                    if not k_on:
                        total = row_mass(
                            mass_ptr + row64 * num_tiles * 2, num_tiles, top_value,
                            inv_temperature, BLOCK,
                        )  # fmt: skip
            if COMPLETE:
                if packed:
                    if not k_on:
                        total = row_total  # the packed tokens hold only part of the mass
            if P_WHOLE_ROW:
                total = whole_total
            if total > 0:
                below = tl.full((), KEY_PAD, tl.int32)
                for i in range(32):
                    trial = (below.to(tl.int64) + (one << (31 - i))).to(tl.int32)
                    mass = _mass_above(
                        key_ptr, index_ptr, num_candidates, trial, top_value,
                        inv_temperature, survivor_bound, COMPLETE, BLOCK,
                    )  # fmt: skip
                    below = tl.where(mass >= top_p * total, trial, below)
                keep_bound = tl.maximum(keep_bound, below + 1)
    return keep_bound, heavy_packed, heavy_keys, heavy_index


@triton.jit
def _flag_if_hidden(
    hidden_key_ptr, tile_hidden_ptr, patch_tile_ptr, patch_count_ptr, overflow_ptr, floor_ptr,
    row, row64, num_tiles, num_patch_tiles, check_bound,
    PATCH_TILES: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Whether a tile may hide a token at or above ``check_bound``: then the row is flagged
    for the fallback (its overflow code, its floor and, when few, its hiding tiles)."""
    hides = 0
    offs = tl.arange(0, BLOCK)
    for start in range(0, num_tiles, BLOCK):
        mask = start + offs < num_tiles
        hidden = tl.load(hidden_key_ptr + row64 * num_tiles + start + offs, mask=mask,
                         other=KEY_PAD)  # fmt: skip
        hides += tl.sum(((hidden >= check_bound) & (hidden > KEY_MINUS_INF)).to(tl.int32))
    if hides > 0:
        # The fallback draws this row. Every token it keeps is at or above check_bound:
        # the k-th largest candidate is <= the row's k-th value, a nucleus bound from the
        # candidates (the row's exact mass, a subset's mass above each key) is <= the
        # row's, and min-p's bound is exact.
        tl.store(floor_ptr + row, check_bound)
        code = OVERFLOW_FULL
        if PATCH_TILES > 0:
            # The tiles (not groups) whose left-out key reaches the floor: when few, only
            # they are recomputed. Every other tile hides less than the floor, which is
            # at or below the bound the patched candidates (a superset of these) give.
            num_hiding = _hiding_tiles(
                tile_hidden_ptr + row64 * num_patch_tiles, num_patch_tiles, check_bound,
                patch_tile_ptr + row64 * PATCH_TILES, PATCH_TILES, BLOCK,
            )  # fmt: skip
            if num_hiding <= PATCH_TILES:
                tl.store(patch_count_ptr + row, num_hiding)
                code = OVERFLOW_PATCH
        tl.store(overflow_ptr + row, code)
    return hides > 0


@triton.jit
def _pack_kept(
    row_keys, row_index, keep_bound, compact, small_keys, small_index, heavy_packed,
    heavy_keys, heavy_index, compact_key_ptr, compact_index_ptr,
    SINGLE: tl.constexpr, COMPACT: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """-> (compact, small_keys, small_index): where the kept candidates fit COMPACT slots,
    packed there, so the noise runs on COMPACT lanes."""
    if SINGLE:
        if heavy_packed:
            # The kept keys are > the nucleus bound, which is >= the lightest heavy key
            # less one (the heavy ones alone hold p of the mass): all of them are packed.
            compact = heavy_packed
            small_keys = heavy_keys
            small_index = heavy_index
        elif BLOCK > COMPACT:
            if not compact:
                # Min-p (and top-p when the heaviest did not suffice) usually keep a few dozen
                # of the thousands of candidates: packed, the noise (a Philox evaluation per
                # lane) runs on COMPACT lanes; the noise of every lane instead cost 10 to 140
                # us more (H100, 16384 lanes, B = 1 to 256).
                kept = (row_keys >= keep_bound) & (row_keys > KEY_PAD)
                num_kept = tl.sum(kept.to(tl.int32))
                compact = num_kept <= COMPACT
                small_keys, small_index = _pack(
                    row_keys, row_index, kept, num_kept, compact, compact_key_ptr,
                    compact_index_ptr, COMPACT,
                )  # fmt: skip
    return compact, small_keys, small_index


@triton.jit
def _draw_kept(
    small_keys, small_index, row_keys, row_index, key_ptr, index_ptr, num_candidates,
    seed_ptr, out_ptr, logprob_ptr, row_log_mass_ptr, row, row64, seed_lo, seed_hi,
    num_samples, num_mass_tiles, temperature, top_value, inv_temperature, keep_bound,
    compact, packed,
    SEED_MODE: tl.constexpr, COMPLETE: tl.constexpr, SINGLE: tl.constexpr,
    FAST_MATH: tl.constexpr, LOGPROBS: tl.constexpr, RAW_LOGIT_LATER: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    """Per sample, Gumbel-max among the kept candidates (keys >= keep_bound; ties to the
    lowest index) and, with LOGPROBS, the drawn token's log-probability."""
    k0, k1, row_counter = row_seeds(seed_ptr, row, seed_lo, seed_hi, SEED_MODE)
    noise_scale = temperature * LN2
    for sample_index in range(num_samples):
        # (kept_mass: the kept tokens' softmax(l / T) mass relative to the row's maximum,
        # for processed log-probabilities; the candidates drawn from hold every kept token)
        kept_mass = tl.zeros((), tl.float32)
        if compact:
            best, best_index, best_value = _gumbel_winner(
                small_keys, small_index, keep_bound, noise_scale, row_counter, sample_index,
                k0, k1, FAST_MATH, LOGPROBS > 0,
            )  # fmt: skip
            if LOGPROBS == 2:
                kept_mass = tl.sum(_weights(small_keys, top_value, inv_temperature, keep_bound))
        else:
            best = tl.full((), float("-inf"), tl.float32)
            best_index = tl.full((), _INT32_MAX, tl.int32)
            best_value = tl.zeros((), tl.float32)
            for start in range(0, num_candidates, BLOCK):
                if SINGLE:
                    keys, index = row_keys, row_index
                else:
                    keys, index = _chunk_keys(
                        key_ptr, index_ptr, start, num_candidates, packed, COMPLETE, BLOCK
                    )
                chunk_best, chunk_index, chunk_value = _gumbel_winner(
                    keys, index, keep_bound, noise_scale, row_counter, sample_index, k0, k1,
                    FAST_MATH, LOGPROBS > 0,
                )  # fmt: skip
                better = (chunk_best > best) | ((chunk_best == best) & (chunk_index < best_index))
                best = tl.where(better, chunk_best, best)
                best_index = tl.where(better, chunk_index, best_index)
                if LOGPROBS > 0:
                    best_value = tl.where(better, chunk_value, best_value)
                if LOGPROBS == 2:
                    kept_mass += tl.sum(_weights(keys, top_value, inv_temperature, keep_bound))
        winner = tl.where(best > float("-inf"), best_index, 0).to(tl.int64)
        tl.store(out_ptr + row64 * num_samples + sample_index, winner)
        if LOGPROBS > 0:
            if LOGPROBS == 2:
                logprob = (best_value - top_value) * (inv_temperature * LN2) - tl.log(kept_mass)
            else:
                logprob = _logprob_of(
                    best_value, row_log_mass_ptr, num_mass_tiles, temperature, LOGPROBS,
                    RAW_LOGIT_LATER, BLOCK,
                )  # fmt: skip
            tl.store(logprob_ptr + row64 * num_samples + sample_index, logprob)


@triton.jit
def _stage2_row(
    row, prefetched, key_ptr, index_ptr, hidden_key_ptr, mass_ptr, plain_score_ptr, plain_index_ptr,
    temperature_ptr, seed_ptr, top_k_ptr, top_p_ptr, min_p_ptr, out_ptr, overflow_ptr,
    floor_ptr, compact_key_ptr, compact_index_ptr, compact_value_ptr,
    tile_hidden_ptr, patch_tile_ptr, patch_count_ptr, patch_key_ptr, patch_index_ptr,
    log_mass_ptr, plain_value_ptr, logprob_ptr,
    num_candidates, num_tiles, num_plain_tiles, num_patch_tiles, num_mass_tiles, V,
    scalar_temperature, seed_lo, seed_hi, scalar_top_k, scalar_top_p, scalar_min_p,
    num_samples,
    TEMPERATURE_MODE: tl.constexpr, SEED_MODE: tl.constexpr,
    TOP_K_MODE: tl.constexpr, TOP_P_MODE: tl.constexpr, MIN_P_MODE: tl.constexpr,
    HAS_PLAIN: tl.constexpr,  # stage 1 also left plain Gumbel candidates (untruncated rows)
    HAS_MASS: tl.constexpr,  # stage 1 left per-tile (max, sum) mass partials
    COMPLETE: tl.constexpr,  # the fallback: key_ptr is the rows' [B, V] fp32 logits
    SINGLE: tl.constexpr,  # num_candidates <= BLOCK: one chunk, kept in registers
    FAST_MATH: tl.constexpr, BLOCK: tl.constexpr, COMPACT: tl.constexpr,
    PACK: tl.constexpr,  # the fallback's slots for the tokens above a row's floor
    # Flagged rows whose hiding tiles are at most PATCH_TILES (0: never) are patched: their
    # tiles (PATCH_V wide, stage 1's) listed for recomputation, then (PATCHED) this kernel
    # again over stage 1's per-tile candidates with those tiles' tokens in place of theirs.
    PATCHED: tl.constexpr, PATCH_TILES: tl.constexpr, PATCH_V: tl.constexpr,
    KEY_LOW_BITS: tl.constexpr,  # low key bits fixed by the sign (key_low_bits; 0: none)
    # 1 "raw", 2 "processed": each drawn token's log-probability too (``drawn_logprob``
    # over stage 1's per-tile partials at log_mass_ptr; processed truncated rows over the
    # kept candidates, which hold every kept token where the row is drawn here).
    LOGPROBS: tl.constexpr = 0,
    RAW_LOGIT_LATER: tl.constexpr = False,  # raw over soft-capped keys: add l[token] after
    PLAIN_BLOCK: tl.constexpr = 16,  # with HAS_PLAIN: lanes of the plain candidates' chunks
    # With HAS_PLAIN: ``prefetched`` is the row's first chunk of plain candidates, loaded
    # before its knobs (``_prefetch_plain``), so an untruncated row waits for one load less.
    PREFETCH_PLAIN: tl.constexpr = False,
    # Top-p's nucleus bound searched from the weighed candidates' key range, two bits a
    # pass (``_nucleus_bound``'s NARROW; NUCLEUS_NARROW, the launchers' choice).
    NUCLEUS_NARROW: tl.constexpr = False,
    P_WHOLE_ROW: tl.constexpr = False,  # top-p over the whole row's mass (``_top_p_bound``)
):  # fmt: skip
    """Row ``row`` of a stage-2 pass: truncation, then Gumbel-max among the kept candidates
    (the arguments are ``_truncated_stage2``'s)."""
    if COMPLETE:
        if tl.load(overflow_ptr + row) != OVERFLOW_FULL:
            return
    elif PATCHED:
        if tl.load(overflow_ptr + row) != OVERFLOW_PATCH:
            return
    else:
        tl.store(overflow_ptr + row, 0)
    row64 = row.to(tl.int64)
    key_ptr += row64 * num_candidates
    index_ptr += row64 * num_candidates
    temperature = knob_per_row(
        temperature_ptr, row, scalar_temperature, TEMPERATURE_MODE, tl.float32
    )
    top_k = knob_per_row(top_k_ptr, row, scalar_top_k, TOP_K_MODE, tl.int64)
    top_p = knob_per_row(top_p_ptr, row, scalar_top_p, TOP_P_MODE, tl.float32)
    min_p = knob_per_row(min_p_ptr, row, scalar_min_p, MIN_P_MODE, tl.float32)
    k_on = (top_k > 0) & (top_k < V)
    p_on = (top_p < 1.0) & (temperature > 0)
    min_p_on = (min_p > 0.0) & (temperature > 0)

    if HAS_PLAIN:
        if not truncates(top_k, top_p, min_p, temperature, V):
            # Nothing truncates this row (or it is greedy): stage 1's plain candidates, as
            # the plain stage 2, before any truncation candidate is read (stage 1 writes
            # those only for the tiles that hold a truncated row).
            _draw_untruncated(
                plain_score_ptr, plain_index_ptr, plain_value_ptr, out_ptr, logprob_ptr,
                log_mass_ptr, row64, num_samples, num_plain_tiles, num_mass_tiles, temperature,
                prefetched, LOGPROBS, RAW_LOGIT_LATER, BLOCK, PLAIN_BLOCK, PREFETCH_PLAIN,
            )  # fmt: skip
            return

    # With SINGLE every candidate of the row stays in registers from here on.
    row_keys, row_index = _chunk_keys(key_ptr, index_ptr, 0, num_candidates, False, COMPLETE, BLOCK)
    if PATCHED:
        row_keys, row_index = _patched_keys(
            row_keys, row_index, num_candidates, row64, patch_tile_ptr, patch_count_ptr,
            patch_key_ptr, patch_index_ptr, PATCH_TILES, PATCH_V, BLOCK,
        )  # fmt: skip
    top_key, top_index = _top_candidate(
        key_ptr, index_ptr, row_keys, row_index, num_candidates, SINGLE, COMPLETE, BLOCK
    )
    top_value = key_value(top_key)

    row_log_mass_ptr = log_mass_ptr
    if LOGPROBS > 0:
        row_log_mass_ptr += row64 * num_mass_tiles * 2
    if temperature == 0:
        # Greedy: truncation never removes the argmax, but a tile (or group of tiles) may
        # hide it, or a token tied with it at a lower index, where more of its keys tie at
        # the top than it keeps: then the fallback draws the row.
        if not (COMPLETE or PATCHED):
            if _flag_if_hidden(
                hidden_key_ptr, tile_hidden_ptr, patch_tile_ptr, patch_count_ptr, overflow_ptr,
                floor_ptr, row, row64, num_tiles, num_patch_tiles, top_key, PATCH_TILES, BLOCK,
            ):  # fmt: skip
                return
        winner = tl.where(top_key > KEY_MINUS_INF, top_index, 0).to(tl.int64)
        for sample_index in range(num_samples):
            tl.store(out_ptr + row64 * num_samples + sample_index, winner)
            if LOGPROBS > 0:
                logprob = _logprob_of(
                    top_value, row_log_mass_ptr, num_mass_tiles, temperature, LOGPROBS,
                    RAW_LOGIT_LATER, BLOCK,
                )  # fmt: skip
                tl.store(logprob_ptr + row64 * num_samples + sample_index, logprob)
        return
    key_ptr, index_ptr, num_candidates, packed, row_total = _pack_above_floor(
        key_ptr, index_ptr, num_candidates, floor_ptr, compact_value_ptr, compact_index_ptr,
        row, row64, top_key, top_value, temperature, COMPLETE, SINGLE, PACK, BLOCK,
    )  # fmt: skip

    survivor_bound = _top_k_bound(
        row_keys, key_ptr, index_ptr, num_candidates, top_k, k_on, SINGLE, COMPLETE,
        KEY_LOW_BITS, BLOCK,
    )  # fmt: skip
    keep_bound = survivor_bound
    inv_temperature = INV_LN2 / tl.where(temperature > 0, temperature, 1.0)

    # The top-k survivors (k plus ties: usually far fewer than the candidates) are packed
    # into COMPACT slots, so top-p and the noise work on them alone.
    survive = (row_keys >= survivor_bound) & (row_keys > KEY_PAD)
    num_survivors = tl.sum(survive.to(tl.int32))
    compact = k_on & (num_survivors <= COMPACT)
    if not SINGLE:
        compact = k_on & False
    if BLOCK <= COMPACT:
        compact = k_on & False  # (packing would not shrink anything: merged candidates)
    compact_key_ptr += row64 * COMPACT
    compact_index_ptr += row64 * COMPACT
    small_keys, small_index = _pack(
        row_keys, row_index, survive, num_survivors, compact, compact_key_ptr,
        compact_index_ptr, COMPACT,
    )  # fmt: skip

    # Top-p alone, pruned: the heaviest candidates, packed, hold every kept one too.
    keep_bound, heavy_packed, heavy_keys, heavy_index = _top_p_bound(
        keep_bound, row_keys, row_index, small_keys, small_index, key_ptr, index_ptr,
        num_candidates, mass_ptr, compact_key_ptr, compact_index_ptr, row64, num_tiles,
        top_value, inv_temperature, survivor_bound, top_p, k_on, p_on, compact, packed,
        row_total, HAS_MASS, COMPLETE, SINGLE, COMPACT, KEY_LOW_BITS, BLOCK, NUCLEUS_NARROW,
        P_WHOLE_ROW,
    )  # fmt: skip

    if min_p_on:
        # The candidates hold the row's maximum, so this is the exact bound; a hidden token
        # at or above it is caught below.
        log_min_p = tl.log(tl.where(min_p_on, min_p, 1.0))
        keep_bound = tl.maximum(keep_bound, ordered_key(top_value + temperature * log_min_p))

    if not (COMPLETE or PATCHED):
        # Could a tile hide a token that the row keeps (or, with top-k and top-p, any top-k
        # survivor: top-p's mass needs them all)? With top-k alone, a hidden token below
        # keep_bound cannot raise the k-th value above it: the k-th largest of the
        # candidates then is the row's, or below keep_bound and so irrelevant.
        check_bound = tl.where(k_on & p_on, survivor_bound, keep_bound)
        if _flag_if_hidden(
            hidden_key_ptr, tile_hidden_ptr, patch_tile_ptr, patch_count_ptr, overflow_ptr,
            floor_ptr, row, row64, num_tiles, num_patch_tiles, check_bound, PATCH_TILES, BLOCK,
        ):  # fmt: skip
            return

    compact, small_keys, small_index = _pack_kept(
        row_keys, row_index, keep_bound, compact, small_keys, small_index, heavy_packed,
        heavy_keys, heavy_index, compact_key_ptr, compact_index_ptr, SINGLE, COMPACT, BLOCK,
    )  # fmt: skip
    _draw_kept(
        small_keys, small_index, row_keys, row_index, key_ptr, index_ptr, num_candidates,
        seed_ptr, out_ptr, logprob_ptr, row_log_mass_ptr, row, row64, seed_lo, seed_hi,
        num_samples, num_mass_tiles, temperature, top_value, inv_temperature, keep_bound,
        compact, packed, SEED_MODE, COMPLETE, SINGLE, FAST_MATH, LOGPROBS, RAW_LOGIT_LATER,
        BLOCK,
    )  # fmt: skip


@triton.jit
def _prefetch_plain(plain_score_ptr, row, num_samples, num_plain_tiles,
                    PREFETCH_PLAIN: tl.constexpr, PLAIN_BLOCK: tl.constexpr):  # fmt: skip
    """With PREFETCH_PLAIN (stage 1 left plain candidates) the first chunk of the row's
    (sample 0's), else 0."""
    prefetched = 0.0
    if PREFETCH_PLAIN:
        first = tl.arange(0, PLAIN_BLOCK)
        prefetched = tl.load(
            plain_score_ptr + row.to(tl.int64) * num_samples * num_plain_tiles + first,
            mask=first < num_plain_tiles, other=float("-inf"),
        )  # fmt: skip
    return prefetched


@triton.jit(do_not_specialize=["scalar_temperature", "seed_lo", "seed_hi", "scalar_top_k",
                               "scalar_top_p", "scalar_min_p"])  # fmt: skip
def _truncated_stage2(
    key_ptr, index_ptr, hidden_key_ptr, mass_ptr, plain_score_ptr, plain_index_ptr,
    temperature_ptr, seed_ptr, top_k_ptr, top_p_ptr, min_p_ptr, out_ptr, overflow_ptr,
    floor_ptr, compact_key_ptr, compact_index_ptr, compact_value_ptr,
    tile_hidden_ptr, patch_tile_ptr, patch_count_ptr, patch_key_ptr, patch_index_ptr,
    log_mass_ptr, plain_value_ptr, logprob_ptr,
    merged_key_ptr, merged_index_ptr, merged_hidden_ptr, merged_mass_ptr,
    num_candidates, num_tiles, num_plain_tiles, num_patch_tiles, num_mass_tiles, V,
    scalar_temperature, seed_lo, seed_hi, scalar_top_k, scalar_top_p, scalar_min_p,
    num_samples, num_merged, num_groups, route_k_max,
    TEMPERATURE_MODE: tl.constexpr, SEED_MODE: tl.constexpr,
    TOP_K_MODE: tl.constexpr, TOP_P_MODE: tl.constexpr, MIN_P_MODE: tl.constexpr,
    HAS_PLAIN: tl.constexpr, HAS_MASS: tl.constexpr, COMPLETE: tl.constexpr,
    SINGLE: tl.constexpr, FAST_MATH: tl.constexpr, BLOCK: tl.constexpr, COMPACT: tl.constexpr,
    PACK: tl.constexpr, PATCHED: tl.constexpr, PATCH_TILES: tl.constexpr,
    PATCH_V: tl.constexpr, KEY_LOW_BITS: tl.constexpr,
    PDL: tl.constexpr,  # launched as a programmatic dependent (pdl_launch)
    LOGPROBS: tl.constexpr = 0, RAW_LOGIT_LATER: tl.constexpr = False,
    PLAIN_BLOCK: tl.constexpr = 16, PREFETCH_PLAIN: tl.constexpr = False,
    # > 0 (a per-row k tensor): a row on the merged route (``_merged_route``) is drawn from
    # the merged candidates (merged_*: num_merged per row over num_groups groups, in
    # MERGED_BLOCK lanes, MERGED_COMPACT slots), any other from stage 1's per-tile ones.
    MERGED_BLOCK: tl.constexpr = 0, MERGED_COMPACT: tl.constexpr = 16,
    NUCLEUS_NARROW: tl.constexpr = False, P_WHOLE_ROW: tl.constexpr = False,
):  # fmt: skip
    """One program per row: truncation, then Gumbel-max among the kept candidates. The
    arguments are ``_stage2_row``'s (their meaning there), less the row, plus PDL and the
    merged route's."""
    await_previous_kernel(PDL)
    row = tl.program_id(0)
    prefetched = _prefetch_plain(
        plain_score_ptr, row, num_samples, num_plain_tiles, PREFETCH_PLAIN, PLAIN_BLOCK
    )
    if MERGED_BLOCK > 0:
        top_k = knob_per_row(top_k_ptr, row, scalar_top_k, TOP_K_MODE, tl.int64)
        if _merged_route(top_k, route_k_max, V):
            _stage2_row(
                row, prefetched, merged_key_ptr, merged_index_ptr, merged_hidden_ptr,
                merged_mass_ptr, plain_score_ptr, plain_index_ptr, temperature_ptr, seed_ptr,
                top_k_ptr, top_p_ptr, min_p_ptr, out_ptr, overflow_ptr, floor_ptr,
                compact_key_ptr, compact_index_ptr, compact_value_ptr, tile_hidden_ptr,
                patch_tile_ptr, patch_count_ptr, patch_key_ptr, patch_index_ptr, log_mass_ptr,
                plain_value_ptr, logprob_ptr, num_merged, num_groups, num_plain_tiles,
                num_patch_tiles, num_mass_tiles, V, scalar_temperature, seed_lo, seed_hi,
                scalar_top_k, scalar_top_p, scalar_min_p, num_samples,
                TEMPERATURE_MODE, SEED_MODE, TOP_K_MODE, TOP_P_MODE, MIN_P_MODE, HAS_PLAIN,
                HAS_MASS, False, True, FAST_MATH, MERGED_BLOCK, MERGED_COMPACT, PACK, False,
                PATCH_TILES, PATCH_V, KEY_LOW_BITS, LOGPROBS, RAW_LOGIT_LATER, PLAIN_BLOCK,
                PREFETCH_PLAIN, NUCLEUS_NARROW, P_WHOLE_ROW,
            )  # fmt: skip
            return
    _stage2_row(
        row, prefetched, key_ptr, index_ptr, hidden_key_ptr, mass_ptr, plain_score_ptr,
        plain_index_ptr, temperature_ptr, seed_ptr, top_k_ptr, top_p_ptr, min_p_ptr,
        out_ptr, overflow_ptr, floor_ptr, compact_key_ptr, compact_index_ptr,
        compact_value_ptr, tile_hidden_ptr, patch_tile_ptr, patch_count_ptr,
        patch_key_ptr, patch_index_ptr, log_mass_ptr, plain_value_ptr, logprob_ptr,
        num_candidates, num_tiles, num_plain_tiles, num_patch_tiles, num_mass_tiles, V,
        scalar_temperature, seed_lo, seed_hi, scalar_top_k, scalar_top_p, scalar_min_p,
        num_samples,
        TEMPERATURE_MODE, SEED_MODE, TOP_K_MODE, TOP_P_MODE, MIN_P_MODE, HAS_PLAIN, HAS_MASS,
        COMPLETE, SINGLE, FAST_MATH, BLOCK, COMPACT, PACK, PATCHED, PATCH_TILES, PATCH_V,
        KEY_LOW_BITS, LOGPROBS, RAW_LOGIT_LATER, PLAIN_BLOCK, PREFETCH_PLAIN, NUCLEUS_NARROW,
        P_WHOLE_ROW,
    )  # fmt: skip


@triton.jit(do_not_specialize=["scalar_temperature", "seed_lo", "seed_hi", "scalar_top_k",
                               "scalar_top_p", "scalar_min_p"])  # fmt: skip
def _fallback_stage2(
    key_ptr, index_ptr, mass_ptr, compact_key_ptr, compact_index_ptr,
    patch_tile_ptr, patch_count_ptr, patch_key_ptr, patch_index_ptr,
    logits_ptr, full_compact_key_ptr, full_compact_index_ptr, full_compact_value_ptr,
    temperature_ptr, seed_ptr, top_k_ptr, top_p_ptr, min_p_ptr, out_ptr, overflow_ptr,
    floor_ptr, log_mass_ptr, logprob_ptr,
    num_candidates, num_tiles, num_mass_tiles, V,
    scalar_temperature, seed_lo, seed_hi, scalar_top_k, scalar_top_p, scalar_min_p,
    num_samples,
    TEMPERATURE_MODE: tl.constexpr, SEED_MODE: tl.constexpr,
    TOP_K_MODE: tl.constexpr, TOP_P_MODE: tl.constexpr, MIN_P_MODE: tl.constexpr,
    HAS_MASS: tl.constexpr, FAST_MATH: tl.constexpr,
    PATCHED_SINGLE: tl.constexpr, PATCHED_BLOCK: tl.constexpr, PATCHED_COMPACT: tl.constexpr,
    PATCH_TILES: tl.constexpr, PATCH_V: tl.constexpr, KEY_LOW_BITS: tl.constexpr,
    COMPLETE_SINGLE: tl.constexpr, COMPLETE_BLOCK: tl.constexpr,
    COMPLETE_COMPACT: tl.constexpr, PACK: tl.constexpr,
    PDL: tl.constexpr, LOGPROBS: tl.constexpr = 0, RAW_LOGIT_LATER: tl.constexpr = False,
    NUCLEUS_NARROW: tl.constexpr = False, P_WHOLE_ROW: tl.constexpr = False,
):  # fmt: skip
    """Both passes of the fallback's stage 2 in one launch, one program per row: a row
    flagged OVERFLOW_PATCH drawn over stage 1's per-tile candidates (key_ptr ... num_tiles,
    ``_truncated_stage2``'s) with its recomputed tiles' tokens (patch_*) in place of theirs,
    a row flagged OVERFLOW_FULL over its recomputed logits (logits_ptr [B, V] fp32, with
    the full_* buffers), any other row not at all: a launch fewer than a pass each on
    every truncating call, where almost no row is flagged."""
    await_previous_kernel(PDL)
    row = tl.program_id(0)
    code = tl.load(overflow_ptr + row)
    # (a flagged row is truncated: neither pass reads plain candidates)
    if code == OVERFLOW_PATCH:
        _stage2_row(
            row, 0.0, key_ptr, index_ptr, None, mass_ptr, None, None, temperature_ptr, seed_ptr,
            top_k_ptr, top_p_ptr, min_p_ptr, out_ptr, overflow_ptr, floor_ptr,
            compact_key_ptr, compact_index_ptr, None, None, patch_tile_ptr, patch_count_ptr,
            patch_key_ptr, patch_index_ptr, log_mass_ptr, None, logprob_ptr, num_candidates,
            num_tiles, 0, 0, num_mass_tiles, V, scalar_temperature, seed_lo, seed_hi,
            scalar_top_k, scalar_top_p, scalar_min_p, num_samples,
            TEMPERATURE_MODE, SEED_MODE, TOP_K_MODE, TOP_P_MODE, MIN_P_MODE, False, HAS_MASS,
            False, PATCHED_SINGLE, FAST_MATH, PATCHED_BLOCK, PATCHED_COMPACT, PACK, True,
            PATCH_TILES,
            PATCH_V, KEY_LOW_BITS, LOGPROBS, RAW_LOGIT_LATER, 16, False, NUCLEUS_NARROW,
            P_WHOLE_ROW,
        )  # fmt: skip
    elif code == OVERFLOW_FULL:
        _stage2_row(
            row, 0.0, logits_ptr, full_compact_index_ptr, None, None, None, None, temperature_ptr,
            seed_ptr, top_k_ptr, top_p_ptr, min_p_ptr, out_ptr, overflow_ptr, floor_ptr,
            full_compact_key_ptr, full_compact_index_ptr, full_compact_value_ptr, None, None,
            None, None, None, log_mass_ptr, None, logprob_ptr, V, 1, 0, 0, num_mass_tiles, V,
            scalar_temperature, seed_lo, seed_hi, scalar_top_k, scalar_top_p, scalar_min_p,
            num_samples,
            TEMPERATURE_MODE, SEED_MODE, TOP_K_MODE, TOP_P_MODE, MIN_P_MODE, False, False,
            True, COMPLETE_SINGLE, FAST_MATH, COMPLETE_BLOCK, COMPLETE_COMPACT, PACK, False, 0,
            16, 0,
            LOGPROBS, RAW_LOGIT_LATER, 16, False, NUCLEUS_NARROW, P_WHOLE_ROW,
        )  # fmt: skip


@triton.jit
def _logprob_of(value, log_mass_ptr, num_mass_tiles, temperature, LOGPROBS: tl.constexpr,
                RAW_LOGIT_LATER: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    """``drawn_logprob`` of a token whose score (a key's value) is ``value``; where that is
    not its raw logit (RAW_LOGIT_LATER: a soft-capped score), without it: the launcher adds
    the token's raw logit after the call."""
    if RAW_LOGIT_LATER:
        value = 0.0
    return drawn_logprob(value, log_mass_ptr, num_mass_tiles, temperature, LOGPROBS, BLOCK)


@triton.jit
def _flagged_rows(overflow_ptr, B, first, BLOCK_B: tl.constexpr, SCAN: tl.constexpr):
    """The rows of flagged ranks first..first + BLOCK_B - 1 (rows flagged OVERFLOW_FULL, in
    row order) and which of those ranks exist, from the [B] flags read SCAN at a time."""
    slots = first + tl.arange(0, BLOCK_B)
    rows = tl.zeros((BLOCK_B,), tl.int32)
    found = tl.zeros((BLOCK_B,), tl.int32)
    seen = 0
    for start in range(0, B, SCAN):
        offs = start + tl.arange(0, SCAN)
        flags = tl.load(overflow_ptr + offs, mask=offs < B, other=0)
        flagged = (flags == OVERFLOW_FULL).to(tl.int32)
        rank = seen + tl.cumsum(flagged, axis=0) - 1
        match = (flagged[None, :] != 0) & (rank[None, :] == slots[:, None])
        rows += tl.sum(tl.where(match, offs[None, :], 0), axis=1)
        found += tl.sum(match.to(tl.int32), axis=1)
        seen += tl.sum(flagged)
    return rows, found != 0


@triton.jit
def _tile_logits(
    hidden_ptr, weight_ptr, bias_ptr, rows, row_mask, offs_v, v_mask, D,
    stride_hb, stride_hd, stride_wv, stride_wd, softcap, HAS_BIAS: tl.constexpr,
    LOGITS_DTYPE: tl.constexpr, HAS_SOFTCAP: tl.constexpr, DOT_PRECISION: tl.constexpr,
    INTERPRETER: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_V: tl.constexpr,
    BLOCK_D: tl.constexpr, LOGITS_IN: tl.constexpr = False,
):  # fmt: skip
    """[BLOCK_ROWS, BLOCK_V] logits of hidden rows ``rows`` (those in ``row_mask``; the
    others are zero vectors) against vocabulary entries ``offs_v``, as stage 1 computes them:
    one MMA chain over D with stage 1's precision, then bias, rounding, soft-cap. LOGITS_IN:
    hidden_ptr holds written logits [B, V] (stage 1's LOGITS_IN), loaded instead."""
    h_rows = hidden_ptr + rows.to(tl.int64)[:, None] * stride_hb
    if LOGITS_IN:
        acc = tl.load(h_rows + offs_v[None, :], mask=row_mask[:, None] & v_mask[None, :],
                      other=0.0).to(tl.float32)  # fmt: skip
    else:
        w_rows = weight_ptr + offs_v.to(tl.int64)[:, None] * stride_wv
        acc = tl.zeros((BLOCK_ROWS, BLOCK_V), tl.float32)
        for d_start in range(0, D, BLOCK_D):
            offs_d = d_start + tl.arange(0, BLOCK_D)
            d_mask = offs_d < D
            h = tl.load(h_rows + offs_d[None, :] * stride_hd,
                        mask=row_mask[:, None] & d_mask[None, :], other=0.0)  # fmt: skip
            w = tl.load(w_rows + offs_d[None, :] * stride_wd,
                        mask=v_mask[:, None] & d_mask[None, :], other=0.0)  # fmt: skip
            if INTERPRETER:
                # (the interpreter multiplies bf16 as raw uint16, as in stage 1)
                h = h.to(tl.float32)
                w = w.to(tl.float32)
            acc = tl.dot(h, tl.trans(w), acc, input_precision=DOT_PRECISION)
    logits = acc
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_v, mask=v_mask, other=0.0).to(tl.float32)
        logits += bias[None, :]
    logits = round_logits(logits, LOGITS_DTYPE)
    if HAS_SOFTCAP:
        logits = softcap_logits(logits, softcap, INTERPRETER)
    return logits


@triton.jit
def _patch_tile(hidden_ptr, weight_ptr, bias_ptr, overflow_ptr, patch_tile_ptr, patch_count_ptr,
                patch_key_ptr, patch_index_ptr, row, j, V, D, stride_hb, stride_hd, stride_wv,
                stride_wd, softcap, HAS_BIAS: tl.constexpr, LOGITS_DTYPE: tl.constexpr,
                HAS_SOFTCAP: tl.constexpr, DOT_PRECISION: tl.constexpr,
                INTERPRETER: tl.constexpr, BLOCK_D: tl.constexpr, PATCH_TILES: tl.constexpr,
                PATCH_V: tl.constexpr, LOGITS_IN: tl.constexpr):  # fmt: skip
    """Tile j of a patched row: its PATCH_V logits (the row in lane 0 of a 16-row MMA, the
    smallest tl.dot takes) stored as keys and global indices."""
    if tl.load(overflow_ptr + row) == OVERFLOW_PATCH:
        if j < tl.load(patch_count_ptr + row):
            row64 = tl.cast(row, tl.int64)  # (row: a Python int under the interpreter)
            tile = tl.load(patch_tile_ptr + row64 * PATCH_TILES + j)
            offs_v = tile * PATCH_V + tl.arange(0, PATCH_V)
            v_mask = offs_v < V
            lanes = tl.arange(0, 16)
            logits = _tile_logits(
                hidden_ptr, weight_ptr, bias_ptr, row + lanes * 0, lanes == 0, offs_v, v_mask,
                D, stride_hb, stride_hd, stride_wv, stride_wd, softcap, HAS_BIAS,
                LOGITS_DTYPE, HAS_SOFTCAP, DOT_PRECISION, INTERPRETER, 16, PATCH_V, BLOCK_D,
                LOGITS_IN,
            )  # fmt: skip
            logits = tl.sum(tl.where(lanes[:, None] == 0, logits, 0.0), axis=0)
            keys = tl.where(v_mask, ordered_key(logits), KEY_PAD)
            slot = row64 * (PATCH_TILES * PATCH_V) + j * PATCH_V + tl.arange(0, PATCH_V)
            tl.store(patch_key_ptr + slot, keys)
            tl.store(patch_index_ptr + slot, offs_v)


@triton.jit(do_not_specialize=["softcap"])
def _fallback_logits(
    hidden_ptr, weight_ptr, bias_ptr, overflow_ptr, scratch_ptr,
    patch_tile_ptr, patch_count_ptr, patch_key_ptr, patch_index_ptr,
    B, V, D, stride_hb, stride_hd, stride_wv, stride_wd, softcap, num_full_programs,
    HAS_BIAS: tl.constexpr, LOGITS_DTYPE: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    DOT_PRECISION: tl.constexpr, INTERPRETER: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr, SCAN: tl.constexpr,
    PATCH_TILES: tl.constexpr, PATCH_V: tl.constexpr, PDL: tl.constexpr,
    LOGITS_IN: tl.constexpr = False,  # hidden_ptr: written logits (``_tile_logits``)
):  # fmt: skip
    """Recompute the logits of the rows that overflowed into scratch [B, V] fp32. The
    programs take the num_full_programs vocabulary tiles in turn (a persistent grid: the
    common call, with no row flagged, is one short wave of programs that read the B flags
    and return), each tile for the flagged rows BLOCK_B at a time per MMA (gathered by rank,
    so 4 flagged rows of 256 cost one read of W, not one per 16-row tile holding one).
    Before that, the programs take the B * PATCH_TILES items (r, j) (item = r * PATCH_TILES
    + j) in turn: tile j of row r recomputed for a patched row (OVERFLOW_PATCH) listing at
    least j + 1 tiles, as keys and indices for the patched stage 2."""
    await_previous_kernel(PDL)
    pid = tl.program_id(0)
    # Every flag first, in one pass of vector loads: a call with no row flagged (almost
    # every call, and every one whose knobs are all off) returns after one load's latency,
    # not after the patch items' flag loads one by one (at B = 64, 4 in turn a program).
    num_flagged = 0
    num_patched = 0
    for start in range(0, B, SCAN):
        offs = start + tl.arange(0, SCAN)
        flags = tl.load(overflow_ptr + offs, mask=offs < B, other=0)
        num_flagged += tl.sum((flags == OVERFLOW_FULL).to(tl.int32))
        num_patched += tl.sum((flags == OVERFLOW_PATCH).to(tl.int32))
    if PATCH_TILES > 0:
        if num_patched > 0:
            for item in range(pid, B * PATCH_TILES, tl.num_programs(0)):
                _patch_tile(
                    hidden_ptr, weight_ptr, bias_ptr, overflow_ptr, patch_tile_ptr,
                    patch_count_ptr, patch_key_ptr, patch_index_ptr, item // PATCH_TILES,
                    item % PATCH_TILES, V, D, stride_hb, stride_hd, stride_wv, stride_wd,
                    softcap, HAS_BIAS, LOGITS_DTYPE, HAS_SOFTCAP, DOT_PRECISION,
                    INTERPRETER, BLOCK_D, PATCH_TILES, PATCH_V, LOGITS_IN,
                )  # fmt: skip
    if num_flagged == 0:
        return
    for tile in range(pid, num_full_programs, tl.num_programs(0)):
        offs_v = tile * BLOCK_V + tl.arange(0, BLOCK_V)
        v_mask = offs_v < V
        for first in range(0, num_flagged, BLOCK_B):
            rows, found = _flagged_rows(overflow_ptr, B, first, BLOCK_B, SCAN)
            logits = _tile_logits(
                hidden_ptr, weight_ptr, bias_ptr, rows, found, offs_v, v_mask, D, stride_hb,
                stride_hd, stride_wv, stride_wd, softcap, HAS_BIAS, LOGITS_DTYPE,
                HAS_SOFTCAP, DOT_PRECISION, INTERPRETER, BLOCK_B, BLOCK_V, BLOCK_D, LOGITS_IN,
            )  # fmt: skip
            tl.store(scratch_ptr + rows.to(tl.int64)[:, None] * V + offs_v[None, :], logits,
                     mask=found[:, None] & v_mask[None, :])  # fmt: skip


@triton.jit
def _masked_gumbel_argmax(
    logits_ptr, threshold_ptr, temperature_ptr, seed_ptr, score_ptr, index_ptr,
    V, vocab_start, num_chunks, num_samples,
    SEED_MODE: tl.constexpr, FAST_MATH: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    """Program (row, chunk): for every sample, the best Gumbel-max score ``logit + T ln2 g``
    and its GLOBAL index (``vocab_start`` + column, ties to the lowest) over the chunk's
    columns of the row's fp32 ``logits`` [B, V] at or above its threshold (the others are
    -inf), with the noise ``reference.gumbel_argmax`` draws for those global indices."""
    masked_gumbel_chunk(
        logits_ptr, threshold_ptr, temperature_ptr, seed_ptr, score_ptr, index_ptr, V,
        vocab_start, num_chunks, num_samples, SEED_MODE, FAST_MATH, BLOCK_V,
    )  # fmt: skip


def masked_gumbel_argmax(
    logits: torch.Tensor,
    threshold: torch.Tensor,
    temperature: torch.Tensor,
    seed: torch.Tensor,
    num_samples: int,
    vocab_start: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``reference.gumbel_argmax`` of ``logits`` masked below ``threshold`` [B, 1], in one
    pass over the materialized logits: per row and sample, the best score [B, S] fp32 and
    its global index [B, S] int64 (ties to the lowest). ``temperature`` [B] fp32, ``seed``
    int64, 0-d (the row in the noise counter) or [B] (per-row seeds)."""
    batch, width = logits.shape
    block = 1024
    chunks = triton.cdiv(width, block)
    score = torch.empty((batch, num_samples, chunks), dtype=torch.float32, device=logits.device)
    index = torch.empty_like(score, dtype=torch.int32)
    launch(
        _masked_gumbel_argmax, (batch, chunks),
        logits.contiguous(), threshold.contiguous(), temperature.contiguous(), seed.contiguous(),
        score, index, width, vocab_start, chunks, num_samples,
        SEED_MODE=2 if seed.dim() else 1, FAST_MATH=logits.is_cuda, BLOCK_V=block,
        num_warps=4,
    )  # fmt: skip
    best = score.amax(-1, keepdim=True)
    winner = torch.where(score == best, index, _INT32_MAX.value).amin(-1)
    return best[..., 0], winner.to(torch.int64)


def _merge(
    stage1: dict[str, torch.Tensor | None],
    params: SamplingParams,
    vocab_size: int,
    temperature_mode: int,
    groups: int,
    keep: int,
    route_k_max: int | None = None,
) -> dict[str, torch.Tensor | None]:
    """Stage 1's per-tile candidates, hidden keys and mass partials merged per group of
    tiles (``_merge_tiles``); the plain candidates are left as they are. With
    ``route_k_max`` (a per-row k tensor) only the rows that take the merged candidates
    (``_merged_route``)."""
    keys, mass = stage1["top_m_key"], stage1.get("mass")
    batch, num_tiles = stage1["hidden_key"].shape
    top_m = keys.shape[1] // num_tiles
    tiles_per_group = triton.cdiv(num_tiles, groups)
    groups = triton.cdiv(num_tiles, tiles_per_group)
    merged_key = torch.empty((batch, groups * keep), dtype=torch.int32, device=keys.device)
    merged = {
        **stage1,
        "top_m_key": merged_key,
        "top_m_index": torch.empty_like(merged_key),
        "hidden_key": torch.empty((batch, groups), dtype=torch.int32, device=keys.device),
        "mass": None if mass is None else torch.empty((batch, groups, 2), device=keys.device),
    }
    block = max(16, triton.next_power_of_2(tiles_per_group * top_m))
    launch(
        _merge_tiles, (batch, groups),
        keys, stage1["top_m_index"], stage1["hidden_key"], mass, params.temperature,
        params.top_k, params.top_p, params.min_p,
        merged["top_m_key"], merged["top_m_index"], merged["hidden_key"], merged["mass"],
        num_tiles, tiles_per_group, params.scalar_temperature, params.scalar_top_k,
        params.scalar_top_p, params.scalar_min_p, vocab_size, route_k_max or 0,
        TEMPERATURE_MODE=temperature_mode, HAS_MASS=mass is not None, TOP_M=top_m, KEEP=keep,
        BLOCK=block, TILE_BLOCK=max(16, triton.next_power_of_2(tiles_per_group)),
        KEY_LOW_BITS=key_low_bits(params), **_tail_pdl(keys.device, batch),
        ROUTED=route_k_max is not None, PLAIN_ROWS=stage1.get("plain_score") is not None,
        TOP_K_MODE=_mode(params.top_k), TOP_P_MODE=_mode(params.top_p),
        MIN_P_MODE=_mode(params.min_p), num_warps=max(1, min(4, block // 256)),
    )  # fmt: skip
    return merged


def _mode(tensor: torch.Tensor | None) -> int:
    return 0 if tensor is None else (1 if tensor.dim() == 0 else 2)


def patch_buffers(
    stage1: dict[str, torch.Tensor | None], block_v: int
) -> dict[str, torch.Tensor | int] | None:
    """The buffers of the tile-level fallback (``PATCH_TILES`` recomputed tiles per flagged
    row, ``block_v`` wide: stage 1's tiles), or None where a patched row's candidates (stage
    1's per-tile ones and the recomputed tokens) would not fit STAGE2_LANES registers."""
    keys = stage1["top_m_key"]
    batch, num_candidates = keys.shape
    width = PATCH_TILES * block_v
    if triton.next_power_of_2(num_candidates + width) > STAGE2_LANES:
        return None
    # (one allocation, split in contiguous parts: this runs on every truncating call, most
    # of which never patch)
    tiles, count, keys, index = torch.empty(
        batch * (PATCH_TILES + 1 + 2 * width), dtype=torch.int32, device=keys.device
    ).split([batch * PATCH_TILES, batch, batch * width, batch * width])
    return {
        "tiles": tiles.view(batch, PATCH_TILES),
        "count": count,
        "keys": keys.view(batch, width),
        "index": index.view(batch, width),
        "width": block_v,
    }


def launch_stage2(
    stage1: dict[str, torch.Tensor | None],
    params: SamplingParams,
    vocab_size: int,
    temperature_mode: int,
    out: torch.Tensor,
    overflow: torch.Tensor,
    floor: torch.Tensor,
    *,
    complete: bool = False,
    patched: bool = False,
    patch: dict[str, torch.Tensor | int] | None = None,
    merge: tuple[int, int] | None = None,
    route_k_max: int | None = None,
    fast_math: bool = True,
    logprobs: torch.Tensor | None = None,
) -> None:
    """Stage 2 of a truncating call over stage 1's candidates (``stage1``: top_m_key,
    top_m_index [B, tiles * m], hidden_key [B, tiles], mass [B, tiles, 2] or None, plain
    score / index [B, S, tiles] or None), or with ``complete`` over the fallback's [B, V]
    fp32 logits (``stage1["top_m_key"]``) for the rows flagged OVERFLOW_FULL, or with
    ``patched`` over stage 1's candidates and ``patch``'s recomputed tiles for the rows
    flagged OVERFLOW_PATCH. ``floor`` [B] int32: where stage 2 flags a row, a key that every
    token the row keeps is at or above, which the fallback uses to search few tokens
    instead of V. ``patch`` (``patch_buffers``): where the first pass lists a flagged row's
    hiding tiles, when few, for the tile-level fallback. ``merge`` (groups, keep): stage 1's
    candidates first merged into each group of tiles' keep largest, where that leaves fewer
    (``_merge``); with ``route_k_max`` (a per-row k tensor) each row chooses on the device:
    top-k off or k <= route_k_max from the merged candidates, a larger k from stage 1's
    per-tile ones, which hold more of its survivors (``_merged_route``). ``logprobs`` [B, S]
    fp32: where
    ``params.logprobs`` asks for them, the drawn tokens' log-probabilities, from stage 1's
    partials (``stage1["log_mass"]`` [B, tiles, 2]) and plain candidates' logits
    (``plain_value``); with "raw" on soft-capped scores, less each token's raw logit
    (``raw_logit_later``), which the caller adds."""
    runtime, constexprs, num_warps = _stage2_arguments(
        stage1, params, vocab_size, temperature_mode, out, overflow, floor, complete=complete,
        patched=patched, patch=patch, merge=merge, route_k_max=route_k_max,
        fast_math=fast_math, logprobs=logprobs,
    )  # fmt: skip
    _launch_by_name(_truncated_stage2, (out.shape[0],), runtime, constexprs, num_warps)


def _launch_by_name(kernel, grid, runtime: dict, constexprs: dict, num_warps: int) -> None:
    """``launch`` with the runtime arguments by name (they come first in the kernel's
    signature: passed positionally, as ``launch`` binds them fastest) and the constexprs."""
    names = kernel.arg_names[: len(runtime)]
    assert set(names) == set(runtime), sorted(set(names) ^ set(runtime))
    launch(kernel, grid, *(runtime[name] for name in names), **constexprs,
           **_tail_pdl(runtime["out_ptr"].device, runtime["out_ptr"].shape[0]),
           num_warps=num_warps)  # fmt: skip


def _stage2_arguments(
    stage1, params, vocab_size, temperature_mode, out, overflow, floor, *, complete=False,
    patched=False, patch=None, merge=None, route_k_max=None, fast_math=True, logprobs=None,
):  # fmt: skip
    """(runtime arguments by name, constexprs, num_warps) of a ``_truncated_stage2`` pass, as
    ``launch_stage2`` documents them; merges the candidates first where ``merge`` asks."""
    batch = out.shape[0]
    num_plain_tiles = num_tiles = stage1["hidden_key"].shape[1] if not complete else 1
    if stage1.get("plain_score") is not None:  # (the Gluon kernel's are per half tile)
        num_plain_tiles = stage1["plain_score"].shape[2]
    tile_hidden = stage1.get("hidden_key")
    merged = {}
    merged_all = False
    if merge is not None and stage1["top_m_key"].shape[1] > merge[0] * merge[1]:
        merged = _merge(stage1, params, vocab_size, temperature_mode, *merge, route_k_max)
        if route_k_max is None:  # every row from the merged candidates
            stage1, merged = merged, {}
            merged_all = True
            num_tiles = stage1["hidden_key"].shape[1]
    num_merged = merged["top_m_key"].shape[1] if merged else 0
    merged_block = max(16, triton.next_power_of_2(num_merged)) if merged else 0
    keys = stage1["top_m_key"]
    num_candidates = keys.shape[1]
    seed_u64 = params.scalar_seed % 2**64
    patch_tiles = PATCH_TILES if patch is not None and not complete else 0
    patch_width = patch["width"] if patch_tiles else 16
    lanes = num_candidates + (patch_tiles * patch_width if patched else 0)
    block = min(STAGE2_LANES, max(16, triton.next_power_of_2(lanes)))
    compact_slots = min(MERGED_COMPACT_SLOTS if merged_all else COMPACT_SLOTS, block)
    pack_slots = min(FALLBACK_PACK_SLOTS, block)
    compact_key = torch.empty((batch, compact_slots), dtype=torch.int32, device=out.device)
    compact_index = torch.empty(
        (batch, max(compact_slots, pack_slots) if complete else compact_slots),
        dtype=torch.int32, device=out.device,
    )  # fmt: skip
    # The fallback packs the logits above each flagged row's floor here (their indices in
    # compact_index).
    compact_value = (
        torch.empty((batch, pack_slots), dtype=torch.float32, device=out.device)
        if complete
        else None
    )
    patch = patch if patch_tiles else {}
    log_mass = stage1.get("log_mass")
    logprobs_code = LOGPROB_CODES[params.logprobs] if logprobs is not None else 0
    runtime = dict(
        key_ptr=keys, index_ptr=stage1.get("top_m_index", compact_index),
        hidden_key_ptr=stage1.get("hidden_key", keys), mass_ptr=stage1.get("mass"),
        plain_score_ptr=stage1.get("plain_score"), plain_index_ptr=stage1.get("plain_index"),
        temperature_ptr=params.temperature, seed_ptr=params.seed, top_k_ptr=params.top_k,
        top_p_ptr=params.top_p, min_p_ptr=params.min_p, out_ptr=out, overflow_ptr=overflow,
        floor_ptr=floor, compact_key_ptr=compact_key, compact_index_ptr=compact_index,
        compact_value_ptr=compact_value,
        tile_hidden_ptr=tile_hidden if patch_tiles else None,
        patch_tile_ptr=patch.get("tiles"), patch_count_ptr=patch.get("count"),
        patch_key_ptr=patch.get("keys"), patch_index_ptr=patch.get("index"),
        log_mass_ptr=log_mass, plain_value_ptr=stage1.get("plain_value"), logprob_ptr=logprobs,
        num_candidates=num_candidates, num_tiles=num_tiles, num_plain_tiles=num_plain_tiles,
        num_patch_tiles=tile_hidden.shape[1] if patch_tiles else 0,
        num_mass_tiles=log_mass.shape[1] if logprobs_code else 0, V=vocab_size,
        scalar_temperature=params.scalar_temperature, seed_lo=seed_u64 & 0xFFFFFFFF,
        seed_hi=seed_u64 >> 32, scalar_top_k=params.scalar_top_k,
        scalar_top_p=params.scalar_top_p, scalar_min_p=params.scalar_min_p,
        num_samples=params.num_samples, merged_key_ptr=merged.get("top_m_key"),
        merged_index_ptr=merged.get("top_m_index"), merged_hidden_ptr=merged.get("hidden_key"),
        merged_mass_ptr=merged.get("mass"), num_merged=num_merged,
        num_groups=merged["hidden_key"].shape[1] if merged else 0,
        route_k_max=route_k_max if merged else 0,
    )  # fmt: skip
    constexprs = dict(
        TEMPERATURE_MODE=temperature_mode, SEED_MODE=_mode(params.seed),
        TOP_K_MODE=_mode(params.top_k), TOP_P_MODE=_mode(params.top_p),
        MIN_P_MODE=_mode(params.min_p),
        HAS_PLAIN=stage1.get("plain_score") is not None,
        HAS_MASS=stage1.get("mass") is not None,
        COMPLETE=complete, SINGLE=lanes <= block, FAST_MATH=fast_math, BLOCK=block,
        COMPACT=compact_slots, PACK=pack_slots, PATCHED=patched, PATCH_TILES=patch_tiles,
        PATCH_V=patch_width, KEY_LOW_BITS=0 if complete else key_low_bits(params),
        LOGPROBS=logprobs_code,
        RAW_LOGIT_LATER=raw_logit_later(params) if logprobs_code else False,
        # (a row's plain candidates in one chunk, 2374 at V = 151936, instead of BLOCK's
        # 16384 lanes, sized for the truncation candidates: 0.4-0.6 us less on an H200)
        PLAIN_BLOCK=min(block, max(16, triton.next_power_of_2(num_plain_tiles))),
        PREFETCH_PLAIN=PREFETCH_PLAIN and stage1.get("plain_score") is not None,
        MERGED_BLOCK=merged_block, MERGED_COMPACT=min(COMPACT_SLOTS, max(16, merged_block)),
        NUCLEUS_NARROW=NUCLEUS_NARROW, P_WHOLE_ROW=params.top_p_whole_row,
    )  # fmt: skip
    warps = 16 if block >= 8192 else _stage2_warps(params, vocab_size, batch)
    return runtime, constexprs, warps


def _stage2_warps(params: SamplingParams, vocab_size: int, batch: int) -> int:
    """Stage 2's warps on up to 4096 lanes: STAGE2_WARPS_WITHOUT_TOP_K where Python knobs
    truncate without top-k (top-p / min-p alone) at up to STAGE2_WARPS_WITHOUT_TOP_K_ROWS_MAX
    rows, STAGE2_WARPS otherwise."""
    python_knobs = params.top_k is None and params.top_p is None and params.min_p is None
    top_k_off = not 0 < params.scalar_top_k < vocab_size
    few_rows = batch <= STAGE2_WARPS_WITHOUT_TOP_K_ROWS_MAX
    return STAGE2_WARPS_WITHOUT_TOP_K if python_knobs and top_k_off and few_rows else STAGE2_WARPS


def raw_logit_later(params: SamplingParams) -> bool:
    """Whether stage 2 leaves the drawn tokens' raw logits out of "raw" log-probabilities
    (for the caller to add): its candidates are soft-capped scores, from which the raw
    logit would come back only through an ill-conditioned atanh."""
    return params.logprobs == "raw" and params.softcap > 0


def launch_fallback(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    params: SamplingParams,
    temperature_mode: int,
    out: torch.Tensor,
    overflow: torch.Tensor,
    logits_dtype,
    dot_precision: str,
    fast_math: bool,
    floor: torch.Tensor,
    stage1: dict[str, torch.Tensor | None] | None = None,
    patch: dict[str, torch.Tensor | int] | None = None,
    logprobs: torch.Tensor | None = None,
    logits_in: bool = False,
) -> None:
    """The exact paths of the rows stage 2 flagged (``logprobs`` as in ``launch_stage2``;
    ``logits_in``: ``hidden`` is written logits [B, V], ``weight`` a stand-in:
    ``dispatch.weight_stand_in``).
    Rows flagged OVERFLOW_PATCH: the few tiles that may hide a kept token recomputed, then
    stage 2 over stage 1's candidates (``stage1``) with those tiles' tokens in place of
    theirs (``patch``). Rows flagged
    OVERFLOW_FULL: their logits into a [B, V] scratch, then stage 2 over all V tokens. Two
    launches (``_fallback_logits``, then both stage-2 passes in ``_fallback_stage2``, or the
    whole-row one alone without ``patch``), always (no host sync); their programs return at
    once for rows without their flag.
    ``logits_dtype`` is the Triton dtype (or None); ``dot_precision`` stage 1's, so the
    recomputed logits are stage 1's."""
    batch, hidden_size = hidden.shape
    vocab_size = weight.shape[0]
    scratch = torch.empty((batch, vocab_size), dtype=torch.float32, device=hidden.device)
    interpreter = hidden.device.type == "cpu"
    # (the interpreter runs programs one by one: wide tiles are fastest there)
    block_v = 512 if interpreter else 128
    full_programs = triton.cdiv(vocab_size, block_v)
    patch_tiles = PATCH_TILES if patch is not None else 0
    buffers = patch if patch is not None else {}
    # (a persistent grid, FALLBACK_PROGRAMS_PER_SM a SM: when no row is flagged, as on
    # almost every call, the launch costs one short wave instead of V / block_v programs;
    # the interpreter runs one program per item, as fast there)
    programs = max(full_programs, batch * patch_tiles)
    if not interpreter:
        sms = torch.cuda.get_device_properties(hidden.device).multi_processor_count
        programs = min(programs, FALLBACK_PROGRAMS_PER_SM * sms)
    launch(
        _fallback_logits, (programs,),
        hidden, weight, bias, overflow, scratch, buffers.get("tiles"), buffers.get("count"),
        buffers.get("keys"), buffers.get("index"),
        batch, vocab_size, hidden_size,
        hidden.stride(0), hidden.stride(1), weight.stride(0), weight.stride(1), params.softcap,
        full_programs,
        HAS_BIAS=bias is not None, LOGITS_DTYPE=logits_dtype, HAS_SOFTCAP=params.softcap > 0,
        DOT_PRECISION=dot_precision, INTERPRETER=interpreter,
        BLOCK_B=16, BLOCK_V=block_v, BLOCK_D=64,
        SCAN=min(256, max(16, triton.next_power_of_2(batch))),
        PATCH_TILES=patch_tiles, PATCH_V=patch["width"] if patch is not None else 16,
        **_tail_pdl(hidden.device, batch), LOGITS_IN=logits_in,
        num_warps=4, num_stages=3,
    )  # fmt: skip
    log_mass = None if stage1 is None else stage1.get("log_mass")
    full = ({"top_m_key": scratch, "log_mass": log_mass}, params, vocab_size, temperature_mode,
            out, overflow, floor)  # fmt: skip
    if patch is None:
        launch_stage2(*full, complete=True, fast_math=fast_math, logprobs=logprobs)
        return
    # Both passes in one launch (_fallback_stage2): one launch fewer on every call.
    patched, patched_constexprs, patched_warps = _stage2_arguments(
        stage1, params, vocab_size, temperature_mode, out, overflow, floor, patched=True,
        patch=patch, fast_math=fast_math, logprobs=logprobs,
    )  # fmt: skip
    whole, whole_constexprs, whole_warps = _stage2_arguments(
        *full, complete=True, fast_math=fast_math, logprobs=logprobs
    )
    runtime = {name: patched[name] for name in _FALLBACK_SHARED + _FALLBACK_PATCHED}
    runtime.update(
        logits_ptr=scratch, full_compact_key_ptr=whole["compact_key_ptr"],
        full_compact_index_ptr=whole["compact_index_ptr"],
        full_compact_value_ptr=whole["compact_value_ptr"],
    )  # fmt: skip
    constexprs = {name: patched_constexprs[name] for name in _FALLBACK_SHARED_CONSTEXPRS}
    constexprs.update(
        PATCHED_SINGLE=patched_constexprs["SINGLE"], PATCHED_BLOCK=patched_constexprs["BLOCK"],
        PATCHED_COMPACT=patched_constexprs["COMPACT"],
        PATCH_TILES=patched_constexprs["PATCH_TILES"], PATCH_V=patched_constexprs["PATCH_V"],
        KEY_LOW_BITS=patched_constexprs["KEY_LOW_BITS"],
        COMPLETE_SINGLE=whole_constexprs["SINGLE"], COMPLETE_BLOCK=whole_constexprs["BLOCK"],
        COMPLETE_COMPACT=whole_constexprs["COMPACT"], PACK=whole_constexprs["PACK"],
    )  # fmt: skip
    _launch_by_name(
        _fallback_stage2, (out.shape[0],), runtime, constexprs, max(patched_warps, whole_warps)
    )


# What _fallback_stage2's two passes share, and the patched pass's own buffers (both as
# _truncated_stage2 names them).
_FALLBACK_SHARED = (
    "temperature_ptr", "seed_ptr", "top_k_ptr", "top_p_ptr", "min_p_ptr", "out_ptr",
    "overflow_ptr", "floor_ptr", "log_mass_ptr", "logprob_ptr", "num_mass_tiles", "V",
    "scalar_temperature", "seed_lo", "seed_hi", "scalar_top_k", "scalar_top_p", "scalar_min_p",
    "num_samples",
)  # fmt: skip
_FALLBACK_PATCHED = (
    "key_ptr", "index_ptr", "mass_ptr", "compact_key_ptr", "compact_index_ptr",
    "patch_tile_ptr", "patch_count_ptr", "patch_key_ptr", "patch_index_ptr", "num_candidates",
    "num_tiles",
)  # fmt: skip
_FALLBACK_SHARED_CONSTEXPRS = (
    "TEMPERATURE_MODE", "SEED_MODE", "TOP_K_MODE", "TOP_P_MODE", "MIN_P_MODE", "HAS_MASS",
    "FAST_MATH", "LOGPROBS", "RAW_LOGIT_LATER", "NUCLEUS_NARROW", "P_WHOLE_ROW",
)  # fmt: skip
