"""Tensor-parallel sampling at large batches on 3 gloo ranks with uneven shards (the
collective exchange, which CUDA takes past ``SYMMETRIC_CAPACITY`` lanes): B = 256 and 512,
two samples a row, seed None (under the same ``torch.manual_seed``) and explicit: every rank
returns the tokens ``fused_sample`` draws over the whole vocabulary."""

from __future__ import annotations

import torch

from flashsampling_inductor import fused_sample, tp_fused_sample

from .sampling_oracle import make_problem
from .tp_ranks import run_ranks

VOCAB, HIDDEN, SAMPLES, WORLD = 101, 8, 2, 3
BATCHES = (256, 512)


def _problem(batch: int):
    return make_problem(batch, VOCAB, HIDDEN, torch.float32, device=torch.device("cpu"))


def _worker(rank, world):
    shard = -(-VOCAB // world)  # 34, 34, 33: uneven
    start = rank * shard
    out = {}
    for batch in BATCHES:
        hidden, weight = _problem(batch)
        knobs = dict(vocab_start=start, vocab_size=VOCAB, num_samples=SAMPLES, temperature=0.8)
        out[batch, "explicit"] = tp_fused_sample(
            hidden, weight[start : start + shard], seed=batch, **knobs
        )
        torch.manual_seed(batch)
        out[batch, None] = tp_fused_sample(hidden, weight[start : start + shard], **knobs)
    return out


def test_large_batches_on_uneven_shards_draw_the_tokens_of_tp1():
    per_rank = run_ranks(WORLD, _worker)
    for key, tokens in per_rank[0].items():
        for other in per_rank[1:]:
            assert torch.equal(other[key], tokens), key
        batch, seed = key
        hidden, weight = _problem(batch)
        if seed is None:
            torch.manual_seed(batch)
        expected = fused_sample(
            hidden, weight, num_samples=SAMPLES, temperature=0.8, impl="torch",
            seed=batch if seed else None,
        )  # fmt: skip
        assert tokens.shape == (batch, SAMPLES)
        assert torch.equal(tokens, expected), key
