"""``graphed.py`` off CUDA, and the SamplingParams split it keys on (the replays themselves:
tests/test_gpu_graphed.py)."""

from __future__ import annotations

import dataclasses

import torch

from flashsampling_inductor import graphed
from flashsampling_inductor.params import SamplingParams


def test_cpu_calls_run_as_they_are():
    calls = []

    def run(x):
        calls.append(x)
        return x + 1

    x = torch.ones(3)
    for _ in range(graphed.CAPTURE_AFTER + 2):
        assert torch.equal(graphed.replay_or_run("test", run, (x,), (), ()), x + 1)
    assert len(calls) == graphed.CAPTURE_AFTER + 2 and not graphed._graphs


def test_params_split_into_knobs_and_scalars():
    """Every field is either a knob (copied into a graph's buffers) or a scalar (part of the
    kind of call): a field added to SamplingParams lands in one of them."""
    params = SamplingParams(
        torch.ones(()), 0.5, torch.zeros(4, dtype=torch.int64), 3, 2, torch.bfloat16,
        torch.full((4,), 5), 7, None, 0.9, torch.zeros(()), 0.1, 30.0, "raw",
    )  # fmt: skip
    assert params.with_knobs(*params.knobs()) is not params
    assert params.with_knobs(*params.knobs()) == params
    fields = [field.name for field in dataclasses.fields(params)]
    assert len(params.knobs()) + len(params.scalars()) == len(fields)
    assert not any(isinstance(value, torch.Tensor) for value in params.scalars())
    hash(params.scalars())
