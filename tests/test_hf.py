"""``fused_generate``: Hugging Face ``model.generate`` with ``custom_generate`` (skipped without
transformers). Greedy output equals generate's own, sampling keeps generate's distribution,
and what cannot be fused runs transformers' own loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats
from torch._dynamo.utils import counters

transformers = pytest.importorskip("transformers", minversion="4.57")
from flashsampling_inductor import hf  # noqa: E402
from flashsampling_inductor.hf import fused_generate  # noqa: E402

pytestmark = pytest.mark.skipif(
    not hf._loop_matches(transformers.__version__),
    reason=f"fused_generate mirrors transformers 4.57, not {transformers.__version__}",
)

VOCAB = 48  # small enough for a full chi-square over the vocabulary


@pytest.fixture(autouse=True)
def _fresh_compile():
    """Each test compiles the step anew, so the rewrite counters see its graphs."""
    torch._dynamo.reset()
    with torch._inductor.config.patch(fx_graph_cache=False):
        yield


def _small_llama(vocab: int, dim: int):
    config = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=dim,
        intermediate_size=2 * dim,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def model():
    return _small_llama(VOCAB, 32)


def test_greedy_equals_generate(model):
    prompt = torch.randint(0, VOCAB, (3, 5))
    expected = model.generate(prompt, do_sample=False, max_new_tokens=6, pad_token_id=0)
    # An eos that one row reaches early: that row is padded from then on, as in generate.
    eos = int(expected[0, 7])
    expected = model.generate(
        prompt, do_sample=False, max_new_tokens=6, pad_token_id=0, eos_token_id=eos
    )
    counters.clear()
    got = model.generate(
        prompt,
        do_sample=False,
        max_new_tokens=6,
        pad_token_id=0,
        eos_token_id=eos,
        custom_generate=fused_generate,
    )
    assert counters["flashsampling"]["greedy"] >= 2  # the prompt step and the decode steps
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


# 40_000 draws over V = 48 (one cell per token): power against a 1% shift in any one likely
# token's probability; p > 1e-4 keeps the fixed-seed test from flaking.
@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_sampling_keeps_the_distribution(model, temperature):
    prompt = torch.randint(0, VOCAB, (1, 4)).expand(40_000, 4)
    with torch.no_grad():
        logits = model(prompt[:1]).logits[0, -1].double()
    counters.clear()
    torch.manual_seed(1)
    out = model.generate(
        prompt,
        do_sample=True,
        temperature=temperature,
        top_k=0,
        max_new_tokens=2,
        pad_token_id=0,
        custom_generate=fused_generate,
    )
    assert counters["flashsampling"]["multinomial"] >= 1
    assert out.shape == (40_000, 6) and bool((out >= 0).all()) and bool((out < VOCAB).all())
    observed = np.bincount(out[:, 4].numpy(), minlength=VOCAB)
    expected = torch.softmax(logits / temperature, -1).numpy() * len(prompt)
    assert stats.chisquare(observed, expected).pvalue > 1e-4


def test_a_new_temperature_or_prompt_does_not_recompile(model):
    def run(length, temperature):
        model.generate(
            torch.randint(0, VOCAB, (2, length)),
            do_sample=True,
            temperature=temperature,
            top_k=0,
            max_new_tokens=3,
            pad_token_id=0,
            custom_generate=fused_generate,
        )

    run(5, 0.7)
    counters.clear()
    for length, temperature in ((7, 0.9), (3, 1.3)):
        run(length, temperature)
    assert counters["stats"]["unique_graphs"] == 0


def test_what_is_not_fused_runs_generates_own_loop(model, caplog):
    """top_k defaults to 50 in generate: not something the fused op draws, so the tokens
    are generate's own (the same random stream, the same tokens)."""
    prompt = torch.randint(0, VOCAB, (2, 5))
    torch.manual_seed(2)
    expected = model.generate(prompt, do_sample=True, max_new_tokens=4, pad_token_id=0)
    counters.clear()
    torch.manual_seed(2)
    with caplog.at_level("INFO", logger="flashsampling_inductor"):
        got = model.generate(
            prompt, do_sample=True, max_new_tokens=4, pad_token_id=0, custom_generate=fused_generate
        )
    assert not counters["flashsampling"]
    assert "TopKLogitsWarper is not fused" in caplog.text
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_another_transformers_version_runs_its_own_loop(model, caplog, monkeypatch):
    """A transformers whose decoding loop fused_generate does not mirror: generate's own
    loop, the same tokens as without custom_generate, and a warning."""
    monkeypatch.setattr(hf, "_loop_matches", lambda version: False)
    prompt = torch.randint(0, VOCAB, (2, 5))
    settings = dict(do_sample=True, temperature=0.7, top_k=0, max_new_tokens=4, pad_token_id=0)
    torch.manual_seed(3)
    expected = model.generate(prompt, **settings)
    counters.clear()
    torch.manual_seed(3)
    with caplog.at_level("WARNING", logger="flashsampling_inductor"):
        got = model.generate(prompt, custom_generate=fused_generate, **settings)
    assert not counters["flashsampling"]
    assert "nothing fused" in caplog.text
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_beam_search_raises(model):
    with pytest.raises(ValueError, match="fused_generate runs sampling and greedy search"):
        model.generate(
            torch.randint(0, VOCAB, (1, 5)),
            num_beams=2,
            max_new_tokens=2,
            pad_token_id=0,
            custom_generate=fused_generate,
        )


@pytest.mark.gpu
def test_sampling_on_cuda():
    """A Llama on the GPU at a real vocabulary size: the steps are rewritten and the first
    sampled token follows generate's distribution. fp32, so that the reference logits (one
    row, cuBLAS) and the fused kernel's agree far below what the chi-square can see."""
    from .test_graph_pass import _top_tokens_chi_square_p

    vocab = 32_000
    model = _small_llama(vocab, 256).to("cuda")
    with torch.no_grad():
        # Logits with a spread of ~2: the likeliest tokens get 0.5-1.5% of the draws each.
        model.lm_head.weight.mul_(6)
        prompt = torch.randint(0, vocab, (1, 6), device="cuda").expand(16_384, 6)
        logits = model(prompt[:1]).logits[0, -1].double()
    counters.clear()
    out = model.generate(
        prompt,
        do_sample=True,
        temperature=0.8,
        top_k=0,
        max_new_tokens=3,
        pad_token_id=0,
        custom_generate=fused_generate,
    )
    assert counters["flashsampling"]["multinomial"] >= 2
    assert bool((out >= 0).all()) and bool((out < vocab).all())
    probs = torch.softmax(logits / 0.8, -1)
    assert probs.max() < 0.05  # the cells of the test are not one token's
    assert _top_tokens_chi_square_p(out[:, 6], probs) > 1e-4
