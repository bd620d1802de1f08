"""The fused LM-head sampling kernel (FlashSampling, two stages) and its launcher.

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
(``SampleConfig``; measurements in benchmarks/results/).

The noise contract (Philox4x32-10 counters and the bits -> Gumbel map) is documented in
``reference.py``, whose torch code draws exactly the same stream; the device code lives in
``sampling_device.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os

import torch
import triton
import triton.language as tl
from triton.compiler.errors import CompilationError
from triton.tools.tensor_descriptor import TensorDescriptor

from . import truncation_kernel
from .launch import launch
from .params import SamplingParams
from .sampling_device import (
    INV_LN2,
    KEY_PAD,
    LN2,
    LOGPROB_CODES,
    await_previous_kernel,
    drawn_logprob,
    gumbel_tile,
    is_hopper,
    knob_per_row,
    ordered_key,
    pdl_launch,
    restore_low_bits,
    round_logits,
    rows_for_tma,
    softcap_logits,
    tile_log_mass,
    tile_mass,
    tma_compatible,
    truncating_rows,
)

__all__ = ["SampleConfig", "default_config", "triton_fused_sample"]

# FLASHSAMPLING_WARP_SPECIALIZED=0 keeps Hopper on the Triton kernel (default_config).
_WARP_SPECIALIZED = os.environ.get("FLASHSAMPLING_WARP_SPECIALIZED", "1") != "0"


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
def _top_m_epilogue(
    logits, v_mask, offs_b, b_mask, v_start, pid_v, num_v_tiles, noise_scale,
    top_m_key_ptr, top_m_index_ptr, hidden_key_ptr, mass_ptr,
    EVEN_V: tl.constexpr, BLOCK_V: tl.constexpr, TOP_M: tl.constexpr,
    ROW_MASS: tl.constexpr, KEY_LOW_BITS: tl.constexpr,
):  # fmt: skip
    """Stage 1's truncating epilogue (``_sample_stage1`` with TOP_M)."""
    # Truncation needs no noise here: the tile's TOP_M largest scores (ties to the
    # lowest index), then the largest one left out, which bounds what it hides.
    keys = ordered_key(logits)
    if not EVEN_V:
        keys = tl.where(v_mask[None, :], keys, KEY_PAD)
    tile_slot = offs_b.to(tl.int64) * num_v_tiles + pid_v
    columns = tl.arange(0, BLOCK_V)[None, :]
    if KEY_LOW_BITS > 0:
        # The key's low bits are its sign's (rounded logits, restore_low_bits): they
        # carry the reversed column instead, so one int32 max finds the largest key
        # and, among equal ones, the lowest column (an argmax reduces two values).
        low = (1 << KEY_LOW_BITS) - 1
        packed = (keys & -(1 << KEY_LOW_BITS)) | (BLOCK_V - 1 - columns)
        for slot in tl.static_range(TOP_M):
            top = tl.max(packed, axis=1)
            key = restore_low_bits(top & -(1 << KEY_LOW_BITS), KEY_LOW_BITS)
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
            tl.store(top_m_key_ptr + tile_slot * TOP_M + slot, key, mask=b_mask)
            tl.store(top_m_index_ptr + tile_slot * TOP_M + slot, v_start + arg,
                     mask=b_mask)  # fmt: skip
            keys = tl.where(columns == arg[:, None], KEY_PAD, keys)
        tl.store(hidden_key_ptr + tile_slot, tl.max(keys, axis=1), mask=b_mask)
    if ROW_MASS:
        # softmax(l / T) mass of the tile relative to its maximum (the reference's
        # weights); stage 2 rescales the partials to the row maximum.
        inv_temperature = tl.where(noise_scale > 0, 1.0 / noise_scale, 0.0)
        tile_max, tile_sum = tile_mass(_tile_values(logits, v_mask, EVEN_V), inv_temperature)
        tl.store(mass_ptr + tile_slot * 2, tile_max, mask=b_mask)
        tl.store(mass_ptr + tile_slot * 2 + 1, tile_sum, mask=b_mask)


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
    ROW_MASS: tl.constexpr = False,  # with TOP_M: per-tile (max, sum of exp2) for top-p
    KEY_LOW_BITS: tl.constexpr = 0,  # with TOP_M: key bits the sign fixes (key_low_bits)
    LOGPROBS: tl.constexpr = 0,  # 1 "raw", 2 "processed": the log-probability partials
    # With PLAIN and TOP_M (per-row knobs that may be off): where top-k, top-p and min-p
    # are, 0 a scalar that is off, 1 a 0-d tensor, 2 a [B] tensor at these pointers.
    top_k_ptr=None, top_p_ptr=None, min_p_ptr=None,
    TOP_K_MODE: tl.constexpr = 0, TOP_P_MODE: tl.constexpr = 0, MIN_P_MODE: tl.constexpr = 0,
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
    num_tiles = tl.cdiv(B, BLOCK_B) * tl.cdiv(V, BLOCK_V)
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
                # The interpreter multiplies bf16 as raw uint16; products of bf16/fp16 values are
                # exact in fp32, so this changes nothing but the speed.
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
        if PLAIN and TOP_M > 0 and TOP_K_MODE + TOP_P_MODE + MIN_P_MODE > 0:
            # Per-row knobs that may be off, read here: each epilogue only where a row of the
            # tile needs it; a tile that needs both runs them in one region.
            truncating = truncating_rows(
                top_k_ptr, top_p_ptr, min_p_ptr, offs_b, b_mask, noise_scale, V,
                TOP_K_MODE, TOP_P_MODE, MIN_P_MODE,
            )  # fmt: skip
            tile_plain = tl.max((b_mask & ~truncating).to(tl.int32)) > 0
            if tl.max(truncating.to(tl.int32)) > 0:
                if tile_plain:
                    _top_m_epilogue(
                        logits, v_mask, offs_b, b_mask, v_start, pid_v, num_v_tiles, noise_scale,
                        top_m_key_ptr, top_m_index_ptr, hidden_key_ptr, mass_ptr,
                        EVEN_V, BLOCK_V, TOP_M, ROW_MASS, KEY_LOW_BITS,
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
                        top_m_key_ptr, top_m_index_ptr, hidden_key_ptr, mass_ptr,
                        EVEN_V, BLOCK_V, TOP_M, ROW_MASS, KEY_LOW_BITS,
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
                    top_m_key_ptr, top_m_index_ptr, hidden_key_ptr, mass_ptr,
                    EVEN_V, BLOCK_V, TOP_M, ROW_MASS, KEY_LOW_BITS,
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


@dataclasses.dataclass(frozen=True)
class SampleConfig:
    """Tile shape and launch parameters of stage 1. Results do not depend on them."""

    block_b: int
    block_v: int
    block_d: int
    swap_ab: bool = True
    num_warps: int = 4
    num_stages: int = 3
    maxnreg: int | None = None  # register cap per thread, to fit more programs per SM
    tma: bool = False  # tiles through the copy engine (TMA descriptors) where the layout allows
    programs_per_sm: int = 0  # > 0: a persistent grid of this many programs per SM
    epilogue_chunks: int = 1  # noise and argmax over 1, 2 or 4 vocabulary chunks in turn
    # > 0: on Hopper, stage 1 is the warp-specialized Gluon kernel (hopper_kernel.py) with
    # this many rows (64 or 128) per tile; calls it cannot run take the Triton kernel above.
    warp_specialized_rows: int = 0


def default_config(
    batch: int, hidden_size: int, device: torch.device, truncates: bool = False
) -> SampleConfig:
    """The configuration for a shape, chosen ahead of time (no autotuning on the call path)
    from sweeps on an H200 and an H100 (benchmarks/results/kernel_sweep_*.json); ``truncates``
    for a call with top-k / top-p / min-p, whose stage 1 keeps each tile's largest scores
    instead of drawing noise."""
    if device.type != "cuda":
        # The interpreter runs one program at a time: few, large tiles are fastest.
        return SampleConfig(min(max(16, triton.next_power_of_2(batch)), 64), 256, 64)
    if batch <= 32:
        # Vocabulary as the MMA's M (swap-AB), W streamed at the memory floor.
        return SampleConfig(max(16, triton.next_power_of_2(batch)), 64, 128, num_stages=4)
    # From 33 rows on Hopper: the warp-specialized kernel, whose loader warp keeps
    # the copies going while a consumer warpgroup draws noise; 1-10% under the Triton
    # kernel's time on an H200 (benchmarks/results/warp_specialized_h200_20261121.txt).
    # 64-row tiles up to 128 rows too: 128-row ones are no faster there and spill with
    # per-row seeds. FLASHSAMPLING_WARP_SPECIALIZED=0 turns it off.
    # From 129 to 192 rows too (three 64-row blocks, W read from HBM once and from L2 by the
    # other blocks), where it beats the Triton kernel's two 128-row blocks: H200, B = 144-192,
    # D = 2048 265-275 us against 317-334; at D >= 4096 only above 160 rows (at 144-160 the
    # two are even plain and Gluon is 5-12% slower with top-k 50); above 192 the Triton
    # kernel wins (large_batch_stage1_padded_h200_20261127-0755.log).
    gluon_rows_max = 192 if hidden_size <= 2048 or batch > 160 else 128
    hopper_rows = 64 if _WARP_SPECIALIZED and batch <= gluon_rows_max and is_hopper(device) else 0
    if batch <= 64 and truncates:
        # The Gluon kernel's top-m epilogue at every D on Hopper. H200, B = 64, whole calls,
        # seed given, Triton (64 x 64 x 128 tiles, the choice below without it) -> Gluon: D =
        # 4096 top-k 50 356 -> 321 us, top-k 256 367 -> 327; D = 8192 top-k 50 650 -> 614
        # (config_ab_h200_20261125-2355.log). On an H100 the two were even at D = 4096 (466 /
        # 468 us) and Gluon 2% slower at D = 8192 (749 / 762); at D = 2048 Gluon is ahead on
        # both (H100 top-k 50 260 -> 257 us: profile_calls_gluon_top_m_h100_20261125-2010.log).
        # Without it, long reductions keep the vocabulary on M with eight warps (the Triton
        # tiles' sweep: kernel_sweep_top_k50_nvidia-h100-80gb-hbm3_20261124-2000.json).
        if hidden_size >= 4096 and not hopper_rows:
            return SampleConfig(64, 64, 128, num_warps=8, num_stages=3)
        return SampleConfig(
            64, 128, 64, swap_ab=False, num_stages=4, tma=True, warp_specialized_rows=hopper_rows
        )
    if batch <= 64:
        return SampleConfig(
            64, 128, 64, swap_ab=False, num_stages=4, warp_specialized_rows=hopper_rows
        )
    # Compute-bound from here: the copy engine feeds the MMAs (TMA), a persistent grid of two
    # programs per SM (registers capped at 128) lets one program's noise overlap the other's
    # MMAs, and the noise is drawn in four vocabulary chunks so that it does not spill.
    triton_config = SampleConfig(
        128, 128, 64, swap_ab=False, num_warps=8, num_stages=3, maxnreg=128,
        tma=True, programs_per_sm=2, epilogue_chunks=4,
    )  # fmt: skip
    if batch > 128 and hidden_size >= 4096:
        # Long reductions: wider vocabulary tiles feed the MMAs better than a second program
        # per SM overlaps the noise (1-5% on H100 and H200; b256_tiles_and_host_h200_*).
        triton_config = SampleConfig(
            128, 256, 64, swap_ab=False, num_warps=8, num_stages=3,
            tma=True, programs_per_sm=1, epilogue_chunks=4,
        )  # fmt: skip
    # (the Triton tiles stay the fallback of calls the Gluon kernel cannot run: soft-cap, fp32)
    return dataclasses.replace(triton_config, warp_specialized_rows=hopper_rows)


def _wide_truncation_tiles(params: SamplingParams, vocab_size: int) -> bool:
    """Whether a truncating call at B <= 32 takes 128-wide tiles instead of 64 (see the call
    site). Not when stage 2 merges its candidates per group of tiles (most calls): it then
    sees the groups' largest (1024 or 2048) whatever the tile width, and 64-wide tiles cost
    stage 1 less and overflow less. Otherwise for top-k on every row (k > 1024, m = 16
    candidates per tile: half as many on 128-wide tiles), not for top-p without top-k, whose
    nucleus may hold hundreds of tokens (433 in the zipf-4 rows of
    benchmarks/fast_path_rate.py): spread at random, such a row overflows to the exact path
    in ~4.5% of rows over 1187 tiles against ~0.3% over 2374 (Poisson estimate of a tile
    holding more than 4)."""
    if not params.truncates or truncation_kernel.merge_keep(params, vocab_size):
        return False
    top_k_on_every_row = params.top_k is None and 0 < params.scalar_top_k < vocab_size
    top_p_may_be_on = params.top_p is not None or params.scalar_top_p < 1.0
    return top_k_on_every_row or not top_p_may_be_on


def _temperature_mode(temperature: torch.Tensor | None, scalar_temperature: float) -> int:
    if temperature is not None:
        return 1 if temperature.dim() == 0 else 2
    # A scalar 0 is greedy for every row: skip the noise altogether.
    return 3 if scalar_temperature == 0.0 else 0


@functools.cache
def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 1  # the interpreter: a persistent grid is then programs_per_sm programs
    return torch.cuda.get_device_properties(device).multi_processor_count


_REGISTERS_PER_SM = 65536  # (sm_80 to sm_120)
_TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


def triton_fused_sample(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    params: SamplingParams,
    config: SampleConfig | None = None,
    vocab_offset: int = 0,
    out_score: torch.Tensor | None = None,
    tile_candidates: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Launch both stages; arguments as validated by ``op.fused_sample``.

    ``config`` overrides the tile shapes (tests use it to show the tokens do not depend on
    them). A tensor-parallel shard (``tp.py``) passes ``vocab_offset``, the global index of
    ``weight``'s first row (a multiple of 4), and ``out_score`` [B, num_samples] fp32, which
    receives each winner's perturbed score; the returned indices are then global. With
    ``tile_candidates`` (no truncation) stage 2 is left to the caller: the call returns
    stage 1's per-tile candidates, scores [B, num_samples, T] fp32 and global indices
    (int32), which the symmetric exchange reduces in its own kernel. With
    ``params.logprobs`` (not on a shard) the call returns (tokens, log-probabilities
    [B, num_samples] fp32).
    """
    if vocab_offset % 4:
        raise ValueError(f"vocab_offset must be a multiple of 4, got {vocab_offset}")
    logprobs_code = LOGPROB_CODES[params.logprobs]
    if logprobs_code and (vocab_offset or out_score is not None or tile_candidates):
        raise ValueError("log-probabilities on a tensor-parallel shard are not supported")
    temperature, scalar_temperature = params.temperature, params.scalar_temperature
    seed, scalar_seed = params.seed, params.scalar_seed
    num_samples, logits_dtype = params.num_samples, params.logits_dtype
    batch, hidden_size = hidden.shape
    vocab_size = weight.shape[0]
    out = torch.empty((batch, num_samples), dtype=torch.int64, device=hidden.device)
    logprobs = None
    if logprobs_code:
        logprobs = torch.empty((batch, num_samples), dtype=torch.float32, device=hidden.device)
    if batch == 0:
        return out if logprobs is None else (out, logprobs)
    if config is None:
        config = default_config(batch, hidden_size, hidden.device, params.truncates)
        if _wide_truncation_tiles(params, vocab_size) and hidden.is_cuda and config.block_v < 128:
            # Truncating calls that stage 2 does not merge keep m candidates per tile for
            # stage 2, one program per row: 128-wide tiles halve them. H100, D = 2048, B = 1
            # (before the merge): stage 2 40 -> 27 us (top-k 50); stage 1 7-9 us slower.
            config = dataclasses.replace(config, block_v=128)
    if config.block_v % 4 or config.block_v < 16:
        raise ValueError(f"block_v must be a multiple of 4 and >= 16, got {config.block_v}")
    if config.epilogue_chunks not in (1, 2, 4) or config.block_v // config.epilogue_chunks < 16:
        raise ValueError(
            f"epilogue_chunks must be 1, 2 or 4 with block_v / epilogue_chunks >= 16, got"
            f" {config.epilogue_chunks} with block_v={config.block_v}"
        )
    seed_u64 = scalar_seed % 2**64
    temperature_mode = _temperature_mode(temperature, scalar_temperature)
    seed_mode = 0 if seed is None else (1 if seed.dim() == 0 else 2)
    truncates = params.truncates
    if truncates and (vocab_offset or out_score is not None):
        raise ValueError("top-k / top-p on a tensor-parallel shard is not supported")
    # The Gluon kernel has no soft-cap and no log-probabilities: those calls take this kernel.
    if config.warp_specialized_rows and not params.softcap and not logprobs_code:
        from . import hopper_kernel

        if hopper_kernel.supported(hidden, weight):
            try:
                return _hopper_fused_sample(
                    hidden, weight, bias, params, config, out, temperature_mode, seed_mode,
                    seed_u64, vocab_offset, out_score, tile_candidates,
                )  # fmt: skip
            except CompilationError as error:  # raised before anything is launched
                hopper_kernel.disable(error)
    num_v_tiles = triton.cdiv(vocab_size, config.block_v)
    stage1, plain, top_m, row_mass, key_low_bits = _truncation_buffers(
        params, batch, vocab_size, num_v_tiles, config.block_v, hidden.device
    )
    cand_score = cand_index = cand_value = log_mass = None
    if plain:
        cand_score, cand_index = _candidates(batch, num_samples, num_v_tiles, hidden.device)
        stage1.update(plain_score=cand_score, plain_index=cand_index)
    if logprobs_code:
        log_mass = torch.empty((batch, num_v_tiles, 2), device=hidden.device)
        stage1.update(log_mass=log_mass)
        if plain:
            cand_value = torch.empty_like(cand_score)
            stage1.update(plain_value=cand_value)
    hidden_desc = weight_desc = None
    if config.tma and tma_compatible(hidden, weight):
        hidden_desc = TensorDescriptor.from_tensor(
            rows_for_tma(hidden, config.block_b), [config.block_b, config.block_d]
        )
        weight_desc = TensorDescriptor.from_tensor(weight, [config.block_v, config.block_d])
    num_tiles = triton.cdiv(batch, config.block_b) * num_v_tiles
    grid = num_tiles
    if config.programs_per_sm:
        grid = min(num_tiles, config.programs_per_sm * _num_sms(hidden.device))
    fp32_precision = "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee"
    # (the fallback recomputes logits with stage 1's precision, so they are stage 1's)
    dot_precision = "ieee" if hidden.dtype != torch.float32 else fp32_precision
    tl_logits_dtype = None if logits_dtype is None else _TL_DTYPES[logits_dtype]
    interpreter = hidden.device.type == "cpu"
    per_row_knobs = plain and top_m > 0 and not config.programs_per_sm
    maxnreg = config.maxnreg
    if per_row_knobs and not maxnreg and hidden.is_cuda and config.block_b <= 32:
        # Both epilogues compiled in took the small-batch tiles from 168 registers a thread
        # (the plain kernel) to 210 (Triton 3.6, sm_90a): two programs of four warps per SM
        # instead of three. Capped for three (160 bytes of spills): H200, D = 2048, B = 16,
        # off-valued knobs' stage 1 148.5 -> 146.0 us (plain 145.1), batches with truncated
        # rows within 0.6% (bench_off_knobs_nvidia-h200_*_20261127-1426.csv).
        maxnreg = _REGISTERS_PER_SM // (3 * 32 * config.num_warps) // 8 * 8
    # Triton launches on the current device: make it the inputs' one.
    on_device = torch.cuda.device(hidden.device) if hidden.is_cuda else contextlib.nullcontext()
    with on_device:
        launch(
            _sample_stage1, (grid,),
            hidden, weight, hidden_desc, weight_desc, bias, temperature, seed,
            cand_score, cand_index, stage1.get("top_m_key"), stage1.get("top_m_index"),
            stage1.get("hidden_key"), stage1.get("mass"), cand_value, log_mass,
            batch, vocab_size, hidden_size,
            hidden.stride(0), hidden.stride(1), weight.stride(0), weight.stride(1),
            scalar_temperature, seed_u64 & 0xFFFFFFFF, seed_u64 >> 32, num_samples, vocab_offset,
            params.softcap,
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
            INTERPRETER=interpreter,
            BLOCK_B=config.block_b, BLOCK_V=config.block_v, BLOCK_D=config.block_d,
            PLAIN=plain, TOP_M=top_m, ROW_MASS=row_mass, KEY_LOW_BITS=key_low_bits,
            LOGPROBS=logprobs_code,
            **_row_knobs(params, per_row_knobs),
            num_warps=config.num_warps, num_stages=config.num_stages,
            **({"maxnreg": maxnreg} if maxnreg else {}),
        )  # fmt: skip
        if tile_candidates and not truncates:
            return cand_score, cand_index
        if not truncates:
            _launch_stage2(
                cand_score, cand_index, out, out_score, params, temperature_mode, cand_value,
                log_mass, logprobs,
            )  # fmt: skip
        else:
            _finish_truncation(
                hidden, weight, bias, params, stage1, config.block_v, temperature_mode, out,
                dot_precision, logprobs,
            )  # fmt: skip
    return out if logprobs is None else (out, logprobs)


def _truncation_buffers(
    params: SamplingParams,
    batch: int,
    vocab_size: int,
    num_v_tiles: int,
    block_v: int,
    device: torch.device,
) -> tuple[dict[str, torch.Tensor | None], bool, int, bool, int]:
    """What a stage 1 on ``block_v``-wide tiles writes for a truncating call: the buffers
    (top_m_key, top_m_index [B, tiles * m], hidden_key [B, tiles], mass [B, tiles, 2] or
    None; empty when the call does not truncate), whether it also draws the plain candidates
    (rows that per-row knobs leave untruncated), m, whether it writes the mass partials and
    the key bits the sign fixes (``truncation_kernel.key_low_bits``)."""
    if not params.truncates:
        return {}, True, 0, False, 0
    top_m = truncation_kernel.candidates_per_tile(params, block_v, vocab_size, batch)
    # (the packed top-m keeps the column in those bits: they must hold block_v values)
    key_low_bits = truncation_kernel.key_low_bits(params)
    if 1 << key_low_bits < block_v:
        key_low_bits = 0
    k_may_be_off = truncation_kernel.k_may_be_off(params, vocab_size)
    plain = (
        k_may_be_off
        and truncation_kernel.p_may_be_off(params)
        and truncation_kernel.min_p_may_be_off(params)
    )
    row_mass = k_may_be_off and not (params.top_p is None and params.scalar_top_p >= 1.0)
    keys = torch.empty((batch, num_v_tiles * top_m), dtype=torch.int32, device=device)
    stage1 = {
        "top_m_key": keys,
        "top_m_index": torch.empty_like(keys),
        "hidden_key": torch.empty((batch, num_v_tiles), dtype=torch.int32, device=device),
        "mass": torch.empty((batch, num_v_tiles, 2), device=device) if row_mass else None,
    }
    return stage1, plain, top_m, row_mass, key_low_bits


def _row_knobs(params: SamplingParams, per_row: bool) -> dict:
    """Stage 1's knob arguments: with ``per_row`` (both epilogues: every knob a tensor or
    off) the knobs' tensors, from which each tile decides on the device which epilogues its
    rows need; else none (where both epilogues are compiled in, every tile runs both).

    The Triton kernel's persistent configurations (B > 64 there, ``programs_per_sm``) run
    both on every tile: on an H200 (B = 256, a fourth of the rows truncated) the choice cost
    mixed batches 2-6% (two branches) or 27% (one region for both, D = 2048, 128 registers
    a thread), though it saves all-plain and all-truncated ones much more
    (bench_off_knobs_nvidia-h200_*_20261127-1103/1118.csv). Elsewhere mixed batches were even
    (Gluon, B = 64) or within 1% (Triton, B = 16, one region for both)."""
    tensors = (params.top_k, params.top_p, params.min_p) if per_row else (None,) * 3
    modes = [0 if t is None else (1 if t.dim() == 0 else 2) for t in tensors]
    return dict(
        top_k_ptr=tensors[0], top_p_ptr=tensors[1], min_p_ptr=tensors[2],
        TOP_K_MODE=modes[0], TOP_P_MODE=modes[1], MIN_P_MODE=modes[2],
    )  # fmt: skip


def _finish_truncation(
    hidden, weight, bias, params, stage1, block_v, temperature_mode, out, dot_precision,
    logprobs=None,
):  # fmt: skip
    """Stage 2 of a truncating call over stage 1's candidates (``stage1``, on ``block_v``-wide
    tiles), then the exact fallback's kernels, which return at once for rows stage 2 did not
    flag (truncation_kernel.py); with ``logprobs`` also the drawn tokens'."""
    batch, vocab_size = hidden.shape[0], weight.shape[0]
    interpreter = hidden.device.type == "cpu"
    logits_dtype = params.logits_dtype
    tl_logits_dtype = None if logits_dtype is None else _TL_DTYPES[logits_dtype]
    overflow = torch.empty(batch, dtype=torch.int32, device=hidden.device)
    floor = torch.empty(batch, dtype=torch.int32, device=hidden.device)
    patch = None
    if truncation_kernel.patching_pays(params):
        patch = truncation_kernel.patch_buffers(stage1, block_v)
    truncation_kernel.launch_stage2(
        stage1, params, vocab_size, temperature_mode, out, overflow, floor,
        patch=patch, fast_math=not interpreter, logprobs=logprobs,
    )  # fmt: skip
    truncation_kernel.launch_fallback(
        hidden, weight, bias, params, temperature_mode, out, overflow,
        tl_logits_dtype, dot_precision, not interpreter, floor, stage1, patch, logprobs,
    )  # fmt: skip
    if logprobs is not None and truncation_kernel.raw_logit_later(params):
        logprobs += _token_logits(hidden, weight, bias, out, logits_dtype)


def _token_logits(hidden, weight, bias, tokens, logits_dtype) -> torch.Tensor:
    """[B, S] fp32: the raw logits of ``tokens`` [B, S], recomputed as stage 1 forms them
    (fp32 dot, bias, rounding; one weight row per token, no [B, V]), for "raw"
    log-probabilities of truncating soft-capped calls, whose candidates hold only the
    soft-capped scores. The dot sums D in another order than stage 1's MMA: an fp32
    rounding apart."""
    logits = torch.einsum("bd,bsd->bs", hidden.float(), weight[tokens].float())
    if bias is not None:
        logits = logits + bias[tokens].float()
    if logits_dtype is not None:
        logits = logits.to(logits_dtype).float()
    return logits


def _candidates(
    batch: int, num_samples: int, num_v_tiles: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage 1's output: per (row, sample, vocab tile) the tile's best score (fp32) and its
    index. Tiny next to [B, V]."""
    score = torch.empty((batch, num_samples, num_v_tiles), dtype=torch.float32, device=device)
    return score, torch.empty_like(score, dtype=torch.int32)


def _launch_stage2(
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


def _hopper_fused_sample(
    hidden, weight, bias, params, config, out, temperature_mode, seed_mode, seed_u64,
    vocab_offset=0, out_score=None, tile_candidates=False,
):  # fmt: skip
    """Both stages with stage 1 in the warp-specialized Gluon kernel (the last three arguments
    as in ``triton_fused_sample``). Sampling: one candidate per half of its
    hopper_kernel.BLOCK_V-wide tiles, then stage 2. Truncating: the top-m epilogue on its
    whole tiles, then truncation_kernel's stage 2 and fallback, as after the Triton kernel."""
    from . import hopper_kernel

    batch, vocab_size = hidden.shape[0], weight.shape[0]
    num_samples = params.num_samples
    num_v_tiles = triton.cdiv(vocab_size, hopper_kernel.BLOCK_V)
    stage1, plain, top_m, row_mass, key_low_bits = _truncation_buffers(
        params, batch, vocab_size, num_v_tiles, hopper_kernel.BLOCK_V, hidden.device
    )
    cand_score = cand_index = None
    if plain:  # per half tile
        cand_score, cand_index = _candidates(batch, num_samples, 2 * num_v_tiles, hidden.device)
        stage1.update(plain_score=cand_score, plain_index=cand_index)
    with torch.cuda.device(hidden.device):
        hopper_kernel.launch_stage1(
            hidden, weight, bias, params.temperature, params.scalar_temperature, params.seed,
            seed_u64 & 0xFFFFFFFF, seed_u64 >> 32, num_samples, params.logits_dtype,
            cand_score, cand_index, config.warp_specialized_rows, _num_sms(hidden.device),
            temperature_mode, seed_mode, vocab_offset,
            stage1=stage1, top_m=top_m, row_mass=row_mass, key_low_bits=key_low_bits,
            row_knobs=_row_knobs(params, plain and top_m > 0),
        )  # fmt: skip
        if not params.truncates:
            if tile_candidates:
                return cand_score, cand_index
            _launch_stage2(cand_score, cand_index, out, out_score)
            return out
        # (16-bit weights: the fallback's dot takes "ieee", as the Triton kernel's does)
        _finish_truncation(
            hidden, weight, bias, params, stage1, hopper_kernel.BLOCK_V, temperature_mode, out,
            "ieee",
        )  # fmt: skip
    return out
