"""Top-k / top-p / min-p over vocabulary shards on the device: the kernels of a truncating
``tp_fused_sample`` call between the shard's logits and the exchange of candidates.

Every token the row keeps is at or above one per-row threshold, which needs only the row's
k largest scores with their multiplicity and its maximum (``tp._truncated_shard_candidates``
says why the shards' k largest give them). Per rank, after the shard's logits and their k
largest (``torch.topk``):

* ``shard_message``: one program per row packs the shard's k largest values and how many
  of its tokens tie with the k-th but were not sent (one pass over the row counts them),
  [B, k + 1] fp32, the count's bits in the last word;
* the ranks all-gather these (``exchange.gather_messages``);
* ``threshold``: one program per row reads the P messages and computes the row's threshold
  as ``reference.truncation_threshold`` does from the same entries, without sorting: the
  k-th value is the largest entry with at least k entries (counted with their ties) at or
  above it, top-p's bound the smallest survivor whose strictly larger mass is still below p
  of the survivors' mass (the single-GPU stage 2's rule), min-p's ``max + T log(min_p)``;
* ``masked_draw``: programs (row, chunk) draw Gumbel-max among the chunk's tokens at or
  above the threshold with the noise of their GLOBAL indices, and leave per-chunk
  candidates, which the exchange kernel reduces with the peers' (no [B, V] logits
  gathered, no torch ops between the kernels but the all-gather).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import launch
from .sampling_device import INV_LN2, masked_gumbel_chunk

__all__ = ["MAX_ENTRIES", "masked_draw", "shard_message", "threshold"]

# The threshold kernel compares every message entry with every other, [entries, CHUNK] at a
# time: up to this many entries a row (P * k, padded to a power of 2) it runs; beyond, the
# caller takes the torch ops of ``reference.truncation_threshold``.
MAX_ENTRIES = 2048
_CHUNK = 32
_DRAW_BLOCK = 1024


@triton.jit
def _shard_message(
    logits_ptr, top_ptr, message_ptr, width, sent,
    SLOTS: tl.constexpr, SLOT_BLOCK: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    """Program (row): the shard's ``sent`` largest values (fp32, -inf past them up to SLOTS)
    and, bit-cast in word SLOTS, how many of its tokens equal the last slot's value but were
    not sent. NaN logits count as -inf."""
    row = tl.program_id(0).to(tl.int64)
    slots = tl.arange(0, SLOT_BLOCK)
    top = tl.load(top_ptr + row * sent + slots, mask=slots < sent, other=float("-inf"))
    top = top.to(tl.float32)
    top = tl.where(top != top, float("-inf"), top)
    top = tl.where(slots < SLOTS, top, float("-inf"))
    # (the last slot's value, -inf included: every other slot adds 0)
    last = tl.sum(tl.where(slots == SLOTS - 1, top, 0.0))
    sent_ties = tl.sum(((slots < sent) & (top == last)).to(tl.int32))
    ties = tl.zeros((BLOCK_V,), tl.int32)
    for start in range(0, width, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        mask = offs < width
        values = tl.load(logits_ptr + row * width + offs, mask=mask, other=0.0).to(tl.float32)
        values = tl.where(values != values, float("-inf"), values)
        ties += (mask & (values == last)).to(tl.int32)
    untold = tl.sum(ties) - sent_ties
    tl.store(message_ptr + row * (SLOTS + 1) + slots, top, mask=slots < SLOTS)
    tl.store(message_ptr + row * (SLOTS + 1) + SLOTS, untold.to(tl.float32, bitcast=True))


def shard_message(logits: torch.Tensor, top: torch.Tensor, slots: int) -> torch.Tensor:
    """[B, slots + 1] fp32: ``top`` [B, sent <= slots] (the shard's ``sent`` largest logits,
    sorted or not) padded with -inf, and the count of ``logits`` [B, width] equal to the
    last slot's value that were not sent, its bits in the last word."""
    batch, width = logits.shape
    message = torch.empty((batch, slots + 1), dtype=torch.float32, device=logits.device)
    launch(
        _shard_message, (batch,),
        logits, top.contiguous(), message, width, top.shape[1],
        SLOTS=slots, SLOT_BLOCK=max(16, triton.next_power_of_2(slots)), BLOCK_V=1024,
        num_warps=4,
    )  # fmt: skip
    return message


@triton.jit
def _threshold(
    message_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, threshold_ptr,
    batch, world, vocab_size,
    SLOTS: tl.constexpr, TOP_K: tl.constexpr, ENTRIES: tl.constexpr, CHUNK: tl.constexpr,
):  # fmt: skip
    """Program (row): ``reference.truncation_threshold`` of the row from every rank's
    message ([P, B, SLOTS + 1]: SLOTS values, then the untold ties' count)."""
    row = tl.program_id(0).to(tl.int64)
    entry = tl.arange(0, ENTRIES)
    valid = entry < world * SLOTS
    source = entry // SLOTS
    word = (source * batch + row) * (SLOTS + 1) + entry % SLOTS
    values = tl.load(message_ptr + word, mask=valid, other=float("-inf"))
    temperature = tl.load(temperature_ptr + row)
    top_k = tl.load(top_k_ptr + row)
    top_p = tl.load(top_p_ptr + row)
    min_p = tl.load(min_p_ptr + row)
    row_max = tl.max(values)
    k_on = (top_k > 0) & (top_k < vocab_size)
    bound = tl.full((), float("-inf"), tl.float32)
    tie_mass_count = tl.zeros((), tl.float32)
    if TOP_K:
        # The row's k-th value: the largest entry with >= k entries at or above it.
        at_or_above = tl.zeros((ENTRIES,), tl.int32)
        for start in range(0, world * SLOTS, CHUNK):
            other = start + tl.arange(0, CHUNK)
            other_word = ((other // SLOTS) * batch + row) * (SLOTS + 1) + other % SLOTS
            others = tl.load(message_ptr + other_word, mask=other < world * SLOTS,
                             other=float("nan"))  # fmt: skip
            at_or_above += tl.sum((others[None, :] >= values[:, None]).to(tl.int32), axis=1)
        kth = tl.max(tl.where(valid & (at_or_above >= top_k), values, float("-inf")))
        bound = tl.where(k_on, kth, bound)
        # A shard whose k-th value is the row's left out its other tokens of that value:
        # they are kept and weigh in top-p's mass.
        peers = tl.arange(0, 16)
        for first in range(0, world, 16):
            peer = first + peers
            here = peer < world
            base = (peer * batch + row) * (SLOTS + 1)
            end = tl.load(message_ptr + base + SLOTS - 1, mask=here, other=float("nan"))
            told = tl.load(message_ptr + base + SLOTS, mask=here, other=0.0)
            untold = told.to(tl.int32, bitcast=True)
            tie_mass_count += tl.sum(tl.where(here & (end == kth), untold, 0).to(tl.float32))
    p_on = (top_p < 1.0) & (temperature > 0)
    if p_on:
        inv_temperature = INV_LN2 / tl.where(temperature > 0, temperature, 1.0)
        weights = tl.exp2((values - row_max) * inv_temperature)
        weights = tl.where(values == row_max, 1.0, weights)
        weights = tl.where((values >= bound) & (values > float("-inf")), weights, 0.0)
        tie_weight = 0.0
        if TOP_K:
            tie_weight = tl.exp2((bound - row_max) * inv_temperature)
            tie_weight = tl.where(bound == row_max, 1.0, tie_weight)
            tie_weight = tl.where(bound > float("-inf"), tie_weight * tie_mass_count, 0.0)
        total = tl.sum(weights) + tie_weight
        # Each entry's strictly larger mass: what the reference's cumulative sum before its
        # first position in sorted order holds (the untold ties weigh at the k-th value).
        larger = tl.zeros((ENTRIES,), tl.float32)
        for start in range(0, world * SLOTS, CHUNK):
            other = start + tl.arange(0, CHUNK)
            other_word = ((other // SLOTS) * batch + row) * (SLOTS + 1) + other % SLOTS
            others = tl.load(message_ptr + other_word, mask=other < world * SLOTS,
                             other=float("-inf"))  # fmt: skip
            other_weights = tl.exp2((others - row_max) * inv_temperature)
            other_weights = tl.where(others == row_max, 1.0, other_weights)
            other_weights = tl.where((others >= bound) & (others > float("-inf")),
                                     other_weights, 0.0)  # fmt: skip
            larger += tl.sum(
                tl.where(others[None, :] > values[:, None], other_weights[None, :], 0.0), axis=1
            )
        if TOP_K:
            larger += tl.where(values < bound, tie_weight, 0.0)
        survivor = (values >= bound) & (values > float("-inf"))
        inside = valid & survivor & (larger < top_p * total)
        nucleus = tl.min(tl.where(inside, values, float("inf")))
        nucleus = tl.where(nucleus == float("inf"), row_max, nucleus)
        bound = tl.maximum(bound, nucleus)
    min_p_on = (min_p > 0.0) & (temperature > 0)
    if min_p_on:
        log_min_p = tl.log(tl.where(min_p_on, min_p, 1.0))
        bound = tl.maximum(bound, row_max + temperature * log_min_p)
    tl.store(threshold_ptr + row, bound)


def threshold(
    received: torch.Tensor,
    batch: int,
    slots: int,
    vocab_size: int,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    k_on: bool,
) -> torch.Tensor:
    """[B] fp32: each row's threshold from every rank's ``shard_message`` (``received``
    [P, B * (slots + 1)]); the knobs [B] tensors (temperature and top-p / min-p fp32, top-k
    int64); ``k_on``: a top-k was given (else each message holds the shard's maximum)."""
    world = received.shape[0]
    out = torch.empty(batch, dtype=torch.float32, device=received.device)
    entries = max(16, triton.next_power_of_2(world * slots))
    launch(
        _threshold, (batch,),
        received.contiguous(), temperature.contiguous(), top_k.contiguous(),
        top_p.contiguous(), min_p.contiguous(), out, batch, world, vocab_size,
        SLOTS=slots, TOP_K=k_on, ENTRIES=entries, CHUNK=_CHUNK,
        num_warps=4 if entries <= 256 else 8,
    )  # fmt: skip
    return out


@triton.jit
def _masked_draw(
    logits_ptr, threshold_ptr, temperature_ptr, seed_ptr, score_ptr, index_ptr,
    width, vocab_start, num_chunks, num_samples,
    SEED_MODE: tl.constexpr, FAST_MATH: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    """Program (row, chunk): for every sample the best ``logit + T ln2 g`` among the chunk's
    logits at or above the row's threshold and its GLOBAL index (ties to the lowest), with
    the noise of ``reference.gumbel_argmax`` for that index; NaN counts as -inf."""
    masked_gumbel_chunk(
        logits_ptr, threshold_ptr, temperature_ptr, seed_ptr, score_ptr, index_ptr, width,
        vocab_start, num_chunks, num_samples, SEED_MODE, FAST_MATH, BLOCK_V,
    )  # fmt: skip


def masked_draw(
    logits: torch.Tensor,
    bound: torch.Tensor,
    temperature: torch.Tensor,
    seed: torch.Tensor,
    num_samples: int,
    vocab_start: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, sample and chunk of ``logits`` [B, width] (any float dtype) the best
    perturbed score among those at or above ``bound`` [B] and its global index: [B, S,
    chunks] fp32 and int32 (the exchange reduces them). ``seed`` int64, 0-d (the row in the
    noise counter) or [B] (per-row seeds)."""
    batch, width = logits.shape
    chunks = triton.cdiv(width, _DRAW_BLOCK)
    score = torch.empty((batch, num_samples, chunks), dtype=torch.float32, device=logits.device)
    index = torch.empty_like(score, dtype=torch.int32)
    launch(
        _masked_draw, (batch, chunks),
        logits, bound.contiguous(), temperature.contiguous(), seed.contiguous(), score, index,
        width, vocab_start, chunks, num_samples,
        SEED_MODE=2 if seed.dim() else 1, FAST_MATH=logits.is_cuda, BLOCK_V=_DRAW_BLOCK,
        num_warps=4,
    )  # fmt: skip
    return score, index
