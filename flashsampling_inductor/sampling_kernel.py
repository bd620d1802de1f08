"""The fused LM-head sampling kernel (FlashSampling, two stages) and its launcher.

Stage 1 computes a (batch tile x vocabulary tile) block of logits on chip with the
vocabulary as the MMA's M dimension (swap-AB: decode batches are far smaller than the 64
rows a Hopper MMA wants), adds bias, optionally rounds the logits, perturbs them with
Gumbel noise scaled by the temperature, and keeps per row only the best (fp32 score, global
index). A program may walk several consecutive vocabulary tiles with a running maximum
(split-V), so the candidate buffer is [B, num_samples, programs along V], not [B, V].
Stage 2 reduces the candidates of each (row, sample) on the device.

The noise contract (Philox4x32-10 counters and the bits -> Gumbel map) is documented in
``reference.py``, whose torch code draws exactly the same stream.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

__all__ = ["SampleConfig", "default_config", "triton_fused_sample"]

PHILOX_ROUND_A = tl.constexpr(0xD2511F53)
PHILOX_ROUND_B = tl.constexpr(0xCD9E8D57)
PHILOX_KEY_A = tl.constexpr(0x9E3779B9)
PHILOX_KEY_B = tl.constexpr(0xBB67AE85)
PHILOX_ROUNDS = tl.constexpr(10)
TWO_POW_MINUS_32 = tl.constexpr(2.3283064365386963e-10)


@triton.jit
def _philox4x32(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 on uint32 tensors; the same rounds as ``reference.philox4x32``."""
    for _ in tl.static_range(PHILOX_ROUNDS):
        prev_c0 = c0
        prev_c2 = c2
        c0 = tl.umulhi(PHILOX_ROUND_B, prev_c2) ^ c1 ^ k0
        c2 = tl.umulhi(PHILOX_ROUND_A, prev_c0) ^ c3 ^ k1
        c1 = PHILOX_ROUND_B * prev_c2
        c3 = PHILOX_ROUND_A * prev_c0
        k0 = k0 + PHILOX_KEY_A
        k1 = k1 + PHILOX_KEY_B
    return c0, c1, c2, c3


@triton.jit
def _bits_to_gumbel(bits):
    """32 random bits -> standard Gumbel in fp32, finite for every input.

    See ``reference.bits_to_gumbel``: work with the distance of u to the nearer end of
    (0, 1), so u never rounds to 1.0 and the upper tail keeps full relative precision.
    """
    upper = bits >= 0x80000000
    mirrored = tl.where(upper, ~bits, bits)
    small = (mirrored.to(tl.float32) + 0.5) * TWO_POW_MINUS_32
    one_minus = tl.where(upper, 1.0 - small, small)
    log_arg = tl.log(one_minus)
    # log1p(-small) = log(one_minus) * small / (1 - one_minus) (Goldberg); 1 - one_minus is exact.
    exact_ratio = tl.where(upper & (one_minus != 1.0), small / (1.0 - one_minus), 1.0)
    expo = tl.where(upper & (one_minus == 1.0), small, -log_arg * exact_ratio)
    return -tl.log(expo)


@triton.jit
def _gumbel_tile(
    quad_offsets, row_counter, sample_index, k0, k1, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr
):
    """Gumbel noise [BLOCK_B, BLOCK_V] for vocab indices 4 * quad_offsets + (0..3).

    One Philox evaluation yields four words; interleave them so word w lands on vocab
    index 4 * quad + w, the layout ``reference.gumbel_noise`` defines.
    """
    c0 = tl.broadcast_to(quad_offsets[None, :], (BLOCK_B, BLOCK_V // 4))
    c1 = tl.broadcast_to(row_counter[:, None], (BLOCK_B, BLOCK_V // 4))
    c2 = tl.full((BLOCK_B, BLOCK_V // 4), sample_index, tl.uint32)
    c3 = tl.zeros((BLOCK_B, BLOCK_V // 4), tl.uint32)
    r0, r1, r2, r3 = _philox4x32(c0, c1, c2, c3, k0, k1)
    g0 = _bits_to_gumbel(r0)
    g1 = _bits_to_gumbel(r1)
    g2 = _bits_to_gumbel(r2)
    g3 = _bits_to_gumbel(r3)
    return tl.reshape(tl.join(tl.join(g0, g2), tl.join(g1, g3)), (BLOCK_B, BLOCK_V))


@triton.jit
def _round_to_bf16(x):
    """fp32 -> the nearest bf16 value (ties to even), kept in fp32; NaN stays NaN.

    Written with integer ops because the Triton interpreter truncates fp32 -> bf16 casts.
    """
    bits = x.to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return tl.where(x == x, rounded.to(tl.float32, bitcast=True), x)


@triton.jit
def _logits_tile(
    hidden_ptr,
    weight_ptr,
    bias_ptr,
    offs_b,
    b_mask,
    v_start,
    V,
    D,
    stride_hb,
    stride_hd,
    stride_wv,
    stride_wd,
    HAS_BIAS: tl.constexpr,
    LOGITS_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    EVEN_D: tl.constexpr,
    UPCAST_OPERANDS: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """fp32 logits [BLOCK_B, BLOCK_V] of vocab tile [v_start, v_start + BLOCK_V), + bias."""
    offs_v = v_start + tl.arange(0, BLOCK_V)
    v_mask = offs_v < V
    offs_d = tl.arange(0, BLOCK_D)
    # The vocabulary is the MMA's M dimension (swap-AB): acc is [BLOCK_V, BLOCK_B].
    acc = tl.zeros((BLOCK_V, BLOCK_B), tl.float32)
    for d_start in range(0, D, BLOCK_D):
        w_ptrs = weight_ptr + offs_v[:, None] * stride_wv + (d_start + offs_d)[None, :] * stride_wd
        h_ptrs = hidden_ptr + offs_b[:, None] * stride_hb + (d_start + offs_d)[None, :] * stride_hd
        if EVEN_D:
            w = tl.load(w_ptrs, mask=v_mask[:, None], other=0.0)
            h = tl.load(h_ptrs, mask=b_mask[:, None], other=0.0)
        else:
            d_mask = (d_start + offs_d) < D
            w = tl.load(w_ptrs, mask=v_mask[:, None] & d_mask[None, :], other=0.0)
            h = tl.load(h_ptrs, mask=b_mask[:, None] & d_mask[None, :], other=0.0)
        if UPCAST_OPERANDS:
            # The Triton interpreter multiplies bf16 as raw uint16; fp32 products of bf16/fp16
            # values are exact, so this changes nothing but the speed.
            w = w.to(tl.float32)
            h = h.to(tl.float32)
        acc = tl.dot(w, tl.trans(h), acc, input_precision=DOT_PRECISION)
    logits = tl.trans(acc)
    if HAS_BIAS:
        logits = logits + tl.load(bias_ptr + offs_v, mask=v_mask, other=0.0).to(tl.float32)[None, :]
    if LOGITS_DTYPE == tl.bfloat16:
        logits = _round_to_bf16(logits)
    elif LOGITS_DTYPE is not None:
        logits = logits.to(LOGITS_DTYPE).to(tl.float32)
    return logits


@triton.jit
def _perturbed_tile_max(
    logits,
    temperature,
    v_start,
    V,
    row_counter,
    sample_index,
    k0,
    k1,
    GREEDY: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """Per row: the best perturbed score of the tile and its global vocab index."""
    if GREEDY:
        scores = logits
    else:
        quad_offsets = (v_start // 4 + tl.arange(0, BLOCK_V // 4)).to(tl.uint32)
        noise = _gumbel_tile(quad_offsets, row_counter, sample_index, k0, k1, BLOCK_B, BLOCK_V)
        # argmax(logits / T + g) == argmax(logits + T * g) for T > 0, and T = 0 is greedy.
        scores = logits + temperature[:, None] * noise
    # NaN counts as -inf; columns past V can never win.
    valid = (v_start + tl.arange(0, BLOCK_V)) < V
    scores = tl.where(valid[None, :] & (scores == scores), scores, float("-inf"))
    tile_score, tile_arg = tl.max(
        scores, axis=1, return_indices=True, return_indices_tie_break_left=True
    )
    return tile_score, v_start + tile_arg


@triton.jit(do_not_specialize=["scalar_temperature", "seed_lo", "seed_hi"])
def _sample_stage1(
    hidden_ptr,
    weight_ptr,
    bias_ptr,
    temperature_ptr,
    seed_ptr,
    cand_score_ptr,
    cand_index_ptr,
    B,
    V,
    D,
    stride_hb,
    stride_hd,
    stride_wv,
    stride_wd,
    scalar_temperature,
    seed_lo,
    seed_hi,
    num_samples,
    num_v_programs,
    HAS_BIAS: tl.constexpr,
    TEMPERATURE_MODE: tl.constexpr,  # 0: scalar, 1: 0-d tensor, 2: [B] tensor, 3: greedy
    SEED_MODE: tl.constexpr,  # 0: scalar argument, 1: 0-d tensor, 2: [B] tensor (per row)
    LOGITS_DTYPE: tl.constexpr,  # None: keep fp32 logits, else round to this dtype
    DOT_PRECISION: tl.constexpr,
    EVEN_D: tl.constexpr,
    UPCAST_OPERANDS: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_D: tl.constexpr,
    TILES_PER_PROGRAM: tl.constexpr,  # > 1 only with one sample per row (launcher checks)
):
    # Batch tiles vary fastest, so the programs that share a weight tile run together and
    # the tile is read from HBM once and from L2 by the others.
    pid = tl.program_id(0)
    num_b_programs = tl.cdiv(B, BLOCK_B)
    pid_b = pid % num_b_programs
    pid_v = pid // num_b_programs
    offs_b = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
    b_mask = offs_b < B

    if TEMPERATURE_MODE == 0 or TEMPERATURE_MODE == 3:
        temperature = tl.full((BLOCK_B,), scalar_temperature, tl.float32)
    elif TEMPERATURE_MODE == 1:
        temperature = tl.full((BLOCK_B,), tl.load(temperature_ptr), tl.float32)
    else:
        temperature = tl.load(temperature_ptr + offs_b, mask=b_mask, other=0.0).to(tl.float32)

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

    out_offsets = offs_b * num_samples * num_v_programs + pid_v
    if TILES_PER_PROGRAM == 1:
        v_start = pid_v * BLOCK_V
        logits = _logits_tile(
            hidden_ptr,
            weight_ptr,
            bias_ptr,
            offs_b,
            b_mask,
            v_start,
            V,
            D,
            stride_hb,
            stride_hd,
            stride_wv,
            stride_wd,
            HAS_BIAS,
            LOGITS_DTYPE,
            DOT_PRECISION,
            EVEN_D,
            UPCAST_OPERANDS,
            BLOCK_B,
            BLOCK_V,
            BLOCK_D,
        )
        for sample_index in range(num_samples):
            score, index = _perturbed_tile_max(
                logits,
                temperature,
                v_start,
                V,
                row_counter,
                sample_index,
                k0,
                k1,
                TEMPERATURE_MODE == 3,
                BLOCK_B,
                BLOCK_V,
            )
            out = out_offsets + sample_index * num_v_programs
            tl.store(cand_score_ptr + out, score, mask=b_mask)
            tl.store(cand_index_ptr + out, index, mask=b_mask)
    else:
        # Split-V: walk consecutive tiles keeping a running maximum. Tiles come in increasing
        # vocab order, so a strict > keeps the lowest index on ties, as torch.argmax does.
        best_score = tl.full((BLOCK_B,), float("-inf"), tl.float32)
        best_index = tl.zeros((BLOCK_B,), tl.int32) + pid_v * TILES_PER_PROGRAM * BLOCK_V
        for tile in range(TILES_PER_PROGRAM):
            v_start = (pid_v * TILES_PER_PROGRAM + tile) * BLOCK_V
            logits = _logits_tile(
                hidden_ptr,
                weight_ptr,
                bias_ptr,
                offs_b,
                b_mask,
                v_start,
                V,
                D,
                stride_hb,
                stride_hd,
                stride_wv,
                stride_wd,
                HAS_BIAS,
                LOGITS_DTYPE,
                DOT_PRECISION,
                EVEN_D,
                UPCAST_OPERANDS,
                BLOCK_B,
                BLOCK_V,
                BLOCK_D,
            )
            score, index = _perturbed_tile_max(
                logits,
                temperature,
                v_start,
                V,
                row_counter,
                0,
                k0,
                k1,
                TEMPERATURE_MODE == 3,
                BLOCK_B,
                BLOCK_V,
            )
            better = score > best_score
            best_index = tl.where(better, index, best_index)
            best_score = tl.where(better, score, best_score)
        tl.store(cand_score_ptr + out_offsets, best_score, mask=b_mask)
        tl.store(cand_index_ptr + out_offsets, best_index, mask=b_mask)


@triton.jit
def _sample_stage2(cand_score_ptr, cand_index_ptr, out_ptr, num_candidates, BLOCK_C: tl.constexpr):
    """One program per (row, sample): the argmax over its candidates, ties to the lowest."""
    pid = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_C)
    mask = offs < num_candidates
    scores = tl.load(cand_score_ptr + pid * num_candidates + offs, mask=mask, other=float("-inf"))
    _, winner = tl.max(scores, axis=0, return_indices=True, return_indices_tie_break_left=True)
    index = tl.load(cand_index_ptr + pid * num_candidates + winner)
    tl.store(out_ptr + pid, index.to(tl.int64))


@dataclasses.dataclass(frozen=True)
class SampleConfig:
    """Tile shape and launch parameters of stage 1. Results do not depend on them."""

    block_b: int
    block_v: int
    block_d: int
    tiles_per_program: int = 1
    num_warps: int = 4
    num_stages: int = 3


def default_config(
    batch: int, vocab_size: int, hidden_size: int, device: torch.device
) -> SampleConfig:
    """The configuration for a shape, chosen ahead of time (no autotuning on the call path)."""
    block_b = min(max(16, triton.next_power_of_2(batch)), 64)
    if device.type != "cuda":
        # The interpreter runs one program at a time: few, large tiles are fastest.
        return SampleConfig(block_b=block_b, block_v=256, block_d=64, tiles_per_program=4)
    return SampleConfig(block_b=block_b, block_v=128, block_d=64)


def _temperature_mode(temperature: torch.Tensor | None, scalar_temperature: float) -> int:
    if temperature is not None:
        return 1 if temperature.dim() == 0 else 2
    # A scalar 0 is greedy for every row: skip the noise altogether.
    return 3 if scalar_temperature == 0.0 else 0


_TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


def triton_fused_sample(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    temperature: torch.Tensor | None,
    scalar_temperature: float,
    seed: torch.Tensor | None,
    scalar_seed: int,
    num_samples: int,
    logits_dtype: torch.dtype | None = None,
    config: SampleConfig | None = None,
) -> torch.Tensor:
    """Launch both stages; arguments as validated by ``op.fused_sample``."""
    batch, hidden_size = hidden.shape
    vocab_size = weight.shape[0]
    out = torch.empty((batch, num_samples), dtype=torch.int64, device=hidden.device)
    if batch == 0:
        return out
    config = config or default_config(batch, vocab_size, hidden_size, hidden.device)
    if config.block_v % 4 or config.block_v < 16:
        raise ValueError(f"block_v must be a multiple of 4 and >= 16, got {config.block_v}")
    if num_samples > 1 and config.tiles_per_program > 1:
        config = dataclasses.replace(config, tiles_per_program=1)
    num_v_tiles = triton.cdiv(vocab_size, config.block_v)
    num_v_programs = triton.cdiv(num_v_tiles, config.tiles_per_program)
    num_b_programs = triton.cdiv(batch, config.block_b)
    cand_score = torch.empty(
        (batch, num_samples, num_v_programs), dtype=torch.float32, device=hidden.device
    )
    cand_index = torch.empty_like(cand_score, dtype=torch.int32)
    seed_u64 = scalar_seed % 2**64
    fp32_precision = "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee"
    _sample_stage1[(num_b_programs * num_v_programs,)](
        hidden,
        weight,
        bias,
        temperature,
        seed,
        cand_score,
        cand_index,
        batch,
        vocab_size,
        hidden_size,
        hidden.stride(0),
        hidden.stride(1),
        weight.stride(0),
        weight.stride(1),
        scalar_temperature,
        seed_u64 & 0xFFFFFFFF,
        seed_u64 >> 32,
        num_samples,
        num_v_programs,
        HAS_BIAS=bias is not None,
        TEMPERATURE_MODE=_temperature_mode(temperature, scalar_temperature),
        SEED_MODE=0 if seed is None else (1 if seed.dim() == 0 else 2),
        LOGITS_DTYPE=None if logits_dtype is None else _TL_DTYPES[logits_dtype],
        DOT_PRECISION="ieee" if hidden.dtype != torch.float32 else fp32_precision,
        EVEN_D=hidden_size % config.block_d == 0,
        UPCAST_OPERANDS=hidden.device.type == "cpu",
        BLOCK_B=config.block_b,
        BLOCK_V=config.block_v,
        BLOCK_D=config.block_d,
        TILES_PER_PROGRAM=config.tiles_per_program,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    _sample_stage2[(batch * num_samples,)](
        cand_score,
        cand_index,
        out,
        num_v_programs,
        BLOCK_C=max(16, triton.next_power_of_2(num_v_programs)),
    )
    return out
