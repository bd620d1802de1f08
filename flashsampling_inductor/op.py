"""The public operators: ``fused_sample``, ``sample_logits`` and their custom ops.

Each validates and normalises its arguments (one normaliser for every "scalar or per-row"
knob: temperature, seed, top_k, top_p, min_p), then calls its custom op
(``torch.ops.flashsampling.fused_sample`` / ``sample_logits``), whose implementation bundles
the flat schema arguments into one ``SamplingParams`` and picks the Triton kernel or the
pure-PyTorch reference (``_use_triton``). Plain eager calls, which nothing traces, run the
implementation directly to save host time. The compiler pass (``graph_pass.py``) emits calls
of the same custom ops, so eager calls and compiled graphs share one implementation. Calls
with ``return_logprobs`` go through the variants ``fused_sample_logprobs`` /
``sample_logits_logprobs`` (one more argument, two outputs), so the plain ops' schemas, and
every graph that holds them, stay as they were.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from . import ahead, graphed, knob_check
from .params import SamplingParams
from .reference import reference_fused_sample, reference_sample_logits

__all__ = ["fused_sample", "sample_logits"]

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
IMPLS = ("auto", "triton", "torch")
_INT64_MIN, _INT64_MAX, _UINT64_MAX = -(2**63), 2**63 - 1, 2**64 - 1


def fused_sample(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    temperature: float | torch.Tensor = 1.0,
    top_k: int | torch.Tensor | None = None,
    top_p: float | torch.Tensor | None = None,
    min_p: float | torch.Tensor | None = None,
    softcap: float | None = None,
    num_samples: int = 1,
    seed: int | torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    logits_dtype: torch.dtype | None = None,
    impl: str = "auto",
    return_logprobs: str | None = None,
    top_p_whole_row: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Sample token ids from ``softmax((hidden @ weight.T + bias) / temperature)``, optionally
    soft-capped first and truncated by top-k, then top-p, then min-p (the order of
    transformers' warpers).

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
        top_k: None, an int or an integer [B] tensor (one per row). Keeps the tokens whose
            score is >= the k-th largest score of the row, counting repeats: every token tied
            with the k-th value stays (``scores < topk(scores, k)[..., -1, None]`` is what is
            removed), and a row with fewer than k finite scores keeps them all. None, 0 (per
            row too) or k >= V is off. Tensors are checked (k >= 0) like temperature tensors.
        top_p: None, a float in (0, 1] or a floating [B] tensor. Applied after top-k to
            ``softmax(scores / T)`` over the top-k survivors (over the whole row without
            top-k): a survivor is kept iff the mass of the survivors with a strictly larger
            score is < p (the token that crosses p, and its ties, stay). None or 1.0 is off;
            greedy rows are not truncated (their argmax is always kept).
        min_p: None, a float in [0, 1] or a floating [B] tensor. Applied after top-p: a
            survivor is kept iff its ``softmax(scores / T)`` is >= min_p times the row's
            largest, i.e. ``score >= max + T * log(min_p)`` (transformers'
            ``MinPLogitsWarper``). None or 0 is off; greedy rows are not truncated.
        softcap: None or a finite float c > 0 (a model constant, Gemma 2's
            ``final_logit_softcapping``): the scores become ``tanh(l / c) * c`` in fp32
            before the temperature and any truncation, as the model computes them (a -inf
            bias entry then scores -c, as ``torch.tanh`` gives).
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
        return_logprobs: None, "raw" or "processed": also return each drawn token's
            log-probability, computed in the same pass (per-tile log-sum-exp; no [B, V]
            tensor). "raw": ``log_softmax(logits)[token]`` of the logits after the bias and
            ``logits_dtype``, before soft-cap and temperature (vLLM's default). "processed":
            under the distribution sampled, ``log_softmax(scores / T)`` over the tokens
            top-k / top-p / min-p keep (scores soft-capped); 0.0 on greedy rows (T = 0:
            the argmax is drawn with probability 1).
        top_p_whole_row: False (default): top-p's mass is that of the top-k survivors, as
            transformers' and vLLM's samplers measure it. True: of the whole row, as SGLang's
            torch-native sampler and the Gemma reference sampler do (their nucleus cut on
            the whole row's sorted probabilities, next to a cut at rank k): a survivor is
            kept iff the whole row's mass above it is < p. The same without top-k.

    Returns:
        [B, num_samples] int64 token ids in [0, V). A NaN score counts as -inf; a row whose
        scores are all -inf or NaN returns token 0, as ``torch.argmax`` would. With
        ``return_logprobs``, the tuple (token ids, [B, num_samples] fp32 log-probabilities);
        a row with nothing finite has NaN ones, as ``log_softmax`` gives.
    """
    _check_tensors(hidden, weight, bias)
    if logits_dtype is not None and logits_dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"logits_dtype must be None, bf16, fp16 or fp32, got {logits_dtype}")
    _check_logprobs(return_logprobs)
    _check_whole_row(top_p_whole_row)
    knobs = _normalize_call(
        hidden, temperature, top_k, top_p, min_p, softcap, num_samples, seed, generator, impl,
        check_beside=impl != "torch",  # (CUDA knob tensors: the fused kernels)
    )  # fmt: skip
    if knobs is None:
        return _empty_result(hidden, num_samples, return_logprobs)
    temperature, seed, top_k, top_p, min_p, softcap, checked = knobs
    args = (
        hidden, weight, bias, *temperature, *seed, num_samples, logits_dtype, impl,
        *top_k, *top_p, *min_p, softcap,
    )  # fmt: skip
    tensors = (temperature[0], seed[0], top_k[0], top_p[0], min_p[0])
    whole_row = {"top_p_whole_row": True} if top_p_whole_row else {}
    with checked:
        if _plain_eager_call(hidden, weight, bias, *tensors):
            # The dispatcher's custom-op layers cost more host time per call than both kernel
            # launches together (benchmarks/results/stagger_and_host_h200_20261121.txt); plain
            # eager tensors need none of them, so they go straight to the implementation.
            if return_logprobs is None:
                return _fused_sample_impl(*args, **whole_row)
            return _fused_sample_logprobs_impl(*args, return_logprobs, **whole_row)
        if return_logprobs is None:
            return torch.ops.flashsampling.fused_sample(*args, **whole_row)
        return torch.ops.flashsampling.fused_sample_logprobs(*args, return_logprobs, **whole_row)


def sample_logits(
    logits: torch.Tensor,
    *,
    temperature: float | torch.Tensor = 1.0,
    top_k: int | torch.Tensor | None = None,
    top_p: float | torch.Tensor | None = None,
    min_p: float | torch.Tensor | None = None,
    softcap: float | None = None,
    num_samples: int = 1,
    seed: int | torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    impl: str = "auto",
    return_logprobs: str | None = None,
    top_p_whole_row: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Sample token ids from logits that are already materialized, as ``fused_sample`` does.

    Draws exactly the tokens ``fused_sample`` draws on the same seed when ``logits`` equals
    its ``hidden @ weight.T (+ bias)``: the same truncation, the same noise keyed on the
    global vocabulary index. For samplers that receive logits from elsewhere (a logits
    processor, a model that returns them).

    Args:
        logits: [B, V] bf16/fp16/fp32, scored in fp32; NaN counts as -inf and -inf entries
            are never drawn.
        temperature, top_k, top_p, min_p, softcap, num_samples, seed, generator,
            return_logprobs, top_p_whole_row: as in ``fused_sample`` ("raw": of ``logits``
            as given).
        impl: "triton", "torch" or "auto", as in ``fused_sample``.

    Returns:
        [B, num_samples] int64 token ids in [0, V); with ``return_logprobs`` the tuple
        (token ids, [B, num_samples] fp32 log-probabilities).
    """
    _check_logits(logits)
    _check_logprobs(return_logprobs)
    return _sample_logits(
        logits, temperature, top_k, top_p, min_p, softcap, num_samples, seed, generator, impl,
        return_logprobs, wait_for_kernels=True, top_p_whole_row=top_p_whole_row,
    )  # fmt: skip


def sample_logits_without_waiting(
    logits: torch.Tensor,
    *,
    temperature: float | torch.Tensor = 1.0,
    top_k: int | torch.Tensor | None = None,
    top_p: float | torch.Tensor | None = None,
    min_p: float | torch.Tensor | None = None,
    softcap: float | None = None,
    num_samples: int = 1,
    seed: int | torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    return_logprobs: str | None = None,
    top_p_whole_row: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``sample_logits`` (impl "auto") that never waits for compiles: on CUDA, while the
    kernels of its kind of call (shapes, dtypes, which knobs are tensors) are not compiled,
    it draws on the PyTorch reference and starts their compile in the background
    (``ahead.compiled``); once they are, on them. The same tokens either way (the
    reference is their contract). For a call made once per ``generate`` (hf.py's prompt
    token), where the kernels' first compile (2.5-7 s on an H200) would add to the first
    call, and the reference costs 0.5-13 ms a call (1-256 rows, V = 151936)."""
    _check_logits(logits)
    _check_logprobs(return_logprobs)
    return _sample_logits(
        logits, temperature, top_k, top_p, min_p, softcap, num_samples, seed, generator, "auto",
        return_logprobs, wait_for_kernels=False, top_p_whole_row=top_p_whole_row,
    )  # fmt: skip


def _check_logits(logits) -> None:
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    if logits.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"logits must be bf16, fp16 or fp32, got {logits.dtype}")
    if logits.dim() != 2:
        raise ValueError(f"logits must be 2-D [B, V], got shape {tuple(logits.shape)}")
    if logits.shape[1] == 0:
        raise ValueError("logits has V = 0 columns: there is no token to sample")


def _sample_logits(
    logits, temperature, top_k, top_p, min_p, softcap, num_samples, seed, generator, impl,
    return_logprobs, wait_for_kernels, top_p_whole_row=False,
):  # fmt: skip
    """``sample_logits`` past its checks of ``logits``; without ``wait_for_kernels`` as
    ``sample_logits_without_waiting`` says."""
    _check_whole_row(top_p_whole_row)
    whole_row = {"top_p_whole_row": True} if top_p_whole_row else {}
    knobs = _normalize_call(
        logits, temperature, top_k, top_p, min_p, softcap, num_samples, seed, generator, impl
    )
    if knobs is None:
        return _empty_result(logits, num_samples, return_logprobs)
    temperature, seed, top_k, top_p, min_p, softcap, checked = knobs
    args = (logits, *temperature, *seed, num_samples, *top_k, *top_p, impl, *min_p, softcap)
    with checked:
        if _plain_eager_call(logits, temperature[0], seed[0], top_k[0], top_p[0], min_p[0]):
            if (
                not wait_for_kernels
                and _use_triton(impl, logits.device, None)  # (impl "auto": on CUDA)
                and not torch.cuda.is_current_stream_capturing()
                and not ahead.compiled(
                    _sample_logits_run,
                    _sample_logits_kind(*args, return_logprobs, top_p_whole_row),
                )
            ):
                args = (*args[:10], "torch", *args[11:])  # (impl: the reference, this once)
            if return_logprobs is None:
                return _sample_logits_impl(*args, **whole_row)
            return _sample_logits_logprobs_impl(*args, return_logprobs, **whole_row)
        if return_logprobs is None:
            return torch.ops.flashsampling.sample_logits(*args, **whole_row)
        return torch.ops.flashsampling.sample_logits_logprobs(*args, return_logprobs, **whole_row)


LOGPROB_MODES = ("raw", "processed")


def _check_whole_row(top_p_whole_row) -> None:
    if not isinstance(top_p_whole_row, bool):
        raise TypeError(f"top_p_whole_row must be a bool, got {type(top_p_whole_row).__name__}")


def _check_logprobs(return_logprobs) -> None:
    if return_logprobs is not None and return_logprobs not in LOGPROB_MODES:
        raise ValueError(
            f"return_logprobs must be None, 'raw' or 'processed', got {return_logprobs!r}"
        )


def _empty_result(rows: torch.Tensor, num_samples: int, return_logprobs: str | None):
    tokens = torch.empty((0, num_samples), dtype=torch.int64, device=rows.device)
    if return_logprobs is None:
        return tokens
    return tokens, torch.empty((0, num_samples), dtype=torch.float32, device=rows.device)


def _normalize_call(
    rows, temperature, top_k, top_p, min_p, softcap, num_samples, seed, generator, impl,
    check_beside=False,
):  # fmt: skip
    """The checks both public functions share. ``rows`` is the [B, ...] tensor whose device
    and batch the knobs follow. -> None for an empty batch, else the (tensor or None, scalar)
    pairs of temperature, seed, top_k, top_p and min_p, with a seed drawn on the device if
    none was given, the softcap as a float (0.0: off) and the context in which the call's
    kernels are to run: the eager CUDA knob tensors' check (``knob_check.checking``, beside
    the kernels under capture with ``check_beside``) or none."""
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be an int >= 1, got {num_samples!r}")
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "triton" and rows.device.type == "cpu" and not _triton_interpreter_on():
        raise ValueError(
            "impl='triton' on CPU tensors needs the Triton interpreter (TRITON_INTERPRET=1)"
        )
    deferred = {}
    temperature = _to_tensor_scalar(temperature, TEMPERATURE, rows, deferred)
    top_k = _to_tensor_scalar(top_k, TOP_K, rows, deferred)
    top_p = _to_tensor_scalar(top_p, TOP_P, rows, deferred)
    min_p = _to_tensor_scalar(min_p, MIN_P, rows, deferred)
    checked = contextlib.nullcontext()
    if deferred:
        message = "; ".join(
            f"{knob.name} must be {knob.rule} in every row"
            for knob in (TEMPERATURE, TOP_K, TOP_P, MIN_P)
            if knob.name in deferred
        )
        checked = knob_check.checking(deferred, f"flashsampling: {message}", check_beside)
    softcap = _normalize_softcap(softcap)
    seed_tensor, scalar_seed = _to_tensor_scalar(seed, SEED, rows)
    if rows.shape[0] == 0:
        with checked:
            return None
    if seed is None:
        # Drawn on the device (62 random bits), so no host sync; under CUDA graph capture the
        # generator hands every replay a fresh offset, and under torch.compile Inductor draws
        # it with its own graph-safe RNG.
        seed_tensor = torch.randint(
            0, 2**62, (), dtype=torch.int64, device=rows.device, generator=generator
        )
    return temperature, (seed_tensor, scalar_seed), top_k, top_p, min_p, softcap, checked


def _normalize_softcap(softcap) -> float:
    """None -> 0.0 (off); else a finite Python number > 0 as a float. A model constant: a
    tensor would be a value the op cannot check without a sync, so it is refused."""
    if softcap is None:
        return 0.0
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
        raise TypeError(f"softcap must be a Python float or None, got {type(softcap).__name__}")
    softcap = float(softcap)
    if not (0.0 < softcap < math.inf):
        raise ValueError(f"softcap must be finite and > 0, got {softcap}")
    return softcap


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


def _on_device(value: torch.Tensor, rows: torch.Tensor, name: str) -> torch.Tensor:
    """A tensor argument on rows' device; a CPU scalar may be moved there."""
    if value.device == rows.device:
        return value
    if _is_cpu_scalar(value):
        return value.to(rows.device)
    raise ValueError(f"{name} is on {value.device}, not on the inputs' device {rows.device}")


@dataclasses.dataclass(frozen=True)
class PerRowKnob:
    """A "scalar or per-row" argument: a Python number, a 0-d tensor or a [B] tensor.

    ``valid`` maps a number or a tensor to whether (elementwise) it is allowed; it is written
    with comparisons only, so the same expression checks a Python value on the host and a
    tensor in the graph. ``off`` is the scalar that None stands for (no None when it is
    None)."""

    name: str
    python_type: type  # int or float
    tensor_dtype: torch.dtype  # what the op receives
    tensor_kind: str  # "floating", "integer" or "int64"
    rule: str  # what ``valid`` accepts, for the error messages
    valid: Callable | None
    off: float | int | None


TEMPERATURE = PerRowKnob(
    "temperature", float, torch.float32, "floating", "finite and >= 0",
    lambda t: (t >= 0) & (t < math.inf), None,
)  # fmt: skip
SEED = PerRowKnob("seed", int, torch.int64, "int64", "", None, 0)
TOP_K = PerRowKnob("top_k", int, torch.int64, "integer", "an integer >= 0", lambda k: k >= 0, 0)
TOP_P = PerRowKnob(
    "top_p", float, torch.float32, "floating", "in (0, 1]", lambda p: (p > 0) & (p <= 1), 1.0
)
MIN_P = PerRowKnob(
    "min_p", float, torch.float32, "floating", "in [0, 1]", lambda p: (p >= 0) & (p <= 1), 0.0
)


def _to_tensor_scalar(
    value, knob: PerRowKnob, rows: torch.Tensor, deferred: dict | None = None
) -> tuple[torch.Tensor | None, float | int]:
    """A knob -> (device tensor or None, scalar used when the tensor is None), as FlashInfer's
    ``_to_tensor_scalar_tuple``. Python values are checked on the host (ValueError); CPU
    tensors in eager calls too; CUDA tensors and traced ones get an assert op (no host sync).
    With ``deferred``, an eager CUDA tensor is left in it (by name) unchecked, for the
    caller to check with the call's other knobs in one kernel (``knob_check.py``)."""
    batch = rows.shape[0]
    if value is None and knob.off is not None:
        return None, knob.off
    if isinstance(value, torch.Tensor):
        if not _tensor_kind_ok(value.dtype, knob.tensor_kind):
            kind = {"floating": "a floating", "integer": "an integer", "int64": "an int64"}
            raise TypeError(
                f"{knob.name} must be {kind[knob.tensor_kind]} tensor, got {value.dtype}"
            )
        if _is_cpu_scalar(value) and rows.device.type != "cpu" and _plain_eager_call(value):
            value = value.item()  # a CPU scalar costs no device sync
        else:
            if value.shape not in ((), (batch,)):
                raise ValueError(
                    f"{knob.name} must be 0-d or [B] = ({batch},), got {tuple(value.shape)}"
                )
            value = _on_device(value, rows, knob.name)
            if (
                knob.valid is not None
                and deferred is not None
                and value.is_cuda
                and _plain_eager_call(value)
            ):
                deferred[knob.name] = value
            elif knob.valid is not None:
                valid = knob.valid(value).all()
                message = f"{knob.name} must be {knob.rule} in every row"
                if value.device.type == "cpu" and _plain_eager_call(value):
                    if not bool(valid):
                        raise ValueError(message)
                else:
                    # Reading CUDA values would sync with the host, and a tracer
                    # (torch.compile, make_fx) has no values to read; an assert op in the
                    # graph fails as loudly as torch.multinomial does on bad probabilities,
                    # when the values exist.
                    torch._assert_async(valid, message)
            return value.to(knob.tensor_dtype), knob.off or 0
    if knob.python_type is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        words = "a float"
    else:
        ok = isinstance(value, int) and not isinstance(value, bool)
        words = "an int"
    if not ok:
        none = " or None" if knob.off is not None else ""
        raise TypeError(f"{knob.name} must be {words}, a tensor{none}, got {type(value).__name__}")
    value = knob.python_type(value)
    if knob is SEED:
        if not (_INT64_MIN <= value <= _UINT64_MAX):
            raise ValueError(f"seed must fit in 64 bits, got {value}")
        # The op's schema holds a signed int64: keep the same 64 bits.
        return None, value - 2**64 if value >= 2**63 else value
    if not knob.valid(value):
        raise ValueError(f"{knob.name} must be {knob.rule}, got {value}")
    if knob is TOP_K:
        value = min(value, _INT64_MAX)  # k >= V is off; the schema holds an int64
    return None, value


def _normalize_temperature(temperature, hidden) -> tuple[torch.Tensor | None, float]:
    """temperature -> (device fp32 tensor or None, scalar) (tp.py's entry to the normaliser)."""
    return _to_tensor_scalar(temperature, TEMPERATURE, hidden)


def _normalize_seed(seed, hidden) -> tuple[torch.Tensor | None, int]:
    """seed -> (device int64 tensor or None, scalar int64 seed) (tp.py's entry)."""
    return _to_tensor_scalar(seed, SEED, hidden)


def _tensor_kind_ok(dtype: torch.dtype, kind: str) -> bool:
    if kind == "floating":
        return dtype.is_floating_point
    if kind == "int64":
        return dtype == torch.int64
    return not dtype.is_floating_point and not dtype.is_complex and dtype != torch.bool


def _schema_softcap(softcap: float) -> float:
    """The custom ops' softcap: 0.0 (off) or what ``_normalize_softcap`` accepts."""
    return 0.0 if softcap == 0.0 else _normalize_softcap(softcap)


def _use_triton(impl: str, device: torch.device, params: SamplingParams) -> bool:
    """The one implementation selector: the Triton kernels for impl="triton", and for
    impl="auto" on CUDA; the reference otherwise."""
    return impl == "triton" or (impl == "auto" and device.type == "cuda")


# Off CUDA the op runs its PyTorch reference, which is slower than what stock Inductor makes
# of the same program (1.1-15x, benchmarks/results/bench_cpu_*.log): the pass leaves
# sampling there as it is unless this variable is 1 (the tests set it, to exercise the pass).
CPU_SWITCH = "FLASHSAMPLING_CPU"


# An fp32 LM head on CUDA with TF32 off (PyTorch's default "highest" precision): the fused
# kernel's IEEE fp32 dot is far slower than cuBLAS's fp32 matmul. H200, D = 2048, V = 151936,
# CUDA graphs, fused / (matmul + softmax + multinomial, eager): B = 1 / 16 / 64 4.03 / 1.83 /
# 1.96 with TF32 off, 0.72 / 0.50 / 0.51 with it on (benchmarks/probes/fp32_weights.py,
# benchmarks/results/session20_h200_20261129/fp32_weights.log). The pass leaves such a head
# alone unless TF32 is on or this variable is 1 (the tests set it, to exercise the pass).
FP32_SWITCH = "FLASHSAMPLING_FP32"


def fp32_rewrite_switches() -> str:
    """What decides whether the pass rewrites an fp32 LM head on CUDA (for its cache key)."""
    return (
        f"tf32 {torch.backends.cuda.matmul.allow_tf32}, {FP32_SWITCH}={os.environ.get(FP32_SWITCH)}"
    )


def why_not_fused_on(device: torch.device, dtype: torch.dtype | None = None) -> str:
    """ "" where the pass rewrites sampling on ``device`` with an LM head of ``dtype`` (CUDA,
    or any device with ``FLASHSAMPLING_CPU=1``; on CUDA an fp32 head only with TF32 on or
    ``FLASHSAMPLING_FP32=1``), else why it does not."""
    if device.type != "cuda" and os.environ.get(CPU_SWITCH) != "1":
        return (
            f"on {device.type} the fused op runs its PyTorch reference, slower than stock"
            f" Inductor's code for the same program ({CPU_SWITCH}=1 rewrites it anyway)"
        )
    fp32_slow = (
        device.type == "cuda" and dtype == torch.float32
        and not torch.backends.cuda.matmul.allow_tf32 and os.environ.get(FP32_SWITCH) != "1"
    )  # fmt: skip
    if fp32_slow:
        return (
            "an fp32 LM head with TF32 off: the fused kernel's IEEE fp32 dot is slower than"
            " cuBLAS's fp32 matmul and the stock sampling after it (1.8-4x on an H200);"
            " torch.set_float32_matmul_precision('high') lets it fuse (and run 0.5-0.7x the"
            f" stock step), {FP32_SWITCH}=1 rewrites it anyway"
        )
    return ""


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
    top_k: torch.Tensor | None = None,
    scalar_top_k: int = 0,
    top_p: torch.Tensor | None = None,
    scalar_top_p: float = 1.0,
    min_p: torch.Tensor | None = None,
    scalar_min_p: float = 0.0,
    softcap: float = 0.0,
    top_p_whole_row: bool = False,
) -> torch.Tensor:
    """The custom op behind ``fused_sample``; arguments are already validated (the softcap
    is checked again: a graph may hold any float there).

    Each tensor knob (0-d or [B]) overrides its scalar when given; a [B] seed means per-row
    seeds. top_k int64 (0 or >= V: off), top_p fp32 (1.0: off), min_p fp32 (0.0: off),
    softcap a float (0.0: off).
    """
    return _fused_sample_run(
        hidden, weight, bias, temperature, scalar_temperature, seed, scalar_seed, num_samples,
        logits_dtype, impl, top_k, scalar_top_k, top_p, scalar_top_p, min_p, scalar_min_p,
        softcap, None, top_p_whole_row,
    )  # fmt: skip


def _fused_sample_logprobs_impl(
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
    top_k: torch.Tensor | None = None,
    scalar_top_k: int = 0,
    top_p: torch.Tensor | None = None,
    scalar_top_p: float = 1.0,
    min_p: torch.Tensor | None = None,
    scalar_min_p: float = 0.0,
    softcap: float = 0.0,
    logprobs: str = "raw",
    top_p_whole_row: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The custom op behind ``fused_sample(return_logprobs=...)``: ``_fused_sample_impl``'s
    arguments and ``logprobs`` ("raw" or "processed", checked again: a graph may hold any
    string); returns (tokens, log-probabilities)."""
    _check_logprobs(logprobs)
    return _fused_sample_run(
        hidden, weight, bias, temperature, scalar_temperature, seed, scalar_seed, num_samples,
        logits_dtype, impl, top_k, scalar_top_k, top_p, scalar_top_p, min_p, scalar_min_p,
        softcap, logprobs, top_p_whole_row,
    )  # fmt: skip


def _fused_sample_run(
    hidden, weight, bias, temperature, scalar_temperature, seed, scalar_seed, num_samples,
    logits_dtype, impl, top_k, scalar_top_k, top_p, scalar_top_p, min_p, scalar_min_p,
    softcap, logprobs, top_p_whole_row=False,
):  # fmt: skip
    """Both fused custom ops' implementation: tokens, or (tokens, logprobs) with
    ``logprobs``."""
    params = SamplingParams(
        temperature, scalar_temperature, seed, scalar_seed, num_samples, logits_dtype,
        top_k, scalar_top_k, top_p, scalar_top_p, min_p, scalar_min_p,
        _schema_softcap(softcap), logprobs, bool(top_p_whole_row),
    )  # fmt: skip
    if _use_triton(impl, hidden.device, params):
        from .dispatch import triton_fused_sample

        if hidden.is_cuda and ahead.MODE != "0":
            # (once per kind of call: its kernels compiled at once, in parallel)
            ahead.before_first_run(
                _fused_sample_run,
                (
                    hidden, weight, bias, temperature, scalar_temperature, seed,
                    ahead.seed_class(scalar_seed), num_samples, logits_dtype, impl, top_k,
                    scalar_top_k, top_p, scalar_top_p, min_p, scalar_min_p, softcap, logprobs,
                    top_p_whole_row,
                ),
            )  # fmt: skip

        def run(hidden, *knobs):
            return triton_fused_sample(hidden, weight, bias, params.with_knobs(*knobs))

        # (eager CUDA calls, and a compiled step without CUDA graphs, launch no kernel from
        # Python once their kind of call is captured: graphed.py; elsewhere run as is)
        return graphed.replay_or_run(
            "fused_sample", run, (hidden, *params.knobs()), (weight, bias), params.scalars()
        )
    return reference_fused_sample(hidden, weight, bias, params)


def compile_ahead_in_background(node: torch.fx.Node) -> None:
    """For the graph pass: start compiling the kernels of the fused call ``node`` (its
    arguments' ``meta["val"]`` fake tensors) in the background, if it runs the Triton
    kernels on CUDA (``ahead.py``). Never fails: at worst nothing is compiled ahead."""
    impl = _FUSED_IMPLS.get(node.target)
    if impl is None or _triton_interpreter_on():
        return
    try:
        _start_compiling(impl, node)
    except Exception as error:
        ahead.log.debug("flashsampling: not compiled ahead (%r)", error, exc_info=True)


def _start_compiling(impl: Callable, node: torch.fx.Node) -> None:
    values = torch.fx.node.map_arg((node.args, node.kwargs), lambda arg: arg.meta.get("val"))
    args = ahead.bind(impl, *values)
    if impl is _fused_sample_impl:  # (the plain op: no log-probabilities)
        args = (*args[:17], None, *args[17:])
    hidden, scalar_seed, impl_name = args[0], args[6], args[9]
    if not isinstance(hidden, torch.Tensor) or not isinstance(scalar_seed, int):
        return
    if not _use_triton(impl_name, hidden.device, None):
        return  # (and ahead.in_background compiles for CUDA only)
    args = (*args[:6], ahead.seed_class(scalar_seed), *args[7:])
    ahead.in_background(_fused_sample_run, args)


def _sample_logits_impl(
    logits: torch.Tensor,
    temperature: torch.Tensor | None,
    scalar_temperature: float,
    seed: torch.Tensor | None,
    scalar_seed: int,
    num_samples: int,
    top_k: torch.Tensor | None = None,
    scalar_top_k: int = 0,
    top_p: torch.Tensor | None = None,
    scalar_top_p: float = 1.0,
    impl: str = "auto",
    min_p: torch.Tensor | None = None,
    scalar_min_p: float = 0.0,
    softcap: float = 0.0,
    top_p_whole_row: bool = False,
) -> torch.Tensor:
    """The custom op behind ``sample_logits``; arguments as in ``_fused_sample_impl``."""
    return _sample_logits_run(
        logits, temperature, scalar_temperature, seed, scalar_seed, num_samples, top_k,
        scalar_top_k, top_p, scalar_top_p, impl, min_p, scalar_min_p, softcap, None,
        top_p_whole_row,
    )  # fmt: skip


def _sample_logits_logprobs_impl(
    logits: torch.Tensor,
    temperature: torch.Tensor | None,
    scalar_temperature: float,
    seed: torch.Tensor | None,
    scalar_seed: int,
    num_samples: int,
    top_k: torch.Tensor | None = None,
    scalar_top_k: int = 0,
    top_p: torch.Tensor | None = None,
    scalar_top_p: float = 1.0,
    impl: str = "auto",
    min_p: torch.Tensor | None = None,
    scalar_min_p: float = 0.0,
    softcap: float = 0.0,
    logprobs: str = "raw",
    top_p_whole_row: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The custom op behind ``sample_logits(return_logprobs=...)``: (tokens, logprobs)."""
    _check_logprobs(logprobs)
    return _sample_logits_run(
        logits, temperature, scalar_temperature, seed, scalar_seed, num_samples, top_k,
        scalar_top_k, top_p, scalar_top_p, impl, min_p, scalar_min_p, softcap, logprobs,
        top_p_whole_row,
    )  # fmt: skip


def _sample_logits_run(
    logits, temperature, scalar_temperature, seed, scalar_seed, num_samples, top_k,
    scalar_top_k, top_p, scalar_top_p, impl, min_p, scalar_min_p, softcap, logprobs,
    top_p_whole_row=False,
):  # fmt: skip
    params = SamplingParams(
        temperature, scalar_temperature, seed, scalar_seed, num_samples, None,
        top_k, scalar_top_k, top_p, scalar_top_p, min_p, scalar_min_p,
        _schema_softcap(softcap), logprobs, bool(top_p_whole_row),
    )  # fmt: skip
    if _use_triton(impl, logits.device, params):
        from .dispatch import triton_sample_logits

        if logits.is_cuda and ahead.MODE != "0":
            # (once per kind of call: its kernels compiled at once, in parallel)
            ahead.before_first_run(_sample_logits_run, _sample_logits_kind(
                logits, temperature, scalar_temperature, seed, scalar_seed, num_samples, top_k,
                scalar_top_k, top_p, scalar_top_p, impl, min_p, scalar_min_p, softcap, logprobs,
                top_p_whole_row,
            ))  # fmt: skip

        def run(*knobs):
            return triton_sample_logits(logits, params.with_knobs(*knobs))

        # (the logits read where they are: a loop that writes them to the same buffer at
        # each step replays one graph; another buffer is another kind of call)
        return graphed.replay_or_run(
            "sample_logits", run, params.knobs(), (logits,), params.scalars()
        )
    return reference_sample_logits(logits, params)


def _sample_logits_kind(*args) -> tuple:
    """``_sample_logits_run``'s arguments as its compile ahead keys them: the host seed by
    its class (``ahead.seed_class``), the only argument whose value the kernels do not
    specialize on."""
    return (*args[:4], ahead.seed_class(args[4]), *args[5:])


_fused_sample_op = torch.library.custom_op(
    "flashsampling::fused_sample", _fused_sample_impl, mutates_args=()
)
_sample_logits_op = torch.library.custom_op(
    "flashsampling::sample_logits", _sample_logits_impl, mutates_args=()
)


_fused_sample_logprobs_op = torch.library.custom_op(
    "flashsampling::fused_sample_logprobs", _fused_sample_logprobs_impl, mutates_args=()
)
_sample_logits_logprobs_op = torch.library.custom_op(
    "flashsampling::sample_logits_logprobs", _sample_logits_logprobs_impl, mutates_args=()
)


@_fused_sample_op.register_fake
def _(hidden, weight, bias, temperature, scalar_temperature, seed, scalar_seed, num_samples, *_):
    return hidden.new_empty((hidden.shape[0], num_samples), dtype=torch.int64)


@_sample_logits_op.register_fake
def _(logits, temperature, scalar_temperature, seed, scalar_seed, num_samples, *_):
    return logits.new_empty((logits.shape[0], num_samples), dtype=torch.int64)


@_fused_sample_logprobs_op.register_fake
def _(hidden, weight, bias, temperature, scalar_temperature, seed, scalar_seed, num_samples, *_):
    shape = (hidden.shape[0], num_samples)
    return hidden.new_empty(shape, dtype=torch.int64), hidden.new_empty(shape, dtype=torch.float32)


@_sample_logits_logprobs_op.register_fake
def _(logits, temperature, scalar_temperature, seed, scalar_seed, num_samples, *_):
    shape = (logits.shape[0], num_samples)
    return logits.new_empty(shape, dtype=torch.int64), logits.new_empty(shape, dtype=torch.float32)


_FUSED_IMPLS = {
    torch.ops.flashsampling.fused_sample.default: _fused_sample_impl,
    torch.ops.flashsampling.fused_sample_logprobs.default: _fused_sample_logprobs_impl,
}
