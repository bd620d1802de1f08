"""What one sampling call asks for, as one object that travels below the custom op.

The custom ops take flat arguments (their schemas are what graphs hold); their
implementations bundle them into a ``SamplingParams`` that the reference and the kernels
read, so a new option crosses the layers as one field, not as a positional argument at every
call site.
"""

from __future__ import annotations

import dataclasses

import torch

__all__ = ["SamplingParams"]


_KNOBS = ("temperature", "seed", "top_k", "top_p", "min_p")


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """The validated options of one call. Each per-row knob is a device tensor (0-d or [B])
    that overrides its scalar when given.

    temperature: fp32 (0 = greedy); seed: int64 ([B]: per-row seeds, the row index is left
    out of the noise counter); top_k: int64 (0 or >= V = off); top_p: fp32 (1.0 = off);
    min_p: fp32 (0.0 = off). softcap: a model constant, never a tensor (0.0 = off): the
    scores are ``tanh(l / softcap) * softcap`` before anything else. logprobs: None, or which
    log-probability of each drawn token the call also returns, "raw" (``log_softmax`` of the
    logits) or "processed" (of the distribution sampled: soft-capped, tempered, truncated).
    top_p_whole_row: top-p's mass measured on the whole row, not on the top-k survivors
    (SGLang's and the Gemma reference sampler's order: ``reference.truncation_threshold``).
    """

    temperature: torch.Tensor | None
    scalar_temperature: float
    seed: torch.Tensor | None
    scalar_seed: int
    num_samples: int
    logits_dtype: torch.dtype | None = None
    top_k: torch.Tensor | None = None
    scalar_top_k: int = 0
    top_p: torch.Tensor | None = None
    scalar_top_p: float = 1.0
    min_p: torch.Tensor | None = None
    scalar_min_p: float = 0.0
    softcap: float = 0.0
    logprobs: str | None = None
    top_p_whole_row: bool = False

    @property
    def truncates(self) -> bool:
        """True when some row may be truncated by top-k, top-p or min-p (decided without reading
        any tensor: a per-row tensor may truncate). A scalar temperature of 0 is greedy for
        every row, and no truncation moves an argmax."""
        if self.temperature is None and self.scalar_temperature == 0.0:
            return False
        return (
            self.top_k is not None
            or self.scalar_top_k > 0
            or self.top_p is not None
            or self.scalar_top_p < 1.0
            or self.min_p is not None
            or self.scalar_min_p > 0.0
        )

    def knobs(self) -> tuple[torch.Tensor | None, ...]:
        """The per-row knob fields (tensors or None), in ``with_knobs``' order."""
        return tuple(getattr(self, name) for name in _KNOBS)

    def with_knobs(self, *knobs: torch.Tensor | None) -> SamplingParams:
        """These options with other tensors in the knob fields."""
        return dataclasses.replace(self, **dict(zip(_KNOBS, knobs, strict=True)))

    def scalars(self) -> tuple:
        """Every other field (numbers, a dtype, a string: hashable)."""
        return tuple(
            getattr(self, field.name)
            for field in dataclasses.fields(self)
            if field.name not in _KNOBS
        )

    @property
    def per_row_seed(self) -> bool:
        return self.seed is not None and self.seed.dim() == 1

    def rows(self, batch: int, device: torch.device) -> RowParams:
        """Every knob as a [B] tensor on ``device`` (the reference's form)."""

        def per_row(tensor, scalar, dtype):
            if tensor is None:
                return torch.full((batch,), scalar, dtype=dtype, device=device)
            return tensor.to(dtype).expand(batch)

        return RowParams(
            temperature=per_row(self.temperature, self.scalar_temperature, torch.float32),
            seed=per_row(self.seed, self.scalar_seed, torch.int64),
            top_k=per_row(self.top_k, self.scalar_top_k, torch.int64),
            top_p=per_row(self.top_p, self.scalar_top_p, torch.float32),
            min_p=per_row(self.min_p, self.scalar_min_p, torch.float32),
        )


@dataclasses.dataclass(frozen=True)
class RowParams:
    """Every per-row knob as a [B] tensor: temperature fp32, seed / top_k int64, top_p and
    min_p fp32."""

    temperature: torch.Tensor
    seed: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor
