"""The public operator: ``fused_sample`` and its ``torch.library`` custom op.

``fused_sample`` validates and normalises its arguments, then calls the custom op
``torch.ops.flashsampling.fused_sample``, which picks the Triton kernel or the pure-PyTorch
reference (plain eager calls, which nothing traces, run the op's implementation directly to
save host time). The compiler pass (``graph_pass.py``) emits calls of the same custom op, so
eager calls and compiled graphs share one implementation.
"""

from __future__ import annotations

import os

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from .reference import reference_fused_sample

__all__ = ["fused_sample"]

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
IMPLS = ("auto", "triton", "torch")
_INT64_MIN, _UINT64_MAX = -(2**63), 2**64 - 1


def fused_sample(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    temperature: float | torch.Tensor = 1.0,
    num_samples: int = 1,
    seed: int | torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    logits_dtype: torch.dtype | None = None,
    impl: str = "auto",
) -> torch.Tensor:
    """Sample token ids from ``softmax((hidden @ weight.T + bias) / temperature)``.

    The [B, V] logits are never written to memory: each vocabulary tile is computed on chip,
    perturbed with Gumbel noise and reduced to its best (score, index); a second small stage
    picks the winner per row (Gumbel-max trick, exact for any tiling).

    Args:
        hidden: [B, D] bf16/fp16/fp32. Any strides; accumulation is fp32.
        weight: [V, D], same dtype and device as ``hidden`` (``nn.Linear`` / tied-embedding
            layout). Any strides.
        bias: optional [V] floating tensor on the same device; ``-inf`` entries are masked
            tokens that are never drawn.
        temperature: Python float, 0-d tensor or [B] tensor (one per row). 0 means greedy:
            the argmax of the row's logits, ties to the lowest index as ``torch.argmax``.
            Python floats and CPU tensors are checked (>= 0, finite) with a ValueError; CUDA
            tensors with a device-side assert (no host sync), as ``torch.multinomial`` checks
            its probabilities, and tensors a tracer sees (torch.compile, make_fx) with an
            assert op in the graph, a RuntimeError when the graph runs.
        num_samples: independent draws per row, with replacement.
        seed: int, 0-d int64 tensor or [B] int64 tensor (one per row). With a seed the
            result is deterministic and independent of tile sizes, launch grid and batch
            position (per-row seeds). Without one, a seed is drawn on the device from
            ``generator`` (or the default generator): no host sync, and safe under CUDA graph
            capture (each replay draws fresh tokens).
        generator: torch.Generator used only when ``seed`` is None.
        logits_dtype: None (default) samples from the fp32 logits. bf16/fp16 first rounds the
            logits (after the bias) to that dtype, as a model that materializes its logits in
            that dtype does; the compiler pass sets it so a rewrite keeps the program's
            distribution, and greedy rows keep its ties.
        impl: "triton" (the fused kernel; CPU tensors only under ``TRITON_INTERPRET=1``),
            "torch" (the reference) or "auto" (triton on CUDA, torch elsewhere).

    Returns:
        [B, num_samples] int64 token ids in [0, V). A NaN score counts as -inf; a row whose
        scores are all -inf or NaN returns token 0, as ``torch.argmax`` would.
    """
    _check_tensors(hidden, weight, bias)
    batch = hidden.shape[0]
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be an int >= 1, got {num_samples!r}")
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "triton" and hidden.device.type == "cpu" and not _triton_interpreter_on():
        raise ValueError(
            "impl='triton' on CPU tensors needs the Triton interpreter (TRITON_INTERPRET=1)"
        )
    if logits_dtype is not None and logits_dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"logits_dtype must be None, bf16, fp16 or fp32, got {logits_dtype}")
    temperature_tensor, scalar_temperature = _normalize_temperature(temperature, hidden)
    seed_tensor, scalar_seed = _normalize_seed(seed, hidden)
    if batch == 0:
        return torch.empty((0, num_samples), dtype=torch.int64, device=hidden.device)
    if seed is None:
        # Drawn on the device (62 random bits), so no host sync; under CUDA graph capture the
        # generator hands every replay a fresh offset, and under torch.compile Inductor draws
        # it with its own graph-safe RNG.
        seed_tensor = torch.randint(
            0, 2**62, (), dtype=torch.int64, device=hidden.device, generator=generator
        )
    args = (
        hidden,
        weight,
        bias,
        temperature_tensor,
        scalar_temperature,
        seed_tensor,
        scalar_seed,
        num_samples,
        logits_dtype,
        impl,
    )
    if _plain_eager_call(hidden, weight, bias, temperature_tensor, seed_tensor):
        # The dispatcher's custom-op layers cost more host time per call than both kernel
        # launches together (benchmarks/results/stagger_and_host_h200_20261121.txt); plain
        # eager tensors need none of them, so they go straight to the implementation.
        return _fused_sample_impl(*args)
    return torch.ops.flashsampling.fused_sample(*args)


def _triton_interpreter_on() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _check_tensors(hidden, weight, bias) -> None:
    for name, value in (("hidden", hidden), ("weight", weight)):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
        if value.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{name} must be bf16, fp16 or fp32, got {value.dtype}")
        if value.dim() != 2:
            raise ValueError(f"{name} must be 2-D, got shape {tuple(value.shape)}")
    if hidden.dtype != weight.dtype:
        raise TypeError(
            f"hidden and weight must share a dtype, got {hidden.dtype} and {weight.dtype}"
        )
    if hidden.device != weight.device:
        raise ValueError(
            f"hidden and weight must be on one device, got {hidden.device} and {weight.device}"
        )
    vocab_size, hidden_size = weight.shape
    if vocab_size == 0:
        raise ValueError("weight has V = 0 rows: there is no token to sample")
    if hidden_size == 0:
        raise ValueError("hidden and weight have D = 0: the logits are undefined")
    if hidden.shape[1] != hidden_size:
        raise ValueError(
            f"hidden is [B, D] = {tuple(hidden.shape)} but weight is [V, D] = "
            f"{tuple(weight.shape)}: D differs"
        )
    if vocab_size >= 2**31:
        raise ValueError(f"weight has V = {vocab_size} rows; at most 2**31 - 1 are supported")
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            raise TypeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}")
        if bias.shape != (vocab_size,):
            raise ValueError(f"bias must have shape [V] = ({vocab_size},), got {tuple(bias.shape)}")
        if bias.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"bias must be bf16, fp16 or fp32, got {bias.dtype}")
        if bias.device != hidden.device:
            raise ValueError(f"bias is on {bias.device} but hidden is on {hidden.device}")


def _compiling() -> bool:
    return torch.compiler.is_compiling()


def _plain_eager_call(*tensors: torch.Tensor | None) -> bool:
    """True when calling the op's implementation directly is indistinguishable from calling
    the custom op: no compiler tracing, no Python dispatch or torch-function mode (fake
    tensors, make_fx, functionalization, user modes), no functorch transform, and only plain
    tensors (a subclass such as DTensor dispatches through the op). The outputs are integer
    tokens, so autograd has nothing to record either way."""
    return (
        not _compiling()
        and _get_current_dispatch_mode() is None
        and not torch._C._is_torch_function_mode_enabled()
        and not torch._C._are_functorch_transforms_active()
        and all(t is None or type(t) is torch.Tensor for t in tensors)
    )


def _is_cpu_scalar(value: torch.Tensor) -> bool:
    return value.dim() == 0 and value.device.type == "cpu"


def _on_device(value: torch.Tensor, hidden: torch.Tensor, name: str) -> torch.Tensor:
    """A tensor argument on hidden's device; a CPU scalar may be moved there."""
    if value.device == hidden.device:
        return value
    if _is_cpu_scalar(value):
        return value.to(hidden.device)
    raise ValueError(f"{name} is on {value.device} but hidden is on {hidden.device}")


def _normalize_temperature(temperature, hidden) -> tuple[torch.Tensor | None, float]:
    """-> (device tensor or None, scalar used when the tensor is None)."""
    batch = hidden.shape[0]
    if isinstance(temperature, torch.Tensor):
        if not temperature.is_floating_point():
            raise TypeError(f"temperature must be a floating tensor, got {temperature.dtype}")
        if (
            _is_cpu_scalar(temperature)
            and hidden.device.type != "cpu"
            and _plain_eager_call(temperature)
        ):
            temperature = temperature.item()  # a CPU scalar costs no device sync
        else:
            if temperature.shape not in ((), (batch,)):
                raise ValueError(
                    f"temperature must be 0-d or [B] = ({batch},), got {tuple(temperature.shape)}"
                )
            temperature = _on_device(temperature, hidden, "temperature")
            valid = ((temperature >= 0) & temperature.isfinite()).all()
            if temperature.device.type == "cpu" and _plain_eager_call(temperature):
                if not bool(valid):
                    raise ValueError("temperature must be finite and >= 0 in every row")
            else:
                # Reading CUDA values would sync with the host, and a tracer (torch.compile,
                # make_fx) has no values to read; an assert op in the graph fails as loudly as
                # torch.multinomial does on bad probabilities, when the values exist.
                torch._assert_async(valid, "temperature must be finite and >= 0 in every row")
            return temperature.float(), 1.0
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise TypeError(
            f"temperature must be a float or a tensor, got {type(temperature).__name__}"
        )
    temperature = float(temperature)
    if not (0.0 <= temperature < float("inf")):
        raise ValueError(f"temperature must be finite and >= 0, got {temperature}")
    return None, temperature


def _normalize_seed(seed, hidden) -> tuple[torch.Tensor | None, int]:
    """-> (device int64 tensor or None, scalar int64 seed used when the tensor is None)."""
    batch = hidden.shape[0]
    if seed is None:
        return None, 0
    if isinstance(seed, torch.Tensor):
        if seed.dtype != torch.int64:
            raise TypeError(f"seed must be an int64 tensor, got {seed.dtype}")
        if _is_cpu_scalar(seed) and hidden.device.type != "cpu" and _plain_eager_call(seed):
            seed = seed.item()  # a CPU scalar costs no device sync
        else:
            if seed.shape not in ((), (batch,)):
                raise ValueError(f"seed must be 0-d or [B] = ({batch},), got {tuple(seed.shape)}")
            return _on_device(seed, hidden, "seed"), 0
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, an int64 tensor or None, got {type(seed).__name__}")
    if not (_INT64_MIN <= seed <= _UINT64_MAX):
        raise ValueError(f"seed must fit in 64 bits, got {seed}")
    # The op's schema holds a signed int64: keep the same 64 bits.
    return None, seed - 2**64 if seed >= 2**63 else seed


def _fused_sample_impl(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    temperature: torch.Tensor | None,
    scalar_temperature: float,
    seed: torch.Tensor | None,
    scalar_seed: int,
    num_samples: int,
    logits_dtype: torch.dtype | None,
    impl: str,
) -> torch.Tensor:
    """The custom op behind ``fused_sample``; arguments are already validated.

    ``temperature`` (0-d or [B] fp32) overrides ``scalar_temperature`` and ``seed``
    (0-d or [B] int64) overrides ``scalar_seed`` when given. A [B] seed means per-row seeds.
    """
    use_triton = impl == "triton" or (impl == "auto" and hidden.device.type == "cuda")
    if use_triton:
        from .sampling_kernel import triton_fused_sample

        return triton_fused_sample(
            hidden,
            weight,
            bias,
            temperature,
            scalar_temperature,
            seed,
            scalar_seed,
            num_samples,
            logits_dtype,
        )
    batch = hidden.shape[0]
    if temperature is None:
        temperature = torch.full((batch,), scalar_temperature, device=hidden.device)
    per_row_seed = seed is not None and seed.dim() == 1
    if seed is None:
        seed = torch.tensor(scalar_seed, dtype=torch.int64, device=hidden.device)
    return reference_fused_sample(
        hidden,
        weight,
        bias,
        temperature.float().expand(batch),
        seed.expand(batch),
        per_row_seed,
        num_samples,
        logits_dtype,
    )


_fused_sample_op = torch.library.custom_op(
    "flashsampling::fused_sample", _fused_sample_impl, mutates_args=()
)


@_fused_sample_op.register_fake
def _(hidden, weight, bias, temperature, scalar_temperature, seed, scalar_seed, num_samples, *_):
    return hidden.new_empty((hidden.shape[0], num_samples), dtype=torch.int64)
