"""The candidate exchange of tensor-parallel sampling: every rank's per-row best (score,
global vocabulary index) reaches every rank, and each rank reduces them to the same tokens.

Two transports carry the candidates:

* ``SymmetricExchange`` (CUDA, every rank of the group on this host with peer access): one
  kernel per call (``_exchange``) reduces the shard's per-tile candidates per lane (row x
  sample), stores the lane's message (header: what the rank sampled, batch size, samples,
  vocabulary size, seed, its shard's global range; then the score's bits and the index) into
  every peer's symmetric-memory buffer over NVLink, waits for the peers' messages and reduces
  them. Each 8-byte word carries the lane's epoch tag beside its value, so a word read with
  this call's tag is this call's value: no barrier, no fence; two slots per lane keep skewed
  ranks apart. No host sync, capturable in a CUDA graph.
* ``gather_messages`` (any backend: gloo on the CPU, NCCL without peer access): one
  functional-collective all-gather of the messages, each one int64 row (``pack_message``:
  the header, then every (fp32 score bits, int32 index) pair in one int64); never of the
  logits.

The reduction checks the headers: ranks that disagree on the batch, the samples, the
vocabulary, the seed, or whose shards do not tile [0, stop) for a stop <= V (ids past the
last shard are padding that no rank holds), fail the call with an
error naming them (on CUDA the exchange's kernel itself: it prints the code and traps, which
reads no value on the host), so a mismatch never becomes a wrong token.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import warnings
from collections.abc import Callable

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from . import teardown
from .launch import launch
from .sampling_device import await_previous_kernel, pdl_launch

__all__ = [
    "EXCHANGE_TIMEOUT_MS",
    "HEADER",
    "SymmetricExchange",
    "exchange_launches_pdl",
    "gather_messages",
    "pack_message",
    "reduce_messages",
    "resolve_group",
    "symmetric_exchange",
    "use_symmetric_memory",
]

# A rank that has not arrived after this long fails the call (symmetric memory: the exchange
# kernel's wait; collectives: the process group's own timeout applies).
EXCHANGE_TIMEOUT_MS = int(os.environ.get("FLASHSAMPLING_TP_TIMEOUT_MS", "30000"))
# Header fields of a message, in order.
HEADER = ("batch", "num_samples", "vocab_size", "seed", "shard_start", "shard_stop")
NO_INDEX = 2**31 - 1  # the index of a shard without vocabulary rows: never the lowest
_NO_INDEX = tl.constexpr(NO_INDEX)


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


# The symmetric buffers: per (slot, rank, lane) one message of MESSAGE_WORDS int64 words, each
# word a 32-bit value in its low half and the lane's epoch tag in its high half.
MESSAGE_WORDS = 16  # 9 used: the header's fields (the seed as two words), score bits, index
_WORDS_USED = tl.constexpr(9)
_MESSAGE_WORDS = tl.constexpr(MESSAGE_WORDS)
# Lanes (rows x samples) a call may exchange through symmetric memory; more go by collectives.
SYMMETRIC_CAPACITY = 8192
_CAPACITY = tl.constexpr(SYMMETRIC_CAPACITY)
# One warp a program. The wait reads the peers' [P, MESSAGE_WORDS] words (32 or more) and
# every thread must see the same words: with more threads than words, Triton's layout holds
# each word in several threads, each loading it on its own; a word that lands between two
# of those loads splits the program's decision, its threads leave the wait loop apart and
# its reductions mix values from both sides (H200 x 4, B = 256: a rank's own message
# "missing" at once, then wrong tokens or a hang). With one warp each word has one thread
# (tests/test_tp.py checks the layout).
EXCHANGE_NUM_WARPS = 1


@triton.jit
def _now():
    """The GPU's global nanosecond timer."""
    return tl.inline_asm_elementwise(
        "mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1
    )


@triton.jit
def _thread_index():
    """The thread's index in its program (x)."""
    return tl.inline_asm_elementwise(
        "mov.u32 $0, %tid.x;", "=r", [], dtype=tl.int32, is_pure=False, pack=1
    )


@triton.jit
def _trap():
    """End the kernel with an error (PTX ``trap``): the CUDA context fails, as after a
    device assert, and the host's next synchronizing call raises."""
    tl.inline_asm_elementwise("trap;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _field(values, j: tl.constexpr):
    """Column ``j`` of a [P, MESSAGE_WORDS] block of message words -> [P]."""
    words = tl.arange(0, _MESSAGE_WORDS)
    return tl.sum(tl.where(words[None, :] == j, values, 0), axis=1)


@triton.jit
def _stale(words, epoch_bits):
    """1 where a message word does not carry this epoch's tag yet, else 0."""
    return (((words >> 32) & 0xFFFFFFFF) != epoch_bits).to(tl.int32)


# The int arguments that change between calls: never specialized (one compiled kernel).
_RUNTIME_INTS = [
    "seed_lo", "seed_hi", "rank", "batch", "num_samples", "vocab_size", "start", "stop",
]  # fmt: skip


@triton.jit(do_not_specialize=_RUNTIME_INTS)
def _exchange(
    cand_score_ptr, cand_index_ptr, num_candidates, seed_ptr, seed_lo, seed_hi, peers_ptr,
    buffer_ptr, epoch_ptr, out_ptr, ok_ptr, error_ptr, rank, lanes, batch, num_samples,
    vocab_size, start, stop, timeout_ns,
    SEED_MODE: tl.constexpr, WORLD: tl.constexpr, WORLD_BLOCK: tl.constexpr,
    BLOCK_C: tl.constexpr, SEND: tl.constexpr, RECEIVE: tl.constexpr, SPIN: tl.constexpr,
    PDL: tl.constexpr, TRAP: tl.constexpr = False,
):  # fmt: skip
    """One tensor-parallel exchange, per lane (row x sample) of the batch:

    1. the shard's best candidate over its ``num_candidates`` per-tile candidates (stage 2 of
       the fused kernel; ties to the lowest tile, so to the lowest global index);
    2. the lane's message (header, score bits, global index) into this rank's row of every
       peer's buffer, each int64 word tagged with the lane's epoch in its high half;
    3. wait until every rank's message of this epoch is in the local buffer: a word is
       written whole (8-byte stores are single-copy atomic), so a word that carries the tag
       carries its value; no fence and no barrier;
    4. the tokens (best score, ties to the lowest global index), and the headers checked.

    The lane's epoch counts the calls that had the lane (the same on every rank: ranks make
    the same calls); its two slots alternate, and a rank writes slot s of epoch n + 2 only
    after reading every peer's message of epoch n + 1, which each peer wrote after it had
    read slot s of epoch n (its launch of epoch n + 1 follows that of epoch n on its
    stream). ``ok`` becomes 0 and ``error`` the largest code on a failure: 1 + a rank that
    sampled something else, WORLD + 1 for shards that do not tile [0, V), WORLD + 2 + a rank
    whose message did not come within ``timeout_ns``. TRAP (with SPIN): the kernel itself
    fails the call, its first failing lane naming the code on stdout and then trapping (the
    CUDA context ends, as with a device assert), instead of a separate assert kernel reading
    ``ok`` after it. SEND / RECEIVE: the halves (tests run them on simulated ranks in turn,
    without SPIN). PDL (``exchange_launches_pdl``):
    launched as a programmatic dependent of stage 1: its launch overlaps stage 1's last
    programs, and it reads nothing before stage 1 has finished (the wait for the peers
    begins after that too, so every program of the grid is resident as before)."""
    await_previous_kernel(PDL)
    words = tl.arange(0, _MESSAGE_WORDS)
    ranks = tl.arange(0, WORLD_BLOCK)
    in_world = ranks < WORLD
    for lane in range(tl.program_id(0), lanes, tl.num_programs(0)):
        epoch = tl.load(epoch_ptr + lane) + 1
        slot = epoch % 2
        # (the tag is the epoch's low 32 bits: it wraps after 2**32 calls, never matching a
        # stale word, which is at most two epochs old)
        epoch_bits = epoch & 0xFFFFFFFF
        tag = epoch_bits << 32
        if SEED_MODE == 0:  # a Python int: its two 32-bit words (no 0-d tensor made per call)
            seed = (seed_hi.to(tl.int64) << 32) | (seed_lo.to(tl.int64) & 0xFFFFFFFF)
        elif SEED_MODE == 1:
            seed = tl.load(seed_ptr)
        else:
            seed = tl.load(seed_ptr + lane // num_samples)
        # The header's words, then (when sending) the score's bits and the index.
        value = tl.where(words == 0, batch, 0).to(tl.int64)
        value = tl.where(words == 1, num_samples, value)
        value = tl.where(words == 2, vocab_size, value)
        value = tl.where(words == 3, seed & 0xFFFFFFFF, value)
        value = tl.where(words == 4, (seed >> 32) & 0xFFFFFFFF, value)
        value = tl.where(words == 5, start, value)
        value = tl.where(words == 6, stop, value)
        if SEND:
            offsets = tl.arange(0, BLOCK_C)
            scores = tl.load(
                cand_score_ptr + lane * num_candidates + offsets,
                mask=offsets < num_candidates,
                other=float("-inf"),
            )
            best, winner = tl.max(
                scores, axis=0, return_indices=True, return_indices_tie_break_left=True
            )
            index = tl.load(cand_index_ptr + lane * num_candidates + winner).to(tl.int64)
            value = tl.where(words == 7, best.to(tl.int32, bitcast=True).to(tl.int64), value)
            value = tl.where(words == 8, index, value)
            message = (value & 0xFFFFFFFF) | tag
            for peer in tl.static_range(WORLD):
                base = tl.load(peers_ptr + peer).to(tl.pointer_type(tl.int64))
                at = base + ((slot * WORLD + rank) * _CAPACITY + lane) * _MESSAGE_WORDS + words
                tl.store(at, message, mask=words < _WORDS_USED)
        if RECEIVE:
            at = (
                buffer_ptr
                + ((slot * WORLD + ranks[:, None]) * _CAPACITY + lane) * _MESSAGE_WORDS
                + words[None, :]
            )
            used = in_world[:, None] & (words < _WORDS_USED)[None, :]
            received = tl.load(at, mask=used, other=tag, volatile=True)
            waiting = tl.sum(_stale(received, epoch_bits))
            if SPIN:
                deadline = _now() + timeout_ns
                late = 0
                while (waiting > 0) & (late == 0):
                    received = tl.load(at, mask=used, other=tag, volatile=True)
                    waiting = tl.sum(_stale(received, epoch_bits))
                    late = (_now() > deadline).to(tl.int32)
            arrived = tl.sum(_stale(received, epoch_bits), axis=1) == 0
            missing = tl.min(tl.where(arrived | ~in_world, WORLD_BLOCK, ranks), axis=0)
            received = received & 0xFFFFFFFF
            # Fields 0-4 (batch, samples, vocabulary size, seed) must be this rank's.
            differs = (received != value[None, :]) & (words < 5)[None, :] & in_world[:, None]
            bad = tl.sum(differs.to(tl.int32), axis=1) > 0
            first_bad = tl.min(tl.where(bad, ranks, WORLD_BLOCK), axis=0)
            starts = _field(received, 5)
            stops = _field(received, 6)
            # The shards tile [0, stop) for a stop <= V when their sizes add up to at most V
            # and each starts at 0 or where another one stops (ids past the last shard:
            # padding).
            follows = tl.sum(
                (starts[:, None] == stops[None, :]).to(tl.int32) * in_world[None, :], axis=1
            )
            placed = (starts == 0) | (follows > 0) | (starts == stops) | ~in_world
            tiles = (tl.sum(tl.where(in_world, stops - starts, 0), axis=0) <= vocab_size) & (
                tl.min(placed.to(tl.int32), axis=0) > 0
            )
            scores = _field(received, 7).to(tl.int32).to(tl.float32, bitcast=True)
            indices = _field(received, 8).to(tl.int32)
            scores = tl.where(in_world, scores, float("-inf"))
            best_score = tl.max(scores, axis=0)
            token = tl.min(tl.where(in_world & (scores == best_score), indices, _NO_INDEX), axis=0)
            tl.store(out_ptr + lane, token.to(tl.int64))
            error = tl.where(
                missing < WORLD,
                WORLD + 2 + missing,
                tl.where(first_bad < WORLD, first_bad + 1, tl.where(tiles, 0, WORLD + 1)),
            )
            if error != 0:
                tl.store(ok_ptr, 0)
                earlier = tl.atomic_max(error_ptr, error.to(tl.int64))
                if SPIN:
                    # The call's assert cannot carry values: the first failing lane names
                    # the rank on stdout before it (one thread prints).
                    if (earlier == 0) & (_thread_index() == 0):
                        tl.device_print(
                            " flashsampling TP exchange failed; this rank, the lane, the code "
                            "(1 + a rank that sampled something else, P + 1: shards that do "
                            "not tile, P + 2 + a rank that did not arrive):",
                            rank, lane, error,
                        )  # fmt: skip
                        if TRAP:
                            _trap()
            tl.store(epoch_ptr + lane, epoch)


class SymmetricExchange:
    """Candidates through CUDA symmetric memory: one kernel per call (``_exchange``) reduces
    this rank's per-tile candidates, stores each lane's message into every peer's buffer
    (NVLink), waits for the peers' messages of the same epoch and reduces them to the tokens.
    One per (group, device).

    Buffer layout: [2 slots, P ranks, SYMMETRIC_CAPACITY lanes, MESSAGE_WORDS] int64; rank r
    writes row r of the lane's slot in every peer's buffer. ``send`` and ``receive`` are the
    kernel's two halves (tests run them on simulated ranks).
    """

    def __init__(self, group_name: str, device: torch.device) -> None:
        import torch.distributed._symmetric_memory as symm_mem

        group = resolve_group(group_name)
        self.group_name = group_name
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        if hasattr(symm_mem, "enable_symm_mem_for_group"):
            with warnings.catch_warnings():  # needed on older torch, deprecated on newer
                warnings.simplefilter("ignore", FutureWarning)
                symm_mem.enable_symm_mem_for_group(group_name)
        size = 2 * self.world * SYMMETRIC_CAPACITY * MESSAGE_WORDS
        self.buffer = symm_mem.empty(size, dtype=torch.int64, device=device)
        self.buffer.zero_()
        self.handle = symm_mem.rendezvous(self.buffer, group_name)
        self.peers = torch.tensor(self.handle.buffer_ptrs, dtype=torch.int64, device=device)
        self._init_state(device)
        # Every peer's buffer is zeroed (no stale tag) before any rank's first message.
        self.handle.barrier(channel=0, timeout_ms=EXCHANGE_TIMEOUT_MS)

    def _init_state(self, device: torch.device) -> None:
        self.epochs = torch.zeros(SYMMETRIC_CAPACITY, dtype=torch.int64, device=device)
        self.ok = torch.ones((), dtype=torch.int64, device=device)
        self.error = torch.zeros((), dtype=torch.int64, device=device)
        # Every program waits for its peers' programs of the same number: a grid that fits
        # on the GPU at once (4 small programs an SM) so that none waits for one not started.
        self.max_programs = 1
        if device.type == "cuda":
            self.max_programs = 4 * torch.cuda.get_device_properties(device).multi_processor_count

    def sample(
        self,
        score: torch.Tensor,
        index: torch.Tensor,
        seed: torch.Tensor | int,
        fields: tuple[int, int, int, int, int],
        where: str,
        pdl: bool = False,
    ) -> torch.Tensor:
        """This rank's candidates (``score`` fp32 and global ``index``, [B, S] or per tile
        [B, S, T]), its seed (a Python int, 0-d or [B]) and header ``fields`` (batch,
        num_samples, vocab_size, shard_start, shard_stop) -> the tokens [B, S] of the whole
        group, the same on every rank. ``pdl``: launched as a programmatic dependent of the
        kernel before it (``exchange_launches_pdl``)."""
        trap = _check_in_kernel()
        tokens = self._launch(
            score, index, seed, fields, send=True, receive=True, spin=True, trap=trap, pdl=pdl
        )
        if not trap:
            self.check(where)
        return tokens

    def send(self, score, index, seed, fields) -> None:
        self._launch(score, index, seed, fields, send=True, receive=False, spin=False)

    def receive(self, score, index, seed, fields, where: str) -> torch.Tensor:
        tokens = self._launch(score, index, seed, fields, send=False, receive=True, spin=False)
        self.check(where)
        return tokens

    def check(self, where: str) -> None:
        # (CUDA's assert messages must stay under 255 characters; the error tensor holds 1 +
        # the rank that differs, P + 1 for shards that do not tile, P + 2 + the missing rank)
        torch._assert_async(
            self.ok,
            f"flashsampling TP exchange ({where[:40]}): a rank did not arrive within "
            f"{EXCHANGE_TIMEOUT_MS} ms, or sampled another batch size, number of samples, "
            "vocabulary size or seed, or the shards do not tile the vocabulary",
        )

    def _launch(self, score, index, seed, fields, send, receive, spin, trap=False, pdl=False):
        batch, num_samples = fields[0], fields[1]
        lanes = batch * num_samples
        if lanes > SYMMETRIC_CAPACITY:
            raise ValueError(
                f"B * num_samples = {lanes} exceeds the symmetric exchange's capacity of "
                f"{SYMMETRIC_CAPACITY} lanes"
            )
        num_candidates = score.numel() // max(lanes, 1)
        tokens = torch.empty((batch, num_samples), dtype=torch.int64, device=score.device)
        scalar_seed = 0
        if not isinstance(seed, torch.Tensor):
            scalar_seed, seed = seed % 2**64, None
        with _on(score.device):
            launch(
                _exchange, (min(lanes, self.max_programs),),
                score.contiguous(), index.contiguous(), num_candidates, seed,
                scalar_seed & 0xFFFFFFFF, scalar_seed >> 32, self.peers, self.buffer,
                self.epochs, tokens, self.ok, self.error, self.rank, lanes,
                *fields, EXCHANGE_TIMEOUT_MS * 1_000_000,
                SEED_MODE=0 if seed is None else 1 + (seed.dim() == 1), WORLD=self.world,
                WORLD_BLOCK=max(2, triton.next_power_of_2(self.world)),
                BLOCK_C=max(16, triton.next_power_of_2(num_candidates)),
                SEND=send, RECEIVE=receive, SPIN=spin, TRAP=trap, num_warps=EXCHANGE_NUM_WARPS,
                **(pdl_launch(score.device) if pdl else {"PDL": False}),
            )  # fmt: skip
        return tokens


def _check_in_kernel() -> bool:
    """Whether the exchange's kernel fails a bad call itself (``TRAP``: the default) or
    leaves its verdict to an assert kernel after it (``FLASHSAMPLING_TP_EXCHANGE_CHECK=assert``,
    read at each call; one launch more per step). Either way a bad exchange ends the CUDA
    context before any rank's tokens are read."""
    return os.environ.get("FLASHSAMPLING_TP_EXCHANGE_CHECK", "kernel") != "assert"


def exchange_launches_pdl(device: torch.device, persistent_stage1: Callable[[], bool]) -> bool:
    """Whether the symmetric exchange after a stage 1 on ``device`` is launched as a
    programmatic dependent of it (``pdl_launch``; stage 1 then signals it as its programs
    start: ``SIGNAL_DEPENDENTS``). FLASHSAMPLING_TP_EXCHANGE_PDL (read at each call, set
    alike on every rank): ``auto`` (the default) where stage 1 is the Triton kernel on a
    persistent grid (``persistent_stage1()``: ``dispatch.persistent_triton_stage1``, which
    picks the call's tiles: asked only under ``auto``), ``0`` never, ``1`` after every stage 1.

    The rule: a persistent grid starts every program at once, so the signal launches the
    exchange at stage 1's start and its programs take the SMs that stage 1's programs free
    at its tail. A full grid (one tile a program, B <= 64) signals only once its last wave
    has started, and the Gluon stage-1 kernels do not signal at all (without the signal
    PDL saved nothing, H200 x 4 2026-11-28 05:29). H200 x 4, bench_tp A/B in one process
    (CUDA graphs, 08:50), PDL after every stage 1 against none: D = 4096 B = 256 (persistent)
    159.3 against 162.3 us, B = 64 (full grid) 99.4 against 96.2; D = 8192 B = 256
    (persistent) 228.1 against 226.9. ``auto`` against ``0`` (14:20, bench_tp's
    ``fused_tp_auto`` beside ``fused_tp``, benchmarks/jobs/tp7_job.sh): within ~1 us at
    B <= 64, where the rule leaves the exchange as it is, and 2.8 / 0.6 us faster at B = 256,
    D = 4096 / 8192; the 10,000 skewed steps passed with it at world 4 (15:58): the default
    since."""
    mode = os.environ.get("FLASHSAMPLING_TP_EXCHANGE_PDL", PDL_DEFAULT)
    if mode == "auto":
        mode = "1" if persistent_stage1() else "0"
    return mode == "1" and pdl_launch(device)["PDL"]


# FLASHSAMPLING_TP_EXCHANGE_PDL's default (``exchange_launches_pdl``).
PDL_DEFAULT = "auto"


def _on(device: torch.device):
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


@functools.cache
def symmetric_exchange(group_name: str, device: torch.device) -> SymmetricExchange:
    return outside_graph_pools(device, lambda: SymmetricExchange(group_name, device))


def outside_graph_pools(device: torch.device, make):
    """``make()``, whose CUDA tensors are kept across calls, with its allocations outside any
    CUDA graph's private memory pool. A group's first TP call may come in the warm-up run of
    a cudagraph tree (``mode="reduce-overhead"``: hf.enable's decode step), whose allocations
    must all be the graph's outputs ("Detected 6 tensor(s) in the cudagraph pool not tracked
    as outputs", transformers 5.17 + torch 2.11 on two and four H200s). The tree sends every
    allocation of the warming thread to its pool (``_cuda_beginAllocateCurrentThreadToPool``),
    whatever the stream: a side stream alone did not help (2026-11-27 17:38). So ``make()``
    runs in a thread of its own, on a side stream that first waits for this thread's current
    stream, which then waits for it."""
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return make()  # (a capture joins what the side stream does: nothing to gain)
    current = torch.cuda.current_stream(device)
    outcome: list = []

    def run() -> None:
        try:
            with torch.cuda.device(device):
                side = torch.cuda.Stream(device)
                side.wait_stream(current)
                with torch.cuda.stream(side):
                    outcome.append((make(), side))
        except BaseException as error:  # noqa: BLE001 - raised again in the caller's thread
            outcome.append((error, None))

    thread = threading.Thread(target=run, name="flashsampling-kept-state")
    thread.start()
    thread.join()
    made, side = outcome[0]
    if side is None:
        raise made
    current.wait_stream(side)
    return made


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


@teardown.on_release
def _release_kept_state() -> None:
    """Drop the kept exchanges (their symmetric-memory buffers are freed with the last
    reference) and the per-group look-ups: a group destroyed and made again may reuse its
    name, and its first TP call agrees on them anew."""
    symmetric_exchange.cache_clear()
    _peers_reachable.cache_clear()
    resolve_group.cache_clear()
