"""Eager ``fused_sample`` calls replayed from CUDA graphs of their own (``graphed.py``): a
replay draws the tokens (and log-probabilities) the same call draws without it, follows new
inputs and knob values between replays, and a new weight is a new kind of call."""

from __future__ import annotations

import pytest
import torch

import flashsampling_inductor as fs
from flashsampling_inductor import graphed

pytestmark = pytest.mark.gpu

V, D = 32_000, 512
FORMS = {
    "plain": {},
    "top_k": {"top_k": 50},
    "top_k_top_p": {"top_k": 50, "top_p": 0.9},
    "min_p": {"min_p": 0.1},
    "logprobs": {"top_k": 20, "return_logprobs": "processed"},
}


@pytest.fixture
def fresh_graphs():
    graphed.clear()
    yield
    graphed.clear()
    graphed.ENABLED = True


def _calls(weight, hiddens, knobs, enabled: bool, seed: int | None = 11):
    graphed.ENABLED = enabled
    torch.manual_seed(3)
    out = [fs.fused_sample(h, weight, seed=seed, **knobs(i)) for i, h in enumerate(hiddens)]
    torch.cuda.synchronize()
    return out


def _same(a, b) -> bool:
    if isinstance(a, tuple):
        return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    return torch.equal(a, b)


@pytest.mark.parametrize("batch", [1, 48, 200])
@pytest.mark.parametrize("form", list(FORMS))
def test_gpu_replays_draw_the_calls_tokens(fresh_graphs, form, batch):
    weight = torch.randn(V, D, device="cuda", dtype=torch.bfloat16) * 0.05
    hiddens = [torch.randn(batch, D, device="cuda", dtype=torch.bfloat16) for _ in range(7)]
    knobs = lambda i: dict(temperature=0.7, **FORMS[form])  # noqa: E731
    expected = _calls(weight, hiddens, knobs, enabled=False)
    got = _calls(weight, hiddens, knobs, enabled=True)
    assert len(graphed._graphs) == 1  # (captured at the third call, replayed after)
    for i, (a, b) in enumerate(zip(expected, got, strict=True)):
        assert _same(a, b), (form, batch, i)


def test_gpu_replays_follow_knob_tensors_and_the_generators_seed(fresh_graphs):
    """Per-row temperature / top-k / top-p tensors whose values change at every call, greedy
    rows among them, and the seed drawn from torch's generator at each call."""
    batch = 64
    weight = torch.randn(V, D, device="cuda", dtype=torch.bfloat16) * 0.05
    hiddens = [torch.randn(batch, D, device="cuda", dtype=torch.bfloat16) for _ in range(8)]
    generator = torch.Generator().manual_seed(0)

    def rows(i):
        g = torch.Generator().manual_seed(i)
        t = torch.rand(batch, generator=g) + 0.3
        t[::7] = 0.0
        return dict(
            temperature=t.cuda(),
            top_k=torch.randint(1, 200, (batch,), generator=g).cuda(),
            top_p=(torch.rand(batch, generator=g) * 0.5 + 0.5).cuda(),
        )

    del generator
    expected = _calls(weight, hiddens, rows, enabled=False, seed=None)
    got = _calls(weight, hiddens, rows, enabled=True, seed=None)
    assert len(graphed._graphs) == 1
    for i, (a, b) in enumerate(zip(expected, got, strict=True)):
        assert torch.equal(a, b), i


def test_gpu_a_new_weight_is_a_new_kind(fresh_graphs):
    first = torch.randn(V, D, device="cuda", dtype=torch.bfloat16) * 0.05
    second = torch.randn(V, D, device="cuda", dtype=torch.bfloat16) * 0.05
    h = torch.randn(16, D, device="cuda", dtype=torch.bfloat16)
    for _ in range(4):
        fs.fused_sample(h, first, temperature=0.7, seed=5)
    assert len(graphed._graphs) == 1
    graphed.ENABLED = False
    expected = fs.fused_sample(h, second, temperature=0.7, seed=5)
    graphed.ENABLED = True
    assert torch.equal(fs.fused_sample(h, second, temperature=0.7, seed=5), expected)
    assert not torch.equal(expected, fs.fused_sample(h, first, temperature=0.7, seed=5))


def test_gpu_sample_logits_replays_read_the_logits_where_they_are(fresh_graphs):
    """The logits are pinned: new values written into the same buffer are what a replay
    samples; logits in another buffer are another kind of call."""
    batch = 32
    buffer = torch.empty(batch, V, device="cuda", dtype=torch.bfloat16)
    values = [torch.randn(batch, V, device="cuda").bfloat16() * 4 for _ in range(7)]

    def draws(enabled):
        graphed.ENABLED = enabled
        out = []
        for i, value in enumerate(values):
            buffer.copy_(value)
            out.append(fs.sample_logits(buffer, temperature=0.8, top_k=40, top_p=0.95, seed=i % 2))
        return out

    expected = draws(False)
    got = draws(True)
    assert len(graphed._graphs) == 2  # (one a seed)
    for i, (a, b) in enumerate(zip(expected, got, strict=True)):
        assert torch.equal(a, b), i
    other = values[0].clone()
    graphed.ENABLED = False
    alone = fs.sample_logits(other, temperature=0.8, top_k=40, top_p=0.95, seed=0)
    graphed.ENABLED = True
    assert torch.equal(
        fs.sample_logits(other, temperature=0.8, top_k=40, top_p=0.95, seed=0), alone
    )


def test_gpu_inference_mode_and_inputs_that_require_grad(fresh_graphs):
    """A kind captured in inference mode is not replayed outside it (its buffers take no
    in-place copy there), and an input that requires grad is copied without recording."""
    weight = torch.randn(V, D, device="cuda", dtype=torch.bfloat16) * 0.05
    h = torch.randn(8, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    graphed.ENABLED = False
    expected = fs.fused_sample(h.detach(), weight, temperature=0.7, seed=1)
    graphed.ENABLED = True
    with torch.inference_mode():
        for _ in range(4):
            assert torch.equal(
                fs.fused_sample(h.detach(), weight, temperature=0.7, seed=1), expected
            )
    for _ in range(4):
        assert torch.equal(fs.fused_sample(h, weight, temperature=0.7, seed=1), expected)
    assert len(graphed._graphs) == 2


def test_gpu_calls_on_another_stream_are_not_graphed(fresh_graphs):
    """Only the default stream's calls are graphed (CUDA graph trees warm up on a stream of
    their own, their pool taking the thread's allocations)."""
    weight = torch.randn(V, D, device="cuda", dtype=torch.bfloat16) * 0.05
    h = torch.randn(8, D, device="cuda", dtype=torch.bfloat16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(4):
            fs.fused_sample(h, weight, temperature=0.7, seed=1)
    torch.cuda.current_stream().wait_stream(stream)
    assert not graphed._graphs
