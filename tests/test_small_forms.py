"""Small spellings of the usual tails: Exp(1) noise clamped from below before the race
(``q.clamp_min_(1e-10)``, accepted: it changes a draw only on an event of probability
<= 1e-9 per token), the last position's logits reshaped with ``.view(B, -1)``, logits laid
out ``[s, b, V]`` and transposed, and ``torch.distributions.Categorical(logits=l).sample()``.
Each becomes one fused call drawing the program's distribution. A clamp that changes the
distribution (eps > 1e-9) is left alone AND warned about: an argmax of noisy scores is a
sampling op whichever idiom looks at it."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from .catalog_checks import assert_left_alone, assert_one_fused_call, chi_square_p, compiled_draws

B, S, D, V = 3, 4, 16, 64
torch.manual_seed(0)
WEIGHT = torch.randn(V, D)


def clamped_race(h, weight=WEIGHT, eps=1e-10):
    probs = F.softmax(F.linear(h, weight) / 0.8, dim=-1)
    q = torch.empty_like(probs).exponential_(1)
    q.clamp_min_(eps)
    return torch.argmax(probs / q, dim=-1)


def clamped_race_1e_3(h):
    return clamped_race(h, eps=1e-3)


def last_position_view(x, weight=WEIGHT):
    logits = F.linear(x, weight)[:, -1, :].view(x.shape[0], -1)
    return torch.multinomial(F.softmax(logits / 0.7, dim=-1), num_samples=1)


def sequence_first(x, weight=WEIGHT):  # [s, b, d] hidden states (Megatron's layout)
    logits = F.linear(x, weight).transpose(0, 1).contiguous()
    return torch.multinomial(F.softmax(logits[:, -1, :], dim=-1), num_samples=1)


def categorical(h, weight=WEIGHT):
    return torch.distributions.Categorical(logits=F.linear(h, weight)).sample()


def transpose_of_the_vocabulary(x):  # [b, V, s]: the vocabulary dim moved
    logits = F.linear(x, WEIGHT).transpose(1, 2)
    return torch.multinomial(F.softmax(logits[:, :, -1], dim=-1), num_samples=1)


@pytest.mark.parametrize(
    "fn, args, idiom",
    [
        pytest.param(clamped_race, (torch.randn(B, D),), "exponential_race", id="clamped-race"),
        pytest.param(last_position_view, (torch.randn(B, S, D),), "multinomial", id="view-B-1"),
        pytest.param(sequence_first, (torch.randn(1, B, D),), "multinomial", id="seq-first"),
        pytest.param(categorical, (torch.randn(B, D),), "multinomial", id="categorical"),
    ],
)
def test_small_form_becomes_one_fused_call(fn, args, idiom):
    assert_one_fused_call(fn, *args, idiom=idiom)


@pytest.mark.parametrize("fn", [last_position_view, categorical], ids=["view-B-1", "categorical"])
def test_symbolic_sizes_are_rewritten(fn):
    args = (torch.randn(B, S, D),) if fn is last_position_view else (torch.randn(B, D),)
    assert_one_fused_call(fn, *args, idiom="multinomial", dynamic=True)


def test_a_clamp_that_changes_the_draw_is_refused_and_warned(caplog):
    h = torch.randn(B, D)
    assert_left_alone(clamped_race_1e_3, h, reason="clamped at 0.001")
    torch._dynamo.reset()
    with caplog.at_level(logging.WARNING, logger="flashsampling_inductor"):
        with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):
            torch.compile(clamped_race_1e_3, backend="flashsampling")(h)
    assert "left unfused" in caplog.text and "clamped at 0.001" in caplog.text


def test_the_vocabulary_dim_moved_is_refused():
    assert_left_alone(transpose_of_the_vocabulary, torch.randn(B, S, D), reason="vocabulary")


@pytest.mark.parametrize(
    "fn, idiom",
    [
        pytest.param(clamped_race, "exponential_race", id="clamped-race"),
        pytest.param(categorical, "multinomial", id="categorical"),
    ],
)
def test_small_form_keeps_the_distribution(fn, idiom):
    torch.manual_seed(7)
    weight, row = torch.randn(12, D) * 3 / D**0.5, torch.randn(D)
    rows = row.expand(20_000, D).contiguous()
    tokens = compiled_draws(lambda h: fn(h, weight), rows, idiom=idiom)
    temperature = 0.8 if fn is clamped_race else 1.0
    probs = torch.softmax((weight @ row).double() / temperature, -1)
    assert chi_square_p(tokens, probs) > 1e-4
