"""The fused LM-head sampling kernel (FlashSampling, two stages) and its launchers.

Stage 1 computes a (batch tile x vocabulary tile) block of logits on chip (for small batches
with the vocabulary as the MMA's M dimension, swap-AB), adds bias, optionally rounds and
soft-caps the logits, perturbs them with Gumbel noise scaled by the temperature, and keeps
per row and sample only the best (fp32 score, global index): a [B, num_samples,
V / BLOCK_V] candidate buffer instead of [B, V] logits. Stage 2 reduces the candidates of
each (row, sample) on the device. Exact for any tiling: the argmax of the perturbed scores
is the argmax of the tile maxima (paper, Lemma D.5), and ties go to the lowest index as in
``torch.argmax``.

With top-k / top-p / min-p (``params.truncates``) stage 1 keeps instead each tile's few
largest scores and draws no noise; ``truncation_kernel.py`` selects among them (and
resamples the rows it cannot prove complete exactly).

Large batches are compute-bound; there the tiles come through TMA descriptors, a persistent
grid keeps two programs on each SM, and the noise is drawn in vocabulary chunks
(``dispatch.SampleConfig``; measurements in benchmarks/results/). Which kernels a call
runs, with which tiles and buffers, ``dispatch.py`` chooses.

The noise contract (Philox4x32-10 counters and the bits -> Gumbel map) is documented in
``reference.py``, whose torch code draws exactly the same stream; the device code lives in
``sampling_device.py``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from .launch import launch
from .params import SamplingParams
from .sampling_device import (
    INV_LN2,
    KEY_PAD,
    LN2,
    LOGPROB_CODES,
    TL_DTYPES,
    any_row_truncates,
    await_previous_kernel,
    drawn_logprob,
    gumbel_tile,
    key_value,
    knob_per_row,
    mass_rows,
    ordered_key,
    pdl_launch,
    restore_low_bits,
    round_logits,
    rows_for_tma,
    softcap_logits,
    tile_log_mass,
    tile_mass,
    tile_sum_below,
    tma_compatible,
    truncating_rows,
)

__all__ = ["launch_stage1", "launch_stage2"]

# Top-p's mass partials (ROW_MASS) with the tile's maximum taken from the top-m epilogue's
# largest key instead of a reduction of its own (ROW_MASS 2; the same bits). H200, D = 2048,
# top-p 0.9 alone, whole calls over cuBLAS: B = 1 1.124 -> 1.118, B = 16 1.123 -> 1.113
# (truncation_ab_h200_20261128-1214; the Gluon kernel above 32 rows has its own epilogue).
MASS_MAX_FROM_TOP_KEY = True
# (The sum reduced in one tuple reduction with the largest key left out, one cross-warp
# reduction fewer again, timed even: B = 1 / 16 1.084 / 1.078, truncation_ab_h200_20261128-
# 1416; removed after 1f9cd07.)

# Stage 1's top-m epilogue on swap-AB tiles (``_top_m_keys``): 5 or 6 keys as the largest
# four from 4-lists and one reduction each after (1: 5 keys, 2: both), else from 8-lists.
# Against 8-lists, H200, D = 2048, B = 1 / 16: top-p 0.9 (5 keys) 164.1 / 168.1 -> 161.7 /
# 166.0 us, min-p 0.1 156.3 / 161.2 -> 154.5 / 159.3, generate's top-k 50 (6 keys) 168.3 /
# 170.1 -> 166.2 / 168.9 (topm_lists_vs_8lists_ab_h200_20261129-0500.txt).
FOUR_LISTS_THEN = tl.constexpr(2)
# ... on tiles of at most this many rows: at 32 (knob tensors at 17-32 rows), where the lists'
# registers rise from 168 to 211 a thread (sm_90a, Triton 3.9), off-valued knobs were 2.0-2.7%
# slower (H200, D = 2048, two runs: 162.9 -> 167.2 us, 162.4 -> 165.7; generate's top-k 50
# 1.4% faster, 187.0 -> 184.4, 186.2 -> 183.6; topm_lists_b32_ab_h200_20261129-0506.txt,
# topm_lists_rows32_ab_h200_20261129-0512.txt).
TOP_M_LISTS_ROWS_MAX = tl.constexpr(16)


@triton.jit
def _split_columns(x, ROWS: tl.constexpr, COLS: tl.constexpr):
    """[ROWS, COLS] -> its left and right halves of columns."""
    return tl.split(tl.permute(tl.reshape(x, (ROWS, 2, COLS // 2)), (0, 2, 1)))


@triton.jit
def _better(s0, i0, v0, s1, i1, v1):
    """Per row, the better of two (score, index, value) candidates; ties go to the first,
    which holds the lower indices."""
    take_second = s1 > s0
    return (
        tl.where(take_second, s1, s0),
        tl.where(take_second, i1, i0),
        tl.where(take_second, v1, v0),
    )


@triton.jit
def _best_of_chunk(
    logits, values, chunk_start, V, noise_scale, row_counter, sample_index, k0, k1,
    GREEDY: tl.constexpr, EVEN_V: tl.constexpr, FAST_MATH: tl.constexpr,
    WITH_VALUE: tl.constexpr, BLOCK_B: tl.constexpr, CHUNK_V: tl.constexpr,
):  # fmt: skip
    """Per row, the best perturbed score of logits [BLOCK_B, CHUNK_V] (vocab indices
    chunk_start + 0..CHUNK_V-1), its global index and (WITH_VALUE) the entry of ``values``
    (the same shape) in its column, which logprobs read; without it, the score again."""
    if GREEDY:
        scores = logits
    else:
        quad_offsets = (chunk_start // 4 + tl.arange(0, CHUNK_V // 4)).to(tl.uint32)
        noise = gumbel_tile(
            quad_offsets, row_counter, sample_index, k0, k1, FAST_MATH, BLOCK_B, CHUNK_V
        )
        scores = logits + noise_scale[:, None] * noise
    # NaN counts as -inf; columns past V never win.
    keep = scores == scores
    if not EVEN_V:
        keep = keep & ((chunk_start + tl.arange(0, CHUNK_V)) < V)[None, :]
    scores = tl.where(keep, scores, float("-inf"))
    score, arg = tl.max(scores, axis=1, return_indices=True, return_indices_tie_break_left=True)
    if WITH_VALUE:
        columns = tl.arange(0, CHUNK_V)[None, :]
        value = tl.max(tl.where(columns == arg[:, None], values, float("-inf")), axis=1)
    else:
        value = score
    return score, chunk_start + arg, value


@triton.jit
def _best_of_chunks(
    logits, values, chunk_start, V, noise_scale, row_counter, sample_index, k0, k1,
    GREEDY: tl.constexpr, EVEN_V: tl.constexpr, FAST_MATH: tl.constexpr,
    WITH_VALUE: tl.constexpr, BLOCK_B: tl.constexpr, CHUNK_V: tl.constexpr,
    CHUNKS: tl.constexpr,
):  # fmt: skip
    """``_best_of_chunk`` over logits [BLOCK_B, CHUNK_V] cut into CHUNKS (1, 2 or 4) equal
    vocabulary chunks, one after the other: fewer noise values live at once."""
    if CHUNKS == 1:
        score, index, value = _best_of_chunk(
            logits, values, chunk_start, V, noise_scale, row_counter, sample_index, k0, k1,
            GREEDY, EVEN_V, FAST_MATH, WITH_VALUE, BLOCK_B, CHUNK_V,
        )  # fmt: skip
    else:
        lo, hi = _split_columns(logits, BLOCK_B, CHUNK_V)
        if WITH_VALUE:
            values_lo, values_hi = _split_columns(values, BLOCK_B, CHUNK_V)
        else:
            values_lo, values_hi = lo, hi
        half: tl.constexpr = CHUNK_V // 2
        s0, i0, v0 = _best_of_chunks(
            lo, values_lo, chunk_start, V, noise_scale, row_counter, sample_index, k0, k1,
            GREEDY, EVEN_V, FAST_MATH, WITH_VALUE, BLOCK_B, half, CHUNKS // 2,
        )  # fmt: skip
        s1, i1, v1 = _best_of_chunks(
            hi, values_hi, chunk_start + half, V, noise_scale, row_counter, sample_index, k0,
            k1, GREEDY, EVEN_V, FAST_MATH, WITH_VALUE, BLOCK_B, half, CHUNKS // 2,
        )  # fmt: skip
        score, index, value = _better(s0, i0, v0, s1, i1, v1)
    return score, index, value


@triton.jit
def _tile_values(logits, v_mask, EVEN_V: tl.constexpr):
    """The tile's logits with NaN and the columns past V at -inf (what a mass sums)."""
    values = tl.where(logits == logits, logits, float("-inf"))
    if not EVEN_V:
        values = tl.where(v_mask[None, :], values, float("-inf"))
    return values


@triton.jit
def _order_pair(x, y):
    """(the larger, the smaller) of two entries: a sorting network's compare-exchange."""
    return tl.maximum(x, y), tl.minimum(x, y)


@triton.jit
def _sort_bitonic4(c0, c1, c2, c3):
    """A bitonic 4-list (one that rises then falls, or falls then rises) sorted descending:
    two half-cleaners."""
    c0, c2 = _order_pair(c0, c2)
    c1, c3 = _order_pair(c1, c3)
    c0, c1 = _order_pair(c0, c1)
    c2, c3 = _order_pair(c2, c3)
    return c0, c1, c2, c3


@triton.jit
def _merge4(a0, a1, a2, a3, b0, b1, b2, b3):
    """The 4 largest of two descending 4-lists, descending: their bitonic merge (each entry
    against the other list's reversed keeps the 4 largest, a bitonic list, then sorted)."""
    return _sort_bitonic4(
        tl.maximum(a0, b3), tl.maximum(a1, b2), tl.maximum(a2, b1), tl.maximum(a3, b0)
    )


@triton.jit
def _merge8(a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3, b4, b5, b6, b7):
    """``_merge4`` for two descending 8-lists (a third half-cleaner first, which leaves each
    half bitonic and the first half's entries the larger)."""
    c0, c4 = _order_pair(tl.maximum(a0, b7), tl.maximum(a4, b3))
    c1, c5 = _order_pair(tl.maximum(a1, b6), tl.maximum(a5, b2))
    c2, c6 = _order_pair(tl.maximum(a2, b5), tl.maximum(a6, b1))
    c3, c7 = _order_pair(tl.maximum(a3, b4), tl.maximum(a7, b0))
    c0, c1, c2, c3 = _sort_bitonic4(c0, c1, c2, c3)
    c4, c5, c6, c7 = _sort_bitonic4(c4, c5, c6, c7)
    return c0, c1, c2, c3, c4, c5, c6, c7


@triton.jit
def _top_m_keys(packed, TOP_M: tl.constexpr):
    """The TOP_M + 1 largest of each row's distinct ``packed`` keys [ROWS, COLS], descending
    (a tuple of [ROWS]): one reduction whose values are sorted lists, merged pairwise, where
    TOP_M + 1 reductions of the largest key left would each cross the warps (the vocabulary
    is the MMA's M, split over them) through shared memory and a barrier."""
    pad = tl.full(packed.shape, KEY_PAD, tl.int32)
    if TOP_M < 4:
        return tl.reduce((packed, pad, pad, pad), 1, _merge4)
    elif TOP_M < 4 + FOUR_LISTS_THEN:
        # The largest four from 4-lists, the rest a reduction each (8-lists cost registers
        # and merges that one or two keys more do not repay).
        t0, t1, t2, t3 = tl.reduce((packed, pad, pad, pad), 1, _merge4)
        rest = tl.where(packed < t3[:, None], packed, KEY_PAD)
        t4 = tl.max(rest, axis=1)
        t5 = t4
        if TOP_M > 4:
            t5 = tl.max(tl.where(rest < t4[:, None], rest, KEY_PAD), axis=1)
        return t0, t1, t2, t3, t4, t5
    else:
        return tl.reduce((packed, pad, pad, pad, pad, pad, pad, pad), 1, _merge8)


@triton.jit
def _top_m_epilogue(
    logits, v_mask, offs_b, b_mask, v_start, pid_v, num_v_tiles, noise_scale,
    top_m_key_ptr, top_m_index_ptr, hidden_key_ptr, mass_ptr, mass_wanted,
    EVEN_V: tl.constexpr, BLOCK_V: tl.constexpr, TOP_M: tl.constexpr,
    ROW_MASS: tl.constexpr, KEY_LOW_BITS: tl.constexpr, LISTS: tl.constexpr,
):  # fmt: skip
    """Stage 1's truncating epilogue (``_sample_stage1`` with TOP_M; the mass partials with
    ROW_MASS where ``mass_wanted``: ROW_MASS 2 takes the tile's maximum from its largest key,
    which the first slot finds, instead of a reduction of its own; LISTS: the slots from
    sorted lists, where the keys allow it)."""
    # Truncation needs no noise here: the tile's TOP_M largest scores (ties to the
    # lowest index), then the largest one left out, which bounds what it hides.
    keys = ordered_key(logits)
    if not EVEN_V:
        keys = tl.where(v_mask[None, :], keys, KEY_PAD)
    tile_slot = offs_b.to(tl.int64) * num_v_tiles + pid_v
    columns = tl.arange(0, BLOCK_V)[None, :]
    if KEY_LOW_BITS > 0 and TOP_M < 8 and LISTS:
        # The key's low bits are its sign's (rounded logits, restore_low_bits): they
        # carry the reversed column instead, so the tile's keys are distinct and its
        # TOP_M + 1 largest come from one reduction of sorted lists (_top_m_keys). H200, D =
        # 2048, bf16 logits, whole calls against a reduction a slot, B = 1 / 16, us: top-k 50
        # 155.6 / 159.3 -> 154.5 / 158.2, top-p 0.9 163.6 / 168.6 -> 161.5 / 166.3, min-p 0.1
        # 156.7 / 162.3 -> 154.7 / 159.4, generate's top-k 50 as 0-d tensors 171.2 / 172.5
        # -> 166.5 / 169.3; tokens equal (topm_lists_ab_h200_20261129-0500.txt).
        low = (1 << KEY_LOW_BITS) - 1
        packed = (keys & -(1 << KEY_LOW_BITS)) | (BLOCK_V - 1 - columns)
        tops = _top_m_keys(packed, TOP_M)
        # The TOP_M slots as one [ROWS, SLOTS] tile, stored at once (each store of a row
        # vector moves it to the store's layout through shared memory first).
        SLOTS: tl.constexpr = 4 if TOP_M < 4 else 8
        slots = tl.arange(0, SLOTS)[None, :]
        top_slots = tl.zeros((packed.shape[0], SLOTS), tl.int32)
        for slot in tl.static_range(TOP_M):
            top_slots = tl.where(slots == slot, tops[slot][:, None], top_slots)
        top_key = restore_low_bits(tops[0] & -(1 << KEY_LOW_BITS), KEY_LOW_BITS)
        slot_keys = restore_low_bits(top_slots & -(1 << KEY_LOW_BITS), KEY_LOW_BITS)
        slot_mask = b_mask[:, None] & (slots < TOP_M)
        slot_ptrs = tile_slot[:, None] * TOP_M + slots
        tl.store(top_m_key_ptr + slot_ptrs, slot_keys, mask=slot_mask)
        tl.store(top_m_index_ptr + slot_ptrs, v_start + BLOCK_V - 1 - (top_slots & low),
                 mask=slot_mask)  # fmt: skip
        left_out = tops[TOP_M] & -(1 << KEY_LOW_BITS)
        tl.store(hidden_key_ptr + tile_slot, restore_low_bits(left_out, KEY_LOW_BITS),
                 mask=b_mask)  # fmt: skip
    elif KEY_LOW_BITS > 0:
        low = (1 << KEY_LOW_BITS) - 1
        packed = (keys & -(1 << KEY_LOW_BITS)) | (BLOCK_V - 1 - columns)
        for slot in tl.static_range(TOP_M):
            top = tl.max(packed, axis=1)
            key = restore_low_bits(top & -(1 << KEY_LOW_BITS), KEY_LOW_BITS)
            if slot == 0:
                top_key = key
            arg = BLOCK_V - 1 - (top & low)
            tl.store(top_m_key_ptr + tile_slot * TOP_M + slot, key, mask=b_mask)
            tl.store(top_m_index_ptr + tile_slot * TOP_M + slot, v_start + arg,
                     mask=b_mask)  # fmt: skip
            packed = tl.where(packed == top[:, None], KEY_PAD, packed)
        left_out = tl.max(packed, axis=1) & -(1 << KEY_LOW_BITS)
        tl.store(hidden_key_ptr + tile_slot, restore_low_bits(left_out, KEY_LOW_BITS),
                 mask=b_mask)  # fmt: skip
    else:
        for slot in tl.static_range(TOP_M):
            key, arg = tl.max(keys, axis=1, return_indices=True, return_indices_tie_break_left=True)
            if slot == 0:
                top_key = key
            tl.store(top_m_key_ptr + tile_slot * TOP_M + slot, key, mask=b_mask)
            tl.store(top_m_index_ptr + tile_slot * TOP_M + slot, v_start + arg,
                     mask=b_mask)  # fmt: skip
            keys = tl.where(columns == arg[:, None], KEY_PAD, keys)
        left_out = tl.max(keys, axis=1)
        tl.store(hidden_key_ptr + tile_slot, left_out, mask=b_mask)
    if ROW_MASS:
        if mass_wanted:
            # softmax(l / T) mass of the tile relative to its maximum (the reference's
            # weights); stage 2 rescales the partials to the row maximum.
            inv_temperature = tl.where(noise_scale > 0, 1.0 / noise_scale, 0.0)
            values = _tile_values(logits, v_mask, EVEN_V)
            if ROW_MASS == 2:
                # The largest key is the largest value's (NaN and the columns past V are
                # -inf in both, -0.0 weighs as +0.0): one cross-warp reduction fewer a
                # tile, where the vocabulary is the MMA's M (swap-AB).
                tile_max = _max_from_key(top_key)
                tile_sum = tile_sum_below(values, tile_max, inv_temperature)
            else:
                tile_max, tile_sum = tile_mass(values, inv_temperature)
            tl.store(mass_ptr + tile_slot * 2, tile_max, mask=b_mask)
            tl.store(mass_ptr + tile_slot * 2 + 1, tile_sum, mask=b_mask)


@triton.jit
def _max_from_key(top_key):
    return tl.where(top_key == KEY_PAD, float("-inf"), key_value(top_key))


@triton.jit
def _plain_epilogue(
    logits, logprob_values, noise_start, noise_stop, noise_scale, row_counter, k0, k1,
    offs_b, b_mask, pid_v, num_v_tiles, num_samples, cand_score_ptr, cand_index_ptr,
    cand_value_ptr,
    TEMPERATURE_MODE: tl.constexpr, EVEN_V: tl.constexpr, INTERPRETER: tl.constexpr,
    LOGPROBS: tl.constexpr, EPILOGUE_CHUNKS: tl.constexpr, BLOCK_B: tl.constexpr,
    BLOCK_V: tl.constexpr,
):  # fmt: skip
    """Stage 1's sampling epilogue (``_sample_stage1`` with PLAIN): per row and sample the
    tile's best perturbed score, its global index and (LOGPROBS) its logit."""
    for sample_index in range(num_samples):
        # The epilogue in vocabulary chunks keeps fewer noise values live at once (a
        # whole 128 x 256 tile of them spills registers); the tile's best is the best
        # chunk's best.
        tile_score, tile_index, tile_value = _best_of_chunks(
            logits, logprob_values, noise_start, noise_stop, noise_scale, row_counter,
            sample_index, k0, k1, TEMPERATURE_MODE == 3, EVEN_V, not INTERPRETER, LOGPROBS > 0,
            BLOCK_B, BLOCK_V, EPILOGUE_CHUNKS,
        )  # fmt: skip
        out = (offs_b * num_samples + sample_index) * num_v_tiles + pid_v
        tl.store(cand_score_ptr + out, tile_score, mask=b_mask)
        tl.store(cand_index_ptr + out, tile_index, mask=b_mask)
        if LOGPROBS > 0:
            tl.store(cand_value_ptr + out, tile_value, mask=b_mask)


@triton.jit(
    do_not_specialize=["scalar_temperature", "seed_lo", "seed_hi", "vocab_offset", "softcap"]
)
def _sample_stage1(
    hidden_ptr, weight_ptr, hidden_desc, weight_desc, bias_ptr, temperature_ptr, seed_ptr,
    cand_score_ptr, cand_index_ptr, top_m_key_ptr, top_m_index_ptr, hidden_key_ptr, mass_ptr,
    cand_value_ptr, log_mass_ptr,
    B, V, D,
    stride_hb, stride_hd, stride_wv, stride_wd,
    scalar_temperature, seed_lo, seed_hi, num_samples, vocab_offset, softcap,
    HAS_BIAS: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,  # tanh(l / softcap) * softcap after the rounding
    TEMPERATURE_MODE: tl.constexpr,  # 0: scalar, 1: 0-d tensor, 2: [B] tensor, 3: greedy
    SEED_MODE: tl.constexpr,  # 0: scalar argument, 1: 0-d tensor, 2: [B] tensor (per row)
    LOGITS_DTYPE: tl.constexpr,  # None: keep fp32 logits, else round to this dtype
    DOT_PRECISION: tl.constexpr,
    SWAP_AB: tl.constexpr,  # vocabulary as the MMA's M dimension (small batches)
    USE_TMA: tl.constexpr,  # load tiles through hidden_desc / weight_desc
    EPILOGUE_CHUNKS: tl.constexpr,  # 1, 2 or 4 vocabulary chunks, one after the other
    EVEN_D: tl.constexpr, EVEN_V: tl.constexpr,
    INTERPRETER: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr,
    PLAIN: tl.constexpr = True,  # write the best perturbed score per (row, sample)
    TOP_M: tl.constexpr = 0,  # > 0: keep the tile's TOP_M largest scores (truncation)
    # with TOP_M: per-tile (max, sum of exp2) for top-p (2: the max from the largest key)
    ROW_MASS: tl.constexpr = False,
    KEY_LOW_BITS: tl.constexpr = 0,  # with TOP_M: key bits the sign fixes (key_low_bits)
    LOGPROBS: tl.constexpr = 0,  # 1 "raw", 2 "processed": the log-probability partials
    # With PLAIN and TOP_M (per-row knobs that may be off): where top-k, top-p and min-p
    # are, 0 a scalar that is off, 1 a 0-d tensor, 2 a [B] tensor at these pointers.
    top_k_ptr=None, top_p_ptr=None, min_p_ptr=None,
    TOP_K_MODE: tl.constexpr = 0, TOP_P_MODE: tl.constexpr = 0, MIN_P_MODE: tl.constexpr = 0,
    # 1: run no tile if a row of the batch is truncated, 2: none if no row is (the knobs'
    # tensors read first, ``any_row_truncates``): one of two launches that split stage 1
    # (``dispatch.triton_fused_sample``); 0: every tile.
    BATCH_TRUNCATES: tl.constexpr = 0,
    # Let the next kernel, a programmatic dependent (the TP exchange with PDL), be scheduled
    # as this grid's last programs start: it waits for this grid's end itself.
    SIGNAL_DEPENDENTS: tl.constexpr = False,
    # Launched as a programmatic dependent of the kernel before it (the TP step's seed draw):
    # wait for that kernel's end and writes before any load.
    WAIT_PREVIOUS: tl.constexpr = False,
    # hidden_ptr holds written logits [B, V] (row stride stride_hb, unit column stride):
    # each tile's logits are loaded, not computed (``sample_logits``); weight_ptr is unused.
    LOGITS_IN: tl.constexpr = False,
):  # fmt: skip
    """Per (batch tile, vocab tile): logits on chip, then per row and sample the best
    perturbed score and its global index (PLAIN), and / or per row the TOP_M largest
    scores as ordered keys with their indices and the largest key left out (truncation,
    truncation_kernel.py). With both and the knobs' tensors (``_row_knobs``), each epilogue
    runs only where a row of the batch tile needs it (``truncating_rows``, read on the
    device): a tile whose rows all have their knobs off, or are greedy, draws noise alone,
    one whose rows all truncate the top-m alone. With LOGPROBS also per row the tile's
    (max, sum of exp2) of the logits a log-probability is taken over (``tile_mass``: the
    raw logits at T = 1, or the scores at the row's temperature) and, with PLAIN, each
    candidate's logit there. Each program takes tiles pid, pid + num_programs, ...: one
    tile per program on a full grid, several on a persistent one."""
    if WAIT_PREVIOUS:
        tl.extra.cuda.gdc_wait()
    if SIGNAL_DEPENDENTS:
        tl.extra.cuda.gdc_launch_dependents()
    num_tiles = tl.cdiv(B, BLOCK_B) * tl.cdiv(V, BLOCK_V)
    if BATCH_TRUNCATES > 0:
        some_row = tl.max(any_row_truncates(
            tl.arange(0, BLOCK_B), B, V, temperature_ptr, scalar_temperature, top_k_ptr,
            top_p_ptr, min_p_ptr, TEMPERATURE_MODE, TOP_K_MODE, TOP_P_MODE, MIN_P_MODE,
        ))  # fmt: skip
        num_tiles *= (some_row == BATCH_TRUNCATES - 1).to(tl.int32)
    for tile in range(tl.program_id(0), num_tiles, tl.num_programs(0)):
        # Batch tiles vary fastest, so the programs that share a weight tile run together and
        # the tile is read from HBM once and from L2 by the others.
        num_b_tiles = tl.cdiv(B, BLOCK_B)
        num_v_tiles = tl.cdiv(V, BLOCK_V)
        pid_b = tile % num_b_tiles
        pid_v = tile // num_b_tiles
        b_start = pid_b * BLOCK_B
        offs_b = b_start + tl.arange(0, BLOCK_B)
        b_mask = offs_b < B
        v_start = pid_v * BLOCK_V
        offs_v = v_start + tl.arange(0, BLOCK_V)
        v_mask = offs_v < V
        offs_d = tl.arange(0, BLOCK_D)

        # Logits [BLOCK_B, BLOCK_V] in fp32. Decode batches are far smaller than the 64 rows a
        # Hopper MMA wants, so small batches put the vocabulary on M (swap-AB).
        # With LOGITS_IN they are loaded: hidden_ptr holds written logits.
        if LOGITS_IN:
            logit_ptrs = hidden_ptr + offs_b.to(tl.int64)[:, None] * stride_hb + offs_v[None, :]
            logits = tl.load(logit_ptrs, mask=b_mask[:, None] & v_mask[None, :], other=0.0)
            logits = logits.to(tl.float32)
        else:
            if SWAP_AB:
                acc = tl.zeros((BLOCK_V, BLOCK_B), tl.float32)
            else:
                acc = tl.zeros((BLOCK_B, BLOCK_V), tl.float32)
            # 64-bit row offsets: V * D can pass 2**31 (262144 x 8192).
            w_rows = weight_ptr + offs_v.to(tl.int64)[:, None] * stride_wv
            h_rows = hidden_ptr + offs_b.to(tl.int64)[:, None] * stride_hb
            for d_start in range(0, D, BLOCK_D):
                if USE_TMA:
                    # The copy engine fetches the tiles (zero-filled past the edges): no address
                    # math in the threads.
                    w = weight_desc.load([v_start, d_start])
                    h = hidden_desc.load([b_start, d_start])
                else:
                    w_ptrs = w_rows + (d_start + offs_d)[None, :] * stride_wd
                    h_ptrs = h_rows + (d_start + offs_d)[None, :] * stride_hd
                    w_mask = v_mask[:, None]
                    h_mask = b_mask[:, None]
                    if not EVEN_D:
                        w_mask = w_mask & ((d_start + offs_d) < D)[None, :]
                        h_mask = h_mask & ((d_start + offs_d) < D)[None, :]
                    if EVEN_V and EVEN_D:
                        w = tl.load(w_ptrs)
                    else:
                        w = tl.load(w_ptrs, mask=w_mask, other=0.0)
                    h = tl.load(h_ptrs, mask=h_mask, other=0.0)
                if INTERPRETER:
                    # The interpreter multiplies bf16 as raw uint16; products of bf16/fp16 values
                    # are exact in fp32, so this changes nothing but the speed.
                    w = w.to(tl.float32)
                    h = h.to(tl.float32)
                if SWAP_AB:
                    acc = tl.dot(w, tl.trans(h), acc, input_precision=DOT_PRECISION)
                else:
                    acc = tl.dot(h, tl.trans(w), acc, input_precision=DOT_PRECISION)
            if SWAP_AB:
                logits = tl.trans(acc)
            else:
                logits = acc
        if HAS_BIAS:
            logits += tl.load(bias_ptr + offs_v, mask=v_mask, other=0.0).to(tl.float32)[None, :]
        logits = round_logits(logits, LOGITS_DTYPE)
        raw_logits = logits  # (what "raw" log-probabilities are of)
        if HAS_SOFTCAP:
            logits = softcap_logits(logits, softcap, INTERPRETER)

        # Noise scale per row: score = logit + (T * ln 2) * base-2 Gumbel noise, the Gumbel-max
        # score logit + T * g up to a per-row constant; T = 0 is greedy.
        if TEMPERATURE_MODE == 0:
            noise_scale = tl.full((BLOCK_B,), scalar_temperature * LN2, tl.float32)
        elif TEMPERATURE_MODE == 1:
            noise_scale = tl.full((BLOCK_B,), tl.load(temperature_ptr) * LN2, tl.float32)
        elif TEMPERATURE_MODE == 2:
            noise_scale = tl.load(temperature_ptr + offs_b, mask=b_mask, other=0.0) * LN2
        else:
            noise_scale = tl.zeros((BLOCK_B,), tl.float32)  # unused: greedy
        if SEED_MODE == 0:
            seed = tl.full((BLOCK_B,), seed_lo, tl.int64) | (
                tl.full((BLOCK_B,), seed_hi, tl.int64) << 32
            )
        elif SEED_MODE == 1:
            seed = tl.full((BLOCK_B,), tl.load(seed_ptr), tl.int64)
        else:
            seed = tl.load(seed_ptr + offs_b, mask=b_mask, other=0)
        k0 = (seed & 0xFFFFFFFF).to(tl.uint32)[:, None]
        k1 = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)[:, None]
        # Per-row seeds leave the row out of the counter: a row's noise depends on its own seed
        # only, never on its position in the batch.
        if SEED_MODE == 2:
            row_counter = tl.zeros((BLOCK_B,), tl.uint32)
        else:
            row_counter = offs_b.to(tl.uint32)
        # A tensor-parallel shard's columns are the global vocabulary indices from
        # vocab_offset (a multiple of 4, so quads of tokens stay aligned): its noise and its
        # candidates' indices are those of the whole vocabulary.
        noise_start = v_start + vocab_offset
        noise_stop = V + vocab_offset
        logprob_values = logits
        if LOGPROBS > 0:
            if LOGPROBS == 1:
                logprob_values = raw_logits
                logprob_inv_temperature = tl.full((BLOCK_B,), INV_LN2, tl.float32)
            else:
                positive = noise_scale > 0
                logprob_inv_temperature = tl.where(
                    positive, 1.0 / tl.where(positive, noise_scale, 1.0), 0.0
                )
            # Stage 2 rescales these to the row's maximum: its log-sum-exp, never [B, V].
            tile_max, tile_sum = tile_log_mass(
                _tile_values(logprob_values, v_mask, EVEN_V), logprob_inv_temperature
            )
            mass_slot = offs_b.to(tl.int64) * num_v_tiles + pid_v
            tl.store(log_mass_ptr + mass_slot * 2, tile_max, mask=b_mask)
            tl.store(log_mass_ptr + mass_slot * 2 + 1, tile_sum, mask=b_mask)
        # The top-m epilogue's slots from sorted lists (``_top_m_keys``) where the vocabulary
        # is the MMA's M, split over the warps, so that a reduction a slot crossed them (with
        # the batch on M a row's keys lie in one warp), on tiles of up to TOP_M_LISTS_ROWS_MAX
        # rows; under the interpreter, which runs a reduction with a combine function one
        # element at a time in Python (~100 s a call on its 16 x 256 tiles), only on tiles of
        # up to 1024 entries, the CPU tests' (test_truncation_candidates.py).
        TOP_M_LISTS: tl.constexpr = (
            SWAP_AB and BLOCK_B <= TOP_M_LISTS_ROWS_MAX
            and (not INTERPRETER or BLOCK_B * BLOCK_V <= 1024)
        )  # fmt: skip
        if PLAIN and TOP_M > 0 and TOP_K_MODE + TOP_P_MODE + MIN_P_MODE > 0:
            # Per-row knobs that may be off, read here: each epilogue only where a row of the
            # tile needs it; a tile that needs both runs them in one region.
            truncating = truncating_rows(
                top_k_ptr, top_p_ptr, min_p_ptr, offs_b, b_mask, noise_scale, V,
                TOP_K_MODE, TOP_P_MODE, MIN_P_MODE,
            )  # fmt: skip
            tile_plain = tl.max((b_mask & ~truncating).to(tl.int32)) > 0
            # Top-p's mass partials only where a row of the tile has top-p on and top-k off
            # (generate's top-k with top-p at 1 as a tensor needs none).
            mass_wanted = True
            if ROW_MASS:
                mass_wanted = tl.max(mass_rows(
                    top_k_ptr, top_p_ptr, offs_b, truncating, V, TOP_K_MODE, TOP_P_MODE,
                ).to(tl.int32)) > 0  # fmt: skip
            if tl.max(truncating.to(tl.int32)) > 0:
                if tile_plain:
                    _top_m_epilogue(
                        logits, v_mask, offs_b, b_mask, v_start, pid_v, num_v_tiles, noise_scale,
                        top_m_key_ptr, top_m_index_ptr, hidden_key_ptr, mass_ptr, mass_wanted,
                        EVEN_V, BLOCK_V, TOP_M, ROW_MASS, KEY_LOW_BITS, TOP_M_LISTS,
                    )  # fmt: skip
                    _plain_epilogue(
                        logits, logprob_values, noise_start, noise_stop, noise_scale,
                        row_counter, k0, k1, offs_b, b_mask, pid_v, num_v_tiles, num_samples,
                        cand_score_ptr, cand_index_ptr, cand_value_ptr, TEMPERATURE_MODE, EVEN_V,
                        INTERPRETER, LOGPROBS, EPILOGUE_CHUNKS, BLOCK_B, BLOCK_V,
                    )  # fmt: skip
                else:
                    _top_m_epilogue(
                        logits, v_mask, offs_b, b_mask, v_start, pid_v, num_v_tiles, noise_scale,
                        top_m_key_ptr, top_m_index_ptr, hidden_key_ptr, mass_ptr, mass_wanted,
                        EVEN_V, BLOCK_V, TOP_M, ROW_MASS, KEY_LOW_BITS, TOP_M_LISTS,
                    )  # fmt: skip
            else:
                _plain_epilogue(
                    logits, logprob_values, noise_start, noise_stop, noise_scale,
                    row_counter, k0, k1, offs_b, b_mask, pid_v, num_v_tiles, num_samples,
                    cand_score_ptr, cand_index_ptr, cand_value_ptr, TEMPERATURE_MODE, EVEN_V,
                    INTERPRETER, LOGPROBS, EPILOGUE_CHUNKS, BLOCK_B, BLOCK_V,
                )  # fmt: skip
        else:
            # (both in turn where both are compiled in and the knobs are not read here)
            if TOP_M > 0:
                _top_m_epilogue(
                    logits, v_mask, offs_b, b_mask, v_start, pid_v, num_v_tiles, noise_scale,
                    top_m_key_ptr, top_m_index_ptr, hidden_key_ptr, mass_ptr, True,
                    EVEN_V, BLOCK_V, TOP_M, ROW_MASS, KEY_LOW_BITS, TOP_M_LISTS,
                )  # fmt: skip
            if PLAIN:
                _plain_epilogue(
                    logits, logprob_values, noise_start, noise_stop, noise_scale,
                    row_counter, k0, k1, offs_b, b_mask, pid_v, num_v_tiles, num_samples,
                    cand_score_ptr, cand_index_ptr, cand_value_ptr, TEMPERATURE_MODE, EVEN_V,
                    INTERPRETER, LOGPROBS, EPILOGUE_CHUNKS, BLOCK_B, BLOCK_V,
                )  # fmt: skip


@triton.jit(do_not_specialize=["scalar_temperature"])
def _sample_stage2(
    cand_score_ptr, cand_index_ptr, out_ptr, out_score_ptr, num_candidates,
    cand_value_ptr, log_mass_ptr, logprob_ptr, temperature_ptr, scalar_temperature,
    num_samples,
    HAS_SCORE: tl.constexpr, BLOCK_C: tl.constexpr, PDL: tl.constexpr,
    LOGPROBS: tl.constexpr = 0, TEMPERATURE_MODE: tl.constexpr = 0,
):  # fmt: skip
    """One program per (row, sample): the argmax over its candidates, ties to the lowest;
    with HAS_SCORE also the winning score (a tensor-parallel shard's candidate), with
    LOGPROBS its log-probability (``drawn_logprob``)."""
    await_previous_kernel(PDL)
    pid = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_C)
    mask = offs < num_candidates
    scores = tl.load(cand_score_ptr + pid * num_candidates + offs, mask=mask, other=float("-inf"))
    best, winner = tl.max(scores, axis=0, return_indices=True, return_indices_tie_break_left=True)
    index = tl.load(cand_index_ptr + pid * num_candidates + winner)
    tl.store(out_ptr + pid, index.to(tl.int64))
    if HAS_SCORE:
        tl.store(out_score_ptr + pid, best)
    if LOGPROBS > 0:
        # (one candidate per tile and sample, and one mass partial per tile)
        row = pid // num_samples
        value = tl.load(cand_value_ptr + pid * num_candidates + winner)
        temperature = knob_per_row(
            temperature_ptr, row, scalar_temperature, TEMPERATURE_MODE, tl.float32
        )
        logprob = drawn_logprob(
            value, log_mass_ptr + row * num_candidates * 2, num_candidates, temperature,
            LOGPROBS, BLOCK_C,
        )  # fmt: skip
        tl.store(logprob_ptr + pid, logprob)


def launch_stage1(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    params: SamplingParams,
    config,
    stage1: dict[str, torch.Tensor | None],
    temperature_mode: int,
    seed_mode: int,
    seed_u64: int,
    vocab_offset: int,
    dot_precision: str,
    num_sms: int,
    *,
    top_m: int = 0,
    row_mass: bool = False,
    key_low_bits: int = 0,
    row_knobs: dict,
    batch_truncates: int = 0,
    signal_dependents: bool = False,
    wait_previous: bool = False,
    logits_in: bool = False,
) -> None:
    """Launch ``_sample_stage1`` with ``config``'s tiles (``dispatch.SampleConfig``) on the
    current device. ``stage1``: the buffers it writes (``dispatch._truncation_buffers``):
    plain_score / plain_index [B, S, tiles] where it samples, plain_value and log_mass with
    log-probabilities, the top-m buffers where it truncates (``top_m`` > 0, ``row_mass``,
    ``key_low_bits``); ``row_knobs``: the knobs' tensors and modes (``dispatch._row_knobs``);
    ``batch_truncates``: which half of a split stage 1 this launch is (BATCH_TRUNCATES);
    ``signal_dependents``: SIGNAL_DEPENDENTS; ``wait_previous``: launched as a programmatic
    dependent of the kernel before it (WAIT_PREVIOUS and ``launch_pdl``, sm_90 and later
    only). ``seed_u64``,
    ``vocab_offset`` as in ``dispatch.triton_fused_sample``; ``dot_precision`` is also the
    fallback's, so it is the caller's. ``logits_in``: ``hidden`` is written logits [B, V]
    (unit column stride) and ``weight`` a stand-in (``dispatch.weight_stand_in``): no
    matmul (LOGITS_IN)."""
    batch, hidden_size = hidden.shape
    vocab_size = weight.shape[0]
    num_v_tiles = triton.cdiv(vocab_size, config.block_v)
    cand_score, cand_index = stage1.get("plain_score"), stage1.get("plain_index")
    hidden_desc = weight_desc = None
    if config.tma and not logits_in and tma_compatible(hidden, weight):
        hidden_desc = TensorDescriptor.from_tensor(
            rows_for_tma(hidden, config.block_b), [config.block_b, config.block_d]
        )
        weight_desc = TensorDescriptor.from_tensor(weight, [config.block_v, config.block_d])
    num_tiles = triton.cdiv(batch, config.block_b) * num_v_tiles
    grid = num_tiles
    if config.programs_per_sm:
        grid = min(num_tiles, config.programs_per_sm * num_sms)
    logits_dtype = params.logits_dtype
    tl_logits_dtype = None if logits_dtype is None else TL_DTYPES[logits_dtype]
    launch(
        _sample_stage1, (grid,),
        hidden, weight, hidden_desc, weight_desc, bias, params.temperature, params.seed,
        cand_score, cand_index, stage1.get("top_m_key"), stage1.get("top_m_index"),
        stage1.get("hidden_key"), stage1.get("mass"), stage1.get("plain_value"),
        stage1.get("log_mass"),
        batch, vocab_size, hidden_size,
        hidden.stride(0), hidden.stride(1), weight.stride(0), weight.stride(1),
        params.scalar_temperature, seed_u64 & 0xFFFFFFFF, seed_u64 >> 32, params.num_samples,
        vocab_offset, params.softcap,
        HAS_BIAS=bias is not None,
        HAS_SOFTCAP=params.softcap > 0,
        TEMPERATURE_MODE=temperature_mode,
        SEED_MODE=seed_mode,
        LOGITS_DTYPE=tl_logits_dtype,
        DOT_PRECISION=dot_precision,
        SWAP_AB=config.swap_ab,
        USE_TMA=weight_desc is not None,
        EPILOGUE_CHUNKS=config.epilogue_chunks,
        EVEN_D=hidden_size % config.block_d == 0,
        EVEN_V=vocab_size % config.block_v == 0,
        INTERPRETER=hidden.device.type == "cpu",
        BLOCK_B=config.block_b, BLOCK_V=config.block_v, BLOCK_D=config.block_d,
        PLAIN=cand_score is not None, TOP_M=top_m,
        ROW_MASS=_row_mass_mode(row_mass),
        KEY_LOW_BITS=key_low_bits, LOGPROBS=LOGPROB_CODES[params.logprobs],
        **row_knobs, BATCH_TRUNCATES=batch_truncates,
        SIGNAL_DEPENDENTS=signal_dependents, WAIT_PREVIOUS=wait_previous, LOGITS_IN=logits_in,
        **({"launch_pdl": True} if wait_previous else {}),
        num_warps=config.num_warps, num_stages=config.num_stages,
        **({"maxnreg": config.maxnreg} if config.maxnreg else {}),
    )  # fmt: skip


def launch_stage2(
    cand_score: torch.Tensor,
    cand_index: torch.Tensor,
    out: torch.Tensor,
    out_score: torch.Tensor | None = None,
    params: SamplingParams | None = None,
    temperature_mode: int = 0,
    cand_value: torch.Tensor | None = None,
    log_mass: torch.Tensor | None = None,
    logprobs: torch.Tensor | None = None,
) -> None:
    """The plain stage 2; with ``logprobs`` (and stage 1's ``cand_value`` and ``log_mass``,
    ``params`` for the temperature) also the drawn tokens' log-probabilities."""
    batch, num_samples, num_v_tiles = cand_score.shape
    # (without logprobs the temperature is not read: one compiled kernel for every mode)
    logprobs_code = mode = 0
    temperature, scalar_temperature = None, 0.0
    if logprobs is not None:
        logprobs_code, mode = LOGPROB_CODES[params.logprobs], temperature_mode
        temperature, scalar_temperature = params.temperature, params.scalar_temperature
    launch(
        _sample_stage2,
        (batch * num_samples,),
        cand_score,
        cand_index,
        out,
        out_score,
        num_v_tiles,
        cand_value,
        log_mass,
        logprobs,
        temperature,
        scalar_temperature,
        num_samples,
        HAS_SCORE=out_score is not None,
        BLOCK_C=max(16, triton.next_power_of_2(num_v_tiles)),
        **pdl_launch(out.device),
        LOGPROBS=logprobs_code,
        TEMPERATURE_MODE=mode,
    )


def _row_mass_mode(row_mass: bool) -> int:
    """``_top_m_epilogue``'s ROW_MASS: 0 no partials, 1 their own maximum, 2 the maximum from
    the largest key (MASS_MAX_FROM_TOP_KEY)."""
    if not row_mass:
        return 0
    return 2 if MASS_MAX_FROM_TOP_KEY else 1
