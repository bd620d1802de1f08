"""Hugging Face ``generate`` after ``flashsampling_inductor.hf.enable(model)`` (skipped without
transformers 5.x): greedy output equals generate's own token for token, sampling keeps
generate's distribution (temperature, top-k, top-p, a model's generation_config), the decode
step is one rewritten graph that new prompts and settings reuse, and what cannot be fused runs
transformers' own loop with one warning. Tiny random Llama and Qwen3 on the CPU."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from scipy import stats
from torch._dynamo.utils import counters

transformers = pytest.importorskip("transformers", minversion="5.17")
from transformers.generation.logits_process import (  # noqa: E402
    LogitsProcessorList,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from transformers.generation.streamers import BaseStreamer  # noqa: E402
from transformers.generation.utils import ALL_CACHE_NAMES  # noqa: E402

from flashsampling_inductor import hf  # noqa: E402

from .catalog_checks import chi_square_p  # noqa: E402
from .hf_models import (  # noqa: E402, F401  (the fixtures: the pass runs, warnings anew)
    VOCAB,
    fresh_warnings,
    our_warnings,
    rewrites,
    run_the_pass,
    stock,
    tiny_model,
    token_probs,
)


@pytest.fixture(scope="module")
def models():
    """The tiny models, enabled, made once: each compiles its decode step once per graph."""
    return {kind: hf.enable(tiny_model(kind)) for kind in ("llama", "qwen3")}


@pytest.fixture
def model(models):
    return models["llama"]


def _stock(model, *args, **kwargs):
    """generate without the fused loop."""
    with stock(model):
        return model.generate(*args, **kwargs)


class _Collect(BaseStreamer):
    def __init__(self):
        self.chunks = []

    def put(self, value):
        self.chunks.append(value.clone())

    def end(self):
        self.chunks.append("end")


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_greedy_equals_generate(models, kind, caplog):
    model = models[kind]
    prompt = torch.randint(0, VOCAB, (3, 5))
    settings = dict(do_sample=False, max_new_tokens=6, pad_token_id=0)
    # An eos that one row reaches early: that row is padded from then on, as in generate.
    eos = int(_stock(model, prompt, **settings)[0, 7])
    settings.update(eos_token_id=eos, return_dict_in_generate=True)
    expected_stream, got_stream = _Collect(), _Collect()
    expected = _stock(model, prompt, streamer=expected_stream, **settings)
    counters.clear()
    with caplog.at_level("WARNING", logger="flashsampling_inductor"):
        got = model.generate(prompt, streamer=got_stream, **settings)
    assert rewrites() >= 1, "the decode step was not rewritten"
    assert not our_warnings(caplog)
    assert got[ALL_CACHE_NAMES[0]] is not None  # past_key_values up to 5.23, cache from 5.24
    torch.testing.assert_close(got.sequences, expected.sequences, rtol=0, atol=0)
    assert len(got_stream.chunks) == len(expected_stream.chunks)
    for got_chunk, expected_chunk in zip(got_stream.chunks, expected_stream.chunks, strict=True):
        assert (
            got_chunk == expected_chunk
            if isinstance(got_chunk, str)
            else got_chunk.equal(expected_chunk)
        )


def test_greedy_stops_at_eos_as_generate_does(model):
    """Without a streamer or a returned cache the loop reads its stop decision one step late
    (so the host never waits for the step it has just queued) and drops the step past the
    stop: the output is generate's, shorter than max_new_tokens."""
    prompt = torch.randint(0, VOCAB, (1, 5))
    settings = dict(do_sample=False, max_new_tokens=8, pad_token_id=0)
    eos = int(_stock(model, prompt, **settings)[0, 7])
    settings.update(eos_token_id=eos)
    expected = _stock(model, prompt, **settings)
    assert expected.shape[1] < 5 + 8, "the eos should end generation early"
    torch.testing.assert_close(model.generate(prompt, **settings), expected, rtol=0, atol=0)


def _warped(logits: torch.Tensor, temperature, top_k, top_p, min_p) -> torch.Tensor:
    """generate's own warpers on [N, V] logits -> float64 probabilities."""
    warpers = LogitsProcessorList([TemperatureLogitsWarper(temperature)])
    if top_k:
        warpers.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p))
    if min_p:
        warpers.append(MinPLogitsWarper(min_p))
    return torch.softmax(warpers(None, logits.float()).double(), dim=-1)


def _token_probs(model, prompt, temperature, top_k, top_p, min_p):
    """-> generate's distributions [V] float64 of the first and the second new token after
    prompt [1, L] (the pad token defaulting to the eos)."""
    return token_probs(
        model,
        prompt,
        lambda logits: _warped(logits, temperature, top_k, top_p, min_p),
        model.generation_config.eos_token_id,
    )


# 40_000 rows, two new tokens each: the first is the prompt's (drawn from the prefill's logits),
# the second the compiled decode step's. Each token's marginal distribution is exact (the
# second's sums over the first), so one-sample chi-squares over V = 48 cells have power
# against a ~1% shift in any one likely token's probability; p > 1e-4 keeps the fixed-seed
# tests from flaking. The settings include generate's default top_k = 50 (> V: every token
# survives), in a model's generation_config Qwen3's (0.6, 20, 0.95), and top-p without top-k
# followed by min-p.
@pytest.mark.parametrize(
    "kind, temperature, top_k, top_p, min_p",
    [
        ("llama", 0.7, 0, 1.0, None),
        ("llama", 1.0, 50, 1.0, None),
        ("qwen3", 0.6, 20, 0.95, None),
        ("llama", 0.8, 0, 0.9, 0.1),
    ],
)
def test_sampling_keeps_the_distribution(models, kind, caplog, temperature, top_k, top_p, min_p):
    model, rows, prompt = models[kind], 40_000, torch.randint(0, VOCAB, (1, 4))
    first, second = _token_probs(model, prompt, temperature, top_k, top_p, min_p)
    config = copy.deepcopy(model.generation_config)
    config.update(do_sample=True, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    counters.clear()
    torch.manual_seed(1)
    with caplog.at_level("WARNING", logger="flashsampling_inductor"):
        out = model.generate(prompt.expand(rows, 4), generation_config=config, max_new_tokens=2)
    # Rewritten now, or the graph an earlier call compiled (and a test checked) reused.
    assert rewrites() >= 1 or counters["stats"]["unique_graphs"] == 0
    assert not our_warnings(caplog)
    for position, probs in ((4, first), (5, second)):
        assert chi_square_p(out[:, position], probs) > 1e-4, f"token {position}"


def test_custom_generate_is_fused_with_a_static_cache(models, caplog):
    """``custom_generate=fused_generate`` on a model without ``enable``: the same loop, the
    dynamic cache generate made for the call swapped for a static one."""
    model = models["qwen3"]
    prompt = torch.randint(0, VOCAB, (3, 5))
    settings = dict(do_sample=False, max_new_tokens=4, pad_token_id=0)
    expected = _stock(model, prompt, **settings)
    counters.clear()
    with stock(model), caplog.at_level("WARNING", logger="flashsampling_inductor"):
        got = model.generate(prompt, custom_generate=hf.fused_generate, **settings)
    assert not our_warnings(caplog)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_new_prompts_and_settings_reuse_the_compiled_step():
    # A model of its own: the shared ones carry graphs that earlier tests specialized on their
    # batch sizes and cache lengths, so which of them a call here reuses would depend on order.
    model = hf.enable(tiny_model("llama"))

    def run(length, **settings):
        model.generate(
            torch.randint(0, VOCAB, (2, length)), max_new_tokens=3, pad_token_id=0, **settings
        )

    run(7, do_sample=True, temperature=0.7, top_k=5, top_p=0.9)
    run(7, do_sample=False)
    counters.clear()
    run(5, do_sample=True, temperature=1.3, top_k=9, top_p=0.5)
    run(3, do_sample=True, temperature=0.9, top_k=2, top_p=0.8)
    run(6, do_sample=False)
    assert counters["stats"]["unique_graphs"] == 0


def test_every_setting_shares_one_graph(model):
    """Greedy, plain sampling and top-k / top-p / min-p turned on and off in any mix share
    one graph: each knob reaches the step as a tensor, at its off value when off (greedy is
    temperature 0), so no toggle between generate calls recompiles."""
    prompt = torch.randint(0, VOCAB, (2, 5))

    def run(**settings):
        model.generate(prompt, max_new_tokens=3, pad_token_id=0, **settings)

    # Models share compiled steps (one code, guards that hold for any of them): without a
    # reset, graphs that earlier tests compiled for other settings would hide a recompile.
    torch._dynamo.reset()
    run(do_sample=False)
    graphs, frames = counters["stats"]["unique_graphs"], counters["frames"]["total"]
    for settings in (
        dict(temperature=0.7, top_k=0),
        dict(temperature=1.3),  # generate's default top_k=50
        dict(top_k=0, top_p=0.9),
        dict(top_k=0, min_p=0.1),
        dict(temperature=0.6, top_k=20, top_p=0.95, min_p=0.05),
        dict(top_k=0),
    ):
        run(do_sample=True, **settings)
        run(do_sample=False)
    # (a frame that misses its compiled code's guards is compiled again: counted in both)
    assert counters["stats"]["unique_graphs"] == graphs
    assert counters["frames"]["total"] == frames


def test_off_valued_knobs_draw_the_tokens_of_none(model, monkeypatch):
    """Knobs that are off reach the step at their off values, not as None: on the same seed
    plain sampling draws the same tokens as with them None (the op's plain path), the
    prompt's token included."""
    # (test_every_setting_shares_one_graph's shapes: its graph, then one with None knobs)
    prompt = torch.randint(0, VOCAB, (2, 5))
    settings = dict(do_sample=True, temperature=0.8, top_k=0, max_new_tokens=3, pad_token_id=0)
    torch.manual_seed(3)
    got = model.generate(prompt, **settings)
    as_tensors = hf._Sampling.as_tensors

    def off_as_none(sampling, device, python_top_k=False):
        knobs = as_tensors(sampling, device, python_top_k)
        off = dict(top_k=sampling.top_k == 0, top_p=sampling.top_p >= 1.0, min_p=not sampling.min_p)
        return {name: None if off.get(name) else value for name, value in knobs.items()}

    monkeypatch.setattr(hf._Sampling, "as_tensors", off_as_none)
    torch.manual_seed(3)
    expected = model.generate(prompt, **settings)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_the_prompts_draw_takes_its_knobs_as_numbers(model, monkeypatch):
    """The prompt's token is drawn eagerly with the knobs as Python numbers, which the op
    checks on the host: as CUDA tensors a kernel of their own checks them (knob_check.py),
    and its compile would come during the first generate's prefill (issue 36 item 7)."""
    from flashsampling_inductor import op

    eager_draws = []
    draw = op._sample_logits_run  # (eager calls only: a traced call is the custom op's)

    def recording_draw(*args):
        eager_draws.append(args)
        return draw(*args)

    monkeypatch.setattr(op, "_sample_logits_run", recording_draw)
    model.generate(torch.randint(0, VOCAB, (2, 5)), do_sample=True, max_new_tokens=3,
                   pad_token_id=0, temperature=0.6, top_k=20, top_p=0.95, min_p=0.05)  # fmt: skip
    (args,) = eager_draws
    tensors = args[1], args[6], args[8], args[11]  # temperature, top_k, top_p, min_p
    assert tensors == (None,) * 4
    scalars = args[2], args[7], args[9], args[12]
    torch.testing.assert_close(scalars, (0.6, 20, 0.95, 0.05))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "sampling",
    [
        hf._Sampling(temperature=0.7, top_k=50),
        hf._Sampling(temperature=0.6, top_k=20, top_p=0.95, min_p=0.05),
        hf._Sampling(temperature=1.0, top_p=0.9),
        hf._Sampling(temperature=0.8),
        hf._Sampling(temperature=0.0, top_k=50),
    ],
)
def test_the_prompts_draw_is_the_same_with_knobs_as_numbers(sampling):
    """The prompt's draw with the knobs as Python numbers (``_fused_loop``) draws the tokens
    that the same knobs as CUDA tensors (``_Sampling.as_tensors``) draw."""
    import dataclasses

    logits = torch.randn(8, 4096, device="cuda").mul_(3).to(torch.bfloat16)
    torch.manual_seed(5)
    as_numbers = hf.sample_logits(logits, **dataclasses.asdict(sampling))
    torch.manual_seed(5)
    as_tensors = hf.sample_logits(logits, **sampling.as_tensors(logits.device))
    torch.testing.assert_close(as_numbers, as_tensors, rtol=0, atol=0)


@pytest.mark.parametrize(
    "settings, why",
    [
        (dict(do_sample=True, repetition_penalty=1.3), "RepetitionPenaltyLogitsProcessor"),
        (dict(do_sample=True, typical_p=0.9), "TypicalLogitsWarper"),
        (dict(do_sample=True, return_dict_in_generate=True, output_scores=True), "scores"),
    ],
)
def test_what_is_not_fused_runs_generates_own_loop(model, caplog, settings, why):
    """The same random stream, so generate's own tokens; the reason at WARNING, once."""
    prompt = torch.randint(0, VOCAB, (2, 5))
    settings = dict(max_new_tokens=4, pad_token_id=0, **settings)
    torch.manual_seed(2)
    expected = _stock(model, prompt, **settings)
    counters.clear()
    with caplog.at_level("WARNING", logger="flashsampling_inductor"):
        for _ in range(2):
            torch.manual_seed(2)
            got = model.generate(prompt, **settings)
    assert not counters["flashsampling"]
    warned = our_warnings(caplog)
    assert warned.count("generate runs transformers' own loop") == 1 and why in warned
    assert not hf.is_fused(model) and why in hf.is_fused(model).reason
    if isinstance(got, torch.Tensor):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    else:
        torch.testing.assert_close(got.sequences, expected.sequences, rtol=0, atol=0)


def test_the_first_generate_says_whether_the_step_is_fused(caplog, monkeypatch):
    """Once at INFO that the decode step is fused, also for a step loaded from Inductor's
    caches (a new process: the pass does not run), else at WARNING why not (here: the CPU
    without FLASHSAMPLING_CPU=1, compiled and then cached); ``is_fused`` tells the same."""
    from torch._inductor.utils import fresh_cache

    def fresh_model():
        torch._dynamo.reset()  # as in a new process
        return hf.enable(tiny_model("llama", layers=1))  # (one layer: four compiles, kept short)

    def generate(model):
        prompt = torch.randint(0, VOCAB, (2, 5))
        model.generate(prompt, do_sample=False, max_new_tokens=2, pad_token_id=0)

    assert "enable(model) was not called" in hf.is_fused(tiny_model("llama")).reason
    with (
        fresh_cache(),
        torch._inductor.config.patch(fx_graph_cache=True),
        torch._functorch.config.patch(enable_autograd_cache=True),
        caplog.at_level("INFO", logger="flashsampling_inductor"),
    ):
        for cached in (False, True):
            model = fresh_model()
            assert "has run yet" in hf.is_fused(model).reason
            caplog.clear()
            counters.clear()
            generate(model)
            generate(model)  # (said once)
            assert bool(counters["inductor"]["fxgraph_cache_hit"]) == cached
            assert our_warnings(caplog).count("the decode step is fused") == 1
            assert hf.is_fused(model) and str(hf.is_fused(model)).startswith("the decode step")
        monkeypatch.delenv("FLASHSAMPLING_CPU")
        for cached in (False, True):
            model = fresh_model()
            caplog.clear()
            counters.clear()
            generate(model)
            assert bool(counters["inductor"]["fxgraph_cache_hit"]) == cached
            warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
            assert len(warnings) == 1 and "not fused: on cpu" in warnings[0]
            assert not hf.is_fused(model) and "FLASHSAMPLING_CPU=1" in hf.is_fused(model).reason


def test_beam_search_runs_generates_own(model, caplog):
    prompt = torch.randint(0, VOCAB, (1, 5))
    settings = dict(num_beams=2, max_new_tokens=3, pad_token_id=0)
    expected = _stock(model, prompt, **settings)
    with caplog.at_level("WARNING", logger="flashsampling_inductor"):
        got = model.generate(prompt, **settings)
        custom = model.generate(prompt, custom_generate=hf.fused_generate, **settings)
    assert our_warnings(caplog).count("beam_search is not fused") == 1
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    torch.testing.assert_close(custom, expected, rtol=0, atol=0)


def test_another_transformers_version_runs_its_own_loop(model, caplog, monkeypatch):
    monkeypatch.setattr(hf, "_transformers_version", lambda: "6.0.0")
    prompt = torch.randint(0, VOCAB, (2, 5))
    settings = dict(do_sample=True, max_new_tokens=3, pad_token_id=0)
    torch.manual_seed(3)
    expected = _stock(model, prompt, **settings)
    torch.manual_seed(3)
    with caplog.at_level("WARNING", logger="flashsampling_inductor"):
        got = model.generate(prompt, **settings)
    assert "transformers 6.0.0 is not supported" in our_warnings(caplog)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.gpu
def test_sampling_on_cuda():
    """A Llama on the GPU at a real vocabulary size, decode steps under CUDA graphs: the step
    is rewritten and the decode step's token follows generate's distribution. fp32, so that
    the reference logits (cuBLAS) and the fused kernel's agree far below what the chi-square
    can see."""
    vocab = 32_000
    config = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    torch.manual_seed(0)
    model = hf.enable(transformers.LlamaForCausalLM(config).to("cuda").eval())
    with torch.no_grad():
        # Logits with a spread of ~2: the likeliest tokens get 0.5-1.5% of the draws each.
        model.lm_head.weight.mul_(6)
    prompt = torch.randint(0, vocab, (1, 6), device="cuda")
    probs = _token_probs(model, prompt, 0.8, 0, 1.0, None)[1]
    counters.clear()
    out = model.generate(
        prompt.expand(16_384, 6), do_sample=True, temperature=0.8, top_k=0, max_new_tokens=2
    )
    assert rewrites() >= 1
    assert probs.max() < 0.05  # the cells of the test are not one token's
    draws = out[:, 7].cpu()
    counts = torch.bincount(draws, minlength=vocab).double().numpy()
    expected = (probs.cpu() * len(draws)).numpy()
    busy = expected >= 5  # the other tokens pooled into one cell
    observed = np.append(counts[busy], counts[~busy].sum())
    assert stats.chisquare(observed, np.append(expected[busy], expected[~busy].sum())).pvalue > 1e-4


def test_a_vocabulary_sharded_head_keeps_top_k_a_python_int():
    """Under a tp_plan (the LM head's weight a DTensor sharded by vocabulary rows) the fused
    step's top-k stays a Python int: tensor-parallel sampling sends k scores a row, a size
    the graph must hold (benchmarks/hf_tp.py runs such a model)."""
    from types import SimpleNamespace

    from torch.distributed.tensor import Replicate, Shard

    def model_with(placements):
        head = SimpleNamespace(weight=SimpleNamespace(placements=placements))
        return SimpleNamespace(get_output_embeddings=lambda: head)

    assert hf._vocabulary_sharded(model_with((Shard(0),)))
    assert not hf._vocabulary_sharded(model_with((Replicate(),)))
    assert not hf._vocabulary_sharded(model_with((Shard(1),)))
    assert not hf._vocabulary_sharded(SimpleNamespace(get_output_embeddings=lambda: None))
    sampling = hf._Sampling(temperature=0.7, top_k=50, top_p=0.9)
    cpu = torch.device("cpu")
    assert sampling.as_tensors(cpu, python_top_k=True)["top_k"] == 50
    assert isinstance(sampling.as_tensors(cpu, python_top_k=True)["top_k"], int)
    assert isinstance(sampling.as_tensors(cpu)["top_k"], torch.Tensor)
    assert hf._Sampling(temperature=0.7).as_tensors(cpu, python_top_k=True)["top_k"] is None
