"""transformers' continuous batching (``generate_batch``, the manager) after
``flashsampling_inductor.hf.enable(model)``: the step is rewritten with no warning, the drawn
tokens follow the engine's own per-request warpers with several settings in one batch, greedy
rows (temperature 0) and a greedy manager give stock ``generate_batch``'s tokens, new
settings never recompile, logprobs are the engine's, and what cannot be drawn runs
transformers' own step with one warning. A tiny random Llama on the CPU (skipped without
transformers 5.17+)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch._dynamo.utils import counters

transformers = pytest.importorskip("transformers", minversion="5.17")
from transformers import ContinuousBatchingConfig, GenerationConfig  # noqa: E402
from transformers.generation.continuous_batching import (  # noqa: E402
    cb_logits_processors as cb_warpers,
)
from transformers.generation.logits_process import (  # noqa: E402
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from flashsampling_inductor import hf  # noqa: E402

from .catalog_checks import chi_square_p  # noqa: E402
from .hf_models import (  # noqa: E402, F401  (the fixtures: the pass runs, warnings anew)
    fresh_warnings,
    our_warnings,
    rewrites,
    run_the_pass,
    stock,
    tiny_model,
    token_probs,
)

PROMPT = [3, 14, 15, 9]
# The manager's generation config: its warpers are the per-request ones each request sets.
SAMPLING = dict(do_sample=True, temperature=0.7, top_k=5, top_p=0.9)
# Three kinds of request in one batch: plain top-k, Qwen3-like settings, greedy.
GROUPS = (
    dict(temperature=0.7, top_k=5, top_p=1.0),
    dict(temperature=0.6, top_k=20, top_p=0.9),
    dict(temperature=0.0),
)


@pytest.fixture(scope="module")
def model():
    return hf.enable(tiny_model("llama", layers=1))


def _generation_config(**settings) -> GenerationConfig:
    return GenerationConfig(
        **{"eos_token_id": -1, "pad_token_id": 0, "max_new_tokens": 2, **settings}
    )


def _batching_config(**settings) -> ContinuousBatchingConfig:
    # page_size in newer transformers (5.24), block_size in 5.17
    fields = {field.name for field in dataclasses.fields(ContinuousBatchingConfig)}
    return ContinuousBatchingConfig(
        **{"page_size" if "page_size" in fields else "block_size": 16},
        num_blocks=512,
        max_batch_tokens=1024,
        per_request_processors=True,
        allow_block_sharing=False,
        seed=0,
        **settings,
    )


def _serve(model, requests, generation_config, **batching) -> list[list[int]]:
    """Each (prompt, settings) request through one manager -> its new tokens, in order."""
    results = _serve_results(model, requests, generation_config, **batching)
    return [result.generated_tokens for result in results]


def _serve_results(model, requests, generation_config, **batching) -> list:
    """Each (prompt, settings) request through one manager -> its GenerationOutput, in order."""
    with model.continuous_batching_context_manager(
        generation_config=generation_config,
        continuous_batching_config=_batching_config(**batching),
        timeout=10,
    ) as manager:
        ids = [manager.add_request(prompt, **settings) for prompt, settings in requests]
        done = {}
        while len(done) < len(ids):
            result = manager.get_result(timeout=1)  # the first step compiles: minutes
            if result is None:
                assert manager.is_running(), "the generation thread stopped"
            elif result.is_finished():
                done[result.request_id] = result
    return [done[request_id] for request_id in ids]


def _stock(model, *args, **kwargs):
    with stock(model):
        return _serve(model, *args, **kwargs)


def _engine_probs(logits: torch.Tensor, temperature, top_k, top_p) -> torch.Tensor:
    """The engine's own per-request warpers on [N, V] logits -> float64 probabilities."""
    rows = logits.shape[0]
    scores = logits.float() / temperature
    top_k_warper = cb_warpers.ContinuousBatchingTopKLogitsWarper(TopKLogitsWarper(top_k))
    scores = top_k_warper(scores, torch.full((rows,), top_k, dtype=torch.int32))
    top_p_warper = cb_warpers.ContinuousBatchingTopPLogitsWarper(TopPLogitsWarper(0.5))
    scores = top_p_warper(scores, torch.full((rows,), top_p).view(torch.int32))
    return torch.softmax(scores.double(), dim=-1)


def _token_probs(model, settings) -> tuple[torch.Tensor, torch.Tensor]:
    """-> the distributions [V] of the first and second new token after PROMPT (no eos)."""
    return token_probs(
        model, torch.tensor([PROMPT]), lambda logits: _engine_probs(logits, **settings)
    )


def test_requests_with_mixed_settings_are_drawn_fused(model, caplog):
    """One batch of plain top-k, Qwen3-like and greedy requests: the step is rewritten with no
    warning, each sampled group's first and second tokens pass a chi-square against the
    engine's warpers, and the greedy rows are stock greedy generate_batch's tokens. Then new
    settings on the same manager shape never recompile."""
    per_group = 800
    requests = [(PROMPT, settings) for settings in GROUPS[:2] for _ in range(per_group)]
    greedy_prompts = [PROMPT, [1, 2], [7, 7, 7, 30, 2], [40]]
    requests += [(prompt, GROUPS[2]) for prompt in greedy_prompts]
    counters.clear()
    with caplog.at_level("WARNING", logger="flashsampling_inductor"):
        tokens = _serve(model, requests, _generation_config(**SAMPLING))
    assert rewrites() >= 1, "the step was not rewritten"
    assert not our_warnings(caplog)
    assert hf.is_fused(model), hf.is_fused(model)
    drawn = torch.tensor(tokens[: 2 * per_group])
    for group, settings in enumerate(GROUPS[:2]):
        rows = drawn[group * per_group : (group + 1) * per_group]
        for position, probs in enumerate(_token_probs(model, settings)):
            assert chi_square_p(rows[:, position], probs) > 1e-4, f"{settings}, token {position}"
    greedy = _stock(model, [(p, {}) for p in greedy_prompts], _generation_config(do_sample=False))
    assert tokens[2 * per_group :] == greedy

    # The same batch shapes with every request's settings changed: no new graph.
    graphs = counters["stats"]["unique_graphs"]
    changed = (dict(temperature=1.3, top_k=3, top_p=0.5), dict(temperature=0.0), GROUPS[1])
    requests = [(prompt, changed[i % 3]) for i, (prompt, _) in enumerate(requests)]
    _serve(model, requests, _generation_config(**SAMPLING))
    assert counters["stats"]["unique_graphs"] == graphs


def test_a_greedy_manager_equals_stock(model, caplog):
    prompts = [[5, 6, 7], [1], [9, 8, 7, 6, 5, 4], [30, 31]]
    config = _generation_config(do_sample=False, max_new_tokens=4)
    expected = _stock(model, [(p, {}) for p in prompts], config)
    counters.clear()
    with caplog.at_level("WARNING", logger="flashsampling_inductor"):
        got = _serve(model, [(p, {}) for p in prompts], config)
    assert rewrites() >= 1 and not our_warnings(caplog)
    assert got == expected


def test_what_is_not_fused_runs_transformers_step(model, caplog):
    """A warper the op does not draw (typical-p): transformers' own step, its own tokens, one
    warning."""
    requests = [([1, 2, 3], {}), ([4, 5], {})]
    config = _generation_config(typical_p=0.9, **SAMPLING)
    expected = _stock(model, requests, config)
    counters.clear()
    with caplog.at_level("WARNING", logger="flashsampling_inductor"):
        for _ in range(2):
            got = _serve(model, requests, config)
    assert not counters["flashsampling"]
    assert our_warnings(caplog).count("TypicalLogitsWarper") == 1
    assert got == expected
    assert "TypicalLogitsWarper" in hf.is_fused(model).reason


def test_logprobs_are_the_engines(model, caplog):
    """return_logprobs: each token's log-probability under the engine's own warped
    distribution (0 for a greedy row), from the one fused call, with no warning."""
    requests = [(PROMPT, dict(settings, max_new_tokens=1)) for settings in GROUPS for _ in range(4)]
    counters.clear()
    with caplog.at_level("WARNING", logger="flashsampling_inductor"):
        results = _serve_results(
            model, requests, _generation_config(**SAMPLING), return_logprobs=True
        )
    assert not our_warnings(caplog)
    assert counters["flashsampling"]["sample_logits"] >= 1
    logits = model(torch.tensor([PROMPT])).logits[:, -1].detach()
    for (_, settings), result in zip(requests, results, strict=True):
        (token,), (logprob,) = result.generated_tokens, result.logprobs
        if settings["temperature"] == 0.0:
            assert token == int(logits.argmax()) and logprob == 0.0
            continue
        settings = {key: value for key, value in settings.items() if key != "max_new_tokens"}
        expected = _engine_probs(logits, **settings)[0, token].log().item()
        assert logprob == pytest.approx(expected, abs=1e-4)


def test_the_step_compiles_each_size_as_its_own_symbol(monkeypatch):
    """The manager pads rows and query tokens apart; with duck sizing a first step where they
    are equal would make them one symbol and the first step where they differ would compile
    every graph again. The fused step compiles (in the manager's thread, where config
    overrides must be entered) with duck sizing off."""
    from torch.fx.experimental import _config as shapes_config
    from transformers import CompileConfig

    seen = []
    monkeypatch.setattr(
        torch, "compile", lambda fn, **_: lambda *a: seen.append(shapes_config.use_duck_shape)
    )
    hf._compiled_batching_step(CompileConfig(backend="flashsampling"))()
    assert seen == [False] and shapes_config.use_duck_shape
