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
vocabulary, the seed, or whose shards do not tile [0, V) exactly, fail the call with an
error naming them (a device assert on CUDA, which reads no value on the host), so a
mismatch never becomes a wrong token.
"""

from __future__ import annotations

import functools
import os
import warnings

import torch
import torch.distributed as dist

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
    """Every rank sampled what this one did, and the shards tile [0, V) once."""
    agree = (headers[:, :4] == mine[:4]).all(dim=1)  # [P]
    start, stop = headers[:, 4], headers[:, 5]
    order = start.argsort(stable=True)
    start, stop = start[order], stop[order]
    vocab_size = mine[2]
    tiles = (start[0] == 0) & (stop[-1] == vocab_size) & (start[1:] == stop[:-1]).all()
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


class SymmetricExchange:
    """Messages through CUDA symmetric memory: NVLink stores into every peer's buffer, one
    device-side barrier, a read of the local buffer. One per (group, device).

    Buffer layout: [2 slots, P ranks, len(HEADER) + SYMMETRIC_CAPACITY] int64; rank r
    writes row r of the step's slot in every peer's buffer.
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
        self.peers = [
            self.handle.get_buffer(peer, self.buffer.shape, torch.int64)
            for peer in range(self.world)
        ]
        self.step = torch.zeros((), dtype=torch.int64, device=device)
        self.handle.barrier(channel=0, timeout_ms=EXCHANGE_TIMEOUT_MS)

    def exchange(self, message: torch.Tensor) -> torch.Tensor:
        """This rank's message [L] -> all ranks' messages [P, L], in rank order."""
        length = message.numel()
        if length > self.row:
            raise ValueError(
                f"B * num_samples = {length - len(HEADER)} exceeds the symmetric exchange's "
                f"capacity of {SYMMETRIC_CAPACITY} candidates per rank"
            )
        # Positions of every rank's message in this step's slot (the slot is read on the
        # device: no host sync, and CUDA-graph replays alternate slots).
        offsets = torch.arange(length, device=message.device)
        ranks = torch.arange(self.world, device=message.device)[:, None] * self.row
        slot_start = self.step.remainder(2) * (self.world * self.row)
        for peer in self.peers:
            peer.index_copy_(0, slot_start + self.rank * self.row + offsets, message)
        self.handle.barrier(channel=0, timeout_ms=EXCHANGE_TIMEOUT_MS)
        # A copy, taken before the next step's barrier lets a peer reuse the other slot.
        mine = self.buffer.index_select(0, (slot_start + ranks + offsets).flatten())
        self.step.add_(1)
        return mine.view(self.world, length)


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
