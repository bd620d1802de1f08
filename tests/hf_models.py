"""What the transformers tests share: the tiny random models, generate's distributions of the
first two new tokens, and the checks on what the pass did and said. Importers skip first
without transformers 5.17+ (``pytest.importorskip``)."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch._dynamo.utils import counters

from flashsampling_inductor import hf

VOCAB = 48  # small enough for a full chi-square over the vocabulary


@pytest.fixture(scope="module", autouse=True)
def run_the_pass():
    """A cached graph is the rewritten one, but the pass (and its counters) would not run."""
    with torch._inductor.config.patch(fx_graph_cache=False):
        yield


@pytest.fixture(autouse=True)
def fresh_warnings():
    hf._warned.clear()


def tiny_model(kind: str = "llama", layers: int = 2):
    """A random Llama or Qwen3 with V = VOCAB, seeded: the same weights on every call."""
    import transformers

    dims = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    if kind == "llama":
        config, cls = transformers.LlamaConfig(**dims), transformers.LlamaForCausalLM
    else:
        config, cls = transformers.Qwen3Config(head_dim=8, **dims), transformers.Qwen3ForCausalLM
    torch.manual_seed(0)
    model = cls(config).eval()
    with torch.no_grad():  # logits with a spread of a few units: every cell of a test is busy
        model.lm_head.weight.mul_(8)
    return model


@contextlib.contextmanager
def stock(model):
    """The model without the fused loop (transformers' own), enabled again after."""
    hf.disable(model)
    try:
        yield model
    finally:
        hf.enable(model)


def our_warnings(caplog) -> str:
    return "".join(r.getMessage() for r in caplog.records if r.name == "flashsampling_inductor")


def rewrites() -> int:
    return sum(counters["flashsampling"].values())


@torch.no_grad()
def token_probs(model, prompt, warp, eos=None, chunk=2048):
    """-> the distributions [V] float64 of the first and the second new token after prompt
    [1, L], ``warp`` taking [N, V] logits to the sampler's float64 probabilities (the
    second's summed over the first; a row that drew ``eos`` is padded with it)."""
    first = warp(model(prompt).logits[:, -1])[0]
    vocab = first.numel()
    second = torch.zeros_like(first)
    for start in range(0, vocab, chunk):
        tokens = torch.arange(start, min(start + chunk, vocab), device=prompt.device)
        both = torch.cat([prompt.expand(len(tokens), -1), tokens[:, None]], dim=1)
        after = warp(model(both).logits[:, -1])
        if eos is not None and start <= eos < start + chunk:
            after[eos - start] = torch.nn.functional.one_hot(torch.tensor(eos), vocab)
        second += first[tokens] @ after
    return first, second
