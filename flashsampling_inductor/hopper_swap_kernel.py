"""Stage 1 for Hopper from 129 to 256 rows: the warp-specialized kernel with the MMA's operands
swapped (plain sampling and greedy, and with its truncating epilogue knob tensors that may be
off: ``dispatch`` says which calls take it, ``SWAP_KNOBS`` and ``_swap_takes_knobs``).

Why. ``hopper_kernel`` tiles the batch by 64 or 128 rows (wgmma's M is 64 per warpgroup), so
B = 144 computes 192 or 256 rows, and its m64n64 MMAs re-read both operands from shared
memory at half the tensor cores' rate. Here the vocabulary is the MMA's M (64 entries per
consumer tile) and the batch its N: one accumulator of 128 rows and a second of ``NB`` (8 to
128, a power of two), so B = 144 computes 144 rows, each weight tile read from HBM serves
every row at once, and one m64nN instruction reads a 64 x 16 weight slice for up to 128 rows.

The schedule is ``hopper_kernel``'s: a TMA loader warp fills a ring of stages (a 64 x 64
weight tile and the hidden's rows, re-read from L2 per vocabulary tile), two consumer
warpgroups alternate their main loops (the ``turn`` barriers) so that one draws its tile's
noise while the other runs its MMAs. A consumer tile is 64 vocabulary entries, exactly a half
tile of ``hopper_kernel``'s candidates: the noise (``hopper_kernel._best_of_staged``, the same
Philox counters keyed on the global row and vocabulary index) and the candidates
[B, num_samples, 2 * cdiv(V, 128)] are the same bits, so stage 2 and every token are unchanged.
The accumulators go through shared memory transposed, 64 rows at a time, so the noise side
reads the rows' quads of tokens as in ``hopper_kernel``. Two other schedules: "cooperative"
(both consumers on one stage of two tiles' weights, hidden read once for both, noise no longer
overlapped) and "ping-pong-wide" (``WIDE_TILE``: ping-pong on 128-entry tiles, each consumer
two MMAs a step per accumulator, so hidden is read from L2 once per 128 entries, not 64; the
same half tiles, noise and candidates).

Truncation (top-k / top-p / min-p): ``hopper_kernel._keep_top_m`` on each staged block of rows
and its 64-wide tile (the truncation buffers per 64-wide tile, which ``truncation_kernel``'s
stage 2 reads as it reads the Triton kernel's), so that a call with knobs that may be off
(``generate``'s 0-d tensors, continuous batching's [B]) runs, per block of 64 rows, each
epilogue only where a row needs it: off-valued knobs draw the noise alone.
"""

from __future__ import annotations

import warnings

import triton

from . import hopper_kernel
from .launch import launch
from .sampling_device import any_row_truncates, mass_rows, rows_for_tma, truncating_rows

__all__ = ["disable", "extra_rows", "launch_stage1", "supported"]

VOCAB_TILE = 64  # the MMA's M: one candidate's half tile (hopper_kernel.BLOCK_V / 2)
MAIN_ROWS = 128  # the first accumulator's rows (the MMA's N)
NOISE_ROWS = 64  # rows whose noise one pass over the staging draws (8 Philox a thread)
SHARED_BYTES = 227 * 1024 - 1024  # an H100's / H200's shared memory a block, less barriers
MAX_STAGES = 8
# The staging's layout (see _swapped_stage1): None chooses per shape (``swizzled``), a bool
# forces it (benchmarks/probes/swap_stage1.py compares the two).
SWIZZLE_STAGING: bool | None = None
# The most rows of the "ping-pong-wide" schedule (WIDE_TILE): above, its four accumulators
# (2 x 64 x (128 + NB) fp32 a consumer) spill (568 bytes of stack at 224 rows, sm_90a).
WIDE_TILE_ROWS_MAX = 192
# The top-m search on rounded logits (KEY_LOW_BITS: one int32 max a slot finds the key and its
# column) packed only from this many slots; below it on whole keys, which write the same keys
# and columns (hopper_kernel.PACKED_TOP_M_MIN_64_ROWS, for the Gluon kernel's 64-row tiles).
# 0: packed at every m (not yet timed against whole keys here).
PACKED_TOP_M_MIN = 0


_disabled_by: str | None = None  # why this process stopped using the kernel


def disable(error: Exception) -> None:
    """Stop using this kernel in this process, with one warning (``hopper_kernel.disable``'s
    reason: the installed Gluon could not compile it); the other kernels take over."""
    global _disabled_by
    if _disabled_by is None:
        while error.__cause__ is not None:
            error = error.__cause__
        lines = [line for line in str(error).splitlines() if line.strip()] or [""]
        _disabled_by = f"{type(error).__name__}: {lines[-1].strip()}"
        warnings.warn(
            f"flashsampling: the swapped Hopper kernel does not compile with Triton"
            f" {triton.__version__} ({_disabled_by}); using the other kernels instead",
            RuntimeWarning,
            stacklevel=3,
        )


def supported(hidden, weight) -> bool:
    """Whether this kernel can run the call: ``hopper_kernel.supported`` and not disabled."""
    return _disabled_by is None and hopper_kernel.supported(hidden, weight)


def extra_rows(batch: int) -> int:
    """The second accumulator's rows for a batch of 129-256: the rows past 128, rounded up to
    a power of two (at least 8, the MMA's smallest N)."""
    return max(8, triton.next_power_of_2(batch - MAIN_ROWS))


def swizzled(batch: int, hidden_size: int) -> bool:
    """Whether the staging is swizzled (conflict-free transposed stores): H200, against the
    plain layout, 3-10% faster at D = 2048 and above 160 rows (D = 2048 B = 256 351 -> 320 us,
    D = 4096 B = 192 479 -> 449), even to 1% slower at D >= 4096 up to 160 rows in one run and
    1-5% slower in another (swap_stage1_h200_20261127-2027_*, -2311_*)."""
    if SWIZZLE_STAGING is not None:
        return SWIZZLE_STAGING
    return hidden_size <= 2048 or batch > 160


def _stages(extra: int, coop: bool = False) -> int:
    """Ring depth: as many stages as fit beside the two consumers' staging (``coop``: a stage
    holds two consumer tiles' weights, as the cooperative and the wide-tile schedules' do)."""
    stage = 2 * BLOCK_D * ((1 + coop) * VOCAB_TILE + MAIN_ROWS + extra)
    staging = 4 * VOCAB_TILE * (MAIN_ROWS + (extra if extra < NOISE_ROWS else 0))
    return min(MAX_STAGES, (SHARED_BYTES - 2 * staging) // stage)


BLOCK_D = hopper_kernel.BLOCK_D

if hopper_kernel.AVAILABLE:
    from .hopper_kernel import (
        _best_of_staged,
        _keep_top_m,
        _noise_scale,
        _seed_keys,
        _thread_barrier,
        _tma_load,
        gl,
        gluon,
        mbarrier,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    @gluon.jit
    def _load_swapped(ha_desc, hb_desc, w_desc, ha_bufs, hb_bufs, w_bufs, ready, empty, V, D,
                      STAGES: gl.constexpr, NB: gl.constexpr):  # fmt: skip
        """The loader warp: per weight box of this program (one consumer tile, or with
        COOP both consumers' tiles) and per step of D, the weight tile and every row of hidden
        (rows >= 128 in a second box)."""
        W_ROWS: gl.constexpr = w_desc.block_type.shape[0]
        BLOCK_D: gl.constexpr = w_desc.block_type.shape[1]
        NA: gl.constexpr = ha_desc.block_type.shape[0]
        num_tiles = gl.cdiv(V, 128) * (128 // W_ROWS)
        k_steps = gl.cdiv(D, BLOCK_D)
        nbytes: gl.constexpr = (
            w_desc.block_type.nbytes + ha_desc.block_type.nbytes + hb_desc.block_type.nbytes
        )
        it = 0
        for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
            v_start = tile * W_ROWS
            for k in range(k_steps):
                stage = it % STAGES
                mbarrier.wait(empty.index(stage), ((it // STAGES) & 1) ^ 1)
                mbarrier.expect(ready.index(stage), nbytes)
                _tma_load(w_desc, [v_start, k * BLOCK_D], ready.index(stage), w_bufs.index(stage))
                _tma_load(ha_desc, [0, k * BLOCK_D], ready.index(stage), ha_bufs.index(stage))
                _tma_load(hb_desc, [NA, k * BLOCK_D], ready.index(stage), hb_bufs.index(stage))
                it += 1

    @gluon.jit
    def _top_m_of_block(staging, block, rows, row_mask, tile, V, bias_ptr, noise_scale,
                        top_m_key_ptr, top_m_index_ptr, hidden_key_ptr, mass_ptr, mass_wanted,
                        HAS_BIAS: gl.constexpr, LOGITS_DTYPE: gl.constexpr,
                        EVEN_V: gl.constexpr, TOP_M: gl.constexpr, ROW_MASS: gl.constexpr,
                        KEY_LOW_BITS: gl.constexpr):  # fmt: skip
        """The truncating epilogue of one staged block of rows on its 64-wide vocabulary tile:
        ``hopper_kernel._keep_top_m`` (m largest keys, the key left out, the mass partials
        where ``mass_wanted``)
        on the block's two halves of 32 entries, loaded from the staging in a layout whose
        reductions over the vocabulary stay in a quarter of a warp. The truncation buffers
        are per 64-wide tile (``cdiv(V, 64)`` of them); a tile wholly past V has none."""
        VT: gl.constexpr = staging.shape[2]
        layout: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0])
        if tile * VT < V:
            row_layout: gl.constexpr = gl.SliceLayout(1, layout)
            block_rows = gl.convert_layout(rows, row_layout)
            logits = staging.index(block)
            lo = logits.slice(0, VT // 2, dim=1).load(layout)
            hi = logits.slice(VT // 2, VT // 2, dim=1).load(layout)
            _keep_top_m(
                lo, hi, block_rows, gl.convert_layout(row_mask, row_layout), tile * VT,
                block_rows.to(gl.int64) * gl.cdiv(V, VT) + tile, V, bias_ptr,
                gl.convert_layout(noise_scale, row_layout), top_m_key_ptr, top_m_index_ptr,
                hidden_key_ptr, mass_ptr, mass_wanted,
                HAS_BIAS, LOGITS_DTYPE, EVEN_V, TOP_M, ROW_MASS, KEY_LOW_BITS,
            )  # fmt: skip

    @gluon.jit
    def _noise_of_staged(staging, num_blocks, row_base, tile, num_cand_tiles, B, V, bias_ptr,
                         temperature_ptr, seed_ptr, cand_score_ptr, cand_index_ptr,
                         scalar_temperature, seed_lo, seed_hi, num_samples, quad_offset,
                         top_m_key_ptr, top_m_index_ptr, hidden_key_ptr, mass_ptr,
                         top_k_ptr, top_p_ptr, min_p_ptr,
                         HAS_BIAS: gl.constexpr, TEMPERATURE_MODE: gl.constexpr,
                         SEED_MODE: gl.constexpr, LOGITS_DTYPE: gl.constexpr,
                         EVEN_V: gl.constexpr, PLAIN: gl.constexpr, TOP_M: gl.constexpr,
                         ROW_MASS: gl.constexpr, KEY_LOW_BITS: gl.constexpr,
                         TOP_K_MODE: gl.constexpr, TOP_P_MODE: gl.constexpr,
                         MIN_P_MODE: gl.constexpr):  # fmt: skip
        """The epilogues of the staged logits (``num_blocks`` blocks of rows, [rows, 64
        vocabulary entries] each, the first row ``row_base``) for vocabulary tile ``tile``, a
        block of rows at a time: the sampling one (``hopper_kernel._draw_noise``'s noise and
        stores) and with TOP_M the truncating one (``_top_m_of_block``); with both (per-row
        knobs that may be off) each where a row of the block needs it, as in
        ``hopper_kernel._consume_tiles``."""
        ROWS: gl.constexpr = staging.shape[1]
        row_layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        for block in range(num_blocks):
            b_start = row_base + block * ROWS
            rows = b_start + gl.arange(0, ROWS, row_layout)
            row_mask = rows < B
            noise_scale = _noise_scale(
                temperature_ptr, scalar_temperature, rows, row_mask, TEMPERATURE_MODE
            )
            if PLAIN and TOP_M > 0:
                truncating = truncating_rows(
                    top_k_ptr, top_p_ptr, min_p_ptr, rows, row_mask, noise_scale, V,
                    TOP_K_MODE, TOP_P_MODE, MIN_P_MODE,
                )  # fmt: skip
                if gl.max(truncating.to(gl.int32), axis=0) > 0:
                    # (top-p's mass partials only where a row has top-p on and top-k off, as
                    # in hopper_kernel._consume_tiles)
                    mass_wanted = True
                    if ROW_MASS:
                        mass_wanted = gl.max(mass_rows(
                            top_k_ptr, top_p_ptr, rows, truncating, V, TOP_K_MODE, TOP_P_MODE,
                        ).to(gl.int32), axis=0) > 0  # fmt: skip
                    _top_m_of_block(
                        staging, block, rows, row_mask, tile, V, bias_ptr, noise_scale,
                        top_m_key_ptr, top_m_index_ptr, hidden_key_ptr, mass_ptr, mass_wanted,
                        HAS_BIAS, LOGITS_DTYPE, EVEN_V, TOP_M, ROW_MASS, KEY_LOW_BITS,
                    )  # fmt: skip
                if gl.max((row_mask & ~truncating).to(gl.int32), axis=0) > 0:
                    _noise_of_block(
                        staging, block, b_start, rows, row_mask, tile, num_cand_tiles, V, bias_ptr,
                        seed_ptr, cand_score_ptr, cand_index_ptr, noise_scale, seed_lo,
                        seed_hi, num_samples, quad_offset,
                        HAS_BIAS, TEMPERATURE_MODE, SEED_MODE, LOGITS_DTYPE, EVEN_V,
                    )  # fmt: skip
            elif TOP_M > 0:
                _top_m_of_block(
                    staging, block, rows, row_mask, tile, V, bias_ptr, noise_scale,
                    top_m_key_ptr, top_m_index_ptr, hidden_key_ptr, mass_ptr, True,
                    HAS_BIAS, LOGITS_DTYPE, EVEN_V, TOP_M, ROW_MASS, KEY_LOW_BITS,
                )  # fmt: skip
            else:
                _noise_of_block(
                    staging, block, b_start, rows, row_mask, tile, num_cand_tiles, V, bias_ptr,
                    seed_ptr, cand_score_ptr, cand_index_ptr, noise_scale, seed_lo, seed_hi,
                    num_samples, quad_offset,
                    HAS_BIAS, TEMPERATURE_MODE, SEED_MODE, LOGITS_DTYPE, EVEN_V,
                )  # fmt: skip

    @gluon.jit
    def _noise_of_block(staging, block, b_start, rows, row_mask, tile, num_cand_tiles, V, bias_ptr,
                        seed_ptr, cand_score_ptr, cand_index_ptr, noise_scale, seed_lo, seed_hi,
                        num_samples, quad_offset,
                        HAS_BIAS: gl.constexpr, TEMPERATURE_MODE: gl.constexpr,
                        SEED_MODE: gl.constexpr, LOGITS_DTYPE: gl.constexpr,
                        EVEN_V: gl.constexpr):  # fmt: skip
        """The sampling epilogue of one staged block of ``rows`` (from ``b_start``, in a row
        layout) on vocabulary tile ``tile``: ``hopper_kernel._draw_noise``'s noise and stores,
        per sample."""
        ROWS: gl.constexpr = staging.shape[1]
        VT: gl.constexpr = staging.shape[2]
        k0, k1 = _seed_keys(seed_ptr, seed_lo, seed_hi, rows, row_mask, SEED_MODE)
        for sample_index in range(num_samples):
            best, index = _best_of_staged(
                staging, block, tile * (VT // 4), quad_offset, b_start, V, bias_ptr,
                noise_scale, sample_index, k0, k1,
                HAS_BIAS, LOGITS_DTYPE, TEMPERATURE_MODE == 3, EVEN_V, SEED_MODE == 2,
                ROWS, 1, VT // 4,
            )  # fmt: skip
            best = gl.convert_layout(best, rows.type.layout)
            index = gl.convert_layout(index, rows.type.layout)
            out = (rows * num_samples + sample_index) * num_cand_tiles + tile
            gl.store(cand_score_ptr + out, best, mask=row_mask)
            gl.store(cand_index_ptr + out, index, mask=row_mask)

    @gluon.jit
    def _stage(acc, staging):
        """Store ``acc`` [64 vocabulary entries, rows] transposed into the first blocks of
        ``staging`` [blocks, rows per block, 64], once its previous contents are read."""
        _thread_barrier()
        rows_t = gl.permute(acc, (1, 0))
        if acc.shape[1] == staging.shape[1]:
            staging.index(0).store(rows_t)
        else:
            gl.static_assert(acc.shape[1] == 2 * staging.shape[1])
            first, second = gl.split(
                gl.permute(gl.reshape(rows_t, [2, staging.shape[1], staging.shape[2]]), (1, 2, 0))
            )
            staging.index(0).store(first)
            staging.index(1).store(second)
        _thread_barrier()

    @gluon.jit
    def _consume_swapped(
        parity, staging, staging_b, shared,
        HAS_BIAS: gl.constexpr, TEMPERATURE_MODE: gl.constexpr, SEED_MODE: gl.constexpr,
        LOGITS_DTYPE: gl.constexpr, EVEN_V: gl.constexpr, STAGES: gl.constexpr,
        NB: gl.constexpr, COOP: gl.constexpr, WIDE_TILE: gl.constexpr, PLAIN: gl.constexpr,
        TOP_M: gl.constexpr, ROW_MASS: gl.constexpr, KEY_LOW_BITS: gl.constexpr,
        TOP_K_MODE: gl.constexpr, TOP_P_MODE: gl.constexpr, MIN_P_MODE: gl.constexpr,
    ):  # fmt: skip
        """One consumer warpgroup (``shared``: the arguments both take, in one tuple so that
        ``_swapped_stage1`` lists them once). Ping-pong (``hopper_kernel._consume_tiles``'s):
        the program's vocabulary tiles number parity, parity + 2, ..., main loops in turn.
        COOP: each ring stage holds two tiles' weights, the consumer takes the half ``parity``
        (hidden read once for both), and the two run their MMAs and their noise together.
        WIDE_TILE: ping-pong on 128-entry tiles, each consumer both halves of a stage's weights
        (two MMAs a step per accumulator: hidden read once per 128 entries, not 64). Each
        64-entry tile is [64, NA + NB] in two accumulators, then its noise."""
        (
            ha_bufs, hb_bufs, w_bufs, ready, empty, turn,
            bias_ptr, temperature_ptr, seed_ptr, cand_score_ptr, cand_index_ptr,
            top_m_key_ptr, top_m_index_ptr, hidden_key_ptr, mass_ptr,
            top_k_ptr, top_p_ptr, min_p_ptr,
            B, V, D, scalar_temperature, seed_lo, seed_hi, num_samples, quad_offset,
        ) = shared  # fmt: skip
        NA: gl.constexpr = ha_bufs.shape[1]
        VT: gl.constexpr = 64
        BLOCK_D: gl.constexpr = w_bufs.shape[2]
        layout_a: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, NA, 16]
        )
        layout_b: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, NB, 16]
        )
        num_cand_tiles = 2 * gl.cdiv(V, 2 * VT)
        k_steps = gl.cdiv(D, BLOCK_D)
        num_programs = gl.num_programs(0)
        if COOP:
            first = gl.program_id(0)
            step = num_programs
            end = gl.cdiv(V, 2 * VT)
        else:
            first = gl.program_id(0) + parity * num_programs
            step = 2 * num_programs
            end = gl.cdiv(V, 2 * VT) if WIDE_TILE else num_cand_tiles
        n = 0
        for t in range(first, end, step):
            if COOP:
                tile = 2 * t + parity
                it = n * k_steps
            else:
                tile = t
                j = 2 * n + parity
                mbarrier.wait(turn.index(parity), (n + parity + 1) & 1, pred=j > 0)
                it = j * k_steps
            acc_a = gl.zeros([VT, NA], gl.float32, layout_a)
            acc_b = gl.zeros([VT, NB], gl.float32, layout_b)
            if WIDE_TILE:  # the second half of the 128 entries
                acc_a2 = gl.zeros([VT, NA], gl.float32, layout_a)
                acc_b2 = gl.zeros([VT, NB], gl.float32, layout_b)
            for k in range(k_steps):
                stage = it % STAGES
                mbarrier.wait(ready.index(stage), (it // STAGES) & 1)
                if COOP:
                    w = w_bufs.index(stage).slice(parity * VT, VT)
                elif WIDE_TILE:
                    w = w_bufs.index(stage).slice(0, VT)
                else:
                    w = w_bufs.index(stage)
                ha = ha_bufs.index(stage).permute((1, 0))
                hb = hb_bufs.index(stage).permute((1, 0))
                acc_a = warpgroup_mma(w, ha, acc_a, is_async=True)
                acc_b = warpgroup_mma(w, hb, acc_b, is_async=True)
                if WIDE_TILE:
                    w2 = w_bufs.index(stage).slice(VT, VT)
                    acc_a2 = warpgroup_mma(w2, ha, acc_a2, is_async=True)
                    acc_b2 = warpgroup_mma(w2, hb, acc_b2, is_async=True)
                    # Only this step's four MMAs may still run: the previous stage is free.
                    acc_a, acc_b, acc_a2, acc_b2 = warpgroup_mma_wait(
                        4, deps=(acc_a, acc_b, acc_a2, acc_b2)
                    )
                else:
                    # Only this step's two MMAs may still run: the previous stage is free.
                    acc_a, acc_b = warpgroup_mma_wait(2, deps=(acc_a, acc_b))
                mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES), pred=k > 0)
                it += 1
            if not COOP:
                mbarrier.arrive(turn.index(1 - parity))
            if WIDE_TILE:
                acc_a, acc_b, acc_a2, acc_b2 = warpgroup_mma_wait(
                    0, deps=(acc_a, acc_b, acc_a2, acc_b2)
                )
                tile = 2 * t
            else:
                acc_a, acc_b = warpgroup_mma_wait(0, deps=(acc_a, acc_b))
            mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES))

            # The epilogue (ping-pong: while the other consumer runs its MMAs).
            _stage(acc_a, staging)
            _noise_of_staged(
                staging, staging.shape[0], 0, tile, num_cand_tiles, B, V, bias_ptr,
                temperature_ptr, seed_ptr, cand_score_ptr, cand_index_ptr, scalar_temperature,
                seed_lo, seed_hi, num_samples, quad_offset, top_m_key_ptr, top_m_index_ptr,
                hidden_key_ptr, mass_ptr, top_k_ptr, top_p_ptr, min_p_ptr,
                HAS_BIAS, TEMPERATURE_MODE, SEED_MODE, LOGITS_DTYPE, EVEN_V, PLAIN, TOP_M,
                ROW_MASS, KEY_LOW_BITS, TOP_K_MODE, TOP_P_MODE, MIN_P_MODE,
            )  # fmt: skip
            _stage(acc_b, staging_b)
            _noise_of_staged(
                staging_b, NB // staging_b.shape[1], NA, tile, num_cand_tiles, B, V, bias_ptr,
                temperature_ptr, seed_ptr, cand_score_ptr, cand_index_ptr, scalar_temperature,
                seed_lo, seed_hi, num_samples, quad_offset, top_m_key_ptr, top_m_index_ptr,
                hidden_key_ptr, mass_ptr, top_k_ptr, top_p_ptr, min_p_ptr,
                HAS_BIAS, TEMPERATURE_MODE, SEED_MODE, LOGITS_DTYPE, EVEN_V, PLAIN, TOP_M,
                ROW_MASS, KEY_LOW_BITS, TOP_K_MODE, TOP_P_MODE, MIN_P_MODE,
            )  # fmt: skip
            if WIDE_TILE:
                _stage(acc_a2, staging)
                _noise_of_staged(
                    staging, staging.shape[0], 0, tile + 1, num_cand_tiles, B, V, bias_ptr,
                    temperature_ptr, seed_ptr, cand_score_ptr, cand_index_ptr,
                    scalar_temperature, seed_lo, seed_hi, num_samples, quad_offset,
                    top_m_key_ptr, top_m_index_ptr, hidden_key_ptr, mass_ptr, top_k_ptr,
                    top_p_ptr, min_p_ptr,
                    HAS_BIAS, TEMPERATURE_MODE, SEED_MODE, LOGITS_DTYPE, EVEN_V, PLAIN, TOP_M,
                    ROW_MASS, KEY_LOW_BITS, TOP_K_MODE, TOP_P_MODE, MIN_P_MODE,
                )  # fmt: skip
                _stage(acc_b2, staging_b)
                _noise_of_staged(
                    staging_b, NB // staging_b.shape[1], NA, tile + 1, num_cand_tiles, B, V,
                    bias_ptr, temperature_ptr, seed_ptr, cand_score_ptr, cand_index_ptr,
                    scalar_temperature, seed_lo, seed_hi, num_samples, quad_offset,
                    top_m_key_ptr, top_m_index_ptr, hidden_key_ptr, mass_ptr, top_k_ptr,
                    top_p_ptr, min_p_ptr,
                    HAS_BIAS, TEMPERATURE_MODE, SEED_MODE, LOGITS_DTYPE, EVEN_V, PLAIN, TOP_M,
                    ROW_MASS, KEY_LOW_BITS, TOP_K_MODE, TOP_P_MODE, MIN_P_MODE,
                )  # fmt: skip
            n += 1

    # A scalar seed or temperature equal to 1 must not become a compile-time constant.
    @gluon.jit(do_not_specialize=["scalar_temperature", "seed_lo", "seed_hi", "quad_offset"])
    def _swapped_stage1(
        ha_desc, hb_desc, w_desc, bias_ptr, temperature_ptr, seed_ptr, cand_score_ptr,
        cand_index_ptr, top_m_key_ptr, top_m_index_ptr, hidden_key_ptr, mass_ptr,
        B, V, D, scalar_temperature, seed_lo, seed_hi, num_samples, quad_offset,
        HAS_BIAS: gl.constexpr, TEMPERATURE_MODE: gl.constexpr, SEED_MODE: gl.constexpr,
        LOGITS_DTYPE: gl.constexpr, EVEN_V: gl.constexpr, STAGES: gl.constexpr,
        NB: gl.constexpr, CONSUMER_REGISTERS: gl.constexpr, LOADER_REGISTERS: gl.constexpr,
        COOP: gl.constexpr = False, SWIZZLE: gl.constexpr = False,
        WIDE_TILE: gl.constexpr = False,  # (_consume_swapped)
        PLAIN: gl.constexpr = True,  # the sampling epilogue (cand_score / cand_index)
        TOP_M: gl.constexpr = 0,  # > 0: the truncating epilogue (_top_m_of_block)
        ROW_MASS: gl.constexpr = False,
        KEY_LOW_BITS: gl.constexpr = 0,
        # With PLAIN and TOP_M: the knobs' tensors (hopper_kernel._hopper_stage1's)
        top_k_ptr=None, top_p_ptr=None, min_p_ptr=None,
        TOP_K_MODE: gl.constexpr = 0, TOP_P_MODE: gl.constexpr = 0, MIN_P_MODE: gl.constexpr = 0,
        # 1: no tile if a row of the batch is truncated, 2: none if no row is (the two halves
        # of a split stage 1: dispatch._hopper_fused_sample / _hopper_swap_fused_sample);
        # 0: every tile.
        BATCH_TRUNCATES: gl.constexpr = 0,
    ):  # fmt: skip
        NA: gl.constexpr = ha_desc.block_type.shape[0]
        VT: gl.constexpr = 64
        NOISE_ROWS: gl.constexpr = 64 if NA >= 64 else NA
        if BATCH_TRUNCATES > 0:
            # The partitions loop over cdiv(V, 128) tiles: none with V = 0.
            rows = gl.arange(0, 128, gl.BlockedLayout([1], [32], [4], [0]))
            some_row = gl.max(any_row_truncates(
                rows, B, V, temperature_ptr, scalar_temperature, top_k_ptr, top_p_ptr,
                min_p_ptr, TEMPERATURE_MODE, TOP_K_MODE, TOP_P_MODE, MIN_P_MODE,
            ), axis=0)  # fmt: skip
            V = V * (some_row == BATCH_TRUNCATES - 1).to(gl.int32)
        w_bufs = gl.allocate_shared_memory(
            w_desc.dtype, [STAGES] + w_desc.block_type.shape, w_desc.layout
        )
        ha_bufs = gl.allocate_shared_memory(
            ha_desc.dtype, [STAGES] + ha_desc.block_type.shape, ha_desc.layout
        )
        hb_bufs = gl.allocate_shared_memory(
            hb_desc.dtype, [STAGES] + hb_desc.block_type.shape, hb_desc.layout
        )
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        # Per consumer, the first accumulator's logits transposed (fp32, no swizzle), in
        # blocks of NOISE_ROWS rows; the second's share it from 64 rows, else have their own.
        if SWIZZLE:
            # 16-byte groups of a row XOR the row (mod 8): the transposed stores of
            # _stage (8 vocabulary entries x 4 rows a warp) hit 32 banks, not 8.
            staging_layout: gl.constexpr = gl.SwizzledSharedLayout(4, 1, 8, [1, 0])
        else:
            staging_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        staging_shape: gl.constexpr = [NA // NOISE_ROWS, NOISE_ROWS, VT]
        staging0 = gl.allocate_shared_memory(gl.float32, staging_shape, staging_layout)
        staging1 = gl.allocate_shared_memory(gl.float32, staging_shape, staging_layout)
        if NB >= NOISE_ROWS:
            staging_b0 = staging0
            staging_b1 = staging1
        else:
            staging_b0 = gl.allocate_shared_memory(gl.float32, [1, NB, VT], staging_layout)
            staging_b1 = gl.allocate_shared_memory(gl.float32, [1, NB, VT], staging_layout)
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
            if COOP:  # both consumers read each stage
                mbarrier.init(empty.index(i), count=2)
            else:
                mbarrier.init(empty.index(i), count=1)
        for i in gl.static_range(2):
            mbarrier.init(turn.index(i), count=1)
        shared = (
            ha_bufs, hb_bufs, w_bufs, ready, empty, turn,
            bias_ptr, temperature_ptr, seed_ptr, cand_score_ptr, cand_index_ptr,
            top_m_key_ptr, top_m_index_ptr, hidden_key_ptr, mass_ptr,
            top_k_ptr, top_p_ptr, min_p_ptr,
            B, V, D, scalar_temperature, seed_lo, seed_hi, num_samples, quad_offset,
        )  # fmt: skip
        gl.warp_specialize(
            [
                # the default partition (the kernel's 4 warps), then the second consumer (the
                # constexprs one by one: in a tuple Triton 3.6 would make them tensors)
                (
                    _consume_swapped,
                    (0, staging0, staging_b0, shared, HAS_BIAS, TEMPERATURE_MODE, SEED_MODE,
                     LOGITS_DTYPE, EVEN_V, STAGES, NB, COOP, WIDE_TILE, PLAIN, TOP_M, ROW_MASS,
                     KEY_LOW_BITS, TOP_K_MODE, TOP_P_MODE, MIN_P_MODE),
                ),
                (
                    _consume_swapped,
                    (1, staging1, staging_b1, shared, HAS_BIAS, TEMPERATURE_MODE, SEED_MODE,
                     LOGITS_DTYPE, EVEN_V, STAGES, NB, COOP, WIDE_TILE, PLAIN, TOP_M, ROW_MASS,
                     KEY_LOW_BITS, TOP_K_MODE, TOP_P_MODE, MIN_P_MODE),
                ),
                (
                    _load_swapped,
                    (ha_desc, hb_desc, w_desc, ha_bufs, hb_bufs, w_bufs, ready, empty, V, D,
                     STAGES, NB),
                ),
            ],
            [4, 1],
            [CONSUMER_REGISTERS, LOADER_REGISTERS],
        )  # fmt: skip
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(ready.index(i))
            mbarrier.invalidate(empty.index(i))
        for i in gl.static_range(2):
            mbarrier.invalidate(turn.index(i))


def launch_stage1(
    hidden, weight, bias, temperature, scalar_temperature, seed, seed_lo, seed_hi,
    num_samples, logits_dtype, cand_score, cand_index, num_sms, temperature_mode, seed_mode,
    vocab_offset=0, coop=False, stage1=None, top_m=0, row_mass=False, key_low_bits=0,
    row_knobs=None, batch_truncates=0, wide_tile=False,
):  # fmt: skip
    """Stage 1 for 129-256 rows on a persistent grid of one program per SM; arguments and
    candidates as ``hopper_kernel.launch_stage1``'s (cand_* [B, num_samples, 2 * cdiv(V,
    128)], where ``cand_score`` is given), except that the truncating epilogue (``top_m``)
    writes ``stage1``'s buffers per 64-wide tile (``dispatch._truncation_buffers`` with
    block_v = VOCAB_TILE); ``coop``: the consumers share each stage's hidden
    (``_consume_swapped``); ``batch_truncates``: which half of a split stage 1 this launch is
    (BATCH_TRUNCATES); ``wide_tile``: each consumer's tile is 128 entries (WIDE_TILE)."""
    stage1 = stage1 or {}
    batch, hidden_size = hidden.shape
    vocab_size = weight.shape[0]
    if not MAIN_ROWS < batch <= 2 * MAIN_ROWS:
        raise ValueError(f"the swapped Hopper kernel takes 129-256 rows, got {batch}")
    extra = extra_rows(batch)
    # Padded so that no row box runs past the tensor (see rows_for_tma).
    padded = rows_for_tma(hidden, MAIN_ROWS + extra)
    ha_desc = hopper_kernel.TensorDescriptor.from_tensor(
        padded, [MAIN_ROWS, BLOCK_D], hopper_kernel._shared_layout(MAIN_ROWS, hidden.dtype)
    )
    hb_desc = hopper_kernel.TensorDescriptor.from_tensor(
        padded, [extra, BLOCK_D], hopper_kernel._shared_layout(extra, hidden.dtype)
    )
    if coop and wide_tile:
        raise ValueError("the cooperative and wide-tile schedules are exclusive")
    if wide_tile and batch > WIDE_TILE_ROWS_MAX:
        raise ValueError(f"128-entry tiles take up to {WIDE_TILE_ROWS_MAX} rows, got {batch}")
    two_tiles = coop or wide_tile  # (a stage holds 128 entries' weights)
    w_rows = 2 * VOCAB_TILE if two_tiles else VOCAB_TILE
    w_desc = hopper_kernel.TensorDescriptor.from_tensor(
        weight, [w_rows, BLOCK_D], hopper_kernel._shared_layout(w_rows, hidden.dtype)
    )
    num_tiles = triton.cdiv(vocab_size, 2 * VOCAB_TILE) * (2 * VOCAB_TILE // w_rows)
    launch(
        _swapped_stage1, (min(num_tiles, num_sms),),
        ha_desc, hb_desc, w_desc, bias, temperature, seed, cand_score, cand_index,
        stage1.get("top_m_key"), stage1.get("top_m_index"), stage1.get("hidden_key"),
        stage1.get("mass"), batch, vocab_size, hidden_size, scalar_temperature, seed_lo,
        seed_hi, num_samples, vocab_offset // 4,
        HAS_BIAS=bias is not None,
        TEMPERATURE_MODE=temperature_mode,
        SEED_MODE=seed_mode,
        LOGITS_DTYPE=hopper_kernel._GL_DTYPES.get(logits_dtype),
        EVEN_V=vocab_size % (2 * VOCAB_TILE) == 0,
        STAGES=_stages(extra, two_tiles),
        NB=extra,
        COOP=coop,
        WIDE_TILE=wide_tile,
        SWIZZLE=swizzled(batch, hidden_size),
        CONSUMER_REGISTERS=hopper_kernel.CONSUMER_REGISTERS,
        LOADER_REGISTERS=hopper_kernel.LOADER_REGISTERS,
        PLAIN=cand_score is not None,
        TOP_M=top_m,
        ROW_MASS=row_mass,
        KEY_LOW_BITS=0 if top_m < PACKED_TOP_M_MIN else key_low_bits,
        **(row_knobs or hopper_kernel._NO_ROW_KNOBS),
        BATCH_TRUNCATES=batch_truncates,
        num_warps=4,
    )  # fmt: skip
