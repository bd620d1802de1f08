"""Tensor-parallel sampling on CUDA: the kernel on shards (one GPU) and the symmetric-memory
exchange (two GPUs or more, ``multigpu``), at real size.

Run on the 2-GPU machine with ``python -m pytest -m "gpu or multigpu" tests/test_tp_gpu.py``.
"""

from __future__ import annotations

import os
import random
import time

import pytest
import torch

from flashsampling_inductor import fused_sample, tp_fused_sample
from flashsampling_inductor.exchange import HEADER, pack_message, reduce_messages
from flashsampling_inductor.tp import _shard_candidates

from .sampling_oracle import assert_pathwise_equal, make_problem
from .tp_ranks import run_ranks

VOCAB = 151936


def world_size() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 64, 256])
@pytest.mark.parametrize("shards", [2, 4, 8])
def test_gpu_kernel_on_shards_draws_the_full_vocabulary_tokens(batch, shards):
    """The fused kernel with a vocabulary offset, one GPU playing every rank (bf16)."""
    hidden, weight = make_problem(batch, VOCAB, 512, torch.bfloat16)
    seed = 2024 + batch
    size = VOCAB // shards
    messages = []
    for start in range(0, VOCAB, size):
        score, index, _ = _shard_candidates(
            hidden, weight[start : start + size], None, None, 1.0,
            torch.tensor(seed, device=hidden.device), 0, 1, None, "triton", start,
        )  # fmt: skip
        header = torch.tensor([batch, 1, VOCAB, 0, start, start + size], device=hidden.device)
        messages.append(pack_message(score, index, header))
    tokens = reduce_messages(torch.stack(messages), messages[0][: len(HEADER)], batch, 1, "test")
    expected = fused_sample(hidden, weight, seed=seed, impl="torch")
    assert_pathwise_equal(tokens, expected, hidden, weight, seed=seed)


def _symmetric_worker(rank, world, batches):
    from flashsampling_inductor.exchange import use_symmetric_memory

    device = torch.device("cuda", rank)
    out = {"symmetric": None, "tokens": {}}
    for batch in batches:
        hidden, weight = make_problem(batch, VOCAB, 512, torch.bfloat16, device=device)
        shard = -(-VOCAB // world)
        start = rank * shard
        for seed in (7, 8):
            tokens = tp_fused_sample(
                hidden, weight[start : start + shard], vocab_start=start, vocab_size=VOCAB,
                seed=seed,
            )  # fmt: skip
            out["tokens"][batch, seed] = tokens.cpu()
            if rank == 0:
                expected = fused_sample(hidden, weight, seed=seed, impl="torch")
                assert_pathwise_equal(tokens, expected, hidden, weight, seed=seed)
    group = torch.distributed.group.WORLD.group_name
    out["symmetric"] = use_symmetric_memory(group, device)
    return out


def _truncated_worker(rank, world, batch):
    """Top-k 50 (then top-p 0.9) over bf16 shards: the ranks' [B, k + 1] messages, the
    threshold, the masked draw on each shard, then the symmetric exchange."""
    device = torch.device("cuda", rank)
    hidden, weight = make_problem(batch, VOCAB, 512, torch.bfloat16, device=device)
    hidden = hidden * 4  # logits of std ~4: top-k 50 and top-p 0.9 both cut
    shard = -(-VOCAB // world)
    start = rank * shard
    out = {}
    for seed, top_p, min_p in ((5, None, None), (6, 0.9, None), (7, 0.95, 0.05)):
        knobs = dict(top_k=50, top_p=top_p, min_p=min_p, logits_dtype=torch.bfloat16, seed=seed)
        tokens = tp_fused_sample(
            hidden, weight[start : start + shard], vocab_start=start, vocab_size=VOCAB, **knobs
        )
        out[seed] = tokens.cpu()
        if rank == 0:
            # TP = 1's reference and its kernels: the same distribution; the logits' bf16
            # rounding after cuBLAS's, the kernel's and the reference's fp32 sums may differ
            # by an ulp in rare columns.
            for impl in ("torch", "auto"):
                expected = fused_sample(hidden, weight, impl=impl, **knobs)
                differ = int((tokens != expected).sum())
                assert differ <= max(1, batch // 50), (impl, differ, batch)
    return out


@pytest.mark.multigpu
@pytest.mark.parametrize("batch", [1, 64, 256])
def test_symmetric_exchange_truncated_tokens_equal_on_ranks_and_tp1(batch):
    per_rank = run_ranks(world_size(), _truncated_worker, batch, backend="nccl")
    for other in per_rank[1:]:
        for seed, tokens in per_rank[0].items():
            assert torch.equal(other[seed], tokens), seed


@pytest.mark.multigpu
def test_symmetric_exchange_tokens_equal_on_ranks_and_tp1():
    per_rank = run_ranks(world_size(), _symmetric_worker, (1, 64, 256), backend="nccl")
    assert all(r["symmetric"] for r in per_rank), "the symmetric-memory path was not taken"
    for key, tokens in per_rank[0]["tokens"].items():
        for other in per_rank[1:]:
            assert torch.equal(other["tokens"][key], tokens), key


def _benchmark_shapes_worker(rank, world, dims, batches, seeds):
    """The benchmark's shapes (D = 4096 / 8192, B = 256 / 512, V = 151936, bf16) through the
    symmetric exchange, 3 calls each; shards of ceil(V / P / 64) * 64 rows (vLLM's padded
    cut: the last one short, at P = 3 and 4)."""
    device = torch.device("cuda", rank)
    shard = -(-VOCAB // world // 64) * 64
    start = min(rank * shard, VOCAB)
    stop = min(start + shard, VOCAB)
    out = {}
    for dim in dims:
        generator = torch.Generator(device=device).manual_seed(dim)  # the same on every rank
        weight = torch.randn(VOCAB, dim, device=device, generator=generator) * (3.0 / dim**0.5)
        weight = weight.to(torch.bfloat16)
        weight_shard = weight[start:stop].contiguous()
        for batch in batches:
            hidden = torch.randn(batch, dim, device=device, generator=generator)
            hidden = hidden.to(torch.bfloat16)
            for seed in seeds:
                draws = [
                    tp_fused_sample(hidden, weight_shard, vocab_start=start, vocab_size=VOCAB,
                                    seed=seed)
                    for _ in range(3)
                ]  # fmt: skip
                torch.cuda.synchronize()
                out[dim, batch, seed] = torch.stack(draws).cpu()
                if seed is not None and rank == 0:
                    expected = fused_sample(hidden, weight, seed=seed, impl="torch")
                    for tokens in draws:
                        assert_pathwise_equal(tokens, expected, hidden, weight, seed=seed)
        del weight, weight_shard
        torch.cuda.empty_cache()
    group = torch.distributed.group.WORLD.group_name
    from flashsampling_inductor.exchange import use_symmetric_memory

    out["symmetric"] = use_symmetric_memory(group, device)
    return out


@pytest.mark.multigpu
@pytest.mark.parametrize("world", [8, 4, 3])
def test_symmetric_exchange_at_the_benchmarks_shapes(world):
    """B = 256 and 512 at D = 4096 and 8192, seed=None and explicit, on 8 ranks (where the
    host has them), 4 and 3 (uneven shards): every call completes, the ranks agree, explicit
    seeds draw TP = 1's tokens. (The exchange's wait once read each message word in several
    threads of a program, which then decided apart: B = 256 at these shapes failed or hung
    on 4 H200s.)"""
    if world_size() < world:
        pytest.skip(f"needs {world} GPUs")
    per_rank = run_ranks(
        world, _benchmark_shapes_worker, (4096, 8192), (256, 512), (None, 11), backend="nccl",
        timeout_s=300,
    )  # fmt: skip
    assert all(r.pop("symmetric") for r in per_rank), "the symmetric-memory path was not taken"
    for key, draws in per_rank[0].items():
        for other in per_rank[1:]:
            assert torch.equal(other[key], draws), key
        if key[2] is None:  # a fresh seed per call
            assert not torch.equal(draws[0], draws[1]), key


def _skewed_worker(rank, world, steps, batch=4, dim=256, pdl=False, int_seeds=False):
    """One rank is delayed at random (host sleeps and device spins) for ``steps`` steps;
    ``pdl``: the shape's exchange must be a programmatic dependent of stage 1; ``int_seeds``:
    each step's seed a Python int (passed to the kernels as it is), else a 0-d tensor."""
    device = torch.device("cuda", rank)
    hidden, weight = make_problem(batch, VOCAB, dim, torch.bfloat16, device=device)
    shard = -(-VOCAB // world)
    start = rank * shard
    if pdl:
        from flashsampling_inductor.dispatch import persistent_triton_stage1
        from flashsampling_inductor.exchange import exchange_launches_pdl
        from flashsampling_inductor.params import SamplingParams

        params = SamplingParams(None, 1.0, None, 0, 1)
        persistent = persistent_triton_stage1(batch, dim, shard, device, params)
        assert exchange_launches_pdl(device, lambda: persistent), "the exchange is not PDL here"
    seeds = torch.arange(steps, device=device)
    tokens = torch.empty((steps, batch), dtype=torch.int64, device=device)
    delay = random.Random(rank)
    for step in range(steps):
        if rank == world - 1:
            if delay.random() < 0.01:
                torch.cuda.synchronize()
                time.sleep(delay.random() * 0.005)
            if delay.random() < 0.1:
                torch.cuda._sleep(delay.randrange(1, 200_000))  # device spin, cycles
        tokens[step] = tp_fused_sample(
            hidden, weight[start : start + shard], vocab_start=start, vocab_size=VOCAB,
            seed=step if int_seeds else seeds[step],
        )[:, 0]  # fmt: skip
    tokens = tokens.cpu()
    if rank == 0:  # TP = 1 on a subset of steps
        for step in range(0, steps, 97):
            expected = fused_sample(hidden, weight, seed=step, impl="torch")
            assert_pathwise_equal(tokens[step, :, None], expected.cpu(), hidden, weight, seed=step)
    return tokens


# The exchange's variants, each set alike on every rank: the default (a bad call fails in
# the exchange's kernel; the PDL rule, FLASHSAMPLING_TP_EXCHANGE_PDL=auto; int seeds passed to
# the kernels as they are), the assert kernel after it, PDL after every stage 1 (stage 1
# signalling the exchange as its programs start), and both switches off (never PDL, int
# seeds as 0-d tensors: the defaults until 2026-11-28).
EXCHANGE_VARIANTS = {
    "default": {},
    "assert": {"FLASHSAMPLING_TP_EXCHANGE_CHECK": "assert"},
    "pdl": {"FLASHSAMPLING_TP_EXCHANGE_PDL": "1"},
    "off": {"FLASHSAMPLING_TP_EXCHANGE_PDL": "0", "FLASHSAMPLING_TP_SCALAR_SEED": "0"},
}
# (batch, D, whether the exchange must be PDL, int seeds) of the skewed steps per variant:
# the default at a shape whose stage 1 runs on a persistent grid (B = 256, D = 8192: the
# Triton kernel at any TP size), the exchange its programmatic dependent there, int seeds;
# PDL after every stage 1 where stage 1 is the Gluon kernel (B = 256, D = 4096: its wide
# tiles on the shards of 2 and 4 ranks), which then signals the exchange, 0-d seeds
SKEWED_SHAPES = {"default": (256, 8192, True, True), "pdl": (256, 4096, True, False)}


@pytest.mark.multigpu
@pytest.mark.parametrize("variant", ["default", "pdl", "off"])  # (not the assert: it
def test_10000_skewed_steps_agree_on_every_rank(variant, monkeypatch):  # changes no exchange)
    for name, value in EXCHANGE_VARIANTS[variant].items():
        monkeypatch.setenv(name, value)  # (the ranks, spawned, inherit it)
    shape = SKEWED_SHAPES.get(variant, (4, 256, False, False))
    per_rank = run_ranks(
        world_size(), _skewed_worker, 10_000, *shape, backend="nccl", timeout_s=300
    )
    for other in per_rank[1:]:
        assert torch.equal(other, per_rank[0])


def _graph_worker(rank, world):
    device = torch.device("cuda", rank)
    batch = 8
    hidden, weight = make_problem(batch, VOCAB, 512, torch.bfloat16, device=device)
    shard = -(-VOCAB // world)
    start = rank * shard
    torch.manual_seed(100 + rank)  # ranks seeded apart: the shared seed stream must agree

    def step():
        return tp_fused_sample(hidden, weight[start : start + shard], vocab_start=start,
                               vocab_size=VOCAB)  # fmt: skip

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    replays = []
    for _ in range(4):
        graph.replay()
        replays.append(out.clone())
    compiled = torch.compile(step, mode="reduce-overhead")
    compiled_tokens = [compiled().clone() for _ in range(5)]
    return torch.stack(replays).cpu(), torch.stack(compiled_tokens).cpu()


@pytest.mark.multigpu
def test_cuda_graph_replays_draw_fresh_tokens_equal_on_ranks():
    per_rank = run_ranks(world_size(), _graph_worker, backend="nccl")
    replays, compiled = per_rank[0]
    for other_replays, other_compiled in per_rank[1:]:
        assert torch.equal(other_replays, replays)
        assert torch.equal(other_compiled, compiled)
    # 8 rows over 151936 tokens: two replays drawing the same tokens would be a stale seed.
    for draws in (replays, compiled):
        assert all(not torch.equal(draws[i], draws[i + 1]) for i in range(len(draws) - 1))


def _missing_rank_worker(rank, world):
    device = torch.device("cuda", rank)
    hidden, weight = make_problem(2, 1024, 64, torch.bfloat16, device=device)
    shard = 1024 // world
    tp_fused_sample(hidden, weight[rank * shard :][:shard], vocab_start=rank * shard,
                    vocab_size=1024, seed=1)  # fmt: skip
    torch.cuda.synchronize()
    if rank != 0:
        time.sleep(8)  # never comes to the second call
        return "absent"
    try:
        tp_fused_sample(hidden, weight[:shard], vocab_start=0, vocab_size=1024, seed=2)
        torch.cuda.synchronize()
    except RuntimeError as error:
        return str(error)
    return "returned tokens"


@pytest.mark.multigpu
def test_a_missing_rank_fails_the_symmetric_exchange_after_the_timeout():
    os.environ["FLASHSAMPLING_TP_TIMEOUT_MS"] = "2000"
    try:
        # (rank 0's CUDA context dies with the exchange's device assert: no clean exit)
        first = run_ranks(world_size(), _missing_rank_worker, backend="nccl", timeout_s=60,
                          clean_exit=False)[0]  # fmt: skip
    finally:
        del os.environ["FLASHSAMPLING_TP_TIMEOUT_MS"]
    assert first != "returned tokens", first


def _seeded_apart_worker(rank, world):
    device = torch.device("cuda", rank)
    hidden, weight = make_problem(2, 1024, 64, torch.bfloat16, device=device)
    shard = 1024 // world // 4 * 4  # (starts at multiples of 4: the kernel's per-tile path)
    start = rank * shard
    stop = 1024 if rank == world - 1 else start + shard
    try:
        tokens = tp_fused_sample(hidden, weight[start:stop], vocab_start=start, vocab_size=1024,
                                 seed=7 + rank)  # fmt: skip
        torch.cuda.synchronize()
        tokens.cpu()
    except Exception as error:  # noqa: BLE001 - a CUDA error's type varies across torch
        return f"{type(error).__name__}: {error}"
    return "returned tokens"


@pytest.mark.multigpu
@pytest.mark.parametrize("variant", list(EXCHANGE_VARIANTS))
def test_ranks_seeded_apart_fail_the_symmetric_exchange(variant, monkeypatch):
    """Every rank with its own explicit seed: no rank returns tokens (the header check fails
    the call on every rank, in the exchange's kernel or by the assert after it)."""
    for name, value in EXCHANGE_VARIANTS[variant].items():
        monkeypatch.setenv(name, value)
    per_rank = run_ranks(world_size(), _seeded_apart_worker, backend="nccl", timeout_s=60,
                         clean_exit=False)  # fmt: skip
    print(f"ranks seeded apart ({variant}): {per_rank}")  # (what a user sees: -s)
    assert all(outcome != "returned tokens" for outcome in per_rank), per_rank


def _compiled_top_k_worker(rank, world):
    """gpt-fast's top-k after the gathered logits, compiled with backend="flashsampling" on
    CUDA: rewritten into the TP op, the tokens of TP = 1's compiled step (same seed)."""
    import torch.distributed._functional_collectives as funcol
    from torch._dynamo.utils import counters

    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    hidden, weight = make_problem(16, VOCAB, 512, torch.bfloat16, device=device)
    hidden = hidden * 4
    shard = -(-VOCAB // world)
    weight_shard = weight[rank * shard :][:shard].contiguous()
    group = torch.distributed.group.WORLD

    def top_k_probs(logits):
        pivot = torch.topk(logits, 50)[0][..., -1:]
        logits = torch.where(logits < pivot, -float("inf"), logits)
        return torch.multinomial(torch.softmax(logits.float() / 0.8, dim=-1), 1)

    def step(h, w):
        full = funcol.all_gather_tensor(torch.nn.functional.linear(h, w), gather_dim=1,
                                        group=group)  # fmt: skip
        return top_k_probs(full[:, :VOCAB])

    counters.clear()
    torch.manual_seed(3)
    tokens = torch.compile(step, backend="flashsampling", fullgraph=True)(hidden, weight_shard)
    rewrites = dict(counters["flashsampling"])
    torch.manual_seed(3)
    single = torch.compile(
        lambda h, w: top_k_probs(torch.nn.functional.linear(h, w)), backend="flashsampling"
    )(hidden, weight)
    return tokens.cpu(), single.cpu(), rewrites


@pytest.mark.multigpu
def test_compiled_top_k_after_the_gather_is_fused_on_cuda():
    per_rank = run_ranks(world_size(), _compiled_top_k_worker, backend="nccl")
    tokens, single, rewrites = per_rank[0]
    assert rewrites.get("tp_all_gather") == 1, rewrites
    for other, _, _ in per_rank[1:]:
        assert torch.equal(other, tokens)
    assert int((tokens != single).sum()) <= 1


def _first_call_in_a_cudagraph_tree_worker(rank, world):
    """The process's first TP call inside a step compiled with mode="reduce-overhead" (as
    hf.enable's decode step under a tp_plan): the exchange's state, made at that call, must
    stay out of the cudagraph tree's pool (exchange.outside_graph_pools)."""
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    hidden, weight = make_problem(4, 4096, 64, torch.bfloat16, device=device)
    shard = 4096 // world
    weight_shard = weight[rank * shard :][:shard].contiguous()

    def step(h):
        return tp_fused_sample(h, weight_shard, vocab_start=rank * shard, vocab_size=4096, seed=5)

    compiled = torch.compile(step, mode="reduce-overhead")
    return torch.stack([compiled(hidden).clone() for _ in range(3)]).cpu()


@pytest.mark.multigpu
def test_the_first_call_inside_a_cudagraph_tree_keeps_its_state_out_of_the_pool():
    per_rank = run_ranks(world_size(), _first_call_in_a_cudagraph_tree_worker, backend="nccl")
    for other in per_rank[1:]:
        assert torch.equal(other, per_rank[0])
    assert all(torch.equal(per_rank[0][i], per_rank[0][0]) for i in range(3))  # one seed


def _captured_collective_worker(rank, world):
    """A step as hf.enable's decode step under a tp_plan: the model's all-reduce and the fused
    TP call in one graph compiled with mode="reduce-overhead", whose CUDA graphs keep the
    captured NCCL work. NCCL's teardown waits until every such graph is destroyed (docs/tp.md):
    run_ranks fails a rank that does not exit within its bound."""
    import torch.distributed._functional_collectives as funcol

    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    hidden, weight = make_problem(4, 4096, 64, torch.bfloat16, device=device)
    shard = 4096 // world
    weight_shard = weight[rank * shard :][:shard].contiguous()
    group = torch.distributed.group.WORLD

    def step(h):
        h = funcol.all_reduce(h, "sum", group) / world
        return tp_fused_sample(h, weight_shard, vocab_start=rank * shard, vocab_size=4096, seed=5)

    from torch._dynamo.utils import counters

    counters.clear()
    compiled = torch.compile(step, mode="reduce-overhead")
    tokens = torch.stack([compiled(hidden).clone() for _ in range(4)]).cpu()
    return tokens, counters["inductor"]["cudagraph_skips"]


@pytest.mark.multigpu
def test_a_fused_step_with_captured_collectives_exits_cleanly():
    per_rank = run_ranks(world_size(), _captured_collective_worker, backend="nccl", exit_s=20)
    # (a step that skipped CUDA graphs captured nothing: the exit would prove nothing)
    assert all(skips == 0 for _, skips in per_rank), per_rank
    for other, _ in per_rank[1:]:
        assert torch.equal(other, per_rank[0][0])
