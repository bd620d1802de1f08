"""Tensor-parallel sampling: ``tp_fused_sample`` over a vocabulary-sharded LM head.

Each rank holds rows ``vocab_start .. vocab_start + V_r - 1`` of the LM-head weight. It
computes, for its shard only, every row's best perturbed score and its GLOBAL vocabulary
index (the noise is keyed on the global index, so it is the noise ``fused_sample`` draws
for that token over the whole vocabulary), exchanges these few candidates with its peers
(``exchange.py``: symmetric memory on CUDA, an all-gather of the candidates elsewhere) and
keeps the best, ties to the lowest global index. Every rank returns the same tokens, and
they are the tokens ``fused_sample`` draws over the full vocabulary with the same seed,
whatever the number of ranks and however the vocabulary is cut (up to the near-ties
docs/exactness.md documents). The [B, V] logits are never gathered.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import warnings

import torch
import torch.distributed as dist

from . import teardown, tp_truncation
from .exchange import (
    HEADER,
    NO_INDEX,
    SYMMETRIC_CAPACITY,
    exchange_launches_pdl,
    gather_messages,
    outside_graph_pools,
    pack_message,
    reduce_messages,
    resolve_group,
    symmetric_exchange,
    use_symmetric_memory,
)
from .op import (
    IMPLS,
    MIN_P,
    SUPPORTED_DTYPES,
    TOP_K,
    TOP_P,
    _check_tensors,
    _normalize_seed,
    _normalize_softcap,
    _normalize_temperature,
    _plain_eager_call,
    _to_tensor_scalar,
    _triton_interpreter_on,
    _use_triton,
)
from .params import SamplingParams
from .reference import (
    gumbel_argmax,
    reference_candidates,
    reference_logits,
    softcap_logits,
    truncation_threshold,
)

__all__ = ["tp_fused_sample"]


def tp_fused_sample(
    hidden: torch.Tensor,
    weight_shard: torch.Tensor,
    *,
    vocab_start: int,
    vocab_size: int,
    group: dist.ProcessGroup | str | None = None,
    bias_shard: torch.Tensor | None = None,
    temperature: float | torch.Tensor = 1.0,
    num_samples: int = 1,
    seed: int | torch.Tensor | None = None,
    logits_dtype: torch.dtype | None = None,
    softcap: float | None = None,
    top_k: int | None = None,
    top_p: float | torch.Tensor | None = None,
    min_p: float | torch.Tensor | None = None,
    impl: str = "auto",
) -> torch.Tensor:
    """Sample from ``softmax((hidden @ W.T + bias) / temperature)`` with W sharded by
    vocabulary rows over the ranks of ``group``; every rank returns the same tokens.

    Args:
        hidden: [B, D], the same on every rank (the replicated input of the LM head).
        weight_shard: [V_r, D], this rank's rows of W: global vocabulary indices
            ``vocab_start .. vocab_start + V_r - 1``. Rows at or past ``vocab_size`` are
            padding (vLLM and Megatron pad the vocabulary to a multiple of the ranks) and
            are never drawn. Shards may differ in size (V % P != 0).
        vocab_start: the global index of the shard's first row.
        vocab_size: V, the real (unpadded) vocabulary size, the same on every rank.
        group: the tensor-parallel process group (or its name); None is the default group.
        bias_shard: optional [V_r], the shard's rows of the bias.
        temperature, num_samples, logits_dtype, softcap, impl: as in ``fused_sample``
            (the soft-cap, elementwise, applies to each shard's logits).
        top_k, top_p, min_p: as in ``fused_sample`` (top-k, then top-p, then min-p, the
            same tokens as ``fused_sample`` draws over the whole vocabulary), with top_k a
            Python int, the same on every rank, and top_p only after a top_k: each rank
            sends its shard's k largest scores (and how many tokens tie with its k-th) to
            every rank, which then all know the row's threshold
            (``_truncated_shard_candidates``); top-p over the whole row would need every
            token's mass. These calls materialize each shard's [B, V_r] logits.
        seed: int, 0-d or [B] int64 tensor, the same on every rank: the tokens are then
            those ``fused_sample`` draws with that seed. None: each rank draws the seed as
            ``fused_sample`` does (62 random bits from the default generator, on the device;
            Inductor's RNG under torch.compile), so under the same ``torch.manual_seed`` on
            every rank the tokens are TP = 1's. Group rank 0's wins: at the group's first
            call every rank's default generator takes rank 0's state (a warning where one
            changes) and that call takes rank 0's seed, so ranks seeded apart agree and draw
            what rank 0 alone would. No host sync after the group's first call, and a CUDA
            graph that captured the call draws fresh tokens per replay.

    Returns:
        [B, num_samples] int64 global token ids in [0, vocab_size), equal on every rank.
        The call fails with an error naming the rank when a rank does not arrive in time
        (``FLASHSAMPLING_TP_TIMEOUT_MS`` for symmetric memory, the process group's timeout
        for collectives) or arrives with another batch size, number of samples, vocabulary
        size, seed or a shard that does not fit the others'.
    """
    _check_tensors(hidden, weight_shard, bias_shard)
    for name, value in (("vocab_start", vocab_start), ("vocab_size", vocab_size)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if vocab_size < 1 or vocab_size >= 2**31:
        raise ValueError(f"vocab_size must be in [1, 2**31), got {vocab_size}")
    if not 0 <= vocab_start <= vocab_size:
        raise ValueError(
            f"vocab_start must be in [0, vocab_size = {vocab_size}], got {vocab_start}"
        )
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be an int >= 1, got {num_samples!r}")
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "triton" and hidden.device.type == "cpu" and not _triton_interpreter_on():
        raise ValueError(
            "impl='triton' on CPU tensors needs the Triton interpreter (TRITON_INTERPRET=1)"
        )
    if logits_dtype is not None and logits_dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"logits_dtype must be None, bf16, fp16 or fp32, got {logits_dtype}")
    group_name = _group_name(group)
    softcap = _normalize_softcap(softcap)
    truncation = _truncation_knobs(top_k, top_p, min_p, hidden, vocab_size)
    temperature_tensor, scalar_temperature = _normalize_temperature(temperature, hidden)
    seed_tensor, scalar_seed = _normalize_seed(seed, hidden)
    if hidden.shape[0] == 0:
        return torch.empty((0, num_samples), dtype=torch.int64, device=hidden.device)
    if seed is None:
        seed_tensor = _draw_seed(hidden.device)  # (traced: Inductor's RNG, as fused_sample's)
    args = (
        hidden,
        weight_shard,
        bias_shard,
        temperature_tensor,
        scalar_temperature,
        seed_tensor,
        scalar_seed,
        num_samples,
        logits_dtype,
        impl,
        vocab_start,
        vocab_size,
        group_name,
        seed is None,
        softcap,
        *truncation,
    )
    tensors = (temperature_tensor, seed_tensor, truncation[1], truncation[3])
    if _plain_eager_call(hidden, weight_shard, bias_shard, *tensors):
        # As fused_sample: plain eager calls skip the dispatcher's custom-op layers.
        return _tp_fused_sample_impl(*args)
    return torch.ops.flashsampling.tp_fused_sample(*args)


def _group_name(group: dist.ProcessGroup | str | None) -> str:
    if isinstance(group, str):
        return group
    if group is None:
        group = dist.group.WORLD
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"group must be a ProcessGroup, its name or None, got {type(group)}")
    return group.group_name


def _tp_fused_sample_impl(
    hidden: torch.Tensor,
    weight_shard: torch.Tensor,
    bias_shard: torch.Tensor | None,
    temperature: torch.Tensor | None,
    scalar_temperature: float,
    seed: torch.Tensor | None,
    scalar_seed: int,
    num_samples: int,
    logits_dtype: torch.dtype | None,
    impl: str,
    vocab_start: int,
    vocab_size: int,
    group_name: str,
    shared_seed: bool,
    softcap: float = 0.0,
    scalar_top_k: int = 0,
    top_p: torch.Tensor | None = None,
    scalar_top_p: float = 1.0,
    min_p: torch.Tensor | None = None,
    scalar_min_p: float = 0.0,
    local_bias: bool = False,
) -> torch.Tensor:
    """The custom op behind ``tp_fused_sample``; arguments are already validated.

    ``shared_seed``: ``seed`` is this rank's fresh draw (drawn here when None); group rank
    0's is taken (``_agreed_seed``).
    A negative ``vocab_start``, -W (what the compiler pass emits, so that one graph serves
    every rank): the vocabulary is cut in blocks of W rows in group-rank order, this rank's
    block starts at group rank x W and holds its ``weight_shard`` rows (fewer than W on a
    short last shard), and ``bias_shard`` is the whole [vocab_size] bias, or with
    ``local_bias`` this rank's rows of it (a sharded LM head with a bias).
    """
    device, batch = hidden.device, hidden.shape[0]
    # What this call may keep (the exchange, captured collectives) goes before the group.
    teardown.release_before_destroy()
    if vocab_start < 0:
        vocab_start = dist.get_rank(resolve_group(group_name)) * -vocab_start
        if bias_shard is not None and not local_bias:
            bias_shard = bias_shard[vocab_start:]
    if shared_seed:
        seed = _agreed_seed(_draw_seed(device) if seed is None else seed, group_name, device)
    stop = min(vocab_start + weight_shard.shape[0], vocab_size)
    if scalar_top_k >= vocab_size:
        scalar_top_k = 0  # off (the pass lowers no top-p after it: tp_gather._lowerable)
    weight_shard = weight_shard[: stop - vocab_start]
    bias_shard = None if bias_shard is None else bias_shard[: stop - vocab_start]
    symmetric = batch * num_samples <= SYMMETRIC_CAPACITY and use_symmetric_memory(
        group_name, device
    )
    params = SamplingParams(
        temperature, scalar_temperature, seed, scalar_seed, num_samples, logits_dtype,
        None, scalar_top_k, top_p, scalar_top_p, min_p, scalar_min_p, softcap,
    )  # fmt: skip
    if seed is None and (params.truncates or not symmetric or not _scalar_seed_to_kernels()):
        seed = torch.full((), scalar_seed, dtype=torch.int64, device=device)
        params = dataclasses.replace(params, seed=seed)
    if params.truncates:
        # (symmetric memory: the exchange's kernel reduces the draw's per-chunk candidates)
        score, index = _truncated_shard_candidates(
            hidden, weight_shard, bias_shard, params, vocab_start, vocab_size, group_name, impl,
            per_chunk=symmetric,
        )  # fmt: skip
        pdl = False
    else:
        # (symmetric memory: the exchange's kernel reduces the shard's per-tile candidates)
        score, index, pdl = _shard_candidates(
            hidden, weight_shard, bias_shard, temperature, scalar_temperature, seed,
            scalar_seed, num_samples, logits_dtype, impl, vocab_start, softcap,
            per_tile=symmetric, drawn_seed=shared_seed,
        )  # fmt: skip
    where = f"group {group_name}"
    if symmetric:
        # The seed travels in every lane's header (a per-row seed: the lane's row's), so
        # ranks seeded apart fail the call instead of drawing wrong tokens.
        fields = (batch, num_samples, vocab_size, vocab_start, stop)
        exchange = symmetric_exchange(group_name, device)
        return exchange.sample(
            score, index, scalar_seed if seed is None else seed, fields, where, pdl=pdl
        )
    seed_key = seed.sum() if seed.dim() else seed
    fields = _header_fields(batch, num_samples, vocab_size, vocab_start, stop, device)
    header = torch.cat([fields[:3], seed_key.view(1), fields[3:]])
    messages = gather_messages(pack_message(score, index, header), group_name)
    return reduce_messages(messages, header, batch, num_samples, where)


def _scalar_seed_to_kernels() -> bool:
    """Whether a plain call through symmetric memory with an explicit int seed passes it to
    stage 1 and the exchange as it is, instead of as a 0-d tensor made per call (one launch
    fewer a step). On by default; FLASHSAMPLING_TP_SCALAR_SEED=0 (read at each call, set
    alike on every rank) makes the tensor. H200 x 4, bench_tp in one process (CUDA graphs,
    2026-11-28 14:20, ``fused_tp_seed_scalar`` against ``fused_tp_seed``): 1.4-3.8 us faster
    in 7 of 8 cells (D = 4096 / 8192, B = 1, 16, 64, 256), 1.8 us slower at D = 8192 B = 1;
    the 10,000 skewed steps passed with it (15:58). The exchange's int path also runs on the
    CPU's simulated ranks."""
    return os.environ.get("FLASHSAMPLING_TP_SCALAR_SEED", "1") != "0"


def _stage1_after_draw_pdl() -> bool:
    """Opt-in (FLASHSAMPLING_TP_STAGE1_PDL=1, read at each call): with ``seed=None`` the
    shard's stage 1 (the Triton kernel or the Gluon one, not the swapped kernel of 129-192 /
    129-160 rows) is launched as a programmatic dependent of the kernel before it (the seed's
    draw, ``torch.randint``: 3 us alone in a CUDA graph, 4-6 us before stage 1 on an H200),
    waiting for its end before any load, so that its launch overlaps the draw's tail. H200 x 4
    (bench_tp's ``fused_tp_stage1pdl`` beside ``fused_tp``, 2026-11-28 16:49 and 17:26): within
    the runs' spread, 1-4 us faster at D = 4096 and 1-4 us slower at D = 8192: opt-in."""
    return os.environ.get("FLASHSAMPLING_TP_STAGE1_PDL", "0") == "1"


@functools.cache
def _header_fields(batch, num_samples, vocab_size, vocab_start, stop, device) -> torch.Tensor:
    """The header's fields other than the seed, made once per shape (no copy per call), kept
    out of CUDA graphs' pools (``exchange.outside_graph_pools``)."""
    assert HEADER == ("batch", "num_samples", "vocab_size", "seed", "shard_start", "shard_stop")
    fields = [batch, num_samples, vocab_size, vocab_start, stop]
    return outside_graph_pools(
        device, lambda: torch.tensor(fields, dtype=torch.int64, device=device)
    )


def _shard_candidates(
    hidden, weight, bias, temperature, scalar_temperature, seed, scalar_seed, num_samples,
    logits_dtype, impl, vocab_start, softcap=0.0, per_tile=False, drawn_seed=False,
):  # fmt: skip
    """Per row and sample, the shard's best score [B, S] fp32 and its global index [B, S];
    with ``per_tile``, where the Triton kernels run, stage 1's per-tile candidates [B, S, T]
    instead (the best of them is the shard's best), and whether the exchange after them is
    launched as a programmatic dependent of stage 1 (``exchange_launches_pdl``).
    ``drawn_seed``: ``seed`` was drawn by the kernel just before (``seed=None``)."""
    batch = hidden.shape[0]
    if weight.shape[0] == 0:  # a shard of padding rows only
        score = torch.full((batch, num_samples), float("-inf"), device=hidden.device)
        return score, torch.full_like(score, NO_INDEX, dtype=torch.int64), False
    params = SamplingParams(
        temperature, scalar_temperature, seed, scalar_seed, num_samples, logits_dtype,
        softcap=softcap,
    )  # fmt: skip
    if _use_triton(impl, hidden.device, params) and vocab_start % 4 == 0:
        from .dispatch import persistent_triton_stage1, triton_fused_sample

        if per_tile:
            # (a PDL exchange after it: stage 1 lets it be scheduled as its programs start)
            pdl = exchange_launches_pdl(
                hidden.device,
                lambda: persistent_triton_stage1(
                    batch, hidden.shape[1], weight.shape[0], hidden.device, params
                ),
            )
            score, index = triton_fused_sample(
                hidden, weight, bias, params, vocab_offset=vocab_start, tile_candidates=True,
                signal_dependents=pdl, wait_previous=drawn_seed and _stage1_after_draw_pdl(),
            )  # fmt: skip
            return score, index, pdl
        score = torch.empty((batch, num_samples), dtype=torch.float32, device=hidden.device)
        index = triton_fused_sample(
            hidden, weight, bias, params, vocab_offset=vocab_start, out_score=score
        )
        return score, index, False
    if impl == "triton":
        raise ValueError(
            f"impl='triton' needs a shard that starts at a multiple of 4 (the kernel draws "
            f"noise for aligned quads of tokens), got vocab_start={vocab_start}"
        )
    # The reference: CPU tensors, and CUDA shards that start off a multiple of 4 (slow).
    if temperature is None:
        temperature = torch.full((batch,), scalar_temperature, device=hidden.device)
    if seed is None:
        seed = torch.full((), scalar_seed, dtype=torch.int64, device=hidden.device)
    score, index = reference_candidates(
        hidden,
        weight,
        bias,
        temperature.float().expand(batch),
        seed.expand(batch),
        seed.dim() == 1,
        num_samples,
        logits_dtype,
        vocab_start,
        softcap,
    )
    return score, index, False


def _truncation_knobs(top_k, top_p, min_p, rows, vocab_size):
    """tp_fused_sample's top_k / top_p / min_p -> (scalar_top_k, top_p tensor or None,
    scalar_top_p, min_p tensor or None, scalar_min_p), checked as ``fused_sample`` checks
    them, plus what the exchange of the top k needs: a Python k, and top-p only after it."""
    if isinstance(top_k, torch.Tensor):
        raise TypeError(
            "tp_fused_sample takes top_k as a Python int (the ranks exchange k scores a row, "
            "a size every rank must know without reading a tensor)"
        )
    _, scalar_top_k = _to_tensor_scalar(top_k, TOP_K, rows)
    if scalar_top_k >= vocab_size:
        scalar_top_k = 0  # off, as in fused_sample
    top_p, scalar_top_p = _to_tensor_scalar(top_p, TOP_P, rows)
    min_p, scalar_min_p = _to_tensor_scalar(min_p, MIN_P, rows)
    if scalar_top_k == 0 and (top_p is not None or scalar_top_p < 1.0):
        raise ValueError(
            "tp_fused_sample takes top_p only after a top_k: the nucleus of a whole row needs "
            "the mass of every token, which no rank has"
        )
    return scalar_top_k, top_p, scalar_top_p, min_p, scalar_min_p


def _shard_logits(hidden, weight, bias, logits_dtype, native: bool = False) -> torch.Tensor:
    """The shard's [B, V_r] fp32 logits as ``fused_sample`` scores them. Where they are
    rounded to the weights' own half dtype (what the pass passes for a bf16 / fp16 LM head),
    the matmul in that dtype (fp32 accumulation, one rounding) gives them without copying
    the shard's weight to fp32 every step (the reference's way, kept for the rest), and
    with ``native`` in that dtype (the same values, half the bytes to read again)."""
    if bias is None and logits_dtype == hidden.dtype and hidden.dtype != torch.float32:
        logits = hidden @ weight.T
        return logits if native else logits.float()
    if hidden.is_cuda and hidden.dtype != torch.float32:
        # fp32 logits of half-precision inputs without an fp32 copy of the weight (cuBLAS's
        # out_dtype matmul), rounded or biased as the reference does
        try:
            logits = torch.mm(hidden, weight.T, out_dtype=torch.float32)
        except torch.OutOfMemoryError:
            raise
        except (TypeError, NotImplementedError, RuntimeError):  # (a torch or GPU without it)
            return reference_logits(hidden, weight, bias, logits_dtype)
        if bias is not None:
            logits = logits + bias.float()
        return logits if logits_dtype is None else logits.to(logits_dtype).float()
    return reference_logits(hidden, weight, bias, logits_dtype)


def _truncated_shard_candidates(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    params: SamplingParams,
    vocab_start: int,
    vocab_size: int,
    group_name: str,
    impl: str = "auto",
    per_chunk: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``_shard_candidates`` for a call that truncates: the shard's best perturbed score and
    global index among the tokens that top-k, top-p and min-p keep over the WHOLE row.

    They keep every token at or above one per-row threshold (``truncation_threshold``),
    which needs the row's top k values with their multiplicity and its maximum: the union of
    every shard's k largest values holds the row's k largest exactly (a shard holds at most
    k of them, and holds them among its own k largest), and every kept token is in it except
    ties with the row's k-th value that a shard left out with its own k-th. So each rank
    sends its k largest values and how many tokens it left out that tie with the last of
    them (one all-gather of [B, k + 1] fp32 a rank); every rank computes the same threshold
    from the same messages, masks its shard below it and draws as ``_shard_candidates``
    (the Triton kernels: ``_kernel_truncated_candidates``; the reference: torch ops).
    With ``per_chunk``, where the kernels run, the draw's per-chunk candidates [B, S, C]
    (the exchange reduces them)."""
    batch, device = hidden.shape[0], hidden.device
    rows = params.rows(batch, device)
    world = dist.get_world_size(resolve_group(group_name))
    slots = max(params.scalar_top_k, 1)  # (min-p alone needs the row's maximum only)
    if _use_triton(impl, device, params) and world * slots <= tp_truncation.MAX_ENTRIES:
        return _kernel_truncated_candidates(
            hidden, weight, bias, params, rows, slots, vocab_start, vocab_size, group_name,
            per_chunk,
        )  # fmt: skip
    logits = softcap_logits(
        _shard_logits(hidden, weight, bias, params.logits_dtype), params.softcap
    )
    logits = logits.masked_fill(logits.isnan(), float("-inf"))
    sent = min(slots, logits.shape[1])  # (a short shard pads its message with -inf)
    top = torch.full((batch, slots), float("-inf"), device=device)
    top[:, :sent] = logits.topk(sent).values
    last = top[:, -1:]
    untold = (logits == last).sum(-1) - (top[:, :sent] == last).sum(-1)
    # (the count travels bit-cast in the fp32 message: exact at any shard size)
    message = torch.cat([top, untold.to(torch.int32).view(torch.float32)[:, None]], dim=1)
    received = gather_messages(message, group_name).view(world, batch, slots + 1)
    values = received[..., :slots].permute(1, 0, 2).reshape(batch, world * slots)
    entries, repeats = values, None
    if params.scalar_top_k:
        # The ties a shard left out count only where its k-th value is the row's k-th.
        kth = values.topk(slots).values[:, -1:]
        ends = received[..., slots - 1].T  # [B, P]: each shard's k-th value
        left_out = received[..., slots].contiguous().view(torch.int32).T.to(torch.int64)
        tied = ends == kth
        entries = torch.cat([values, torch.where(tied, kth, float("-inf"))], dim=1)
        repeats = torch.cat(
            [torch.ones_like(values, dtype=torch.int64), torch.where(tied, left_out, 0)], dim=1
        )
    entries, order = entries.sort(dim=-1, descending=True)
    if repeats is not None:
        repeats = repeats.gather(1, order)
    threshold = truncation_threshold(
        entries, vocab_size, rows.temperature, rows.top_k, rows.top_p, rows.min_p, repeats
    )
    if logits.shape[1] == 0:  # a shard of padding rows only: it sent, it has no token
        score = torch.full((batch, params.num_samples), float("-inf"), device=device)
        return score, torch.full_like(score, NO_INDEX, dtype=torch.int64)
    if _use_triton(impl, device, params):
        from .truncation_kernel import masked_gumbel_argmax

        return masked_gumbel_argmax(
            logits, threshold, rows.temperature, params.seed, params.num_samples, vocab_start
        )
    logits = logits.masked_fill(logits < threshold, float("-inf"))
    return gumbel_argmax(
        logits, rows.temperature, rows.seed, params.per_row_seed, params.num_samples, vocab_start
    )


def _kernel_truncated_candidates(
    hidden, weight, bias, params, rows, slots, vocab_start, vocab_size, group_name, per_chunk
):  # fmt: skip
    """``_truncated_shard_candidates`` through the kernels of ``tp_truncation``: the shard's
    logits (cuBLAS, in the head's half dtype where the logits are rounded to it), their
    ``slots`` largest (torch.topk), then one kernel each for the message, the threshold and
    the draw, and one all-gather of the messages; no torch op on [B, V_r] but the topk (and
    the soft-cap, where one is on)."""
    batch, device = hidden.shape[0], hidden.device
    logits = _shard_logits(hidden, weight, bias, params.logits_dtype, native=True)
    if params.softcap:
        logits = softcap_logits(logits.float(), params.softcap)
    # (torch.topk ranks NaN above everything; the kernels read NaN as -inf themselves)
    logits = logits.nan_to_num_(nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))
    if logits.shape[1]:
        top = logits.topk(min(slots, logits.shape[1])).values
        message = tp_truncation.shard_message(logits, top, slots)
    else:  # a shard of padding rows only: nothing sent, no ties (0.0's bits are 0)
        message = torch.full((batch, slots + 1), float("-inf"), device=device)
        message[:, slots] = 0.0
    received = gather_messages(message, group_name)
    bound = tp_truncation.threshold(
        received, batch, slots, vocab_size, rows.temperature, rows.top_k, rows.top_p,
        rows.min_p, params.scalar_top_k > 0,
    )  # fmt: skip
    if logits.shape[1] == 0:  # a shard of padding rows only: it sent, it has no token
        score = torch.full((batch, params.num_samples), float("-inf"), device=device)
        return score, torch.full_like(score, NO_INDEX, dtype=torch.int64)
    score, index = tp_truncation.masked_draw(
        logits, bound, rows.temperature, params.seed, params.num_samples, vocab_start
    )
    if per_chunk:
        return score, index
    best = score.amax(-1, keepdim=True)
    winner = torch.where(score == best, index, NO_INDEX).amin(-1)
    return best[..., 0], winner.to(torch.int64)


def _draw_seed(device: torch.device) -> torch.Tensor:
    """The seed ``fused_sample`` draws for ``seed=None``: 62 random bits on the device."""
    return torch.randint(0, 2**62, (), dtype=torch.int64, device=device)


def _agreed_seed(seed: torch.Tensor, group_name: str, device: torch.device) -> torch.Tensor:
    """This rank's fresh ``seed`` (0-d int64) -> group rank 0's, the same on every rank.

    Ranks seeded alike draw alike (SPMD programs consume their generators alike): the seed
    is theirs, with no communication. At the group's first call (per device) the ranks'
    default generators are made rank 0's (``_align_generators``, once) and that call takes
    rank 0's seed through one all-gather, since it was drawn before; from then on every rank
    draws rank 0's seeds itself. A rank whose generator drifts later (a rank-dependent random
    op) fails the call: the seed travels in the exchange's header."""
    if (group_name, device) in _ALIGNED:
        return seed
    _align_generators(group_name, device)
    world = dist.get_world_size(resolve_group(group_name))
    gathered = torch.ops._c10d_functional.all_gather_into_tensor(seed.reshape(1), world, group_name)
    return torch.ops._c10d_functional.wait_tensor(gathered)[0]


_ALIGNED: set[tuple[str, torch.device]] = set()
# (a group destroyed and made again may reuse its name; its generators are aligned anew)
teardown.on_release(_ALIGNED.clear)


def _align_generators(group_name: str, device: torch.device) -> None:
    """Once per group and device: every rank's default generator of the device's type takes
    group rank 0's state (one broadcast and one host sync). CUDA's default generators are
    seeded at random per process unless ``torch.manual_seed`` ran, so unseeded ranks differ;
    a rank whose state changes is warned."""
    if device.type == "cuda":
        generator = torch.cuda.default_generators[device.index or 0]
    else:
        generator = torch.default_generator
    group = resolve_group(group_name)
    mine = generator.get_state()
    state = mine.to(device, copy=True)
    dist.broadcast(state, src=dist.get_global_rank(group, 0), group=group)
    state = state.cpu()
    if not torch.equal(state, mine):
        generator.set_state(state)
        warnings.warn(
            f"flashsampling: tensor-parallel sampling with seed=None (group {group_name}): this "
            f"rank's default {device.type} generator differed from group rank 0's at the "
            "group's first call and now takes rank 0's state, so that every rank draws rank "
            "0's seeds (seed every rank alike, torch.manual_seed, to keep your own)",
            stacklevel=2,
        )
    _ALIGNED.add((group_name, device))


@torch.library.custom_op("flashsampling::tp_gathered_weight", mutates_args=())
def _tp_gathered_weight(
    weight_shard: torch.Tensor, group_size: int, group_name: str, vocab_size: int
) -> torch.Tensor:
    """The whole LM-head weight [vocab_size, D]: every rank's rows gathered, padding dropped.

    The compiler pass's stand-in for a gather of sharded logits (``patterns/tp_gather.py``);
    it runs only where a lifted gather met a sampling step the TP op cannot take, and then
    computes what the program did, gathering the weight instead of the logits.
    """
    gathered = torch.ops._c10d_functional.all_gather_into_tensor(
        weight_shard.contiguous(), group_size, group_name
    )
    return torch.ops._c10d_functional.wait_tensor(gathered)[:vocab_size].clone()


@_tp_gathered_weight.register_fake
def _(weight_shard, group_size, group_name, vocab_size):
    return weight_shard.new_empty((vocab_size, weight_shard.shape[1]))


@torch.library.custom_op("flashsampling::tp_gathered_bias", mutates_args=())
def _tp_gathered_bias(
    bias_shard: torch.Tensor, shard_width: int, group_size: int, group_name: str, vocab_size: int
) -> torch.Tensor:
    """The whole bias [vocab_size]: every rank's rows (padded to ``shard_width``) gathered,
    padding dropped. ``tp_gathered_weight``'s companion for an LM head with a bias; the
    lowered TP call takes the rank's own rows instead."""
    padded = torch.nn.functional.pad(bias_shard, (0, shard_width - bias_shard.shape[0]))
    gathered = torch.ops._c10d_functional.all_gather_into_tensor(
        padded.contiguous(), group_size, group_name
    )
    return torch.ops._c10d_functional.wait_tensor(gathered)[:vocab_size].clone()


@_tp_gathered_bias.register_fake
def _(bias_shard, shard_width, group_size, group_name, vocab_size):
    return bias_shard.new_empty((vocab_size,))


_tp_op = torch.library.custom_op(
    "flashsampling::tp_fused_sample", _tp_fused_sample_impl, mutates_args=()
)


@_tp_op.register_fake
def _(hidden, weight_shard, bias_shard, temperature, scalar_temperature, seed, scalar_seed, n, *_):
    return hidden.new_empty((hidden.shape[0], n), dtype=torch.int64)
