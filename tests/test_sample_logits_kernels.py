"""``sample_logits`` on the kernels (``dispatch.triton_sample_logits``): stage 1 reads the
written logits' tiles (LOGITS_IN) instead of computing them, and the truncation's stage 2 and
its exact fallback read the same logits. The tokens and log-probabilities are the reference's
(``impl="torch"``) and ``fused_sample``'s when the logits are its matmul's, for every form,
whatever the tiles."""

from __future__ import annotations

import pytest
import torch

from flashsampling_inductor import dispatch, fused_sample, sample_logits
from flashsampling_inductor.dispatch import SampleConfig, triton_fused_sample
from flashsampling_inductor.params import SamplingParams

from .sampling_oracle import DEVICE, make_exact_problem

ON_KERNELS = "triton" if DEVICE.type == "cpu" else "auto"
B, V = 5, 300  # (300: a partial last tile of every width, 64 to 512)
TEMPERATURE = torch.tensor([0.5, 1.0, 0.0, 2.0, 0.9])
FORMS = {
    "plain": dict(temperature=0.8),
    "rows_t_seeds": dict(temperature=TEMPERATURE, seed=torch.arange(B) * 1000 + 3),
    "greedy": dict(temperature=0.0),
    "two_samples": dict(temperature=1.3, num_samples=2),
    "softcap": dict(temperature=0.7, softcap=2.0),
    "top_k": dict(temperature=0.9, top_k=20),
    "top_k_top_p": dict(temperature=0.6, top_k=20, top_p=0.95),
    "top_p": dict(temperature=1.0, top_p=0.9),
    "min_p": dict(temperature=0.8, min_p=0.1),
    "per_row_knobs": dict(
        temperature=TEMPERATURE,
        top_k=torch.tensor([0, 5, 50, 0, 1000]),
        top_p=torch.tensor([1.0, 0.9, 0.5, 0.3, 1.0]),
        min_p=torch.tensor([0.0, 0.0, 0.2, 0.0, 0.05]),
    ),
}


def _logits(dtype=torch.float32):
    hidden, weight = make_exact_problem(B, V, 32, dtype)
    return hidden, weight, (hidden.float() @ weight.float().T).to(dtype)


def _on_device(knobs):
    return {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in knobs.items()}


@pytest.mark.parametrize("form", list(FORMS))
def test_kernels_draw_the_reference_tokens(form):
    _, _, logits = _logits()
    knobs = {"seed": 11, **_on_device(FORMS[form])}
    tokens = sample_logits(logits, impl=ON_KERNELS, **knobs)
    assert torch.equal(tokens, sample_logits(logits, impl="torch", **knobs))


@pytest.mark.parametrize("mode", ["raw", "processed"])
@pytest.mark.parametrize("form", ["plain", "softcap", "per_row_knobs"])
def test_kernels_log_probabilities_are_the_reference(form, mode):
    _, _, logits = _logits()
    knobs = {"seed": 5, "return_logprobs": mode, **_on_device(FORMS[form])}
    tokens, logprobs = sample_logits(logits, impl=ON_KERNELS, **knobs)
    expected_tokens, expected = sample_logits(logits, impl="torch", **knobs)
    assert torch.equal(tokens, expected_tokens)
    torch.testing.assert_close(logprobs, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("form", ["plain", "top_k", "min_p"])
def test_kernels_draw_what_fused_sample_draws_on_bf16_logits(form):
    """bf16 logits as a bf16 model writes them: fused_sample rounding its own to bf16 draws
    the same tokens, and a strided view of the logits changes nothing."""
    hidden, weight, logits = _logits(torch.bfloat16)
    knobs = {"seed": 3, **_on_device(FORMS[form])}
    tokens = sample_logits(logits, impl=ON_KERNELS, **knobs)
    fused = fused_sample(hidden, weight, logits_dtype=torch.bfloat16, impl=ON_KERNELS, **knobs)
    assert torch.equal(tokens, fused)
    wide = torch.full((B, V + 9), float("nan"), dtype=logits.dtype, device=DEVICE)
    wide[:, :V] = logits
    assert torch.equal(sample_logits(wide[:, :V], impl=ON_KERNELS, **knobs), tokens)


@pytest.mark.parametrize("tile", [(16, 64, 2, 4), (8, 512, 4, 2)])
def test_written_logits_tiles_do_not_change_tokens(monkeypatch, tile):
    _, _, logits = _logits()
    params = SamplingParams(TEMPERATURE.to(DEVICE), 1.0, None, 9, 1)
    config = SampleConfig(16, 128, 16, swap_ab=False)
    stand_in = dispatch.weight_stand_in(logits)
    expected = triton_fused_sample(logits, stand_in, None, params, config, logits_in=True)
    monkeypatch.setattr(dispatch, "LOGITS_IN_TILE", tile)
    assert torch.equal(dispatch.triton_sample_logits(logits, params), expected)


@pytest.mark.parametrize("patch", [False, True])
def test_the_fallback_reads_the_written_logits(monkeypatch, overflowed, patch):
    """Rows whose candidates cannot prove their kept set complete (one candidate a tile):
    flat top-p rows through the fallback's whole-row pass, top-k 20 rows whose 40 largest
    lie in one tile through its patch (that tile recomputed), both over the written
    logits, draw the reference's tokens."""
    from flashsampling_inductor.truncation_kernel import OVERFLOW_FULL, OVERFLOW_PATCH

    monkeypatch.setattr(dispatch, "candidates_per_tile", lambda *args: 1)
    monkeypatch.setattr(dispatch, "patching_pays", lambda params: patch)
    logits = torch.zeros(B, V, device=DEVICE)
    logits[:, ::3] = 0.25
    knobs = dict(temperature=1.0, top_p=0.5, seed=21)
    if patch:
        logits[:, :40] = 5.0 + torch.arange(40, device=DEVICE) / 64
        knobs = dict(temperature=1.0, top_k=20, seed=21)
    tokens = sample_logits(logits, impl=ON_KERNELS, **knobs)
    assert torch.equal(tokens, sample_logits(logits, impl="torch", **knobs))
    (codes,) = overflowed
    expected = OVERFLOW_PATCH if patch else OVERFLOW_FULL
    assert (codes == getattr(expected, "value", expected)).all(), codes


def test_sample_logits_without_waiting_is_sample_logits():
    """hf generate's prompt token (``op.sample_logits_without_waiting``): off CUDA, or once
    the kernels are compiled, exactly ``sample_logits`` (tests/test_gpu_compile_ahead.py: the
    first call of a kind on CUDA, on the reference); its arguments checked alike."""
    from flashsampling_inductor.op import sample_logits_without_waiting

    logits = _logits()[2].cpu()
    for form in ("plain", "top_k_top_p", "per_row_knobs"):
        knobs = dict(FORMS[form], seed=FORMS[form].get("seed", 7))
        expected = sample_logits(logits, impl="torch", **knobs)
        assert torch.equal(sample_logits_without_waiting(logits, **knobs), expected)
    with pytest.raises(ValueError, match="2-D"):
        sample_logits_without_waiting(logits[0])
