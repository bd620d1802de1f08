"""What the real-size GPU tests share: Qwen3's vocabulary on the GPU, knobs that cycle over
the rows, the temperature rows with greedy rows among them, and a bias with masked tokens."""

from __future__ import annotations

import torch

VOCAB = 151936  # Qwen3's
CUDA = torch.device("cuda")


def per_row(values: list, batch: int) -> torch.Tensor:
    """``values`` cycled over ``batch`` rows, on the GPU."""
    return torch.tensor(values, device=CUDA).repeat(batch)[:batch]


def temperature_rows(batch: int) -> torch.Tensor:
    """[B] in 0.5 .. 1.5, every fourth row greedy (0)."""
    temperature = torch.linspace(0.5, 1.5, batch, device=CUDA)
    temperature[::4] = 0.0
    return temperature


def masked_bias() -> torch.Tensor:
    """[V] random, every third token masked (-inf)."""
    bias = torch.randn(VOCAB, device=CUDA)
    bias[::3] = float("-inf")
    return bias
