"""The candidate exchange of tensor-parallel sampling: every rank's per-row best (score,
global vocabulary index) reaches every rank, and each rank reduces them to the same tokens.

A rank's message is one int64 row: a header (what the rank sampled: batch size, samples,
vocabulary size, seed, its shard's global range) and its candidates, each packed as
(fp32 score bits, int32 index) in one int64. Two transports carry it:

* ``SymmetricExchange`` (CUDA, every rank of the group on this host with peer access):
  each rank writes its message into every peer's symmetric-memory buffer (NVLink stores),
  then one device-side barrier of ``torch.distributed._symmetric_memory`` (release/acquire
  signals, with a timeout that names the rank it waited for), then a local reduction. Two
  slots, picked by a step counter on the device, let one barrier per step suffice: a rank
  writes slot ``s`` of step n + 2 only after passing step n + 1's barrier, which every peer
  reaches only after reading slot ``s`` of step n. No host sync, capturable in a CUDA graph.
* ``gather_messages`` (any backend: gloo on the CPU, NCCL without peer access): one
  functional-collective all-gather of the messages; never of the logits.

The reduction checks the headers: ranks that disagree on the batch, the samples, the
vocabulary, the seed, or whose shards do not tile [0, stop) for a stop <= V (ids past the
last shard are padding that no rank holds), fail the call with an
error naming them (a device assert on CUDA, which reads no value on the host), so a
mismatch never becomes a wrong token.
"""

from __future__ import annotations

import contextlib
import functools
import os
import warnings

import torch
import torch.distributed as dist
import triton
import triton.language as tl

__all__ = [
    "EXCHANGE_TIMEOUT_MS",
    "HEADER",
    "SymmetricExchange",
    "gather_messages",
    "pack_message",
    "reduce_messages",
    "resolve_group",
    "symmetric_exchange",
    "use_symmetric_memory",
]

# A rank that has not arrived after this long fails the call (symmetric memory: the
# barrier traps and prints the rank it waited for; collectives: the process group's own
# timeout applies).
EXCHANGE_TIMEOUT_MS = int(os.environ.get("FLASHSAMPLING_TP_TIMEOUT_MS", "30000"))
# Header fields of a message, in order.
HEADER = ("batch", "num_samples", "vocab_size", "seed", "shard_start", "shard_stop")
NO_INDEX = 2**31 - 1  # the index of a shard without vocabulary rows: never the lowest
_NO_INDEX = tl.constexpr(NO_INDEX)
# Candidates per rank and step the symmetric buffers hold (B * num_samples).
SYMMETRIC_CAPACITY = 1 << 16


def pack_message(score: torch.Tensor, index: torch.Tensor, header: torch.Tensor) -> torch.Tensor:
    """A rank's per-row bests, ``score`` [B, S] fp32 and global ``index`` [B, S], and its
    ``header`` [len(HEADER)] int64 -> its message [len(HEADER) + B * S] int64."""
    pairs = torch.stack([score.float().view(torch.int32), index.to(torch.int32)], dim=-1)
    return torch.cat([header, pairs.view(torch.int64).flatten()])


def reduce_messages(
    messages: torch.Tensor, header: torch.Tensor, batch: int, num_samples: int, where: str
) -> torch.Tensor:
    """[P, len(HEADER) + B * S] int64 messages of all ranks -> tokens [B, S] int64.

    Per (row, sample) the best score wins, ties to the lowest global index (the token
    ``torch.argmax`` over the whole vocabulary picks). ``header`` is this rank's own.
    """
    headers = messages[:, : len(HEADER)]
    _check_headers(headers, header, where)
    pairs = messages[:, len(HEADER) :].contiguous().view(torch.int32)
    pairs = pairs.view(-1, batch, num_samples, 2)
    scores, indices = pairs[..., 0].view(torch.float32), pairs[..., 1]
    best = scores.amax(dim=0, keepdim=True)
    tokens = torch.where(scores == best, indices, NO_INDEX).amin(dim=0)
    return tokens.to(torch.int64)


def _check_headers(headers: torch.Tensor, mine: torch.Tensor, where: str) -> None:
    """Every rank sampled what this one did, and the shards tile [0, stop) once, stop <= V
    (ids past the last shard's rows are padding no rank holds: never drawn)."""
    agree = (headers[:, :4] == mine[:4]).all(dim=1)  # [P]
    start, stop = headers[:, 4], headers[:, 5]
    order = start.argsort(stable=True)
    start, stop = start[order], stop[order]
    vocab_size = mine[2]
    tiles = (start[0] == 0) & (stop[-1] <= vocab_size) & (start[1:] == stop[:-1]).all()
    if headers.device.type == "cpu" and not torch.compiler.is_compiling():
        if not bool(agree.all()):
            bad = (~agree).nonzero().flatten().tolist()
            fields = dict(zip(HEADER, mine.tolist(), strict=True))
            theirs = {rank: headers[rank].tolist() for rank in bad}
            raise RuntimeError(
                f"flashsampling TP exchange ({where}): rank(s) {bad} sampled something else "
                f"than this rank ({fields}); their headers {HEADER}: {theirs}"
            )
        if not bool(tiles):
            raise RuntimeError(
                f"flashsampling TP exchange ({where}): the shards [start, stop) of the ranks "
                f"{headers[:, 4:].tolist()} do not tile the vocabulary [0, {int(vocab_size)})"
            )
        return
    # No host sync: a device assert per rank, each naming its rank.
    for rank in range(headers.shape[0]):
        torch._assert_async(
            agree[rank],
            f"flashsampling TP exchange ({where}): rank {rank} sampled another batch size, "
            "number of samples, vocabulary size or seed than this rank",
        )
    torch._assert_async(
        tiles, f"flashsampling TP exchange ({where}): the ranks' shards do not tile [0, V)"
    )


def gather_messages(message: torch.Tensor, group_name: str) -> torch.Tensor:
    """All ranks' messages [P, L] through one functional-collective all-gather."""
    world = dist.get_world_size(resolve_group(group_name))
    # The functional collective ops themselves (``all_gather_tensor`` wraps them and is
    # deprecated on newer torch): traceable, capturable, the same on torch 2.11 and 2.13.
    gathered = torch.ops._c10d_functional.all_gather_into_tensor(message, world, group_name)
    try:
        gathered = torch.ops._c10d_functional.wait_tensor(gathered)
    except RuntimeError as error:
        raise RuntimeError(
            f"flashsampling TP exchange (group {group_name}, rank "
            f"{dist.get_rank(resolve_group(group_name))}): the all-gather of the candidates "
            "failed, "
            "most likely because a rank did not arrive within the process group's timeout "
            f"or arrived with another batch size or number of samples (this rank sent "
            f"{message.numel()} int64: {len(HEADER)} header + B * num_samples)"
        ) from error
    return gathered.view(world, -1)


@functools.cache
def resolve_group(group_name: str) -> dist.ProcessGroup:
    """The process group of a group name (what functional collectives and custom ops carry)."""
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(group_name)


@triton.jit
def _fan_out(
    score_ptr, index_ptr, header_ptr, peers_ptr, step_ptr, rank, row, count,
    HEADER_LEN: tl.constexpr, WORLD: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """One program: this rank's message into row ``rank`` of slot ``step % 2`` of every
    peer's buffer (``peers_ptr``: their addresses). A candidate travels as one int64:
    the fp32 score's bits in the low word, the index in the high word (``pack_message``'s
    layout)."""
    slot = tl.load(step_ptr) % 2
    header_offsets = tl.arange(0, 8)
    header_mask = header_offsets < HEADER_LEN
    header = tl.load(header_ptr + header_offsets, mask=header_mask)
    for peer in tl.static_range(WORLD):
        base = tl.load(peers_ptr + peer).to(tl.pointer_type(tl.int64))
        tl.store(base + (slot * WORLD + rank) * row + header_offsets, header, mask=header_mask)
    for start in range(0, count, BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        mask = offsets < count
        score = tl.load(score_ptr + offsets, mask=mask).to(tl.int32, bitcast=True)
        index = tl.load(index_ptr + offsets, mask=mask).to(tl.int64)
        packed = (score.to(tl.int64) & 0xFFFFFFFF) | (index << 32)
        for peer in tl.static_range(WORLD):
            base = tl.load(peers_ptr + peer).to(tl.pointer_type(tl.int64))
            at = base + (slot * WORLD + rank) * row + HEADER_LEN + offsets
            tl.store(at, packed, mask=mask)


@triton.jit
def _reduce(
    buffer_ptr, header_ptr, step_ptr, out_ptr, error_ptr, row, count, vocab_size,
    HEADER_LEN: tl.constexpr, WORLD: tl.constexpr, WORLD_BLOCK: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    """One program, after the barrier: every rank's message in this step's slot of the local
    buffer -> the tokens (best score, ties to the lowest global index); ``error`` = 1 + the
    first rank whose header disagrees with this one's, WORLD + 1 if the shards do not tile
    [0, V), else 0. Then the next step's slot."""
    step = tl.load(step_ptr)
    base = buffer_ptr + (step % 2) * WORLD * row
    ranks = tl.arange(0, WORLD_BLOCK)
    fields = tl.arange(0, 8)
    mine = tl.load(header_ptr + fields, mask=fields < HEADER_LEN, other=0)
    in_world = ranks < WORLD
    headers = tl.load(
        base + ranks[:, None] * row + fields[None, :],
        mask=in_world[:, None] & (fields < HEADER_LEN)[None, :],
        other=0,
    )
    # Fields 0-3 (batch, samples, vocabulary size, seed) must be this rank's.
    differs = (headers != mine[None, :]) & (fields < 4)[None, :]
    bad = tl.sum(differs.to(tl.int32), axis=1) > 0
    first_bad = tl.min(tl.where(bad & in_world, ranks, WORLD_BLOCK), axis=0)
    start = tl.sum(tl.where(fields[None, :] == 4, headers, 0), axis=1)
    stop = tl.sum(tl.where(fields[None, :] == 5, headers, 0), axis=1)
    # The shards tile [0, stop) for a stop <= V when their sizes add up to at most V and
    # each starts at 0 or where another one stops (ids past the last shard: padding).
    follows = tl.sum((start[:, None] == stop[None, :]).to(tl.int32) * in_world[None, :], axis=1)
    placed = (start == 0) | (follows > 0) | (start == stop) | ~in_world
    tiles = (tl.sum(tl.where(in_world, stop - start, 0), axis=0) <= vocab_size) & (
        tl.min(placed.to(tl.int32), axis=0) > 0
    )
    error = tl.where(first_bad < WORLD, first_bad + 1, tl.where(tiles, 0, WORLD + 1))
    tl.store(error_ptr, error.to(tl.int64))
    for begin in range(0, count, BLOCK):
        offsets = begin + tl.arange(0, BLOCK)
        mask = offsets < count
        best_score = tl.full((BLOCK,), float("-inf"), tl.float32)
        best_index = tl.full((BLOCK,), _NO_INDEX, tl.int32)
        for peer in tl.static_range(WORLD):
            packed = tl.load(base + peer * row + HEADER_LEN + offsets, mask=mask, other=0)
            score = packed.to(tl.int32).to(tl.float32, bitcast=True)
            index = (packed >> 32).to(tl.int32)
            take = (score > best_score) | ((score == best_score) & (index < best_index))
            best_score = tl.where(take, score, best_score)
            best_index = tl.where(take, index, best_index)
        tl.store(out_ptr + offsets, best_index.to(tl.int64), mask=mask)
    tl.store(step_ptr, step + 1)


class SymmetricExchange:
    """Candidates through CUDA symmetric memory: one kernel stores this rank's message into
    every peer's buffer (NVLink), one device-side barrier, one kernel reduces the local
    buffer to the tokens. One per (group, device).

    Buffer layout: [2 slots, P ranks, len(HEADER) + SYMMETRIC_CAPACITY] int64; rank r
    writes row r of the step's slot in every peer's buffer. ``send`` and ``receive`` are
    the two halves around the barrier (tests run them on simulated ranks).
    """

    def __init__(self, group_name: str, device: torch.device) -> None:
        import torch.distributed._symmetric_memory as symm_mem

        group = resolve_group(group_name)
        self.group_name = group_name
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.row = len(HEADER) + SYMMETRIC_CAPACITY
        if hasattr(symm_mem, "enable_symm_mem_for_group"):
            with warnings.catch_warnings():  # needed on older torch, deprecated on newer
                warnings.simplefilter("ignore", FutureWarning)
                symm_mem.enable_symm_mem_for_group(group_name)
        self.buffer = symm_mem.empty(2 * self.world * self.row, dtype=torch.int64, device=device)
        self.buffer.zero_()
        self.handle = symm_mem.rendezvous(self.buffer, group_name)
        self.peers = torch.tensor(self.handle.buffer_ptrs, dtype=torch.int64, device=device)
        self.step = torch.zeros((), dtype=torch.int64, device=device)
        self.error = torch.zeros((), dtype=torch.int64, device=device)
        self.handle.barrier(channel=0, timeout_ms=EXCHANGE_TIMEOUT_MS)

    def sample(
        self,
        score: torch.Tensor,
        index: torch.Tensor,
        header: torch.Tensor,
        vocab_size: int,
        where: str,
    ) -> torch.Tensor:
        """This rank's candidates (``score`` [B, S] fp32, global ``index`` [B, S]) and
        header -> the tokens [B, S] of the whole group, the same on every rank."""
        self.send(score, index, header)
        self.handle.barrier(channel=0, timeout_ms=EXCHANGE_TIMEOUT_MS)
        return self.receive(header, score.shape, vocab_size, where)

    def send(self, score: torch.Tensor, index: torch.Tensor, header: torch.Tensor) -> None:
        count = score.numel()
        if count > SYMMETRIC_CAPACITY:
            raise ValueError(
                f"B * num_samples = {count} exceeds the symmetric exchange's capacity of "
                f"{SYMMETRIC_CAPACITY} candidates per rank"
            )
        with _on(score.device):
            _fan_out[(1,)](
                score.contiguous(), index.contiguous(), header, self.peers, self.step,
                self.rank, self.row, count,
                HEADER_LEN=len(HEADER), WORLD=self.world, BLOCK=_BLOCK,
            )  # fmt: skip

    def receive(
        self, header: torch.Tensor, shape: torch.Size, vocab_size: int, where: str
    ) -> torch.Tensor:
        tokens = torch.empty(shape, dtype=torch.int64, device=header.device)
        with _on(header.device):
            _reduce[(1,)](
                self.buffer, header, self.step, tokens, self.error, self.row, tokens.numel(),
                vocab_size,
                HEADER_LEN=len(HEADER), WORLD=self.world,
                WORLD_BLOCK=max(2, triton.next_power_of_2(self.world)), BLOCK=_BLOCK,
            )  # fmt: skip
        torch._assert_async(
            self.error == 0,
            f"flashsampling TP exchange ({where}): a rank sampled another batch size, number "
            "of samples, vocabulary size or seed than this one, or the shards do not tile the "
            "vocabulary (the exchange's error tensor holds 1 + that rank, or P + 1)",
        )
        return tokens


_BLOCK = 1024


def _on(device: torch.device):
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


@functools.cache
def symmetric_exchange(group_name: str, device: torch.device) -> SymmetricExchange:
    return SymmetricExchange(group_name, device)


def use_symmetric_memory(group_name: str, device: torch.device) -> bool:
    """Whether the call takes the symmetric-memory path: CUDA, every rank of the group on
    this host with peer access, and ``FLASHSAMPLING_TP_EXCHANGE`` not ``collective`` (set it
    alike on every rank)."""
    if device.type != "cuda" or os.environ.get("FLASHSAMPLING_TP_EXCHANGE") == "collective":
        return False
    return _peers_reachable(group_name, device)


@functools.cache
def _peers_reachable(group_name: str, device: torch.device) -> bool:
    """Agreed by one all-reduce, once per group and device."""
    group = resolve_group(group_name)
    local = dist.get_world_size(group) <= torch.cuda.device_count()
    if local:
        others = [d for d in range(torch.cuda.device_count()) if d != device.index]
        local = all(torch.cuda.can_device_access_peer(device.index, d) for d in others)
    try:
        from torch.distributed import _symmetric_memory  # noqa: F401
    except ImportError:
        local = False
    flag = torch.tensor([int(local)], dtype=torch.int64, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())  # once per group and device, not per step
