"""A minimal gpt-fast-style decoder over a Hugging Face Llama / Qwen3's weights.

What gpt-fast does, and nothing more: a static KV cache (module buffers, so CUDA graphs see
fixed addresses), one decode step compiled with ``mode="reduce-overhead"`` and fullgraph,
gpt-fast's own sampling (the exponential race ``argmax(probs / Exp(1))``, no host sync).
bench_generate.py times the step under stock Inductor and ``backend="flashsampling"``, and a
step that returns the logits without sampling (sampling's share of the step). The weights
are the Hugging Face model's own tensors (no copy), so both loops run the same model.

A module, not a measurement: ``python benchmarks/gpt_fast_decoder.py --help`` prints this and
exits; bench_generate.py and profile_generate.py import it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _rms_norm(x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), norm.weight, norm.variance_epsilon)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x * cos + rotated * sin).to(x.dtype)


class Decoder(nn.Module):
    """Decoder-only transformer over ``hf_model``'s layers: [B, L] tokens at positions
    ``input_pos`` [L] -> last-position logits [B, V]. KV caches for up to ``max_batch`` rows
    and ``max_len`` positions."""

    def __init__(self, hf_model, max_batch: int, max_len: int) -> None:
        super().__init__()
        config = hf_model.config
        self.hf = hf_model  # the weights, not its forward
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        device, dtype = hf_model.device, hf_model.dtype
        cache = (max_batch, self.kv_heads, max_len, self.head_dim)
        for index in range(config.num_hidden_layers):
            self.register_buffer(f"k{index}", torch.zeros(cache, device=device, dtype=dtype))
            self.register_buffer(f"v{index}", torch.zeros(cache, device=device, dtype=dtype))
        theta = (getattr(config, "rope_parameters", None) or {}).get("rope_theta", 1e6)
        exponents = torch.arange(0, self.head_dim, 2, device=device) / self.head_dim
        inverse = 1.0 / theta**exponents
        angles = torch.outer(torch.arange(max_len, device=device), inverse)
        self.register_buffer("cos", torch.cat([angles.cos(), angles.cos()], -1).to(dtype))
        self.register_buffer("sin", torch.cat([angles.sin(), angles.sin()], -1).to(dtype))
        causal = torch.ones(max_len, max_len, dtype=torch.bool, device=device).tril()
        self.register_buffer("causal", causal)

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        batch, length = tokens.shape
        inner = self.hf.model
        x = inner.embed_tokens(tokens)
        cos, sin = self.cos[input_pos], self.sin[input_pos]
        mask = self.causal[input_pos][None, None]
        for index, layer in enumerate(inner.layers):
            attn = layer.self_attn
            h = _rms_norm(x, layer.input_layernorm)
            q = attn.q_proj(h).view(batch, length, self.heads, self.head_dim)
            k = attn.k_proj(h).view(batch, length, self.kv_heads, self.head_dim)
            v = attn.v_proj(h).view(batch, length, self.kv_heads, self.head_dim)
            if hasattr(attn, "q_norm"):  # Qwen3
                q, k = _rms_norm(q, attn.q_norm), _rms_norm(k, attn.k_norm)
            q = _rotate(q.transpose(1, 2), cos, sin)
            k = _rotate(k.transpose(1, 2), cos, sin)
            k_cache = getattr(self, f"k{index}")[:batch]
            v_cache = getattr(self, f"v{index}")[:batch]
            k_cache.index_copy_(2, input_pos, k)
            v_cache.index_copy_(2, input_pos, v.transpose(1, 2))
            y = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask, enable_gqa=True)
            x = x + attn.o_proj(y.transpose(1, 2).reshape(batch, length, -1))
            h = _rms_norm(x, layer.post_attention_layernorm)
            mlp = layer.mlp
            x = x + mlp.down_proj(F.silu(mlp.gate_proj(h)) * mlp.up_proj(h))
        return self.hf.lm_head(_rms_norm(x[:, -1], inner.norm))


def sample_step(decoder: Decoder, tokens, input_pos, temperature: float) -> torch.Tensor:
    """gpt-fast's decode step: logits -> softmax(logits / T) -> argmax(probs / Exp(1))."""
    probs = torch.softmax(decoder(tokens, input_pos).float() / temperature, dim=-1)
    noise = torch.empty_like(probs).exponential_(1)
    return torch.argmax(probs / noise, dim=-1, keepdim=True)


def logits_step(decoder: Decoder, tokens, input_pos, temperature: float) -> torch.Tensor:
    """The same step returning the logits: what is left when sampling costs nothing."""
    return decoder(tokens, input_pos)


def compile_step(step, backend: str):
    """As gpt-fast compiles its decode step (reduce-overhead, fullgraph); dynamic, so that
    one compile serves every batch size (CUDA graphs are recorded per size)."""
    return torch.compile(
        step, backend=backend, mode="reduce-overhead", fullgraph=True, dynamic=True
    )


@torch.no_grad()
def generate(decoder: Decoder, step, prompt: torch.Tensor, new_tokens: int, temperature=0.7):
    """Prefill eagerly, then ``new_tokens`` decode steps. -> [B, new_tokens] tokens."""
    length = prompt.shape[1]
    positions = torch.arange(length, device=prompt.device)
    token = sample_step(decoder, prompt, positions, temperature)
    drawn, input_pos = [token], positions[-1:] + 1
    for _ in range(new_tokens - 1):
        torch.compiler.cudagraph_mark_step_begin()
        out = step(decoder, token, input_pos, temperature)
        if out.dtype == torch.int64:  # the logits-only step feeds its last token back
            token = out.clone()
        drawn.append(token)
        input_pos += 1
    return torch.cat(drawn, dim=1)


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()
    print(__doc__)
