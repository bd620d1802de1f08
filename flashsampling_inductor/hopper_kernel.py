"""Stage 1 of the fused sampler for Hopper, warp-specialized, in Gluon.

``default_config`` uses it from 33 to 128 rows on sm_90, to 192 at some shapes, and at
129-256 rows for calls that truncate every row (``dispatch._large_batch_gluon_rows``)
(``FLASHSAMPLING_WARP_SPECIALIZED=0`` turns it off). Written for Triton 3.6's Gluon; it
also compiles with 3.9's.

Why a second kernel. In ``sampling_kernel._sample_stage1`` each program computes a tile's
logits and then draws the tile's noise; while it draws noise it issues no loads, and a
second program per SM cannot keep enough bytes in flight to cover it (measurements in
benchmarks/results/). From B = 64 up that costs 5-40% over cuBLAS. Here the roles are split
inside one program per SM, as CUTLASS's "ping-pong" schedule does:

* one loader warp only issues TMA copies of hidden and weight tiles into a ring of
  shared-memory stages, so the copies never wait for the arithmetic;
* two consumer warpgroups take the tiles in turn. While one runs a tile's MMAs (wgmma), the
  other draws the noise of its previous tile. An mbarrier pair (``turn``) makes their main
  loops alternate strictly: the tensor cores serve one tile at a time, and each consumer
  waits on a ring stage only after the other has consumed the stage's previous fill, so no
  wait on the shared ring can mistake an old phase for a new one. (Three in turn on 64-row
  tiles, each with two other tiles' main loops for its noise on fewer registers and ring
  stages, were 1-14% slower than two on an H200 at 96-256 rows: docs/performance.md; removed.)

Each k step is two m64n64 MMAs, one per accumulator, or with ``WIDE_MMA`` one m64n128 into one
accumulator whose halves are the same registers (the hidden tile read from shared memory once
a step instead of twice): the default at 129-256 rows, where it took 3-17% off.

The result is the same as ``_sample_stage1``'s: per (row, sample, vocabulary tile) the best
perturbed fp32 score and its global index, with the same noise stream (the shared Philox and
Gumbel helpers), so stage 2 and every token are unchanged. Gluon needs a GPU (there is no
interpreter), so the CPU tests run the Triton kernel and the GPU tests compare the two.

Truncating calls (top-k / top-p / min-p) get the Triton kernel's top-m epilogue on the same
128-wide tiles (``_keep_top_m``): each tile's m largest keys with their indices, the largest
key left out and, for top-p without top-k, the tile's mass, read straight from the
accumulators (no staging, no noise), so ``truncation_kernel``'s stage 2 reads the same
candidates whichever kernel wrote them. Where per-row knobs leave rows untruncated the
sampling epilogue runs beside it.
"""

from __future__ import annotations

import functools
import warnings

import torch
import triton
import triton.language as tl

from .launch import launch
from .sampling_device import (
    KEY_PAD,
    LN2,
    any_row_truncates,
    bits_to_log2_gumbel,
    is_hopper,
    key_value,
    ordered_key,
    philox4x32,
    restore_low_bits,
    rows_for_tma,
    tma_compatible,
    truncating_rows,
)

try:  # Gluon is experimental: its API moves between Triton releases (written for 3.6).
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    # Names that moved after Triton 3.6: the CTA-wide barrier (thread_barrier -> barrier)
    # and the TMA load (async_copy_global_to_shared -> async_load).
    _thread_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    AVAILABLE = True
except ImportError:  # pragma: no cover - depends on the Triton build
    AVAILABLE = False

__all__ = ["AVAILABLE", "disable", "launch_stage1", "supported"]

# Tile of one consumer: BLOCK_B rows x BLOCK_V vocabulary entries, as two accumulators of
# BLOCK_V / 2 columns so that the noise is drawn half a tile at a time (a whole tile's noise
# next to its logits would not fit in registers).
BLOCK_V = 128
BLOCK_D = 64
# Ring depth by batch tile: as many stages as fit next to the two staging buffers in the
# 227 KB of shared memory (24 KB and 32 KB a stage); the copies in flight cover HBM latency.
STAGES = {64: 8, 128: 5}
CONSUMER_REGISTERS = 232
LOADER_REGISTERS = 40
# One m64n128 MMA a k step into one accumulator instead of two m64n64 (WIDE_MMA): None
# chooses per call (``launch_stage1``'s ``wide_mma``), a bool forces it (A/B runs).
WIDE_MMA: bool | None = None
# On 64-row tiles, the packed top-m search on rounded logits (KEY_LOW_BITS: one int32 max a
# slot finds the key and its column) only from this many slots; below it the search on whole
# keys, which writes the same keys and columns. With 4 slots (top-k up to 64, top-p or min-p
# alone) on 64-row tiles the compiler unrolls the packed slot loop in full (the kernel 3864
# SASS instructions against 2912 on whole keys, sm_90a, Triton 3.9; with 6 or 8 slots, or on
# 128-row tiles, it stays a loop, half as long as the whole keys' one), and on an H200 that
# stage 1 was the slower by a fifth: D = 4096, top-k 50 on bf16 logits, B = 144, wide 64-row
# tiles, 510 against 420 us (fp32 logits 443; large_batch_rounding_h200_20261128-1346).
# Whole calls on bf16 logits, 64-row tiles, over cuBLAS, packed -> whole keys (-1413 there,
# tokens equal): D = 4096 B = 96 top-k 50 1.066 -> 1.054, top-p 0.9 1.155 -> 1.112; B = 144
# 1.618 -> 1.281, 1.703 -> 1.380; D = 2048 B = 96 1.172 -> 1.111, 1.321 -> 1.232; B = 144
# 1.624 -> 1.330, 1.793 -> 1.482. (128-row tiles keep the packed loop: not timed against whole
# keys; hopper_swap_kernel's top-m, knob tensors at 129-160 rows, keeps it too: not timed.)
PACKED_TOP_M_MIN_64_ROWS = 5
# Top-p's mass partials with each tile's maximum from the top-m search's largest key instead
# of a reduction of its own (``_keep_top_m``'s ROW_MASS 2; the same bits), as
# sampling_kernel.MASS_MAX_FROM_TOP_KEY does at up to 32 rows. H200, D = 2048, top-p 0.9
# alone, whole calls over cuBLAS: B = 48 / 64 / 96 / 128 1.126 / 1.112 / 1.316 / 1.333 ->
# 1.104 / 1.090 / 1.155 / 1.159, tokens equal (truncation_ab_h200_20261128-1351). (Before,
# the partials were taken before the top-m search, as their own pass over the tile.)
MASS_MAX_FROM_TOP_KEY = True


_disabled_by: str | None = None  # why this process stopped using the kernel


def disable(error: Exception) -> None:
    """Stop using this kernel in this process, with one warning: the installed Triton's Gluon
    could not compile it (its API moves between releases). The Triton kernel takes over."""
    global _disabled_by
    if _disabled_by is None:
        # The cause is innermost; Gluon wraps it once per call level, with source excerpts.
        while error.__cause__ is not None:
            error = error.__cause__
        lines = [line for line in str(error).splitlines() if line.strip()] or [""]
        _disabled_by = f"{type(error).__name__}: {lines[-1].strip()}"
        warnings.warn(
            f"flashsampling: the warp-specialized Hopper kernel does not compile with Triton"
            f" {triton.__version__} ({_disabled_by}); using the Triton kernel instead",
            RuntimeWarning,
            stacklevel=3,
        )


def supported(hidden: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether this kernel can run the call: Gluon present and compiling, a Hopper GPU, and
    tensors of one 16-bit dtype that TMA can read (the Triton kernel's TMA check)."""
    return (
        AVAILABLE
        and _disabled_by is None
        and hidden.is_cuda
        and weight.is_cuda
        and hidden.dtype == weight.dtype
        and is_hopper(hidden.device)
        and tma_compatible(hidden, weight)
    )


if AVAILABLE:

    @gluon.jit
    def _load_tiles(h_desc, w_desc, h_bufs, w_bufs, ready, empty, B, V, D, num_tiles,
                    STAGES: gl.constexpr):  # fmt: skip
        """The loader warp: every tile of this program below ``num_tiles`` (all of them, or
        none: BATCH_TRUNCATES), in order, stage by stage."""
        BLOCK_B: gl.constexpr = h_desc.block_type.shape[0]
        BLOCK_D: gl.constexpr = h_desc.block_type.shape[1]
        BLOCK_V: gl.constexpr = w_desc.block_type.shape[0]
        num_b_tiles = gl.cdiv(B, BLOCK_B)
        k_steps = gl.cdiv(D, BLOCK_D)
        it = 0
        for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
            b_start = (tile % num_b_tiles) * BLOCK_B
            v_start = (tile // num_b_tiles) * BLOCK_V
            for k in range(k_steps):
                stage = it % STAGES
                # Wait until the consumer of the stage's previous fill has released it (the
                # first pass over the ring finds every stage free).
                mbarrier.wait(empty.index(stage), ((it // STAGES) & 1) ^ 1)
                mbarrier.expect(
                    ready.index(stage), h_desc.block_type.nbytes + w_desc.block_type.nbytes
                )
                _tma_load(h_desc, [b_start, k * BLOCK_D], ready.index(stage), h_bufs.index(stage))
                _tma_load(w_desc, [v_start, k * BLOCK_D], ready.index(stage), w_bufs.index(stage))
                it += 1

    @gluon.jit
    def _noise_scale(temperature_ptr, scalar_temperature, rows, row_mask,
                     TEMPERATURE_MODE: gl.constexpr):  # fmt: skip
        """T ln 2 of each of ``rows`` (fp32, in their layout): TEMPERATURE_MODE 0 the scalar,
        1 a 0-d tensor, 2 a [B] tensor, 3 greedy (zeros, unused)."""
        if TEMPERATURE_MODE == 0:
            scale = gl.full(rows.shape, scalar_temperature * LN2, gl.float32, rows.type.layout)
        elif TEMPERATURE_MODE == 1:
            scale = gl.full(rows.shape, gl.load(temperature_ptr) * LN2, gl.float32,
                            rows.type.layout)  # fmt: skip
        elif TEMPERATURE_MODE == 2:
            scale = gl.load(temperature_ptr + rows, mask=row_mask, other=0.0) * LN2
        else:  # (gl.full, not gl.zeros: a jit function in Triton 3.6, whose layout argument
            # must be a constexpr, and rows.type.layout is a plain object)
            scale = gl.full(rows.shape, 0.0, gl.float32, rows.type.layout)
        return scale

    @gluon.jit
    def _seed_keys(seed_ptr, seed_lo, seed_hi, rows, row_mask, SEED_MODE: gl.constexpr):
        """The Philox key halves (k0, k1) of ``rows``: uint32 scalars where the seed is shared
        (SEED_MODE 0 the scalar halves, 1 a 0-d tensor), per row (2, in the rows' layout)."""
        if SEED_MODE == 0:
            k0 = seed_lo.to(gl.uint32)
            k1 = seed_hi.to(gl.uint32)
        else:
            if SEED_MODE == 1:
                seed = gl.load(seed_ptr)
            else:
                seed = gl.load(seed_ptr + rows, mask=row_mask, other=0)
            k0 = (seed & 0xFFFFFFFF).to(gl.uint32)
            k1 = ((seed >> 32) & 0xFFFFFFFF).to(gl.uint32)
        return k0, k1

    @gluon.jit
    def _staged_words(staging, chunk, BLOCK_B: gl.constexpr, CHUNK_Q: gl.constexpr):
        """The staged logits of one chunk as four [BLOCK_B, CHUNK_Q] tensors: word w holds the
        columns 4 * quad + w, the tokens whose noise is word w of the quad's Philox output.
        Each thread loads whole quads, so splitting them into words moves no data."""
        layout: gl.constexpr = gl.BlockedLayout(
            [1, 1, 2, 2], [32 // CHUNK_Q, CHUNK_Q, 1, 1], [4, 1, 1, 1], [3, 2, 1, 0]
        )
        quads = staging.index(chunk).reshape([BLOCK_B, CHUNK_Q, 2, 2]).load(layout)
        even, odd = gl.split(quads)
        w0, w2 = gl.split(even)
        w1, w3 = gl.split(odd)
        return w0, w1, w2, w3

    @gluon.jit
    def _best_of_staged(staging, first_chunk, quad_start, quad_offset, b_start, V, bias_ptr,
                        noise_scale, sample_index, k0, k1,
                        HAS_BIAS: gl.constexpr, LOGITS_DTYPE: gl.constexpr,
                        GREEDY: gl.constexpr, EVEN_V: gl.constexpr, PER_ROW_SEED: gl.constexpr,
                        BLOCK_B: gl.constexpr, NUM_CHUNKS: gl.constexpr,
                        CHUNK_Q: gl.constexpr):  # fmt: skip
        """Per row, the best perturbed score of the staged logits (chunks ``first_chunk`` on,
        vocab indices 4 * quad_start + 0..4 * NUM_CHUNKS * CHUNK_Q - 1) and its global index (a
        tensor-parallel shard's columns are global quads from ``quad_offset``: their noise and
        their index are those of the whole vocabulary).

        The chunks go by in a loop that is not unrolled: one copy of the noise code, which
        keeps the instruction cache warm. NaN counts as -inf, columns past V never win, and
        ties go to the lowest index.
        """
        QUAD_LAYOUT: gl.constexpr = _staged_words(staging, 0, BLOCK_B, CHUNK_Q)[0].type.layout
        rows = b_start + gl.arange(0, BLOCK_B, gl.SliceLayout(1, QUAD_LAYOUT))
        noise_scale = gl.convert_layout(noise_scale, gl.SliceLayout(1, QUAD_LAYOUT))[:, None]
        if PER_ROW_SEED:
            k0 = gl.convert_layout(k0, gl.SliceLayout(1, QUAD_LAYOUT))[:, None]
            k1 = gl.convert_layout(k1, gl.SliceLayout(1, QUAD_LAYOUT))[:, None]
            # Per-row seeds leave the row out of the counter (as in _sample_stage1).
            row_counter = gl.zeros([BLOCK_B, 1], gl.uint32, QUAD_LAYOUT)
        else:
            row_counter = rows.to(gl.uint32)[:, None]
        best = gl.full([BLOCK_B, CHUNK_Q], float("-inf"), gl.float32, QUAD_LAYOUT)
        # A row of NaN reports the first column, as the Triton kernel's argmax does.
        best_index = gl.full([BLOCK_B, CHUNK_Q], 4 * quad_start, gl.int32, QUAD_LAYOUT)
        for chunk in range(NUM_CHUNKS):
            col_quads = (
                quad_start
                + chunk * CHUNK_Q
                + gl.arange(0, CHUNK_Q, gl.SliceLayout(0, QUAD_LAYOUT))[None, :]
            )
            words = _staged_words(staging, first_chunk + chunk, BLOCK_B, CHUNK_Q)
            if not GREEDY:
                # One Philox evaluation per (row, quad): the counter layout of reference.py.
                # c0 and c2 start narrow, so the first round's products are computed once
                # per column and once per chunk.
                bits = philox4x32(
                    (col_quads + quad_offset).to(gl.uint32), row_counter,
                    gl.full([1, 1], sample_index, gl.uint32, QUAD_LAYOUT),
                    gl.zeros([1, 1], gl.uint32, QUAD_LAYOUT), k0, k1, True,
                )  # fmt: skip
            for w in gl.static_range(4):
                cols = 4 * col_quads + w
                scores = words[w]
                if HAS_BIAS:
                    scores += gl.load(bias_ptr + cols, mask=cols < V, other=0.0).to(gl.float32)
                if LOGITS_DTYPE is not None:
                    scores = scores.to(LOGITS_DTYPE).to(gl.float32)
                if not GREEDY:
                    scores += noise_scale * bits_to_log2_gumbel(bits[w], True)
                # Strictly better only: on a tie the earlier chunk or word, the lower index.
                # A NaN compares false, so it never wins (no select to -inf first: two
                # instructions a score fewer).
                better = scores > best
                if not EVEN_V:
                    better = better & (cols < V)
                best = gl.where(better, scores, best)
                best_index = gl.where(better, cols, best_index)
        row_best = gl.max(best, axis=1)
        index = gl.min(gl.where(best == row_best[:, None], best_index, 2147483647), axis=1)
        return row_best, index + 4 * quad_offset

    @gluon.jit
    def _tile_keys(acc, columns, V, bias_ptr, HAS_BIAS: gl.constexpr,
                   LOGITS_DTYPE: gl.constexpr, EVEN_V: gl.constexpr):  # fmt: skip
        """Half a tile's scores (bias, rounding) and their order-preserving keys, columns past V
        padded; ``columns`` the global indices, [1, HALF_V] in the accumulator's layout."""
        scores = acc
        if HAS_BIAS:
            scores += gl.load(bias_ptr + columns, mask=columns < V, other=0.0).to(gl.float32)
        if LOGITS_DTYPE is not None:
            scores = scores.to(LOGITS_DTYPE).to(gl.float32)
        keys = ordered_key(scores)
        if not EVEN_V:
            keys = gl.where(columns < V, keys, KEY_PAD)
        return scores, keys

    @gluon.jit
    def _mass_values(lo, hi, v_start, columns, V, EVEN_V: gl.constexpr):
        """A tile's scores as top-p's mass weighs them: NaN and the columns past V -inf."""
        HALF_V: gl.constexpr = lo.shape[1]
        mass_lo = gl.where(lo == lo, lo, float("-inf"))
        mass_hi = gl.where(hi == hi, hi, float("-inf"))
        if not EVEN_V:
            mass_lo = gl.where(v_start + columns < V, mass_lo, float("-inf"))
            mass_hi = gl.where(v_start + HALF_V + columns < V, mass_hi, float("-inf"))
        return mass_lo, mass_hi

    @gluon.jit
    def _store_tile_mass(mass_lo, mass_hi, tile_max, noise_scale, mass_ptr, tile_slot,
                         row_mask):  # fmt: skip
        """The tile's mass partials (its maximum, the sum of exp2 below it at the row's
        temperature), as ``sampling_device.tile_mass``."""
        inv_temperature = gl.where(noise_scale > 0, 1.0 / noise_scale, 0.0)[:, None]
        w_lo = gl.exp2((mass_lo - tile_max[:, None]) * inv_temperature)
        w_lo = gl.where(mass_lo == tile_max[:, None], 1.0, w_lo)
        w_lo = gl.where(mass_lo > float("-inf"), w_lo, 0.0)
        w_hi = gl.exp2((mass_hi - tile_max[:, None]) * inv_temperature)
        w_hi = gl.where(mass_hi == tile_max[:, None], 1.0, w_hi)
        w_hi = gl.where(mass_hi > float("-inf"), w_hi, 0.0)
        gl.store(mass_ptr + tile_slot * 2, tile_max, mask=row_mask)
        tile_sum = gl.sum(w_lo, axis=1) + gl.sum(w_hi, axis=1)
        gl.store(mass_ptr + tile_slot * 2 + 1, tile_sum, mask=row_mask)

    @gluon.jit
    def _mass_from_top_key(lo, hi, top_key, v_start, columns, V, noise_scale, mass_ptr,
                           tile_slot, row_mask, EVEN_V: gl.constexpr):  # fmt: skip
        """The mass partials (ROW_MASS 2) with the tile's maximum from its largest key, which
        the top-m search finds anyway (NaN and the columns past V are -inf in both; -0.0
        weighs as +0.0): one row reduction fewer a tile, as the Triton kernel's ROW_MASS 2."""
        mass_lo, mass_hi = _mass_values(lo, hi, v_start, columns, V, EVEN_V)
        tile_max = gl.where(top_key == KEY_PAD, float("-inf"), key_value(top_key))
        _store_tile_mass(mass_lo, mass_hi, tile_max, noise_scale, mass_ptr, tile_slot, row_mask)

    @gluon.jit
    def _keep_top_m(acc_lo, acc_hi, rows, row_mask, v_start, tile_slot, V, bias_ptr,
                    noise_scale, top_m_key_ptr, top_m_index_ptr, hidden_key_ptr, mass_ptr,
                    mass_wanted,
                    HAS_BIAS: gl.constexpr, LOGITS_DTYPE: gl.constexpr, EVEN_V: gl.constexpr,
                    TOP_M: gl.constexpr, ROW_MASS: gl.constexpr,
                    KEY_LOW_BITS: gl.constexpr):  # fmt: skip
        """The truncating epilogue, ``sampling_kernel._sample_stage1``'s with TOP_M on the same
        BLOCK_V-wide tiles, so stage 2 reads the same candidates: per row, the tile's TOP_M
        largest keys (ties to the lowest index) with their indices, the largest key left out
        and, with ROW_MASS where ``mass_wanted`` (``mass_rows``), the tile's (max, sum of
        exp2) at the row's temperature. It draws no noise and reads the accumulators in their
        own layout (no staging)."""
        HALF_V: gl.constexpr = acc_lo.shape[1]
        BLOCK_V: gl.constexpr = 2 * HALF_V
        columns = gl.arange(0, HALF_V, gl.SliceLayout(0, acc_lo.type.layout))[None, :]
        lo, keys_lo = _tile_keys(acc_lo, v_start + columns, V, bias_ptr, HAS_BIAS,
                                 LOGITS_DTYPE, EVEN_V)  # fmt: skip
        hi, keys_hi = _tile_keys(acc_hi, v_start + HALF_V + columns, V, bias_ptr, HAS_BIAS,
                                 LOGITS_DTYPE, EVEN_V)  # fmt: skip
        if ROW_MASS == 1:
            # (before the key loop below, so its scores are dead when the keys are searched)
            if mass_wanted:
                mass_lo, mass_hi = _mass_values(lo, hi, v_start, columns, V, EVEN_V)
                tile_max = gl.maximum(gl.max(mass_lo, axis=1), gl.max(mass_hi, axis=1))
                _store_tile_mass(mass_lo, mass_hi, tile_max, noise_scale, mass_ptr, tile_slot,
                                 row_mask)  # fmt: skip
        # (the slots in a loop, not unrolled: each depends on the one before anyway. The
        # kernel with both epilogues that per-row knobs take has 7240 SASS instructions
        # instead of 12352 (plain: 3952; sm_90a, Triton 3.9), and on an H200 (D = 2048, B =
        # 64) batches with truncated rows took 294 / 263 us instead of 413 / 311 (a fourth /
        # every row at top-k 50, top-p 0.9); off-valued knobs even (171 against 170 us).
        # The Triton kernel's epilogue (B <= 32) stays unrolled: rolled, its off-valued
        # knobs were 3-5 us slower at B = 16, truncated rows even
        # (bench_off_knobs_nvidia-h200_{main,rolled}_20261127-200*.csv). Each pass finds the
        # next slot's largest key, the last one the largest left out.)
        if KEY_LOW_BITS > 0:
            # The packed form of the Triton kernel: the bits the rounding fixed carry the
            # reversed column, so one int32 max per round finds the key and its lowest column.
            low: gl.constexpr = (1 << KEY_LOW_BITS) - 1
            high: gl.constexpr = -(1 << KEY_LOW_BITS)
            keys_lo = (keys_lo & high) | (BLOCK_V - 1 - columns)
            keys_hi = (keys_hi & high) | (HALF_V - 1 - columns)
            top = gl.maximum(gl.max(keys_lo, axis=1), gl.max(keys_hi, axis=1))
            if ROW_MASS == 2:
                if mass_wanted:
                    _mass_from_top_key(lo, hi, restore_low_bits(top & high, KEY_LOW_BITS),
                                       v_start, columns, V, noise_scale, mass_ptr, tile_slot,
                                       row_mask, EVEN_V)  # fmt: skip
            for slot in range(TOP_M):
                key = restore_low_bits(top & high, KEY_LOW_BITS)
                gl.store(top_m_key_ptr + tile_slot * TOP_M + slot, key, mask=row_mask)
                gl.store(top_m_index_ptr + tile_slot * TOP_M + slot,
                         v_start + BLOCK_V - 1 - (top & low), mask=row_mask)  # fmt: skip
                keys_lo = gl.where(keys_lo == top[:, None], KEY_PAD, keys_lo)
                keys_hi = gl.where(keys_hi == top[:, None], KEY_PAD, keys_hi)
                top = gl.maximum(gl.max(keys_lo, axis=1), gl.max(keys_hi, axis=1))
            left_out = top & high
        else:
            top = gl.maximum(gl.max(keys_lo, axis=1), gl.max(keys_hi, axis=1))
            if ROW_MASS == 2:
                if mass_wanted:
                    _mass_from_top_key(lo, hi, top, v_start, columns, V, noise_scale, mass_ptr,
                                       tile_slot, row_mask, EVEN_V)  # fmt: skip
            for slot in range(TOP_M):
                arg = gl.minimum(
                    gl.min(gl.where(keys_lo == top[:, None], columns, BLOCK_V), axis=1),
                    gl.min(gl.where(keys_hi == top[:, None], HALF_V + columns, BLOCK_V), axis=1),
                )
                gl.store(top_m_key_ptr + tile_slot * TOP_M + slot, top, mask=row_mask)
                gl.store(top_m_index_ptr + tile_slot * TOP_M + slot, v_start + arg,
                         mask=row_mask)  # fmt: skip
                keys_lo = gl.where(columns == arg[:, None], KEY_PAD, keys_lo)
                keys_hi = gl.where(HALF_V + columns == arg[:, None], KEY_PAD, keys_hi)
                top = gl.maximum(gl.max(keys_lo, axis=1), gl.max(keys_hi, axis=1))
            left_out = top
        gl.store(hidden_key_ptr + tile_slot, restore_low_bits(left_out, KEY_LOW_BITS),
                 mask=row_mask)  # fmt: skip

    @gluon.jit
    def _consume_tiles(
        parity, h_bufs, w_bufs, ready, empty, turn, staging,
        bias_ptr, temperature_ptr, seed_ptr, cand_score_ptr, cand_index_ptr,
        top_m_key_ptr, top_m_index_ptr, hidden_key_ptr, mass_ptr,
        top_k_ptr, top_p_ptr, min_p_ptr,
        B, V, D, num_tiles, scalar_temperature, seed_lo, seed_hi, num_samples, quad_offset,
        HAS_BIAS: gl.constexpr, TEMPERATURE_MODE: gl.constexpr, SEED_MODE: gl.constexpr,
        LOGITS_DTYPE: gl.constexpr, EVEN_V: gl.constexpr, STAGES: gl.constexpr,
        PLAIN: gl.constexpr, TOP_M: gl.constexpr, ROW_MASS: gl.constexpr,
        KEY_LOW_BITS: gl.constexpr, TOP_K_MODE: gl.constexpr, TOP_P_MODE: gl.constexpr,
        MIN_P_MODE: gl.constexpr, WIDE_MMA: gl.constexpr,
    ):  # fmt: skip
        """One consumer warpgroup: the program's tiles number parity, parity + 2, ...
        With both epilogues (per-row knobs that may be off), each runs only where a row of
        the tile needs it (``truncating_rows``), as in the Triton kernel."""
        BLOCK_B: gl.constexpr = h_bufs.shape[1]
        BLOCK_D: gl.constexpr = h_bufs.shape[2]
        BLOCK_V: gl.constexpr = w_bufs.shape[1]
        HALF_V: gl.constexpr = BLOCK_V // 2
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HALF_V, 16]
        )
        wide_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_V, 16]
        )
        row_layout: gl.constexpr = gl.SliceLayout(1, acc_layout)

        num_b_tiles = gl.cdiv(B, BLOCK_B)
        num_v_tiles = gl.cdiv(V, BLOCK_V)
        k_steps = gl.cdiv(D, BLOCK_D)
        num_programs = gl.num_programs(0)
        n = 0
        for tile in range(gl.program_id(0) + parity * num_programs, num_tiles, 2 * num_programs):
            # This is the program's tile number j = 2n + parity. Its main loop starts when the
            # other consumer's main loop of tile j - 1 has issued its last MMA.
            j = 2 * n + parity
            mbarrier.wait(turn.index(parity), (n + parity + 1) & 1, pred=j > 0)
            it = j * k_steps
            if WIDE_MMA:
                # One m64n128 MMA a step instead of two m64n64: each reads the hidden tile
                # from shared memory once, not twice (a third fewer operand bytes a step).
                acc = gl.zeros([BLOCK_B, BLOCK_V], gl.float32, wide_layout)
                for k in range(k_steps):
                    stage = it % STAGES
                    mbarrier.wait(ready.index(stage), (it // STAGES) & 1)
                    acc = warpgroup_mma(h_bufs.index(stage), w_bufs.index(stage).permute((1, 0)),
                                        acc, is_async=True)  # fmt: skip
                    # Only this step's MMA may still run: the previous stage is free.
                    acc = warpgroup_mma_wait(1, deps=(acc,))
                    mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES), pred=k > 0)
                    it += 1
                mbarrier.arrive(turn.index(1 - parity))
                acc = warpgroup_mma_wait(0, deps=(acc,))
                mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES))
                # The halves hold the same registers in the narrow MMA's layout: column c of
                # the wide one sits where column c mod HALF_V of a narrow one does.
                lo, hi = gl.split(gl.permute(gl.reshape(acc, [BLOCK_B, 2, HALF_V]), (0, 2, 1)))
                acc_lo = gl.convert_layout(lo, acc_layout)
                acc_hi = gl.convert_layout(hi, acc_layout)
            else:
                acc_lo = gl.zeros([BLOCK_B, HALF_V], gl.float32, acc_layout)
                acc_hi = gl.zeros([BLOCK_B, HALF_V], gl.float32, acc_layout)
                for k in range(k_steps):
                    stage = it % STAGES
                    mbarrier.wait(ready.index(stage), (it // STAGES) & 1)
                    h = h_bufs.index(stage)
                    w = w_bufs.index(stage)
                    acc_lo = warpgroup_mma(h, w.slice(0, HALF_V).permute((1, 0)), acc_lo,
                                           is_async=True)  # fmt: skip
                    acc_hi = warpgroup_mma(h, w.slice(HALF_V, HALF_V).permute((1, 0)), acc_hi,
                                           is_async=True)  # fmt: skip
                    # Only this step's two MMAs may still run: the previous stage is free.
                    acc_lo, acc_hi = warpgroup_mma_wait(2, deps=(acc_lo, acc_hi))
                    mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES), pred=k > 0)
                    it += 1
                mbarrier.arrive(turn.index(1 - parity))
                acc_lo, acc_hi = warpgroup_mma_wait(0, deps=(acc_lo, acc_hi))
                mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES))

            # The epilogue, while the other consumer runs its MMAs.
            b_start = (tile % num_b_tiles) * BLOCK_B
            pid_v = tile // num_b_tiles
            rows = b_start + gl.arange(0, BLOCK_B, row_layout)
            row_mask = rows < B
            noise_scale = _noise_scale(
                temperature_ptr, scalar_temperature, rows, row_mask, TEMPERATURE_MODE
            )
            if PLAIN and TOP_M > 0:
                # Per-row knobs that may be off: each epilogue where a row of the tile
                # needs it.
                truncating = truncating_rows(
                    top_k_ptr, top_p_ptr, min_p_ptr, rows, row_mask, noise_scale, V,
                    TOP_K_MODE, TOP_P_MODE, MIN_P_MODE,
                )  # fmt: skip
                if gl.max(truncating.to(gl.int32), axis=0) > 0:
                    # (every tile's mass partials with ROW_MASS: deciding it per tile, as the
                    # Triton kernel and the swapped one do with sampling_device.mass_rows,
                    # gained nothing measurable here at B = 64 on an H200 and never ran on a
                    # GPU with rows that need the mass)
                    _keep_top_m(
                        acc_lo, acc_hi, rows, row_mask, pid_v * BLOCK_V,
                        rows.to(gl.int64) * num_v_tiles + pid_v, V, bias_ptr, noise_scale,
                        top_m_key_ptr, top_m_index_ptr, hidden_key_ptr, mass_ptr, True,
                        HAS_BIAS, LOGITS_DTYPE, EVEN_V, TOP_M, ROW_MASS, KEY_LOW_BITS,
                    )  # fmt: skip
                if gl.max((row_mask & ~truncating).to(gl.int32), axis=0) > 0:
                    _draw_noise(
                        acc_lo, acc_hi, staging, b_start, rows, row_mask, pid_v, num_v_tiles, V,
                        bias_ptr, seed_ptr, cand_score_ptr, cand_index_ptr, noise_scale, seed_lo,
                        seed_hi, num_samples, quad_offset,
                        HAS_BIAS, TEMPERATURE_MODE, SEED_MODE, LOGITS_DTYPE, EVEN_V,
                    )  # fmt: skip
            elif TOP_M > 0:
                _keep_top_m(
                    acc_lo, acc_hi, rows, row_mask, pid_v * BLOCK_V,
                    rows.to(gl.int64) * num_v_tiles + pid_v, V, bias_ptr, noise_scale,
                    top_m_key_ptr, top_m_index_ptr, hidden_key_ptr, mass_ptr, True,
                    HAS_BIAS, LOGITS_DTYPE, EVEN_V, TOP_M, ROW_MASS, KEY_LOW_BITS,
                )  # fmt: skip
            else:
                _draw_noise(
                    acc_lo, acc_hi, staging, b_start, rows, row_mask, pid_v, num_v_tiles, V,
                    bias_ptr, seed_ptr, cand_score_ptr, cand_index_ptr, noise_scale, seed_lo,
                    seed_hi, num_samples, quad_offset,
                    HAS_BIAS, TEMPERATURE_MODE, SEED_MODE, LOGITS_DTYPE, EVEN_V,
                )  # fmt: skip
            n += 1

    @gluon.jit
    def _draw_noise(
        acc_lo, acc_hi, staging, b_start, rows, row_mask, pid_v, num_v_tiles, V, bias_ptr,
        seed_ptr, cand_score_ptr, cand_index_ptr, noise_scale, seed_lo, seed_hi, num_samples,
        quad_offset,
        HAS_BIAS: gl.constexpr, TEMPERATURE_MODE: gl.constexpr, SEED_MODE: gl.constexpr,
        LOGITS_DTYPE: gl.constexpr, EVEN_V: gl.constexpr,
    ):  # fmt: skip
        """The sampling epilogue: per row and sample, each half tile's best perturbed score and
        its global index (cand_* [B, num_samples, 2 * num_v_tiles]), the noise drawn from
        the logits staged in shared memory."""
        BLOCK_B: gl.constexpr = acc_lo.shape[0]
        HALF_V: gl.constexpr = acc_lo.shape[1]
        BLOCK_V: gl.constexpr = 2 * HALF_V
        NUM_CHUNKS: gl.constexpr = staging.shape[0]
        CHUNK_V: gl.constexpr = staging.shape[2]
        row_layout: gl.constexpr = gl.SliceLayout(1, acc_lo.type.layout)
        # One key for the whole batch where the seed is shared: per-row keys would make the
        # compiler keep every row's ten round keys in registers.
        k0, k1 = _seed_keys(seed_ptr, seed_lo, seed_hi, rows, row_mask, SEED_MODE)
        for half in range(2):
            # Each half of the tile goes through shared memory once, so that the noise
            # side reads whole quads of tokens in its own layout.
            _thread_barrier()  # the previous half's readers are done
            logits = gl.where(half == 0, acc_lo, acc_hi)
            if NUM_CHUNKS == 1:
                staging.index(0).store(logits)
            else:
                gl.static_assert(NUM_CHUNKS == 2)
                left, right = gl.split(
                    gl.permute(gl.reshape(logits, [BLOCK_B, 2, CHUNK_V]), (0, 2, 1))
                )
                staging.index(0).store(left)
                staging.index(1).store(right)
            _thread_barrier()
            # Candidates are per half tile: cand_* are [B, num_samples, V / HALF_V].
            cand_tile = 2 * pid_v + half
            for sample_index in range(num_samples):
                best, index = _best_of_staged(
                    staging, 0, (pid_v * BLOCK_V + half * HALF_V) // 4, quad_offset, b_start, V,
                    bias_ptr,
                    noise_scale, sample_index, k0, k1,
                    HAS_BIAS, LOGITS_DTYPE, TEMPERATURE_MODE == 3, EVEN_V, SEED_MODE == 2,
                    BLOCK_B, NUM_CHUNKS, CHUNK_V // 4,
                )  # fmt: skip
                best = gl.convert_layout(best, row_layout)
                index = gl.convert_layout(index, row_layout)
                out = (rows * num_samples + sample_index) * (2 * num_v_tiles) + cand_tile
                gl.store(cand_score_ptr + out, best, mask=row_mask)
                gl.store(cand_index_ptr + out, index, mask=row_mask)

    # A scalar seed or temperature equal to 1 must not become a compile-time constant.
    @gluon.jit(do_not_specialize=["scalar_temperature", "seed_lo", "seed_hi", "quad_offset"])
    def _hopper_stage1(
        h_desc, w_desc, bias_ptr, temperature_ptr, seed_ptr, cand_score_ptr, cand_index_ptr,
        top_m_key_ptr, top_m_index_ptr, hidden_key_ptr, mass_ptr,
        B, V, D, scalar_temperature, seed_lo, seed_hi, num_samples, quad_offset,
        HAS_BIAS: gl.constexpr, TEMPERATURE_MODE: gl.constexpr, SEED_MODE: gl.constexpr,
        LOGITS_DTYPE: gl.constexpr, EVEN_V: gl.constexpr, STAGES: gl.constexpr,
        CONSUMER_REGISTERS: gl.constexpr, LOADER_REGISTERS: gl.constexpr,
        PLAIN: gl.constexpr = True,  # the sampling epilogue (cand_score / cand_index)
        TOP_M: gl.constexpr = 0,  # > 0: the truncating epilogue (_keep_top_m)
        ROW_MASS: gl.constexpr = False,
        KEY_LOW_BITS: gl.constexpr = 0,
        # With PLAIN and TOP_M: the knobs' tensors (modes as in sampling_kernel's stage 1)
        top_k_ptr=None, top_p_ptr=None, min_p_ptr=None,
        TOP_K_MODE: gl.constexpr = 0, TOP_P_MODE: gl.constexpr = 0, MIN_P_MODE: gl.constexpr = 0,
        # 1: no tile if a row of the batch is truncated, 2: none if no row is (the two
        # launches of a split stage 1, as sampling_kernel's); 0: every tile.
        BATCH_TRUNCATES: gl.constexpr = 0,
        WIDE_MMA: gl.constexpr = False,  # one m64n128 MMA a step (_consume_tiles)
        # Launched as a programmatic dependent of the kernel before it (the TP step's seed
        # draw): wait for that kernel's end and writes before any load.
        WAIT_PREVIOUS: gl.constexpr = False,
        # Let the next kernel, a programmatic dependent (the TP exchange with PDL), be
        # scheduled as this persistent grid's programs start: it waits for its end itself.
        SIGNAL_DEPENDENTS: gl.constexpr = False,
        # Launched as the second half of a split stage 1 whose halves are programmatic
        # dependents (dispatch.GLUON_SPLIT_PDL; the first half SIGNAL_DEPENDENTS): only the
        # last program waits for the first half's end, so that this grid ends after it
        # while the others leave at once where the batch wants none of their tiles.
        AWAIT_LAST: gl.constexpr = False,
    ):  # fmt: skip
        if WAIT_PREVIOUS:  # (the default warps, before the partitions start: before any load)
            tl.extra.cuda.gdc_wait()
        if SIGNAL_DEPENDENTS:
            tl.extra.cuda.gdc_launch_dependents()
        if AWAIT_LAST:
            if gl.program_id(0) == gl.num_programs(0) - 1:
                tl.extra.cuda.gdc_wait()
        num_tiles = gl.cdiv(B, h_desc.block_type.shape[0]) * gl.cdiv(V, w_desc.block_type.shape[0])
        if BATCH_TRUNCATES > 0:
            rows = gl.arange(0, 128, gl.BlockedLayout([1], [32], [4], [0]))
            some_row = gl.max(any_row_truncates(
                rows, B, V, temperature_ptr, scalar_temperature, top_k_ptr, top_p_ptr,
                min_p_ptr, TEMPERATURE_MODE, TOP_K_MODE, TOP_P_MODE, MIN_P_MODE,
            ), axis=0)  # fmt: skip
            num_tiles *= (some_row == BATCH_TRUNCATES - 1).to(gl.int32)
        h_bufs = gl.allocate_shared_memory(
            h_desc.dtype, [STAGES] + h_desc.block_type.shape, h_desc.layout
        )
        w_bufs = gl.allocate_shared_memory(
            w_desc.dtype, [STAGES] + w_desc.block_type.shape, w_desc.layout
        )
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        # Per consumer, half a tile of logits on its way to the noise side (fp32, no swizzle).
        # Chunks of 4096 logits: eight rows of Philox evaluations per thread.
        CHUNK_V: gl.constexpr = 4096 // h_desc.block_type.shape[0]
        NUM_CHUNKS: gl.constexpr = w_desc.block_type.shape[0] // 2 // CHUNK_V
        staging_shape: gl.constexpr = [NUM_CHUNKS, h_desc.block_type.shape[0], CHUNK_V]
        staging_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        staging0 = gl.allocate_shared_memory(gl.float32, staging_shape, staging_layout)
        staging1 = gl.allocate_shared_memory(gl.float32, staging_shape, staging_layout)
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=1)
        for i in gl.static_range(2):
            mbarrier.init(turn.index(i), count=1)
        # Tuples cannot be concatenated inside a kernel: each partition's arguments in full.
        gl.warp_specialize(
            [
                (
                    _consume_tiles,
                    (  # the default partition: the kernel's 4 warps
                        0,
                        h_bufs,
                        w_bufs,
                        ready,
                        empty,
                        turn,
                        staging0,
                        bias_ptr,
                        temperature_ptr,
                        seed_ptr,
                        cand_score_ptr,
                        cand_index_ptr,
                        top_m_key_ptr,
                        top_m_index_ptr,
                        hidden_key_ptr,
                        mass_ptr,
                        top_k_ptr,
                        top_p_ptr,
                        min_p_ptr,
                        B,
                        V,
                        D,
                        num_tiles,
                        scalar_temperature,
                        seed_lo,
                        seed_hi,
                        num_samples,
                        quad_offset,
                        HAS_BIAS,
                        TEMPERATURE_MODE,
                        SEED_MODE,
                        LOGITS_DTYPE,
                        EVEN_V,
                        STAGES,
                        PLAIN,
                        TOP_M,
                        ROW_MASS,
                        KEY_LOW_BITS,
                        TOP_K_MODE,
                        TOP_P_MODE,
                        MIN_P_MODE,
                        WIDE_MMA,
                    ),
                ),
                (
                    _consume_tiles,
                    (
                        1,
                        h_bufs,
                        w_bufs,
                        ready,
                        empty,
                        turn,
                        staging1,
                        bias_ptr,
                        temperature_ptr,
                        seed_ptr,
                        cand_score_ptr,
                        cand_index_ptr,
                        top_m_key_ptr,
                        top_m_index_ptr,
                        hidden_key_ptr,
                        mass_ptr,
                        top_k_ptr,
                        top_p_ptr,
                        min_p_ptr,
                        B,
                        V,
                        D,
                        num_tiles,
                        scalar_temperature,
                        seed_lo,
                        seed_hi,
                        num_samples,
                        quad_offset,
                        HAS_BIAS,
                        TEMPERATURE_MODE,
                        SEED_MODE,
                        LOGITS_DTYPE,
                        EVEN_V,
                        STAGES,
                        PLAIN,
                        TOP_M,
                        ROW_MASS,
                        KEY_LOW_BITS,
                        TOP_K_MODE,
                        TOP_P_MODE,
                        MIN_P_MODE,
                        WIDE_MMA,
                    ),
                ),
                (
                    _load_tiles,
                    (h_desc, w_desc, h_bufs, w_bufs, ready, empty, B, V, D, num_tiles, STAGES),
                ),
            ],
            [4, 1],
            [CONSUMER_REGISTERS, LOADER_REGISTERS],
        )
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(ready.index(i))
            mbarrier.invalidate(empty.index(i))
        for i in gl.static_range(2):
            mbarrier.invalidate(turn.index(i))


_GL_DTYPES = {}
if AVAILABLE:
    _GL_DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}


@functools.cache
def _shared_layout(rows: int, dtype: torch.dtype):
    """The swizzled shared-memory layout of a [rows, BLOCK_D] TMA tile (built once)."""
    return gl.NVMMASharedLayout.get_default_for([rows, BLOCK_D], _GL_DTYPES[dtype])


def launch_stage1(
    hidden, weight, bias, temperature, scalar_temperature, seed, seed_lo, seed_hi,
    num_samples, logits_dtype, cand_score, cand_index, block_b, num_sms,
    temperature_mode, seed_mode, vocab_offset=0, stage1=None, top_m=0, row_mass=False,
    key_low_bits=0, row_knobs=None, batch_truncates=0, wide_mma=False,
    signal_dependents=False, wait_previous=False, await_last=False,
):  # fmt: skip
    """Run stage 1 on a persistent grid of one program per SM; arguments as in
    ``dispatch.triton_fused_sample``, which calls this and then stage 2
    (``vocab_offset``, a multiple of 4: a tensor-parallel shard's first global index). The
    sampling epilogue runs where ``cand_score`` is given; with ``top_m`` the truncating one
    writes ``stage1``'s buffers (``dispatch._truncation_buffers``); ``row_knobs``:
    the knobs' tensors and modes where both run (``dispatch._row_knobs``);
    ``batch_truncates``: which half of a split stage 1 this launch is (BATCH_TRUNCATES);
    ``signal_dependents`` / ``wait_previous`` as in ``sampling_kernel.launch_stage1``
    (SIGNAL_DEPENDENTS; WAIT_PREVIOUS with ``launch_pdl``); ``await_last``: AWAIT_LAST (with
    ``launch_pdl``)."""
    stage1 = stage1 or {}
    batch, hidden_size = hidden.shape
    vocab_size = weight.shape[0]
    h_layout = _shared_layout(block_b, hidden.dtype)
    w_layout = _shared_layout(BLOCK_V, hidden.dtype)
    h_desc = TensorDescriptor.from_tensor(
        rows_for_tma(hidden, block_b), [block_b, BLOCK_D], h_layout
    )
    w_desc = TensorDescriptor.from_tensor(weight, [BLOCK_V, BLOCK_D], w_layout)
    num_tiles = triton.cdiv(batch, block_b) * triton.cdiv(vocab_size, BLOCK_V)
    launch(
        _hopper_stage1, (min(num_tiles, num_sms),),
        h_desc, w_desc, bias, temperature, seed, cand_score, cand_index,
        stage1.get("top_m_key"), stage1.get("top_m_index"), stage1.get("hidden_key"),
        stage1.get("mass"),
        batch, vocab_size, hidden_size, scalar_temperature, seed_lo, seed_hi, num_samples,
        vocab_offset // 4,
        HAS_BIAS=bias is not None,
        TEMPERATURE_MODE=temperature_mode,
        SEED_MODE=seed_mode,
        # Rounding fp32 logits to fp32 changes nothing.
        LOGITS_DTYPE=_GL_DTYPES.get(logits_dtype),
        EVEN_V=vocab_size % BLOCK_V == 0,
        STAGES=STAGES[block_b],
        CONSUMER_REGISTERS=CONSUMER_REGISTERS,
        LOADER_REGISTERS=LOADER_REGISTERS,
        PLAIN=cand_score is not None,
        TOP_M=top_m,
        ROW_MASS=(2 if MASS_MAX_FROM_TOP_KEY else 1) if row_mass else 0,
        KEY_LOW_BITS=0 if block_b == 64 and top_m < PACKED_TOP_M_MIN_64_ROWS else key_low_bits,
        **(row_knobs or _NO_ROW_KNOBS),
        BATCH_TRUNCATES=batch_truncates,
        WIDE_MMA=wide_mma if WIDE_MMA is None else WIDE_MMA,
        SIGNAL_DEPENDENTS=signal_dependents, WAIT_PREVIOUS=wait_previous, AWAIT_LAST=await_last,
        **({"launch_pdl": True} if wait_previous or await_last else {}),
        num_warps=4,
    )  # fmt: skip


_NO_ROW_KNOBS = dict(
    top_k_ptr=None, top_p_ptr=None, min_p_ptr=None, TOP_K_MODE=0, TOP_P_MODE=0, MIN_P_MODE=0
)
