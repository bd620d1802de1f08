"""The path a fused call takes through the kernels: the one place that chooses.

``op.py`` validates a call and, for the Triton implementation, calls ``triton_fused_sample``
here, which picks, from the shape, the device and the knobs:

* the stage 1 kernel and its tiles (``default_config``): the Triton kernel
  (``sampling_kernel.py``) with a full grid up to 64 rows and a persistent one above, or on
  Hopper the warp-specialized Gluon kernel (``hopper_kernel.py``) where it is faster and can
  run the call (no soft-cap, no log-probabilities, 16-bit TMA-readable tensors; a Gluon that
  does not compile turns it off for the process);
* stage 1's buffers: one candidate per (row, sample, vocabulary tile) for sampling, or for
  top-k / top-p / min-p each tile's m largest keys (``candidates_per_tile``),
  both where per-row knobs may leave rows untruncated;
* stage 2: the plain argmax over the candidates (``sampling_kernel.launch_stage2``), or the
  truncation's stage 2 and its exact fallback (``truncation_kernel.py``), and the raw logits
  of soft-capped log-probabilities.

The kernel files hold their kernels and launchers only; they import nothing from here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os

import torch
import triton
from triton.compiler.errors import CompilationError

from . import sampling_kernel, truncation_kernel
from .params import SamplingParams
from .sampling_device import LOGPROB_CODES, TL_DTYPES, is_hopper, key_low_bits, pdl_launch

__all__ = [
    "SampleConfig",
    "candidates_per_tile",
    "default_config",
    "merge_groups",
    "merge_keep",
    "merge_route_k_max",
    "overflow_chance",
    "patching_pays",
    "persistent_triton_stage1",
    "triton_fused_sample",
]

# FLASHSAMPLING_WARP_SPECIALIZED=0 keeps Hopper on the Triton kernel (default_config).
_WARP_SPECIALIZED = os.environ.get("FLASHSAMPLING_WARP_SPECIALIZED", "1") != "0"
# Stage 1 of a call whose per-row knobs may all be off, as two launches (``_split_stage1``):
# "gluon" (default) for the Gluon kernel, "1" for both stage-1 kernels, "0" for neither.
_SPLIT_STAGE1 = os.environ.get("FLASHSAMPLING_SPLIT_STAGE1", "gluon")
# Candidates per 64-wide tile for a per-row k tensor (``candidates_per_tile``; A/B runs).
_TENSOR_K_CANDIDATES_NARROW = int(os.environ.get("FLASHSAMPLING_TENSOR_K_CANDIDATES_64", "5"))
# The Gluon kernel's split stage 1 (knob tensors that may be off, 33-64 rows and more:
# ``_hopper_fused_sample``) with its halves as programmatic dependents: the first lets the
# second be scheduled as its persistent programs start, and only the second's last program
# waits for the first's end, so that when no row truncates the second's programs leave
# without a launch gap after the first. H200, B = 64, tokens equal in every cell, us: D =
# 2048 0-d knobs off / top-k 50 / Qwen3's 170.0 / 209.2 / 218.8 -> 169.2 / 209.3 / 218.3, D =
# 4096 317.3 / 350.9 / 360.4 -> 314.0 / 349.7 / 359.3, [B] knobs off / mixed / all 172.3 /
# 278.5 / 234.5 -> 169.2 / 275.9 / 234.2 (3 rounds, bench_off_knobs_nvidia-h200_gsplit*_
# 20261128-172*.csv); once before (with the fold, 2 rounds): D = 2048 off +0.9, D = 4096 off
# -1.9, [B] mixed -5.6 (..._ab-*_20261128-164*.csv).
GLUON_SPLIT_PDL = True


def _split_stage1(kernel: str) -> bool:
    """Whether stage 1 of a call with per-row knobs that may be off (both epilogues) runs
    as two launches of the ``kernel`` ("triton" or "gluon"): first the plain kernel, whose
    programs run their tiles only if no row of the batch is truncated, then the one with
    both epilogues, whose programs run them only if some row is (BATCH_TRUNCATES 1 and 2:
    each reads the batch's knobs first, on the device). A plain-sampling batch with its
    knobs at their off values then runs the plain kernel's code, not one that carries the
    top-m epilogue too (its registers and code cost the Gluon kernel ~9 us at B = 64, D =
    2048), for one launch whose programs return at once. On an H200 (D = 2048, 0-d knobs at
    their off values, CUDA graphs) that took the Gluon kernel's batch (B = 64) from 1.089x
    to 1.070x of plain sampling, but the Triton kernel's (B = 1 and 16, a full grid of 2374
    programs, each reading the knobs before its MMAs) from 1.057 / 1.047x to 1.073 /
    1.065x (bench_off_knobs_nvidia-h200_{base,split}_20261127-2358.csv): the Triton kernel
    keeps one launch unless FLASHSAMPLING_SPLIT_STAGE1=1 (the CPU tests use it)."""
    return _SPLIT_STAGE1 == "1" or _SPLIT_STAGE1 == kernel


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
    # On Hopper, plain sampling (and greedy) at 129-256 rows takes the warp-specialized kernel
    # with the vocabulary on the MMA's M (hopper_swap_kernel.py), its consumers "ping-pong",
    # "ping-pong-wide" (128-entry tiles) or "cooperative"; other calls as above.
    warp_specialized_swap: str = ""
    # The swapped kernel's top-m epilogue also for calls whose knobs truncate every row
    # (``swap_wide_tiles``; knob tensors that may be off take it anyway: ``swap_serves_knobs``).
    swap_truncating: bool = False
    # The Gluon kernel with one m64n128 MMA a k step instead of two m64n64
    # (hopper_kernel's WIDE_MMA): see _large_batch_gluon_rows.
    wide_mma: bool = False


# On Hopper, calls whose knobs truncate every row take default_config's swap-AB Triton tiles
# up to this many rows; past it and up to 32 rows the Gluon kernel's 64-row tiles, as at
# 33-64 rows. H200, D = 2048, B = 32, whole calls over cuBLAS, swap-AB -> Gluon: top-k 50
# 1.053 -> 1.042, top-k 50 + top-p 0.9 1.063 -> 1.052, top-p 0.9 1.145 -> 1.117, min-p 0.1
# 1.078 -> 1.043, tokens equal (truncation_ab_h200_20261128-1351; was 32; B = 17-31 not
# timed then).
TRUNCATING_SWAP_ROWS_MAX = 16
# The Gluon kernel's rows a tile for calls whose knobs truncate every row at 65-128 rows,
# with its wide MMA (one m64n128 a k step). 128-row tiles read each W tile once (64-row ones
# twice, the second time from L2) where the H200 runs at its power cap: H200, D = 2048, B =
# 96 / 128, whole calls over cuBLAS, 64 -> 128 rows: top-k 50 1.167 / 1.166 -> 1.124 / 1.109,
# top-k 50 + top-p 0.9 1.174 / 1.180 -> 1.133 / 1.130, min-p 0.1 1.154 / 1.171 -> 1.115 /
# 1.115, tokens equal (truncation_ab_h200_20261128-1416). Not for top-p without top-k,
# whose mass partials (``writes_mass_partials``) made it 1.147 / 1.165 -> 1.474 / 1.457: 64.
# The wide MMA there, 64-row tiles: top-k 50 1.166 / 1.177 -> 1.161 / 1.175, top-k 50 +
# top-p 0.9 1.182 / 1.185 -> 1.170 / 1.177, min-p 1.167 / 1.176 -> 1.154 / 1.168, top-p alone
# 1.316 / 1.333 -> 1.311 / 1.320; even at 48 / 64 rows (truncation_ab_h200_20261128-1351).
TRUNCATING_TILE_ROWS_65_128 = 128
MASS_TILE_ROWS_65_128 = 64
TRUNCATING_WIDE_MMA_65_128 = True
# Plain sampling (T > 0, one seed for the batch) at 65-128 rows on a whole vocabulary: the
# Gluon kernel's 128-row tiles with its wide MMA, not the 64-row tiles with two m64n64 MMAs a
# step. H200, one process, min over 4-5 rounds over cuBLAS alone, T = 1, 0-d seed, tokens
# equal (large_batch_mid_h200_20261128-2054: benchmarks/probes/large_batch_ab.py --what mid),
# B = 80 / 96 / 112 / 128, 64-row -> 128-row wide tiles: D = 2048 1.110 / 1.096 / 1.102 /
# 1.099 -> 1.067 / 1.052 / 1.083 / 1.048; D = 4096 1.042 / 1.065 / 1.076 / 1.046 -> 1.024 /
# 1.012 / 1.038 / 1.037; D = 8192 1.015 / 1.070 / 1.076 / 1.034 -> 0.989 / 1.045 / 1.032 /
# 1.032. Not for per-row seeds (128-row tiles spill with them) nor greedy, which these
# tiles did not speed up: T = 0, switch off -> on, B = 65 / 96 / 128, D = 2048 1.017 / 0.994 /
# 0.957 -> 1.018 / 0.999 / 0.964, D = 4096 1.030 / 1.019 / 0.998 -> 1.044 / 1.034 / 1.007,
# D = 8192 1.017 / 1.080 / 1.053 -> 1.016 / 1.079 / 1.033 (large_batch_greedy_mid_h200_
# 20261128-2107: the rule with greedy in it for that run).
PLAIN_WIDE_TILES_65_128 = True
# The same at 193-256 rows, where the other truncating calls take 128-row tiles
# (``_large_batch_gluon_rows``): H200, top-p 0.9 alone on bench_sampling's rows (bf16
# logits), wide 128-row tiles -> 64-row ones, tokens equal: D = 2048 B = 224 384.2 -> 337.7
# us (sweep_cells_ab_h200_20261128-1625); over cuBLAS, D = 2048 / 4096 / 8192, B = 224 1.741
# / 1.668 / 1.317 -> 1.552 / 1.548 / 1.229, B = 256 1.612 / 1.469 / 1.159 -> 1.409 / 1.298 /
# 1.079 (-1644).
MASS_TILE_ROWS_193_256 = 64


def _swap_ab_config(batch: int) -> SampleConfig:
    """Up to 32 rows: the vocabulary as the MMA's M (swap-AB), W streamed at the memory floor."""
    return SampleConfig(max(16, triton.next_power_of_2(batch)), 64, 128, num_stages=4)


def default_config(
    batch: int,
    hidden_size: int,
    device: torch.device,
    truncates: bool = False,
    vocab_size: int | None = None,
    knobs_per_row: bool = False,
    per_row_seed: bool = False,
    mass_partials: bool = False,
    greedy: bool = False,
) -> SampleConfig:
    """The configuration for a shape, chosen ahead of time (no autotuning on the call path)
    from sweeps on an H200 and an H100 (benchmarks/results/kernel_sweep_*.json); ``truncates``
    for a call with top-k / top-p / min-p, whose stage 1 keeps each tile's largest scores
    instead of drawing noise; ``vocab_size`` the rows of the weight this call sees (a
    tensor-parallel shard's, V / P), when known; ``knobs_per_row`` for truncating knobs
    that may leave rows untruncated (tensors, as ``generate`` and continuous batching pass
    them: ``knobs_may_be_off``), whose stage 1 carries both epilogues; ``per_row_seed`` for
    a [B] seed tensor (``_large_batch_gluon_rows``), ``mass_partials`` for a stage 1 that
    writes top-p's mass partials (``writes_mass_partials``), ``greedy`` for a scalar
    temperature of 0 (``swap_wide_tiles``)."""
    if device.type != "cuda":
        # The interpreter runs one program at a time: few, large tiles are fastest.
        return SampleConfig(min(max(16, triton.next_power_of_2(batch)), 64), 256, 64)
    truncates_every_row = truncates and not knobs_per_row
    gluon_from_17 = (
        truncates_every_row and batch > TRUNCATING_SWAP_ROWS_MAX and _WARP_SPECIALIZED
        and is_hopper(device)
    )  # fmt: skip
    if batch <= 32 and not gluon_from_17:
        return _swap_ab_config(batch)
    # From 33 rows on Hopper: the warp-specialized kernel, whose loader warp keeps
    # the copies going while a consumer warpgroup draws noise; 1-10% under the Triton
    # kernel's time on an H200 (benchmarks/results/warp_specialized_h200_20261121.txt).
    # 64-row tiles up to 128 rows too: 128-row ones are no faster there and spill with
    # per-row seeds. FLASHSAMPLING_WARP_SPECIALIZED=0 turns it off.
    # From 129 to 192 rows too (three 64-row blocks, W read from HBM once and from L2 by the
    # other blocks), where it beats the Triton kernel's two 128-row blocks: H200, B = 144-192,
    # D = 2048 265-275 us against 317-334; at D >= 4096 only above 160 rows (at 144-160 the
    # two are even plain and Gluon is 5-12% slower with top-k 50); above 192 the Triton
    # kernel wins (large_batch_stage1_padded_h200_20261127-0755.log). Since measured again:
    # calls that truncate every row, and plain ones at 193-256 rows and D = 4096, take the
    # Gluon kernel's wide MMA at 129-256 rows (``_large_batch_gluon_rows``, below).
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
    # A short vocabulary at D = 4096 (a tensor-parallel shard: V / 4 = 37984 rows) leaves the
    # wide tiles too few to fill the SMs (297 tiles of 128 rows on 132 SMs) and each tile too
    # short a reduction to hide its noise. H200, plain sampling against cuBLAS on the same
    # shard: B = 64 1.53x (Gluon, 128-wide) -> 1.12x on 64-wide Triton tiles; B = 256 1.57x
    # (256-wide) -> 1.41x on 128-wide tiles, two programs per SM (kernel_sweep_tp_shards_
    # h200_20261127-1710.log). At V / 2 = 75968 and at D = 8192 the usual tiles win. (On
    # Hopper at 129-256 rows the short shard takes the Gluon kernels instead: _swap_rows_max,
    # _large_batch_gluon_rows.)
    short_vocab_shard = (
        vocab_size is not None and vocab_size < 48_000 and 2048 < hidden_size <= 4096
    ) and not truncates
    if batch <= 64 and short_vocab_shard:
        return SampleConfig(64, 64, 64, swap_ab=False, num_stages=4)
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
    if batch > 128 and short_vocab_shard:
        triton_config = dataclasses.replace(triton_config, epilogue_chunks=2)
    elif batch > 128 and hidden_size >= 4096:
        # Long reductions: wider vocabulary tiles feed the MMAs better than a second program
        # per SM overlaps the noise (1-5% on H100 and H200; b256_tiles_and_host_h200_*).
        triton_config = SampleConfig(
            128, 256, 64, swap_ab=False, num_warps=8, num_stages=3,
            tma=True, programs_per_sm=1, epilogue_chunks=4,
        )  # fmt: skip
    # Plain sampling and greedy from 129 rows: the swapped Gluon kernel (the batch on the MMA's
    # N: B = 144 computes 144 rows, not 192 or 256). H200, whole calls against the choice
    # above, T = 1 / per-row temperatures and seeds / greedy: D = 8192 B = 144 898 -> 700 /
    # 984 -> 709 / 822 -> 689 us, B = 192 879 -> 794 / 919 -> 812 / 882 -> 768; D = 4096 B =
    # 144 579 -> 421; D = 2048 B = 144 294 -> 242, B = 160 294 -> 254
    # (swap_stage1_h200_20261127-2027_*, benchmarks/probes/swap_stage1.py). With swizzled staging
    # (hopper_swap_kernel.swizzled) also up to 256 rows at D <= 4096: per-row temperatures and
    # seeds 8-9% faster at B = 224 / 256 (D = 2048 395 -> 363 / 396 -> 362 us, D = 4096 636 ->
    # 581 / 636 -> 582), T = 1 3-5% faster at D = 2048 and even to 3% slower at D = 4096 (the
    # same Triton kernel timed twice in that run differed by up to 7%); at D = 8192 224-256 rows
    # 1-9% slower, and greedy above 192 rows 2-9% slower at D = 4096 (within that noise at
    # D = 2048; triton_fused_sample keeps it off: SWAP_GREEDY_ROWS_MAX;
    # swap_stage1_h200_20261127-2311_*: "old" and "default" are the same kernel there).
    # Truncating calls: see swap_serves_knobs.
    large_batch_rows = _large_batch_gluon_rows(
        batch, hidden_size, truncates, per_row_seed, short_vocab_shard, mass_partials
    )
    # (truncating calls: measured on whole vocabularies only, not on a tensor-parallel shard's)
    whole_vocab = vocab_size is None or vocab_size >= 100_000
    gluon_rows_here = whole_vocab or not truncates
    wide_tiles = swap_wide_tiles(batch, hidden_size, truncates, greedy) and whole_vocab
    if large_batch_rows and _WARP_SPECIALIZED and not knobs_per_row and gluon_rows_here:
        if is_hopper(device):
            # (the Gluon tiles stay the choice where the swapped kernel cannot run)
            swap_truncating = truncates and wide_tiles
            return dataclasses.replace(
                triton_config, warp_specialized_rows=large_batch_rows, wide_mma=True,
                warp_specialized_swap="ping-pong-wide" if swap_truncating else "",
                swap_truncating=swap_truncating,
            )  # fmt: skip
    swap = (
        _WARP_SPECIALIZED
        and 128 < batch <= _swap_rows_max(hidden_size, short_vocab_shard)
        and is_hopper(device)
    )
    if knobs_per_row:
        # Both epilogues (knob tensors that may be off) in the persistent Triton tiles spill: ptxas
        # for sm_90a (Triton 3.9) gives them 1720 bytes of stack a thread at D = 2048 and 2408 at D
        # = 4096, against 48 / 184 for plain sampling; such calls took 3.7-6.6x of cuBLAS alone
        # (H100 D = 2048 B = 256, D = 4096 B = 144 / 256, swap_knobs_h100_20261128-0224_*; H200 D =
        # 2048 B = 144 / 256, profile: stage 1 975 us of the call's ~990 at B = 144,
        # swap_knobs_big4_h200_20261128-0309_*). On Hopper they take the Gluon kernel's 64-row tiles
        # at every batch, or the swapped kernel where it is faster (``_swap_takes_knobs``). (Off
        # Hopper they keep these tiles: 64 x 64 ones with eight warps, which do not spill, were
        # 8-38% faster at B = 144 but up to 18% slower at B = 256 with truncated rows, H200.)
        hopper_rows = 64 if _WARP_SPECIALIZED and is_hopper(device) else 0
        swap = swap and _swap_takes_knobs(batch, hidden_size)
    truncates_65_128 = truncates_every_row and hopper_rows and batch <= 128 and whole_vocab
    if truncates_65_128:
        hopper_rows = MASS_TILE_ROWS_65_128 if mass_partials else TRUNCATING_TILE_ROWS_65_128
    plain_65_128 = (
        PLAIN_WIDE_TILES_65_128 and hopper_rows and batch <= 128 and whole_vocab
        and not (truncates or knobs_per_row or per_row_seed or greedy)
    )  # fmt: skip
    if plain_65_128:
        hopper_rows = 128
    # (the Triton tiles stay the fallback of calls the Gluon kernel cannot run: soft-cap, fp32)
    schedule = "ping-pong-wide" if wide_tiles and not knobs_per_row else "ping-pong"
    return dataclasses.replace(
        triton_config,
        wide_mma=bool(truncates_65_128 and TRUNCATING_WIDE_MMA_65_128 or plain_65_128),
        warp_specialized_rows=hopper_rows,
        warp_specialized_swap=schedule if swap else "",
    )


# Shared memory for stage 1's pipelined operand tiles (Hopper has 227 KB a block; the
# epilogue's scratch reuses the same memory).
OPERAND_SHARED_MEMORY = 200 * 1024


def _fit_operand_stages(config: SampleConfig, element_size: int) -> SampleConfig:
    """``config`` with fewer pipeline stages where its operand tiles would overflow shared
    memory: the configurations are sized for 16-bit operands, and fp32 ones (an fp32 LM head)
    take twice the bytes. H200, D = 4096, fp32, 4096 rows: the 128 x 256 x 64 tiles' three
    stages asked for 294912 bytes of the 232448 a block has, and the launch failed
    (benchmarks/results/session20_h200_20261129/whole_row_ab_tf32_2048.log, its D = 4096
    cell; with the stages fitted: fp32_d4096_smem.log)."""
    per_stage = (config.block_b + config.block_v) * config.block_d * element_size
    stages = max(1, min(config.num_stages, OPERAND_SHARED_MEMORY // per_stage))
    return config if stages == config.num_stages else dataclasses.replace(config, num_stages=stages)


def persistent_triton_stage1(
    batch: int, hidden_size: int, vocab_size: int, device: torch.device, params: SamplingParams
) -> bool:
    """Whether a plain call's stage 1 (``triton_fused_sample`` without a ``config``) is the
    Triton kernel on a persistent grid (``programs_per_sm``: every program resident at once),
    not a full grid of one tile a program nor a Gluon kernel. The TP exchange after such a
    stage 1 is launched as its programmatic dependent (``exchange.exchange_launches_pdl``)."""
    if params.truncates or params.logprobs or batch == 0:
        return False
    config = default_config(
        batch, hidden_size, device, False, vocab_size, knobs_may_be_off(params, vocab_size)
    )
    gluon = (config.warp_specialized_rows or config.warp_specialized_swap) and not params.softcap
    return config.programs_per_sm > 0 and not gluon


def _widen_truncation_tiles(config, params, vocab_size, hidden) -> SampleConfig:
    """``config`` with 128-wide tiles where ``_wide_truncation_tiles`` asks for them: truncating
    calls that stage 2 does not merge keep m candidates per tile for stage 2, one program per
    row, and 128-wide tiles halve them. H100, D = 2048, B = 1 (before the merge): stage 2 40
    -> 27 us (top-k 50); stage 1 7-9 us slower."""
    if _wide_truncation_tiles(params, vocab_size) and hidden.is_cuda and config.block_v < 128:
        return dataclasses.replace(config, block_v=128)
    return config


def _wide_truncation_tiles(params: SamplingParams, vocab_size: int) -> bool:
    """Whether a truncating call at B <= 32 takes 128-wide tiles instead of 64 (see the call
    site). Not when stage 2 merges its candidates per group of tiles (most calls): it then
    sees the groups' largest (1024 or 2048) whatever the tile width, and 64-wide tiles cost
    stage 1 less and overflow less. Otherwise for top-k on every row (k > 1024, m = 16
    candidates per tile: half as many on 128-wide tiles), not for top-p without top-k, whose
    nucleus may hold hundreds of tokens (433 in the zipf-4 rows of
    benchmarks/probes/fast_path_rate.py): spread at random, such a row overflows to the exact path
    in ~4.5% of rows over 1187 tiles against ~0.3% over 2374 (Poisson estimate of a tile
    holding more than 4)."""
    if not params.truncates or merge_keep(params, vocab_size):
        return False
    top_k_on_every_row = params.top_k is None and 0 < params.scalar_top_k < vocab_size
    top_p_may_be_on = params.top_p is not None or params.scalar_top_p < 1.0
    return top_k_on_every_row or not top_p_may_be_on


# Stage 2's candidates are first merged in groups of tiles (one program per row and group)
# into each group's MERGE_KEEP largest (``merge_keep``, ``merge_groups``): MERGE_GROUPS *
# MERGE_KEEP per row at most instead of tiles * m (9496 at V = 151936 on 64-wide tiles with
# m = 4). Tests lower them to merge small rows.
MERGE_GROUPS = 64
MERGE_KEEP = 32
# At every batch: the merge (64 one-warp programs per row, 4-16 us) is cheaper than stage 2's
# search over the 4748-9496 candidates it replaces. H100, whole calls, D = 2048, unmerged ->
# merged: B = 64 top-p 0.9 281 -> 268 us; B = 128 top-k 50 261 -> 256, top-p 0.9 296 -> 278;
# B = 256 top-k 50 364 -> 346, top-p 0.9 439 -> 402 (merge_above_64_rows_h100_*.log). (An
# older stage 1 and stage 2 had it cost B = 256 15-20 us more, so it once stopped at 64.)


def overflow_chance(survivors: int, block_v: int, vocab_size: int, m: int) -> float:
    """The chance that some ``block_v``-wide tile of a row holds more than m of its
    ``survivors`` tokens, spread at random (per tile Poisson with mean survivors * block_v /
    V, then over the row's tiles): the rate at which such a row takes the exact fallback."""
    mean = survivors * block_v / vocab_size
    # (P(X <= m) term by term in log space: exp(-mean) alone underflows on small vocabularies)
    head = sum(math.exp(i * math.log(mean) - mean - math.lgamma(i + 1)) for i in range(m + 1))
    return min(1.0, max(0.0, 1.0 - head) * triton.cdiv(vocab_size, block_v))


def candidates_per_tile(params: SamplingParams, block_v: int, vocab_size: int, batch: int) -> int:
    """m: how many of its largest scores each (row, ``block_v``-wide vocabulary tile) keeps
    for stage 2.

    A row overflows (to an exact but slower path: for k <= 256 the row's logits recomputed,
    one more read of W) only when one tile holds more than m of the tokens it keeps, and
    each slot costs stage 1 a reduction over the tile. With a Python k up to 256 on every
    row, m is the smallest that lets at most one call in 1000 overflow (``batch`` times
    ``overflow_chance`` for k survivors <= 1e-3), and no more than the table below (which
    caps it at B = 256, 128-wide tiles: ~4e-6 a row, 1.1e-3 a call); at V =
    151936: B = 1 k = 50 3, k = 256 4 (64-wide tiles); B = 16 k = 256 5; B = 64 (128-wide)
    k = 50 4, k = 256 6; B = 256 on 256-wide tiles (D >= 4096) k = 256 8. On an H200, D =
    2048, each slot fewer took 1.5-2.3 us off B = 1 and 16 calls (6 -> 5 at k = 256: 171.3 ->
    169.3 us at B = 1, truncation_levers_h200_20261126-0140.log; then per call instead of
    per row, B = 1 top-k 50 165.8 -> 164.0, top-k 256 168.4 -> 166.9, B = 16 top-k 50 169.0
    -> 166.7: candidates_per_call_and_merge_groups_h200_20261126-0150.log). Otherwise
    (larger k, per-row k, top-p or min-p alone) the table, with k counted as k * block_v /
    128 (wider tiles hold proportionally more): a chance of 4e-4 a row for m = 8 at k =
    1024 (such rows mostly take the tile-level patch); a per-row k tensor gets 8, top-p or
    min-p alone 4 (6 on wider tiles: their kept set's size is unknown ahead). A per-row k
    tensor gets 8 on 128-wide tiles or wider and 5 on 64-wide ones (the small-batch Triton
    tiles): the fewest with which a row overflows with chance < 1e-3 at every k that stage 2
    draws from the merged candidates (up to MERGE_ROUTE_K_MAX = 512: 2.6e-4 at V = 151936;
    1.4e-2 at k = 1024, whose row then takes the tile-level patch). Each slot costs the
    stage 1 that carries both epilogues ~5 us: H200, D = 2048, generate's top-k 50 as 0-d
    tensors, B = 1 / 16, 6 -> 5 slots 196.8 -> 190.7 / 195.3 -> 190.1 us (4: 185.4 / 186.0,
    but k = 512 rows would overflow with chance 9e-3), off-valued knobs unchanged
    (bench_off_knobs_nvidia-h200_ab-d2048-0d_20261128-0901.csv)."""
    scale = max(1, block_v // 128)
    if params.top_k is not None:
        return 8 if block_v >= 128 else _TENSOR_K_CANDIDATES_NARROW
    k = params.scalar_top_k
    if k <= 0:
        return 4 if scale == 1 else 6
    table = 4 if k * scale <= 64 else 6 if k * scale <= 256 else 8 if k * scale <= 1024 else 16
    if k > 256:
        return table
    return _fewest_candidates(k, block_v, vocab_size, batch, table)


@functools.cache
def _fewest_candidates(k: int, block_v: int, vocab_size: int, batch: int, table: int) -> int:
    # (cached: the search costs 15-30 us of Python, on every call's host path)
    for m in range(1, table):
        if batch * overflow_chance(k, block_v, vocab_size, m) <= 1e-3:
            return m
    return table


# False: the stage-1 choice at 129-256 rows before _large_batch_gluon_rows (A/B runs).
LARGE_BATCH_GLUON = True


def _large_batch_gluon_rows(
    batch: int,
    hidden_size: int,
    truncates: bool,
    per_row_seed: bool = False,
    short_vocab: bool = False,
    mass_partials: bool = False,
) -> int:
    """Rows per tile of the Gluon kernel with its wide MMA (``SampleConfig.wide_mma``) for a
    call at 129-256 rows whose knobs truncate every row (scalars), or plain sampling at
    193-256 rows and 2048 < D <= 4096 (64-row tiles on a ``short_vocab`` shard, below);
    0: the choice below it in ``default_config``. A stage 1 that writes top-p's mass partials
    (``mass_partials``) takes MASS_TILE_ROWS_193_256 above 192 rows.

    H200, one process, CUDA-graph medians (min of two rounds) over cuBLAS alone, top-k 50:
    the previous choice (the Gluon kernel's 64-row tiles with two m64n64 MMAs a step up to
    192 rows at D = 2048, else the Triton kernel) against 64-row tiles with the wide MMA up
    to 192 rows and 128-row ones above: D = 2048 B = 144 1.37 -> 1.35, B = 224 / 256 1.51 /
    1.41 -> 1.35 / 1.32; D = 4096 B = 144 / 160 1.80 / 1.66 -> 1.32 / 1.26, B = 224 / 256
    1.45 / 1.40 -> 1.25 / 1.20; D = 8192 B = 144 / 160 1.63 / 1.63 -> 1.27 / 1.48 (1.29 on
    the narrow MMA), B = 256 1.19 -> 1.12. Plain sampling, D = 4096, the swapped kernel ->
    128-row tiles: B = 224 1.48 -> 1.28, B = 256 1.34 -> 1.29; at D = 2048 and 8192 and below
    193 rows the swapped kernel (or, at D = 8192 above 192 rows, the Triton kernel) stays
    ahead or even (large_batch_ab_h200_20261128-1050: benchmarks/probes/large_batch_ab.py).
    Logits rounded to bf16 first (``logits_dtype``, as a bf16 model's step asks) take the same
    tiles since their 4-slot top-m search on 64-row tiles is no longer the packed one
    (``hopper_kernel.PACKED_TOP_M_MIN_64_ROWS``): D = 4096 / 2048, B = 144, old choice ->
    64-row wide tiles, top-k 50 1.62 / 1.37 -> 1.28 / 1.33, top-p 0.9 1.82 / 1.51 -> 1.38 /
    1.48 (large_batch_rounding_h200_20261128-1413).

    A tensor-parallel shard's stage 1 (plain sampling, per-tile candidates), H200, stage 1
    alone against cuBLAS on the shard, one process, three rounds round-robin
    (short_shard_stage1_nvidia-h200_20261128-1626.json: benchmarks/probes/short_shard_stage1.py):
    on D = 4096's short shard (``short_vocab``, V / 4 = 37984 rows) at 224 / 256 rows the
    64-row wide tiles took 140.8 / 145.5 us against the persistent Triton tiles' 156.7 /
    154.7 (the 64-row narrow ones 142.4 / 146.9, 128-row wide 144.6 / 155.8: 297 vocabulary
    tiles of 128 rows leave the last of 4.5 waves half idle); at V / 2 = 75968 the 128-row
    wide tiles, as on a whole vocabulary, 286.9 / 285.4 against the swapped kernel's 292.3 /
    293.1. (64-row tiles with per-row seeds do not spill: 168 registers, no stack.)"""
    if not LARGE_BATCH_GLUON or not 128 < batch <= 256:
        return 0
    if truncates:  # (the top-m epilogue draws no noise: per-row seeds do not matter)
        return 64 if batch <= 192 else MASS_TILE_ROWS_193_256 if mass_partials else 128
    if not (batch > 192 and 2048 < hidden_size <= 4096):
        return 0
    if short_vocab:
        return 64
    # (128-row tiles with per-row seeds spill: 632 bytes a thread, Triton 3.9, sm_90a)
    return 0 if per_row_seed else 128


# Plain sampling on D = 4096's short shard (default_config's ``short_vocab_shard``) takes the
# swapped kernel up to this many rows (from 129): H200, stage 1 alone at V / 4 = 37984 rows,
# B = 144 / 160, 107.7 / 111.9 us against the persistent Triton tiles' 150.4 / 147.0 (cuBLAS
# 85.6 / 91.5); at 176 / 192 rows 123.7 / 120.5 against the Gluon kernel's 64-row tiles'
# 114.2-116.8 / 112.6-115.4, which it keeps there
# (short_shard_stage1_nvidia-h200_20261128-1626.json).
SHORT_SHARD_SWAP_ROWS_MAX = 160


def _swap_rows_max(hidden_size: int, short_vocab_shard: bool = False) -> int:
    """The most rows plain sampling takes the swapped kernel for (from 129; default_config)."""
    if short_vocab_shard:
        return SHORT_SHARD_SWAP_ROWS_MAX
    return 192 if hidden_size > 4096 else 256


def _swap_takes_knobs(batch: int, hidden_size: int) -> bool:
    """Whether a call with knobs that may be off takes the swapped kernel at 129-256 rows
    (else the Gluon kernel's 64-row tiles, with the swapped kernel as their plain half:
    SWAP_PLAIN_HALF). Up to 160 rows, where its second accumulator holds at most 32 rows
    (``hopper_swap_kernel.extra_rows``). H200, us, 0-d knobs off / top-k 50 / [B] mixed /
    top-p 0.9, swapped against Gluon (swap_knobs.py time,
    benchmarks/results/swap_knobs_big4_h200_20261128-0309_*): D = 2048 B = 129 264 / 351 /
    429 / 363 against 277 / 397 / 532 / 402, B = 160 273 / 391 / 476 / 409 against 287 / 396
    / 510 / 403, B = 192 316 / 441 / 636 / 449 against 287 / 396 / 496 / 403, B = 256 374 /
    510 / 727 / 529 against 364 / 474 / 601 / 482; D = 4096 B = 144 502 / 587 / 628 / 594
    against 558 / 571 / 721 / 617, B = 192 529 / 626 / 835 / 625 against 559 / 587 / 671 /
    587, B = 256 647 / 744 / 977 / 747 against 695 / 733 / 824 / 736 (B = 224 even: 3056
    against 3120 over the four). Not measured at D = 8192."""
    return hidden_size <= 4096 and batch <= 160


# The swapped kernel's consumers on 128-entry vocabulary tiles ("ping-pong-wide":
# hopper_swap_kernel.WIDE_TILE) where ``swap_wide_tiles`` says; False: never (A/B runs).
SWAP_WIDE_TILES = True
SWAP_WIDE_TILE_ROWS_MAX = 192  # (hopper_swap_kernel.WIDE_TILE_ROWS_MAX: spills above)


def swap_wide_tiles(batch: int, hidden_size: int, truncates: bool, greedy: bool) -> bool:
    """Whether a call at 129-192 rows on a whole vocabulary takes the swapped kernel with its
    consumers on 128-entry tiles: every hidden row read from L2 once per 128 vocabulary
    entries instead of 64, at the cost of a longer epilogue per tile with more accumulators
    held through it. Calls whose knobs truncate every row then run its top-m epilogue
    instead of the Gluon kernel's wide 64-row tiles (``_large_batch_gluon_rows``), which
    compute 192 rows at B = 144 and read each weight tile three times.

    H200, 2026-11-28 16:25 UTC, one process, CUDA-graph medians, fastest of two rounds over
    cuBLAS, bench_sampling's calls (logits rounded to bf16, a 0-d seed, std-5 logits), tokens
    equal (large_batch_ab.py --what truncating / swapped, wide10_job.sh round 1; files
    benchmarks/results/large_batch_wide_tiles_h200_20261128-1625/). Top-k 50 / top-k 50 +
    top-p 0.9 / top-p 0.9 / min-p 0.1, Gluon wide 64-row tiles -> 128-entry swapped tiles:
    D = 8192 B = 144 1.581 / 1.567 / 1.611 / 1.570 -> 1.182 / 1.208 / 1.227 / 1.200, B = 160
    1.487 / 1.570 / 1.497 / 1.502 -> 1.210 / 1.234 / 1.240 / 1.200, B = 192 1.321 / 1.322 /
    1.407 / 1.289 -> 1.174 / 1.160 / 1.277 / 1.177; D = 4096 B = 144 1.287 / 1.276 / 1.456 /
    1.294 -> 1.201 / 1.258 / 1.308 / 1.223, B = 160 1.279 / 1.316 / 1.398 / 1.282 -> 1.233 /
    1.255 / 1.321 / 1.267, but B = 192 1.171 / 1.169 / 1.245 / 1.167 -> 1.156 / 1.211 /
    1.586 / 1.180 (the 64-entry swapped tiles 1.19-1.29 at D >= 4096). Plain T = 1 / greedy,
    the swapped kernel's 64-entry tiles -> 128: D = 8192 B = 144 1.303 / 1.268 -> 1.187 /
    1.143, B = 160 1.333 / 1.256 -> 1.213 / 1.099, B = 192 1.135 / 1.068 -> 1.043 / 0.966;
    D = 4096 B = 144 1.258 / 1.199 -> 1.111 / 1.079, B = 160 1.247 / 1.199 -> 1.322 / 1.103,
    B = 192 1.275 / 1.118 -> 1.415 / 1.026; D = 2048 B = 144 1.265 / 1.127 -> 1.227 / 1.041,
    B = 160 1.282 / 1.128 -> 1.547 / 1.046, B = 192 1.314 / 1.141 -> 1.950 / 1.035. So the
    matmul gains everywhere (greedy), but with noise past 144 rows (a second accumulator of
    32-64 rows) the epilogue is no longer hidden below D = 8192 (no spill: Triton 3.6 gives
    the plain kernel no stack at 160 / 192 rows; its code is twice the 64-entry tiles', 10032
    / 12960 SASS instructions against 5240 / 6768: swap_kernel_sass.py). At D = 2048 truncating
    calls gain at 144 rows only (top-k 50 1.320 -> 1.299) and lose from 160 (top-p 0.9 at 192
    1.468 -> 2.136): they keep the Gluon tiles.

    This rule against the choice before (SWAP_WIDE_TILES off), round 2 (16:44 UTC, fastest of
    three rounds, large_batch_ab.py --what wide, files -1644/ beside the above; new faster in
    all 27 cells that changed, tokens equal): plain T = 1 / per-row temperatures and seeds /
    greedy / top-k 50 / top-k 50 + top-p 0.9 / top-p 0.9 / min-p 0.1, D = 8192 B = 144 1.189 /
    1.251 / 1.224 / 1.326 / 1.439 / 1.446 / 1.490 -> 1.139 / 1.146 / 1.091 / 1.151 / 1.136 /
    1.175 / 1.162, B = 160 1.27-1.46 -> 1.15-1.19, B = 192 1.12-1.34 -> 1.03-1.17; D = 4096
    B = 144 1.19-1.39 -> 1.04-1.27, B = 160 (greedy and truncating) 1.16-1.35 -> 1.10-1.30, B
    = 192 greedy 1.097 -> 1.036; D = 2048 B = 144 plain / per-row / greedy 1.211 / 1.217 /
    1.118 -> 1.158 / 1.175 / 1.035."""
    if not SWAP_WIDE_TILES or not 128 < batch <= SWAP_WIDE_TILE_ROWS_MAX:
        return False
    if truncates:
        return hidden_size > 4096 or (hidden_size > 2048 and batch <= 160)
    return greedy or hidden_size > 4096 or batch <= 144


def writes_mass_partials(params: SamplingParams, vocab_size: int) -> bool:
    """Whether a truncating call's stage 1 writes top-p's mass partials (each tile's max and
    sum of exp2): top-p may be on where top-k may be off, or is measured on the whole row
    (``top_p_whole_row``), so a row's nucleus is over the whole row's mass, which the
    candidates lack."""
    p_may_be_on = not (params.top_p is None and params.scalar_top_p >= 1.0)
    return p_may_be_on and (params.top_p_whole_row or _k_may_be_off(params, vocab_size))


def knobs_may_be_off(params: SamplingParams, vocab_size: int) -> bool:
    """Whether a truncating call's knobs may leave some row untruncated (tensors, or
    scalars at their off values): its stage 1 then carries both epilogues."""
    return (
        params.truncates
        and _k_may_be_off(params, vocab_size)
        and _p_may_be_off(params)
        and _min_p_may_be_off(params)
    )


def _k_may_be_off(params: SamplingParams, vocab_size: int) -> bool:
    return params.top_k is not None or not (0 < params.scalar_top_k < vocab_size)


def _p_may_be_off(params: SamplingParams) -> bool:
    return params.top_p is not None or params.scalar_top_p >= 1.0


def _min_p_may_be_off(params: SamplingParams) -> bool:
    return params.min_p is not None or params.scalar_min_p <= 0.0


def merge_keep(params: SamplingParams, vocab_size: int) -> int:
    """How many candidates each group of tiles keeps for stage 2 (0: no merging).

    A row overflows when a group holds MERGE_KEEP or more of the tokens that decide it: the
    top-k survivors (k / ``merge_groups`` per group on average, hence twice the slots past
    k = 256 and no merging past k = 1024), top-p's nucleus or min-p's survivors (a few
    hundred on real rows: a handful per group). Up to k = 64 (generate's default 50; top-p /
    min-p then keep at most k) half the slots do: a group holds 16 of 64 survivors spread at
    random with chance ~1e-12, and stage 2 then searches and draws noise on 1024 lanes
    instead of 2048. A per-row k tensor (any size) keeps 32, for the rows whose k is at most
    MERGE_ROUTE_K_MAX or off; stage 2 draws the others from the per-tile candidates
    (``merge_route_k_max``)."""
    if params.top_k is not None:
        return MERGE_KEEP if MERGE_PER_ROW_K else 0
    k = params.scalar_top_k
    if 0 < k <= 64:
        return MERGE_KEEP // 2
    if not 0 < k < vocab_size or k <= 256:
        return MERGE_KEEP
    return 2 * MERGE_KEEP if k <= 1024 else 0


# A per-row k tensor: rows with k up to this (or top-k off) take stage 2's merged candidates
# (MERGE_GROUPS groups of MERGE_KEEP: a group holds MERGE_KEEP of 512 survivors spread at
# random with chance 8e-11, 5e-9 a row; at k = 1024 1.6e-2 a row, and one past 64 * 31 = 1984
# always overflows, to the whole row's recomputation), larger k the per-tile ones, each
# row's route chosen on the device (truncation_kernel._merged_route).
# Before, every row of such a call took the per-tile ones: one program searched 2374 * 6
# candidates on 16384 lanes (H200, D = 2048, B = 1: generate's top-k 50 as 0-d tensors 249 us,
# plain sampling 152; bench_off_knobs_nvidia-h200_fold-ab-d2048_20261128-0702.csv).
MERGE_ROUTE_K_MAX = 512
# False: no merging for a per-row k tensor, as before (A/B runs).
MERGE_PER_ROW_K = True


def merge_route_k_max(params: SamplingParams) -> int | None:
    """The largest per-row k that stage 2 draws from the merged candidates, for a call with
    a per-row k tensor (else None: every row takes one route)."""
    return MERGE_ROUTE_K_MAX if params.top_k is not None and MERGE_PER_ROW_K else None


def merge_groups(params: SamplingParams) -> int:
    """Into how many groups of tiles stage 2's candidates are merged (``merge_keep`` each).
    Half of MERGE_GROUPS for a Python k in (64, 256], so stage 2 searches and draws noise on
    1024 lanes instead of 2048, as up to k = 64: a group overflows only when it holds
    MERGE_KEEP of the row's k survivors (on average k / 32 <= 8; per row a binomial tail of
    1.3e-9 at k = 256). On an H200 (D = 2048, k = 256) that took 2.8 us off B = 64 calls
    (179.9 -> 177.1) and was even at B = 1 and 16 (truncation_levers_h200_20261126-0140.log);
    below k = 64 (16 kept per group) and for top-p or min-p alone (a nucleus of hundreds on
    flat rows) it was mixed, so they keep MERGE_GROUPS."""
    if params.top_k is None and 64 < params.scalar_top_k <= 256:
        return MERGE_GROUPS // 2
    return MERGE_GROUPS


def patching_pays(params: SamplingParams) -> bool:
    """Whether flagged rows may take the tile-level fallback
    (``truncation_kernel.patch_buffers``). Its pass
    over the patched rows launches on every call (2-3 us with no row flagged, H100): not
    worth it where a call overflows with chance <= 1e-3 (a Python k up to 256, which top-p
    and min-p after it keep below: ``candidates_per_tile``), whose rare flagged row has its
    whole row recomputed instead (one read of W)."""
    return not (params.top_k is None and 0 < params.scalar_top_k <= 256)


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


def triton_fused_sample(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    params: SamplingParams,
    config: SampleConfig | None = None,
    vocab_offset: int = 0,
    out_score: torch.Tensor | None = None,
    tile_candidates: bool = False,
    signal_dependents: bool = False,
    wait_previous: bool = False,
    logits_in: bool = False,
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
    [B, num_samples] fp32). ``signal_dependents`` (with ``tile_candidates``): the Triton
    stage 1 and the Gluon one (``hopper_kernel``) let a programmatic dependent launched after
    it (the exchange with PDL) be scheduled as its programs start (the swapped kernel ignores
    it). ``wait_previous``: those two are launched as a programmatic dependent of the kernel
    before it (the TP step's seed draw; PDL where ``sampling_device.pdl_launch`` allows it).
    ``logits_in``: ``hidden`` is written logits and ``weight`` a stand-in
    (``triton_sample_logits``).
    """
    if vocab_offset % 4:
        raise ValueError(f"vocab_offset must be a multiple of 4, got {vocab_offset}")
    logprobs_code = LOGPROB_CODES[params.logprobs]
    if logprobs_code and (vocab_offset or out_score is not None or tile_candidates):
        raise ValueError("log-probabilities on a tensor-parallel shard are not supported")
    temperature, scalar_temperature = params.temperature, params.scalar_temperature
    seed, scalar_seed = params.seed, params.scalar_seed
    num_samples = params.num_samples
    batch, hidden_size = hidden.shape
    vocab_size = weight.shape[0]
    out = torch.empty((batch, num_samples), dtype=torch.int64, device=hidden.device)
    logprobs = None
    if logprobs_code:
        logprobs = torch.empty((batch, num_samples), dtype=torch.float32, device=hidden.device)
    if batch == 0:
        return out if logprobs is None else (out, logprobs)
    temperature_mode = _temperature_mode(temperature, scalar_temperature)
    chosen = config is None
    if chosen and logits_in:
        config = _logits_in_config(batch)
    elif chosen:
        config = default_config(
            batch, hidden_size, hidden.device, params.truncates, vocab_size,
            knobs_may_be_off(params, vocab_size), params.per_row_seed,
            writes_mass_partials(params, vocab_size),
            temperature_mode == 3,
        )  # fmt: skip
        config = _widen_truncation_tiles(config, params, vocab_size, hidden)
        config = _fit_operand_stages(config, hidden.element_size())
    if config.block_v % 4 or config.block_v < 16:
        raise ValueError(f"block_v must be a multiple of 4 and >= 16, got {config.block_v}")
    if config.epilogue_chunks not in (1, 2, 4) or config.block_v // config.epilogue_chunks < 16:
        raise ValueError(
            f"epilogue_chunks must be 1, 2 or 4 with block_v / epilogue_chunks >= 16, got"
            f" {config.epilogue_chunks} with block_v={config.block_v}"
        )
    seed_u64 = scalar_seed % 2**64
    seed_mode = 0 if seed is None else (1 if seed.dim() == 0 else 2)
    truncates = params.truncates
    if truncates and (vocab_offset or out_score is not None):
        raise ValueError("top-k / top-p on a tensor-parallel shard is not supported")
    # The Gluon kernels have no soft-cap and no log-probabilities: those calls take this kernel.
    if (
        not logits_in
        and config.warp_specialized_swap
        and 128 < batch <= 256
        and not (temperature_mode == 3 and batch > SWAP_GREEDY_ROWS_MAX)
        and (not truncates or config.swap_truncating or swap_serves_knobs(params, vocab_size))
        and not params.softcap
        and not logprobs_code
    ):
        from . import hopper_swap_kernel

        if hopper_swap_kernel.supported(hidden, weight):
            try:
                return _hopper_swap_fused_sample(
                    hidden, weight, bias, params, out, temperature_mode, seed_mode, seed_u64,
                    vocab_offset, out_score, tile_candidates, config.warp_specialized_swap,
                )  # fmt: skip
            except CompilationError as error:  # raised before anything is launched
                hopper_swap_kernel.disable(error)
    if not logits_in and config.warp_specialized_rows and not params.softcap and not logprobs_code:
        from . import hopper_kernel

        if hopper_kernel.supported(hidden, weight):
            try:
                return _hopper_fused_sample(
                    hidden, weight, bias, params, config, out, temperature_mode, seed_mode,
                    seed_u64, vocab_offset, out_score, tile_candidates,
                    signal_dependents and tile_candidates and not truncates,
                    wait_previous and pdl_launch(hidden.device)["PDL"],
                )  # fmt: skip
            except CompilationError as error:  # raised before anything is launched
                hopper_kernel.disable(error)
    if chosen and batch <= 32 and not config.swap_ab and not logits_in:
        # (17-32 rows take the Gluon kernel's tiles only where it runs: TRUNCATING_SWAP_ROWS_MAX)
        config = _widen_truncation_tiles(_swap_ab_config(batch), params, vocab_size, hidden)
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
    fp32_precision = "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee"
    # (the fallback recomputes logits with stage 1's precision, so they are stage 1's)
    dot_precision = "ieee" if hidden.dtype != torch.float32 else fp32_precision
    per_row_knobs = plain and top_m > 0 and not config.programs_per_sm
    split = per_row_knobs and _split_stage1("triton")
    # (The small-batch tiles carrying both epilogues are not capped for three programs per
    # SM, as they were when they took 210 registers: on Triton 3.6 they take the plain
    # kernel's 168 uncapped, while the cap left 112 bytes of stack. H200, D = 2048, 0-d knobs
    # at their off values, B = 1 / 16, capped -> uncapped: 156.8 / 157.6 -> 156.3 / 157.4 us
    # at 16:25 UTC, 159.9 / 160.9 -> 159.4 / 159.7 at 16:45; [B] knobs at B = 16 off / mixed /
    # all 158.4 / 208.7 / 197.7 -> 155.9 / 202.3 / 191.7 and 160.7 / 211.2 / 199.8 -> 158.2 /
    # 204.6 / 193.9; top-k 50 and D = 4096 even; bench_off_knobs_nvidia-h200_ab-*_20261128-
    # 1626.csv, ..._1645/1646.csv.)
    # Triton launches on the current device: make it the inputs' one.
    on_device = torch.cuda.device(hidden.device) if hidden.is_cuda else contextlib.nullcontext()
    with on_device:
        if split:  # the plain kernel's half, then the other
            plain_buffers = ("plain_score", "plain_index", "plain_value", "log_mass")
            sampling_kernel.launch_stage1(
                hidden, weight, bias, params, config,
                {name: stage1.get(name) for name in plain_buffers}, temperature_mode,
                seed_mode, seed_u64, vocab_offset, dot_precision, _num_sms(hidden.device),
                row_knobs=_row_knobs(params, True), batch_truncates=1,
            )  # fmt: skip
        sampling_kernel.launch_stage1(
            hidden, weight, bias, params, config, stage1, temperature_mode, seed_mode,
            seed_u64, vocab_offset, dot_precision, _num_sms(hidden.device),
            top_m=top_m, row_mass=row_mass, key_low_bits=key_low_bits,
            row_knobs=_row_knobs(params, per_row_knobs), batch_truncates=2 if split else 0,
            signal_dependents=signal_dependents and tile_candidates and not truncates,
            wait_previous=wait_previous and not split and pdl_launch(hidden.device)["PDL"],
            **({"logits_in": True} if logits_in else {}),
        )  # fmt: skip
        if tile_candidates and not truncates:
            return cand_score, cand_index
        if not truncates:
            sampling_kernel.launch_stage2(
                cand_score, cand_index, out, out_score, params, temperature_mode, cand_value,
                log_mass, logprobs,
            )  # fmt: skip
        else:
            _finish_truncation(
                hidden, weight, bias, params, stage1, config.block_v, temperature_mode, out,
                dot_precision, logprobs, logits_in,
            )  # fmt: skip
    return out if logprobs is None else (out, logprobs)


# Stage 1's tiles on written logits (``triton_sample_logits``): at most this many rows x
# vocabulary entries (the noise of a tile in one chunk), warps. Against 16 x 512 in two
# chunks and 8 x 1024 in four, H200, V = 151936, 96-256 rows, whole calls of cuBLAS's matmul
# and stage 1 on its logits: the fastest in 41 of 42 sampling cells (T = 1 on fp32 and bf16
# logits, D = 2048 / 4096 / 8192), 14 of 21 greedy ones (matmul_first_h200_20261129-1057).
# Fewer rows take tiles of their own power of two: the noise is drawn for every row a tile
# spans.
LOGITS_IN_TILE = (32, 256, 1, 4)  # block_b, block_v, epilogue_chunks, num_warps


def triton_sample_logits(logits: torch.Tensor, params: SamplingParams):
    """``sample_logits`` on the kernels: stage 1 reads the tiles of the written ``logits``
    [B, V] (LOGITS_IN) instead of computing them; stage 2, the truncation's stage 2 and its
    fallback as for ``triton_fused_sample``, whose result this returns."""
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    return triton_fused_sample(logits, weight_stand_in(logits), None, params, logits_in=True)


def weight_stand_in(logits: torch.Tensor) -> torch.Tensor:
    """What the kernels take for the weight of written logits [B, V]: V rows (the vocabulary
    size they read from it) of one element, all the same (a real address: Triton's launcher
    refuses the null pointer of an empty tensor)."""
    return logits.new_zeros((1, 1)).expand(logits.shape[1], 1)


def _logits_in_config(batch: int) -> SampleConfig:
    block_b, block_v, chunks, warps = LOGITS_IN_TILE
    block_b = min(block_b, triton.next_power_of_2(batch))
    return SampleConfig(block_b, block_v, 16, swap_ab=False, num_warps=warps,
                        num_stages=1, epilogue_chunks=chunks)  # fmt: skip


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
    the key bits the sign fixes (``sampling_device.key_low_bits``)."""
    if not params.truncates:
        return {}, True, 0, False, 0
    top_m = candidates_per_tile(params, block_v, vocab_size, batch)
    # (the packed top-m keeps the column in those bits: they must hold block_v values)
    low_bits = key_low_bits(params)
    if 1 << low_bits < block_v:
        low_bits = 0
    k_may_be_off = _k_may_be_off(params, vocab_size)
    plain = k_may_be_off and _p_may_be_off(params) and _min_p_may_be_off(params)
    row_mass = writes_mass_partials(params, vocab_size)
    keys = torch.empty((batch, num_v_tiles * top_m), dtype=torch.int32, device=device)
    stage1 = {
        "top_m_key": keys,
        "top_m_index": torch.empty_like(keys),
        "hidden_key": torch.empty((batch, num_v_tiles), dtype=torch.int32, device=device),
        "mass": torch.empty((batch, num_v_tiles, 2), device=device) if row_mass else None,
    }
    return stage1, plain, top_m, row_mass, low_bits


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
    logprobs=None, logits_in=False,
):  # fmt: skip
    """Stage 2 of a truncating call over stage 1's candidates (``stage1``, on ``block_v``-wide
    tiles), then the exact fallback's kernels, which return at once for rows stage 2 did not
    flag (truncation_kernel.py); with ``logprobs`` also the drawn tokens'. ``logits_in`` as
    in ``triton_fused_sample``."""
    batch, vocab_size = hidden.shape[0], weight.shape[0]
    interpreter = hidden.device.type == "cpu"
    logits_dtype = params.logits_dtype
    tl_logits_dtype = None if logits_dtype is None else TL_DTYPES[logits_dtype]
    overflow = torch.empty(batch, dtype=torch.int32, device=hidden.device)
    floor = torch.empty(batch, dtype=torch.int32, device=hidden.device)
    patch = None
    if patching_pays(params):
        patch = truncation_kernel.patch_buffers(stage1, block_v)
    keep = merge_keep(params, vocab_size)
    truncation_kernel.launch_stage2(
        stage1, params, vocab_size, temperature_mode, out, overflow, floor, patch=patch,
        merge=(merge_groups(params), keep) if keep else None,
        route_k_max=merge_route_k_max(params), fast_math=not interpreter, logprobs=logprobs,
    )  # fmt: skip
    truncation_kernel.launch_fallback(
        hidden, weight, bias, params, temperature_mode, out, overflow,
        tl_logits_dtype, dot_precision, not interpreter, floor, stage1, patch, logprobs,
        logits_in,
    )  # fmt: skip
    if logprobs is not None and truncation_kernel.raw_logit_later(params):
        if logits_in:  # (the written logits: no bias, no rounding)
            logprobs += hidden.gather(1, out).float()
        else:
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


def _hopper_fused_sample(
    hidden, weight, bias, params, config, out, temperature_mode, seed_mode, seed_u64,
    vocab_offset=0, out_score=None, tile_candidates=False, signal_dependents=False,
    wait_previous=False,
):  # fmt: skip
    """Both stages with stage 1 in the warp-specialized Gluon kernel (the last five arguments
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
    per_row_knobs = plain and top_m > 0
    split = per_row_knobs and _split_stage1("gluon")
    common = (
        hidden, weight, bias, params.temperature, params.scalar_temperature, params.seed,
        seed_u64 & 0xFFFFFFFF, seed_u64 >> 32, num_samples, params.logits_dtype,
        cand_score, cand_index, config.warp_specialized_rows, _num_sms(hidden.device),
        temperature_mode, seed_mode, vocab_offset,
    )  # fmt: skip
    with torch.cuda.device(hidden.device):
        if split and _swap_plain_half(hidden, weight):  # the swapped kernel's half, then ours
            from . import hopper_swap_kernel

            try:
                hopper_swap_kernel.launch_stage1(
                    *common[:12], _num_sms(hidden.device), temperature_mode, seed_mode,
                    vocab_offset, row_knobs=_row_knobs(params, True), batch_truncates=1,
                )  # fmt: skip
            except CompilationError as error:  # raised before anything is launched
                hopper_swap_kernel.disable(error)
        # (its halves as programmatic dependents: GLUON_SPLIT_PDL)
        split_pdl = split and GLUON_SPLIT_PDL and pdl_launch(hidden.device)["PDL"]
        if split and not _swap_plain_half(hidden, weight):  # the plain kernel's half, then ours
            hopper_kernel.launch_stage1(
                *common, row_knobs=_row_knobs(params, True), batch_truncates=1,
                signal_dependents=split_pdl,
            )  # fmt: skip
        else:
            split_pdl = False
        hopper_kernel.launch_stage1(
            *common, stage1=stage1, top_m=top_m, row_mass=row_mass, key_low_bits=key_low_bits,
            row_knobs=_row_knobs(params, per_row_knobs), batch_truncates=2 if split else 0,
            wide_mma=config.wide_mma, signal_dependents=signal_dependents,
            wait_previous=wait_previous and not split, await_last=split_pdl,
        )  # fmt: skip
        if not params.truncates:
            if tile_candidates:
                return cand_score, cand_index
            sampling_kernel.launch_stage2(cand_score, cand_index, out, out_score)
            return out
        # (16-bit weights: the fallback's dot takes "ieee", as the Triton kernel's does)
        _finish_truncation(
            hidden, weight, bias, params, stage1, hopper_kernel.BLOCK_V, temperature_mode, out,
            "ieee",
        )  # fmt: skip
    return out


# Truncating calls in the swapped kernel. SWAP_KNOBS: knobs that may be off (generate's 0-d tensors,
# continuous batching's [B]) where default_config routes them there (``_swap_takes_knobs``); its
# top-m epilogue drew the Triton kernel's tokens at B = 64 / 144 / 256, D = 2048 (H100, off, k50,
# mixed, top-p 0.9; swap_knobs.py exact, swap_knobs_h100_20261128-0224_*). SWAP_TRUNCATING: also
# calls that truncate every row (off: the Triton kernel's top-m alone is faster there, scalar_k50 in
# the same run).
SWAP_KNOBS = True
SWAP_TRUNCATING = False
# Knob tensors that may be off in the swapped kernel: stage 1 as two launches (its plain
# kernel, then its top-m one, each leaving at once unless the batch's knobs want it, as
# _hopper_fused_sample's split), so that a batch whose knobs are all off costs the plain
# kernel's time. H200, D = 2048 B = 144, us: off 272 -> 237 (plain 221), top-k 50 396 -> 384,
# mixed 439 -> 443 (swap_knobs_big4_h200_20261128-0309_*; the two columns from two processes).
SWAP_SPLIT = True
# Knob tensors that may be off in the Gluon kernel's 64-row tiles at 161-256 rows: its split
# stage 1's plain half in the swapped kernel (the same half-tile candidates), where plain
# sampling takes it. H200, D = 2048 B = 256, us: off 364 -> 350 (plain 317), top-k 50 474 ->
# 469, mixed 601 -> 601 (swap_knobs_big4_h200_20261128-0309_*, as above).
SWAP_PLAIN_HALF = True


def _swap_plain_half(hidden: torch.Tensor, weight: torch.Tensor) -> bool:
    from . import hopper_swap_kernel

    batch, hidden_size = hidden.shape
    return (
        SWAP_PLAIN_HALF
        and 128 < batch <= _swap_rows_max(hidden_size)
        and hopper_swap_kernel.supported(hidden, weight)
    )


# Greedy calls (a scalar temperature of 0) above this many rows keep the Triton kernel, whose
# tiles run a bare matmul 2-9% faster there at D = 4096 (default_config's comment).
SWAP_GREEDY_ROWS_MAX = 192


def swap_serves_knobs(params: SamplingParams, vocab_size: int) -> bool:
    """Whether a truncating call at 129-256 rows takes the swapped Gluon stage 1: knobs that
    may leave every row untruncated (tensors, as ``generate`` and continuous batching pass
    them, or off scalars), whose stage 1 decides per block of 64 rows on the device which
    epilogue runs, so that off-valued knobs cost the plain kernel's time (with SWAP_KNOBS).
    ``SWAP_TRUNCATING`` adds calls that truncate every row (a scalar k, p or min-p)."""
    return SWAP_TRUNCATING or (SWAP_KNOBS and knobs_may_be_off(params, vocab_size))


def _hopper_swap_fused_sample(
    hidden, weight, bias, params, out, temperature_mode, seed_mode, seed_u64, vocab_offset=0,
    out_score=None, tile_candidates=False, schedule="ping-pong",
):  # fmt: skip
    """Both stages at 129-256 rows with stage 1 in ``hopper_swap_kernel`` (``vocab_offset``
    to ``tile_candidates`` as in ``triton_fused_sample``; ``schedule``: its consumers'
    (``SampleConfig.warp_specialized_swap``)). Sampling: the candidates of
    ``_hopper_fused_sample``'s half tiles, then stage 2. Truncating: the top-m epilogue on
    64-wide tiles (and the sampling one beside it where knobs may be off), then
    truncation_kernel's stage 2 and fallback."""
    from . import hopper_swap_kernel

    batch, vocab_size = hidden.shape[0], weight.shape[0]
    num_samples = params.num_samples
    block_v = hopper_swap_kernel.VOCAB_TILE
    stage1, plain, top_m, row_mass, key_low_bits = _truncation_buffers(
        params, batch, vocab_size, triton.cdiv(vocab_size, block_v), block_v, hidden.device
    )
    cand_score = cand_index = None
    if plain:  # per half of a 128-wide tile, as the Gluon kernel's
        cand_score, cand_index = _candidates(
            batch, num_samples, 2 * triton.cdiv(vocab_size, 2 * block_v), hidden.device
        )
        stage1.update(plain_score=cand_score, plain_index=cand_index)
    per_row_knobs = plain and top_m > 0
    split = per_row_knobs and SWAP_SPLIT
    common = (
        hidden, weight, bias, params.temperature, params.scalar_temperature, params.seed,
        seed_u64 & 0xFFFFFFFF, seed_u64 >> 32, num_samples, params.logits_dtype,
        cand_score, cand_index, _num_sms(hidden.device), temperature_mode, seed_mode,
        vocab_offset,
    )  # fmt: skip
    schedule_args = dict(coop=schedule == "cooperative", wide_tile=schedule == "ping-pong-wide")
    with torch.cuda.device(hidden.device):
        if split:  # the plain kernel's half, then the other (as _hopper_fused_sample's)
            hopper_swap_kernel.launch_stage1(
                *common, **schedule_args, row_knobs=_row_knobs(params, True), batch_truncates=1
            )
        hopper_swap_kernel.launch_stage1(
            *common, **schedule_args, stage1=stage1, top_m=top_m, row_mass=row_mass,
            key_low_bits=key_low_bits, row_knobs=_row_knobs(params, per_row_knobs),
            batch_truncates=2 if split else 0,
        )  # fmt: skip
        if not params.truncates:
            if tile_candidates:
                return cand_score, cand_index
            sampling_kernel.launch_stage2(cand_score, cand_index, out, out_score)
            return out
        # (16-bit weights: the fallback's dot takes "ieee", as the Triton kernel's does)
        _finish_truncation(
            hidden, weight, bias, params, stage1, block_v, temperature_mode, out, "ieee"
        )
    return out
