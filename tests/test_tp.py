"""Tensor-parallel sampling on the CPU: gloo process groups of 2, 3 and 4 spawned ranks.

The contract: on one seed, every rank returns the tokens ``fused_sample`` draws over the
whole vocabulary (pathwise, up to the near-ties ``assert_pathwise_equal`` allows), however
the vocabulary is cut: even, uneven (V % P != 0) and padded shards, per-row temperatures
with greedy rows, per-row seeds, a bias with masked tokens, several samples, bf16 logits.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time

import pytest
import torch
from scipy import stats

from flashsampling_inductor import fused_sample, tp_fused_sample
from flashsampling_inductor.exchange import (
    HEADER,
    MESSAGE_WORDS,
    SYMMETRIC_CAPACITY,
    SymmetricExchange,
    pack_message,
    reduce_messages,
)
from flashsampling_inductor.params import SamplingParams
from flashsampling_inductor.tp import _shard_candidates

from .sampling_oracle import ALPHA, assert_pathwise_equal, make_problem, warped_probabilities
from .tp_ranks import run_ranks

PAD_LOGIT = 1e4  # padding rows would win every draw if they were ever sampled


def shard_bounds(vocab_size: int, world_size: int, layout: str) -> list[tuple[int, int]]:
    """[start, stop) of every rank's weight rows (stop may pass V: padding rows)."""
    if layout == "chunk":  # torch.chunk / DTensor Shard(0): ceil(V / P), the last shorter
        size = -(-vocab_size // world_size)
    else:  # "padded": vLLM / Megatron pad V to a multiple of 8 P, every shard one size
        size = -(-vocab_size // (8 * world_size)) * 8
        return [(r * size, (r + 1) * size) for r in range(world_size)]
    return [(min(r * size, vocab_size), min((r + 1) * size, vocab_size)) for r in range(world_size)]


CASES = {
    "plain": dict(batch=5, vocab_size=1000, hidden_size=24, kwargs=dict(seed=3)),
    "per_row": dict(
        batch=6,
        vocab_size=1001,
        hidden_size=17,
        kwargs=dict(
            seed=torch.tensor([5, -1, 2**62, 7, 7, 0]),
            temperature=torch.tensor([1.0, 0.0, 0.5, 2.0, 0.0, 1.3]),
            num_samples=3,
        ),
    ),
    "bias_bf16": dict(
        batch=3,
        vocab_size=997,
        hidden_size=32,
        dtype=torch.bfloat16,
        bias=True,
        kwargs=dict(seed=11, temperature=0.7, logits_dtype=torch.bfloat16, num_samples=2),
    ),
    "greedy": dict(batch=4, vocab_size=1000, hidden_size=8, kwargs=dict(temperature=0.0)),
    "softcap": dict(
        batch=3,
        vocab_size=999,
        hidden_size=16,
        bias=True,
        kwargs=dict(seed=4, temperature=0.9, softcap=2.0, num_samples=2),
    ),  # fmt: skip
}


# Top-k, then top-p and min-p (each rank sends its shard's k largest scores): every case
# has a k-th value tied across shards somewhere (bf16 logits of few distinct values), and
# per-row knobs with greedy rows.
TRUNCATING_CASES = {
    "top_k": dict(batch=5, vocab_size=1000, hidden_size=24, kwargs=dict(seed=3, top_k=20)),
    "top_k_ties_bf16": dict(
        batch=4, vocab_size=999, hidden_size=8, dtype=torch.bfloat16, bias=True, coarse=True,
        kwargs=dict(seed=7, temperature=0.8, top_k=30, logits_dtype=torch.bfloat16,
                    num_samples=3),
    ),
    "top_k_top_p_min_p": dict(
        batch=6, vocab_size=1001, hidden_size=17,
        kwargs=dict(
            seed=torch.tensor([5, -1, 2**62, 7, 7, 0]),
            temperature=torch.tensor([1.0, 0.0, 0.5, 2.0, 0.7, 1.3]),
            top_k=50, top_p=torch.tensor([0.9, 0.5, 1.0, 0.95, 0.3, 0.8]), min_p=0.05,
            num_samples=2,
        ),
    ),
    "top_k_ties_top_p": dict(
        batch=4, vocab_size=998, hidden_size=8, coarse=True,
        kwargs=dict(seed=2, top_k=40, top_p=0.7, softcap=3.0),
    ),
    # 3 tokens at 2, 100 tied at 1 every 10th index: the k-th; a shard sends a few of them,
    # and top-p 0.1 keeps the ties only with the mass of all 100 (22 < 0.1 * 294)
    "tie_wall": dict(
        batch=3, vocab_size=1000, hidden_size=1, wall=True, kwargs=dict(seed=6, top_k=5, top_p=0.1)
    ),
    "min_p": dict(batch=3, vocab_size=1000, hidden_size=16, kwargs=dict(seed=1, min_p=0.2)),
    # bf16 logits of a bf16 head: the shard's matmul in bf16 (tp._shard_logits)
    "top_k_bf16_head": dict(
        batch=4, vocab_size=1000, hidden_size=64, dtype=torch.bfloat16,
        kwargs=dict(seed=8, temperature=0.9, top_k=50, top_p=0.9, logits_dtype=torch.bfloat16),
    ),
    "few_finite": dict(
        batch=3, vocab_size=1000, hidden_size=16, bias=True, sparse=True,
        kwargs=dict(seed=9, top_k=50, top_p=0.9),
    ),
}  # fmt: skip


def build_case(case: dict):
    """hidden [B, D], weight [V, D], bias [V] or None: the same on every rank."""
    hidden, weight = make_problem(
        case["batch"],
        case["vocab_size"],
        case["hidden_size"],
        case.get("dtype", torch.float32),
        device=torch.device("cpu"),
    )
    if case.get("wall"):
        weight = torch.zeros(case["vocab_size"], 1)
        weight[::10] = 1.0
        weight[[5, 505, 905]] = 2.0
        hidden = torch.ones(case["batch"], 1)
    if case.get("coarse"):  # logits of a few distinct values: ties at every k-th value
        weight = (weight * 2).round() / 2
        hidden = torch.ones_like(hidden)
    bias = None
    if case.get("bias"):
        bias = torch.randn(case["vocab_size"], generator=torch.Generator().manual_seed(1))
        bias[::7] = float("-inf")  # masked tokens
        if case.get("sparse"):  # 30 finite tokens, fewer than k, all in the first shard
            bias[30:] = float("-inf")
        bias = bias.to(weight.dtype)
    return hidden, weight, bias


def shard_of(weight, bias, start: int, stop: int):
    """This rank's rows; rows past V are padding whose logits would win every draw."""
    vocab_size, hidden_size = weight.shape
    pad = max(0, stop - vocab_size)
    weight_shard = weight[start:stop]
    bias_shard = None if bias is None else bias[start:stop]
    if pad:
        padding = torch.full((pad, hidden_size), PAD_LOGIT, dtype=weight.dtype)
        weight_shard = torch.cat([weight_shard, padding])
        if bias is not None:
            bias_shard = torch.cat([bias_shard, torch.full((pad,), PAD_LOGIT, dtype=bias.dtype)])
    return weight_shard, bias_shard


def _pathwise_worker(rank, world_size, layouts, cases=CASES):
    out = {}
    for name, case in cases.items():
        hidden, weight, bias = build_case(case)
        for layout in layouts:
            start, stop = shard_bounds(case["vocab_size"], world_size, layout)[rank]
            weight_shard, bias_shard = shard_of(weight, bias, start, stop)
            out[name, layout] = tp_fused_sample(
                hidden,
                weight_shard,
                bias_shard=bias_shard,
                vocab_start=start,
                vocab_size=case["vocab_size"],
                **case["kwargs"],
            )
    return out


def assert_same_as_tp1(per_rank: list[dict], cases=CASES) -> None:
    for key in per_rank[0]:
        name, _ = key
        case = cases[name]
        hidden, weight, bias = build_case(case)
        knobs = {k: v for k, v in case["kwargs"].items() if k != "impl"}
        expected = fused_sample(hidden, weight, bias=bias, impl="torch", **knobs)
        for rank, tokens in enumerate(per_rank):
            assert torch.equal(tokens[key], per_rank[0][key]), (key, rank)
        assert_pathwise_equal(
            per_rank[0][key],
            expected,
            hidden,
            weight,
            bias=bias,
            temperature=case["kwargs"].get("temperature", 1.0),
            seed=case["kwargs"].get("seed", 0),
            logits_dtype=case["kwargs"].get("logits_dtype"),
        )


@pytest.mark.parametrize(
    "world_size, layouts",
    [
        pytest.param(2, ("chunk", "padded"), id="tp2"),
        pytest.param(3, ("chunk", "padded"), id="tp3-uneven"),
        pytest.param(4, ("chunk", "padded"), id="tp4"),
    ],
)
def test_tp_draws_the_tokens_of_tp1(world_size, layouts):
    assert_same_as_tp1(run_ranks(world_size, _pathwise_worker, layouts))


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_truncated_tp_draws_the_tokens_of_tp1(world_size):
    """Top-k (ties at the k-th value across shards, fewer finite tokens than k), top-p
    after it, min-p, per-row knobs: every rank draws what fused_sample draws at TP = 1."""
    per_rank = run_ranks(world_size, _pathwise_worker, ("chunk", "padded"), TRUNCATING_CASES)
    assert_same_as_tp1(per_rank, TRUNCATING_CASES)


@pytest.mark.parametrize(
    "world_size, names",
    [
        pytest.param(2, ("top_k_ties_top_p", "min_p"), id="tp2"),
        pytest.param(3, ("top_k_top_p_min_p", "tie_wall", "top_k_bf16_head"), id="tp3-uneven"),
    ],
)
def test_truncated_tp_through_the_kernels_draws_the_tokens_of_tp1(world_size, names):
    """The same through the Triton kernels (interpreter, ``tp_truncation.py``): the shard's
    message, the threshold from every rank's, the draw over the shard's logits."""
    cases = {
        name: {**TRUNCATING_CASES[name], "kwargs": {**TRUNCATING_CASES[name]["kwargs"],
                                                     "impl": "triton"}}
        for name in names
    }  # fmt: skip
    assert_same_as_tp1(run_ranks(world_size, _pathwise_worker, ("chunk",), cases), cases)


@pytest.mark.parametrize(
    "world_size, layout, impl",
    [
        *[pytest.param(p, layout, "torch", id=f"tp{p}-{layout}") for p in (1, 2, 3, 4, 8)
          for layout in ("chunk", "padded")],
        # The kernel takes shards that start at a multiple of 4 (padded: multiples of 8).
        pytest.param(2, "padded", "triton", id="tp2-padded-triton"),
        pytest.param(3, "padded", "triton", id="tp3-padded-triton"),
    ],
)  # fmt: skip
def test_the_reduction_of_any_number_of_shards_is_the_full_draw(world_size, layout, impl):
    """One process plays every rank: the shards' messages, reduced, give TP = 1's tokens
    (the same tokens for the reference; up to near-ties for the kernel, as fused_sample)."""
    for name, case in CASES.items():
        hidden, weight, bias = build_case(case)
        kwargs = case["kwargs"]
        seed = kwargs.get("seed", 0)
        seed = seed if isinstance(seed, torch.Tensor) else torch.tensor(seed)
        temperature = torch.as_tensor(kwargs.get("temperature", 1.0)).float()
        num_samples, vocab_size = kwargs.get("num_samples", 1), case["vocab_size"]
        messages = []
        for start, stop in shard_bounds(vocab_size, world_size, layout):
            weight_shard, bias_shard = shard_of(weight, bias, start, stop)
            stop = min(stop, vocab_size)
            score, index, _ = _shard_candidates(
                hidden, weight_shard[: stop - start],
                None if bias_shard is None else bias_shard[: stop - start],
                temperature, 1.0, seed, 0, num_samples, kwargs.get("logits_dtype"), impl,
                start, kwargs.get("softcap", 0.0),
            )  # fmt: skip
            header = torch.tensor([case["batch"], num_samples, vocab_size, 0, start, stop])
            messages.append(pack_message(score, index, header))
        tokens = reduce_messages(
            torch.stack(messages), messages[0][: len(HEADER)], case["batch"], num_samples, name
        )
        expected = fused_sample(hidden, weight, bias=bias, impl="torch", **kwargs)
        if impl == "torch":
            assert torch.equal(tokens, expected), (name, tokens, expected)
        assert_pathwise_equal(
            tokens, expected, hidden, weight, bias=bias, temperature=temperature,
            seed=kwargs.get("seed", 0), logits_dtype=kwargs.get("logits_dtype"),
        )  # fmt: skip


def _shared_seed_worker(rank, world_size):
    torch.manual_seed(1000 + rank)  # ranks seeded apart: the op must agree anyway
    hidden, weight = make_problem(8, 1000, 16, logit_std=0.1, device=torch.device("cpu"))
    start, stop = shard_bounds(1000, world_size, "chunk")[rank]
    return [
        tp_fused_sample(hidden, weight[start:stop], vocab_start=start, vocab_size=1000)
        for _ in range(3)
    ]


def _skewed_worker(rank, world_size, steps):
    delay = random.Random(rank)
    hidden, weight = make_problem(4, 1000, 16, device=torch.device("cpu"))
    start, stop = shard_bounds(1000, world_size, "chunk")[rank]
    tokens = []
    for step in range(steps):
        time.sleep(delay.random() * 0.02)
        tokens.append(
            tp_fused_sample(
                hidden, weight[start:stop], vocab_start=start, vocab_size=1000, seed=step
            )
        )
    return torch.stack(tokens)


def _disagreeing_worker(rank, world_size):
    """Rank 1 comes with another seed, then with a shard overlapping rank 0's."""
    hidden, weight = make_problem(2, 100, 8, device=torch.device("cpu"))
    errors = []
    for seed, start in ((rank, 50 * rank), (0, 40 * rank)):
        try:
            tp_fused_sample(
                hidden, weight[start : start + 50], vocab_start=start, vocab_size=100, seed=seed
            )
        except RuntimeError as error:
            errors.append(str(error))
    return errors


def test_seed_none_needs_no_seeding_alike():
    per_rank = run_ranks(2, _shared_seed_worker)
    for step in range(3):
        assert torch.equal(per_rank[0][step], per_rank[1][step])
    # Fresh tokens per call (8 rows over 1000 near-uniform tokens: a repeat is ~1e-24).
    assert not torch.equal(per_rank[0][0], per_rank[0][1])


@pytest.mark.parametrize("world_size", [3, 4])
def test_skewed_ranks_agree_on_every_step(world_size):
    steps = 20
    per_rank = run_ranks(world_size, _skewed_worker, steps)
    hidden, weight = make_problem(4, 1000, 16, device=torch.device("cpu"))
    for step in range(steps):
        expected = fused_sample(hidden, weight, seed=step, impl="torch")
        for tokens in per_rank:
            assert torch.equal(tokens[step], expected), step


def test_ranks_that_disagree_fail_naming_them():
    rank0, rank1 = run_ranks(2, _disagreeing_worker)
    assert len(rank0) == len(rank1) == 2, (rank0, rank1)
    assert "rank(s) [1] sampled something else" in rank0[0]
    assert "rank(s) [0] sampled something else" in rank1[0]
    assert "do not tile the vocabulary" in rank0[1] and "do not tile" in rank1[1]


def _missing_rank_worker(rank, world_size, wait_s):
    hidden, weight = make_problem(2, 100, 8, device=torch.device("cpu"))
    if rank == 1:
        time.sleep(wait_s)  # never calls
        return None
    try:
        tp_fused_sample(hidden, weight[:50], vocab_start=0, vocab_size=100, seed=1)
    except RuntimeError as error:
        return str(error)
    return "returned tokens"


def test_a_missing_rank_fails_the_call_after_the_timeout():
    rank0, _ = run_ranks(2, _missing_rank_worker, 6.0, timeout_s=2.0)
    assert "a rank did not arrive" in rank0, rank0


def _teardown_worker(rank, world_size):
    """A seed=None TP call keeps per-group state; destroying the group releases it first."""
    import torch.distributed as dist

    from flashsampling_inductor import exchange, tp

    hidden, weight = make_problem(2, 100, 8, device=torch.device("cpu"))
    tp_fused_sample(hidden, weight[50 * rank :][:50], vocab_start=50 * rank, vocab_size=100)
    kept = (len(tp._ALIGNED), exchange.resolve_group.cache_info().currsize)
    wrapped = getattr(dist.destroy_process_group, "__flashsampling_releases__", False)
    dist.destroy_process_group()
    return kept, wrapped, (len(tp._ALIGNED), exchange.resolve_group.cache_info().currsize)


def test_destroying_the_group_releases_what_tp_calls_keep():
    for kept, wrapped, after in run_ranks(2, _teardown_worker):
        assert kept[0] == 1 and kept[1] >= 1, kept
        assert wrapped
        assert after == (0, 0)


def _lingering_worker(rank, world_size):
    if rank == 1:  # a thread the interpreter waits for at exit, as a hung teardown would be
        threading.Thread(target=time.sleep, args=(60,)).start()
    return rank


def test_a_rank_that_does_not_exit_fails_the_run():
    with pytest.raises(AssertionError, match=r"rank\(s\) \[1\] of 2 did not exit cleanly"):
        run_ranks(2, _lingering_worker, exit_s=2.0)


def _chi_square_worker(rank, world_size, logits, knobs=None):
    vocab_size = logits.shape[1]
    start, stop = shard_bounds(vocab_size, world_size, "chunk")[rank]
    # hidden = I, weight = logits.T: the logits of every row are the given ones.
    rows, samples = 400, 50
    hidden = torch.eye(logits.shape[0]).repeat(rows, 1)
    weight = logits.T.contiguous()
    tokens = tp_fused_sample(
        hidden, weight[start:stop], vocab_start=start, vocab_size=vocab_size,
        temperature=0.8, num_samples=samples, seed=12345, **(knobs or {}),
    )  # fmt: skip
    return tokens


def test_tp_draws_follow_the_float64_softmax():
    """20,000 draws at V = 30 over 3 ranks: chi-square (29 df) at level ALPHA = 1e-3 has
    power > 0.99 against a 10% relative bias on half the mass (noncentrality 20000 * 0.01)."""
    logits = torch.linspace(-2.0, 2.0, 30)[None, :]
    tokens = run_ranks(3, _chi_square_worker, logits)[0]
    counts = torch.bincount(tokens.flatten(), minlength=30).double()
    probabilities = torch.softmax(logits[0].double() / 0.8, dim=0)
    _, p_value = stats.chisquare(counts.numpy(), (probabilities * counts.sum()).numpy())
    assert p_value > ALPHA, p_value


def test_truncated_tp_draws_follow_the_float64_warpers():
    """Top-k 10 then top-p 0.8 at V = 30 over 3 ranks, logits of 7 values each repeated
    on every rank (the k-th value, 2.0, tied across them; top-p's boundary between two
    values, where transformers' sort order does not pick among ties): 20,000 draws against
    transformers' warpers in float64, chi-square at level ALPHA over the kept tokens; none
    removed drawn. (The ties that decide top-p: test_truncated_tp_draws_the_tokens_of_tp1's
    "tie_wall".)"""
    logits = ((torch.arange(30) % 7) * 0.5)[None, :].float()
    tokens = run_ranks(3, _chi_square_worker, logits, dict(top_k=10, top_p=0.8))[0]
    counts = torch.bincount(tokens.flatten(), minlength=30).double()
    target = warped_probabilities(logits[0].double(), 0.8, 10, 0.8, 0.0, 0.0)
    kept = target > 0
    assert 4 < int(kept.sum()) < 30, target
    assert counts[~kept].sum() == 0, counts
    _, p_value = stats.chisquare(counts[kept].numpy(), (target[kept] * counts.sum()).numpy())
    assert p_value > ALPHA, p_value


@pytest.mark.parametrize(
    "knobs, error, words",
    [
        (dict(top_k=torch.tensor([5, 5])), TypeError, "top_k as a Python int"),
        (dict(top_p=0.9), ValueError, "top_p only after a top_k"),
        (dict(top_k=2000, top_p=0.9), ValueError, "top_p only after a top_k"),  # k >= V: off
        (dict(top_k=-1), ValueError, "top_k must be"),
        (dict(top_k=5, top_p=1.5), ValueError, "top_p must be"),
        (dict(min_p=float("nan")), ValueError, "min_p must be"),
    ],
)
def test_bad_truncation_knobs_fail_naming_the_argument(knobs, error, words):
    hidden, weight = make_problem(2, 100, 8, device=torch.device("cpu"))
    with pytest.raises(error, match=words):
        tp_fused_sample(
            hidden, weight[:50], vocab_start=0, vocab_size=1000, group="unused", **knobs
        )


@pytest.mark.parametrize("per_row_seed", [False, True], ids=["one-seed", "per-row-seeds"])
def test_masked_gumbel_argmax_kernel_draws_the_reference(per_row_seed):
    """The truncated TP path's draw over a shard's materialized logits (Triton, one pass):
    per row threshold, a greedy row, -inf tokens, a shard starting off a multiple of 4, 3
    samples: the reference's scores and global indices."""
    from flashsampling_inductor.reference import gumbel_argmax
    from flashsampling_inductor.truncation_kernel import masked_gumbel_argmax

    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(5, 2500, generator=generator) * 3
    logits[:, ::9] = float("-inf")
    threshold = torch.tensor([[2.0], [-float("inf")], [4.0], [0.5], [99.0]])
    temperature = torch.tensor([1.0, 0.7, 0.0, 1.3, 1.0])
    seed = torch.tensor([5, 17, 2**62, 7, 0]) if per_row_seed else torch.tensor(11)
    score, index = masked_gumbel_argmax(logits, threshold, temperature, seed, 3, 333)
    expected_score, expected_index = gumbel_argmax(
        logits.masked_fill(logits < threshold, float("-inf")), temperature,
        seed.expand(5), per_row_seed, 3, 333,
    )  # fmt: skip
    assert torch.equal(index, expected_index), (index, expected_index)
    assert torch.equal(score, expected_score)


def _simulated_ranks(world: int) -> list[SymmetricExchange]:
    """The symmetric exchange's state on ``world`` simulated ranks of one process: CPU
    buffers stand for the symmetric ones (the interpreter stores through their addresses)."""
    size = 2 * world * SYMMETRIC_CAPACITY * MESSAGE_WORDS
    buffers = [torch.zeros(size, dtype=torch.int64) for _ in range(world)]
    ranks = []
    for rank in range(world):
        exchange = object.__new__(SymmetricExchange)
        exchange.rank, exchange.world = rank, world
        exchange.buffer = buffers[rank]
        exchange.peers = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64)
        exchange._init_state(torch.device("cpu"))
        ranks.append(exchange)
    return ranks


def _exchange_in_turn(ranks, candidates, seeds, fields):
    """Every simulated rank sends, then every one receives: the tokens of each rank."""
    for exchange, (score, index), seed, rank_fields in zip(
        ranks, candidates, seeds, fields, strict=True
    ):
        exchange.send(score, index, seed, rank_fields)
    return [
        exchange.receive(score, index, seed, rank_fields, "test")
        for exchange, (score, index), seed, rank_fields in zip(
            ranks, candidates, seeds, fields, strict=True
        )
    ]


@pytest.mark.parametrize("world_size", [2, 3])
def test_symmetric_exchange_kernel_on_simulated_ranks(world_size):
    """The exchange's kernel (interpreter), four steps so both slots of a lane are used and
    the batch changes: every rank gets the full vocabulary's tokens, from one candidate a
    lane or from stage 1's per-tile candidates (the shard's stage 2 in the same kernel)."""
    ranks = _simulated_ranks(world_size)
    for step, (name, per_tile) in enumerate(
        (("per_row", False), ("plain", True), ("bias_bf16", False), ("per_row", True))
    ):
        case = CASES[name]
        hidden, weight, bias = build_case(case)
        kwargs = case["kwargs"]
        seed = torch.as_tensor(kwargs.get("seed", 0))
        temperature = torch.as_tensor(kwargs.get("temperature", 1.0)).float()
        num_samples, vocab_size = kwargs.get("num_samples", 1), case["vocab_size"]
        candidates, fields = [], []
        # (the Triton kernel takes shards that start at multiples of 4: vLLM's padded cut)
        for start, stop in shard_bounds(vocab_size, world_size, "padded" if per_tile else "chunk"):
            start, stop = min(start, vocab_size), min(stop, vocab_size)
            shard_bias = None if bias is None else bias[start:stop]
            impl = "triton" if per_tile else "torch"
            *shard, _ = _shard_candidates(
                hidden, weight[start:stop], shard_bias, temperature, 1.0, seed, 0, num_samples,
                kwargs.get("logits_dtype"), impl, start, per_tile=per_tile,
            )  # fmt: skip
            candidates.append(shard)
            fields.append((case["batch"], num_samples, vocab_size, start, stop))
        if per_tile:
            assert candidates[0][0].dim() == 3 and candidates[0][0].shape[-1] > 1
        expected = fused_sample(hidden, weight, bias=bias, impl="torch", **kwargs)
        tokens = _exchange_in_turn(ranks, candidates, [seed] * world_size, fields)
        for exchange, rank_tokens in zip(ranks, tokens, strict=True):
            assert torch.equal(rank_tokens, expected), (step, name, exchange.rank)
            assert int(exchange.ok) == 1 and int(exchange.error) == 0


def _plain_candidates(world_size, seed=3):
    hidden, weight, _ = build_case(CASES["plain"])
    bounds = shard_bounds(1000, world_size, "chunk")
    one, seed = torch.tensor(1.0), torch.tensor(seed)
    candidates = []
    for start, stop in bounds:
        *shard, _ = _shard_candidates(
            hidden, weight[start:stop], None, one, 1.0, seed, 0, 1, None, "torch", start
        )
        candidates.append(shard)
    return candidates, [(5, 1, 1000, start, stop) for start, stop in bounds]


@pytest.mark.parametrize("world_size", [2, 3])
def test_symmetric_exchange_fails_a_rank_seeded_apart(world_size):
    """A rank that comes with another seed: every rank's call fails, naming the rank."""
    ranks = _simulated_ranks(world_size)
    candidates, fields = _plain_candidates(world_size)
    seeds = [torch.tensor(99 if rank == world_size - 1 else 3) for rank in range(world_size)]
    for exchange, (score, index), seed, rank_fields in zip(
        ranks, candidates, seeds, fields, strict=True
    ):
        exchange.send(score, index, seed, rank_fields)
    for exchange, (score, index), seed, rank_fields in zip(
        ranks, candidates, seeds, fields, strict=True
    ):
        with pytest.raises(RuntimeError, match="sampled another batch size"):
            exchange.receive(score, index, seed, rank_fields, "test")
        bad = world_size if exchange.rank != world_size - 1 else 1  # 1 + the rank that differs
        assert int(exchange.ok) == 0 and int(exchange.error) == bad, exchange.rank


def test_symmetric_exchange_takes_an_int_seed_as_its_tensor():
    """A Python int seed goes into the exchange's kernel as two words (no 0-d tensor made
    per call): its header is the 0-d tensor's, so a rank passing the int and one passing the
    tensor agree, also for a seed with its high bit set; another int fails the call."""
    big = 2**63 + 12345  # (the op takes seeds modulo 2**64: a negative int64 tensor)
    for seed, tensor in ((3, torch.tensor(3)), (big, torch.tensor(big - 2**64))):
        ranks = _simulated_ranks(2)
        candidates, fields = _plain_candidates(2)
        tokens = _exchange_in_turn(ranks, candidates, [seed, tensor], fields)
        assert torch.equal(tokens[0], tokens[1])
        assert all(int(r.ok) == 1 and int(r.error) == 0 for r in ranks)
    ranks = _simulated_ranks(2)
    with pytest.raises(RuntimeError, match="sampled another batch size"):
        _exchange_in_turn(ranks, candidates, [3, 4], fields)


def test_symmetric_exchange_fails_a_missing_rank_and_shards_that_do_not_tile():
    """Without its peer's message of this epoch a rank's call fails (code P + 2 + the rank,
    what the GPU's wait reports after its timeout); shards that overlap fail with P + 1."""
    ranks = _simulated_ranks(2)
    candidates, fields = _plain_candidates(2)
    ranks[1].send(*candidates[1], torch.tensor(3), fields[1])
    with pytest.raises(RuntimeError, match="did not arrive"):
        ranks[1].receive(*candidates[1], torch.tensor(3), fields[1], "test")
    assert int(ranks[1].error) == 2 + 2 + 0
    ranks = _simulated_ranks(2)
    overlapping = [(5, 1, 1000, 0, 600), (5, 1, 1000, 400, 1000)]
    with pytest.raises(RuntimeError, match="do not tile"):
        _exchange_in_turn(ranks, candidates, [torch.tensor(3)] * 2, overlapping)
    assert int(ranks[0].error) == 2 + 1


_COMPILE_EXCHANGE = r"""
import math
import re

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from flashsampling_inductor import exchange

kernel = exchange._exchange
signature = {
    "cand_score_ptr": "*fp32", "cand_index_ptr": "*i32", "num_candidates": "i32",
    "seed_ptr": "*i64", "seed_lo": "i32", "seed_hi": "u32", "peers_ptr": "*i64",
    "buffer_ptr": "*i64", "epoch_ptr": "*i64",
    "out_ptr": "*i64", "ok_ptr": "*i64", "error_ptr": "*i64", "rank": "i32", "lanes": "i32",
    "batch": "i32", "num_samples": "i32", "vocab_size": "i32", "start": "i32", "stop": "i32",
    "timeout_ns": "i64",
}
for world_block in (2, 4, 8):
    constants = dict(SEED_MODE={2: 0, 4: 2, 8: 1}[world_block], WORLD=world_block,
                     WORLD_BLOCK=world_block, BLOCK_C=2048, SEND=True, RECEIVE=True, SPIN=True,
                     PDL=True, TRAP=world_block != 8)
    types = dict(signature, **{name: "constexpr" for name in constants})
    constexprs = {(kernel.arg_names.index(n),): v for n, v in constants.items()}
    compiled = triton.compile(
        ASTSource(kernel, types, constexprs), target=GPUTarget("cuda", 90, 32),
        options={"num_warps": exchange.EXCHANGE_NUM_WARPS},
    )
    ptx = compiled.asm["ptx"]
    # The wait reads the peers' words as volatile (system-scope) loads, with the GPU's timer.
    assert "ld.volatile.global.b64" in ptx and "%globaltimer" in ptx
    # A programmatic dependent of stage 1: nothing read before stage 1 has finished.
    assert "griddepcontrol.wait" in ptx
    # A bad call fails in the kernel itself (TRAP), else by the assert kernel after it.
    assert ("trap;" in ptx) == constants["TRAP"], world_block
    # ... each word by one thread: the loads' layout covers no more than their shape.
    ttgir = compiled.asm["ttgir"]
    layouts = dict(re.findall(r"^(#\w+) = #ttg\.blocked<\{(.*)\}>", ttgir, re.M))
    waits = re.findall(r"isVolatile = true\} : tensor<([\dx]+)x!tt\.ptr<i64>, (#\w+)>", ttgir)
    assert waits, "no volatile load found"
    for shape, name in waits:
        fields = dict(re.findall(r"(\w+) = \[([\d, ]+)\]", layouts[name]))
        per = [list(map(int, fields[k].split(","))) for k in
               ("sizePerThread", "threadsPerWarp", "warpsPerCTA")]
        cover = [math.prod(sizes) for sizes in zip(*per)]
        dims = list(map(int, shape.split("x")))
        assert all(c <= d for c, d in zip(cover, dims)), (world_block, dims, layouts[name])

# The TP shard's plain stage 1 signalling the PDL exchange as its programs start.
from flashsampling_inductor import sampling_kernel

stage1 = sampling_kernel._sample_stage1
stage1_signature = {
    "hidden_ptr": "*bf16", "weight_ptr": "*bf16", "seed_ptr": "*i64", "cand_score_ptr": "*fp32",
    "cand_index_ptr": "*i32", "B": "i32", "V": "i32", "D": "i32", "stride_hb": "i32",
    "stride_hd": "i32", "stride_wv": "i32", "stride_wd": "i32", "scalar_temperature": "fp32",
    "seed_lo": "i64", "seed_hi": "i64", "num_samples": "i32", "vocab_offset": "i32",
    "softcap": "fp32",
}
for signal, wait in ((False, False), (True, False), (False, True)):
    constants = dict(
        hidden_desc=None, weight_desc=None, bias_ptr=None, temperature_ptr=None,
        top_m_key_ptr=None, top_m_index_ptr=None, hidden_key_ptr=None, mass_ptr=None,
        cand_value_ptr=None, log_mass_ptr=None, top_k_ptr=None, top_p_ptr=None, min_p_ptr=None,
        HAS_BIAS=False, HAS_SOFTCAP=False, TEMPERATURE_MODE=0, SEED_MODE=1, LOGITS_DTYPE=None,
        DOT_PRECISION="ieee", SWAP_AB=False, USE_TMA=False, EPILOGUE_CHUNKS=1, EVEN_D=True,
        EVEN_V=False, INTERPRETER=False, BLOCK_B=64, BLOCK_V=64, BLOCK_D=128, PLAIN=True,
        TOP_M=0, ROW_MASS=False, KEY_LOW_BITS=0, LOGPROBS=0, TOP_K_MODE=0, TOP_P_MODE=0,
        MIN_P_MODE=0, BATCH_TRUNCATES=0, SIGNAL_DEPENDENTS=signal, WAIT_PREVIOUS=wait,
        LOGITS_IN=False,
    )
    types = dict(stage1_signature, **{name: "constexpr" for name in constants})
    constexprs = {(stage1.arg_names.index(n),): v for n, v in constants.items()}
    ptx = triton.compile(
        ASTSource(stage1, types, constexprs), target=GPUTarget("cuda", 90, 32),
        options={"num_warps": 4, "num_stages": 3},
    ).asm["ptx"]
    assert ("griddepcontrol.launch_dependents" in ptx) == signal, signal
    assert ("griddepcontrol.wait" in ptx) == wait, wait
    if wait:  # (before any load: the kernel before it may write what stage 1 reads)
        assert ptx.index("griddepcontrol.wait") < ptx.index("ld.global"), "a load first"
print("compiled")
"""


def test_exchange_kernel_compiles_for_hopper():
    """The exchange's whole kernel (the wait loop, its timer and volatile loads, its trap,
    which the interpreter never runs) compiles for sm_90a without a GPU, and its wait reads
    each word of the peers' messages in one thread (no thread of a program decides on a copy
    of a word that another thread read at another time); the shard's stage 1 signals a PDL
    exchange only where asked."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    child = subprocess.run(
        [sys.executable, "-c", _COMPILE_EXCHANGE], capture_output=True, text=True, env=env,
        cwd=root,
    )  # fmt: skip
    assert child.returncode == 0, child.stderr[-3000:]
    assert "compiled" in child.stdout


def test_symmetric_exchange_tags_wrap_after_2_to_the_32_calls():
    """A lane's tag is its epoch's low 32 bits: across the wrap every call still reads its
    own peers' messages, and a message not sent this call is still missing."""
    ranks = _simulated_ranks(2)
    for exchange in ranks:
        exchange.epochs.fill_(2**32 - 3)
    candidates, fields = _plain_candidates(2)
    expected = fused_sample(*build_case(CASES["plain"])[:2], seed=3, impl="torch")
    for _ in range(4):  # epochs 2**32 - 2 .. 2**32 + 1: tags ..., 0xFFFFFFFF, 0, 1
        tokens = _exchange_in_turn(ranks, candidates, [torch.tensor(3)] * 2, fields)
        assert all(torch.equal(t, expected) for t in tokens)
    assert int(ranks[0].epochs[0]) == 2**32 + 1
    with pytest.raises(RuntimeError, match="did not arrive"):
        ranks[0].receive(*candidates[0], torch.tensor(3), fields[0], "test")


@pytest.mark.parametrize(
    ("dim", "shard", "batch", "hopper", "persistent"),
    [
        pytest.param(4096, 37984, 1, True, False, id="D4096-B1-full-grid"),
        pytest.param(4096, 37984, 64, True, False, id="D4096-B64-full-grid"),
        pytest.param(4096, 37984, 256, True, False, id="D4096-B256-gluon"),
        pytest.param(4096, 37984, 256, False, True, id="D4096-B256-persistent-off-hopper"),
        pytest.param(8192, 32064, 64, True, False, id="D8192-B64-gluon"),
        pytest.param(8192, 32064, 256, True, True, id="D8192-B256-persistent"),
        pytest.param(2048, 75968, 256, True, False, id="D2048-B256-swapped-gluon"),
        pytest.param(2048, 75968, 128, False, True, id="D2048-B128-persistent-off-hopper"),
    ],
)
def test_the_pdl_exchange_follows_a_persistent_triton_stage1(
    dim, shard, batch, hopper, persistent, monkeypatch
):
    """FLASHSAMPLING_TP_EXCHANGE_PDL=auto (the default): the exchange is a programmatic
    dependent of stage 1 exactly where stage 1 is the Triton kernel on a persistent grid;
    0 never, 1 always."""
    from flashsampling_inductor import dispatch, exchange

    monkeypatch.setattr(dispatch, "is_hopper", lambda device: hopper)
    params = SamplingParams(None, 1.0, None, 7, 1)
    cuda = torch.device("cuda", 0)
    assert dispatch.persistent_triton_stage1(batch, dim, shard, cuda, params) == persistent
    monkeypatch.setattr(exchange, "pdl_launch", lambda device: {"PDL": True, "launch_pdl": True})
    monkeypatch.delenv("FLASHSAMPLING_TP_EXCHANGE_PDL", raising=False)
    assert exchange.exchange_launches_pdl(cuda, lambda: persistent) == persistent
    for mode, expected in (("0", False), ("1", True), ("auto", persistent)):
        monkeypatch.setenv("FLASHSAMPLING_TP_EXCHANGE_PDL", mode)
        assert exchange.exchange_launches_pdl(cuda, lambda: persistent) == expected
    top_k = SamplingParams(None, 1.0, None, 7, 1, scalar_top_k=50)
    assert not dispatch.persistent_triton_stage1(batch, dim, shard, cuda, top_k)
