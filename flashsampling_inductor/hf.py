"""FlashSampling inside Hugging Face ``model.generate`` (transformers >= 5.17).

``generate`` runs the model's forward and the token choice in different places (the choice
after the logits processors, outside anything compiled), so no graph holds an LM head and its
sampling. Here the decode step is transformers' own fast path, a static cache and the
forward compiled with CUDA graphs (``mode="reduce-overhead"``), with the token choice inside
the same graph: ``sample_logits`` on the last position's logits, with the temperature, top-k,
top-p and min-p as device tensors, a knob that is off at its off value and greedy as
temperature 0 (neither new values nor settings turned on or off recompile). The step is
compiled with ``backend="flashsampling"``, whose pass turns the LM-head matmul and
``sample_logits`` into one fused call, so the step's logits are never written. The prompt
(prefill) runs as transformers runs it, eagerly, and its token is drawn by ``sample_logits``
from its logits (on the reference until the kernels for it have compiled in the background)::

    import flashsampling_inductor.hf

    flashsampling_inductor.hf.enable(model)
    out = model.generate(ids, do_sample=True, max_new_tokens=128)  # fused
    flashsampling_inductor.hf.disable(model)

or, per call, ``model.generate(ids, ..., custom_generate=fused_generate)``. The first
``generate`` says at INFO that its decode step is fused (or at WARNING why not), and
``is_fused(model)`` tells the same.

It fuses greedy search and sampling with a temperature, top-k, top-p and min-p (generate's
defaults and a model's generation_config included). Anything else (other logits processors
such as a repetition penalty, beam search, assisted decoding, returned scores or logits,
``synced_gpus``, encoder-decoder models, a cache that is not static) runs transformers' own
loop and says why once, at WARNING, on the ``flashsampling_inductor`` logger.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging

import torch

from . import teardown
from .explain import Explanation, recording
from .op import sample_logits, sample_logits_without_waiting, why_not_fused_on

__all__ = ["Fusion", "disable", "enable", "fused_generate", "is_fused"]

log = logging.getLogger("flashsampling_inductor")

# The decoding loop below follows transformers' _sample from 5.17 on (prefill apart, StopCheck).
_OLDEST_LOOP = (5, 17)
_FUSED_MODES = ("SAMPLE", "GREEDY_SEARCH")
# generate's own arguments: not generation settings.
_GENERATE_ARGUMENTS = (
    "logits_processor",
    "stopping_criteria",
    "prefix_allowed_tokens_fn",
    "synced_gpus",
    "assistant_model",
    "streamer",
    "negative_prompt_ids",
    "negative_prompt_attention_mask",
)
_warned: set[tuple[str, str]] = set()
# Graphs one compiled decode step may hold: a few shape changes, times, under a vocabulary-
# sharded head, 2^3 on/off states of top-k, top-p and min-p and each k (see _mark_steps).
_STEP_GRAPHS_LIMIT = 64


def enable(model):
    """Make plain ``model.generate(...)`` calls and transformers' continuous batching
    (``model.generate_batch(...)``, ``model.init_continuous_batching()`` and the context
    manager built on it) on this model run fused.

    Greedy and sampling ``generate`` calls get ``custom_generate=fused_generate`` and, unless
    the call chooses a cache, ``cache_implementation="static"`` (the fused step is compiled
    for a static cache, as transformers' own compiled decoding is); other modes run
    transformers' own ``generate`` and say why once. Continuous batching managers made after
    ``enable`` run a fused step (``_fuse_continuous_batching``). Returns the model.
    ``disable(model)`` undoes it for calls and managers made afterwards.
    """
    if "generate" not in vars(model):
        model.generate = functools.partial(_generate, model, type(model).generate)
    init = getattr(type(model), "init_continuous_batching", None)
    if init is not None and "init_continuous_batching" not in vars(model):
        model.init_continuous_batching = functools.partial(_init_continuous_batching, model, init)
    return model


def disable(model):
    """Undo ``enable``: ``model.generate`` and ``model.init_continuous_batching`` are
    transformers' own again (a manager kept on the model, ``persistent_manager=True``, stays
    as it was made). Returns the model."""
    vars(model).pop("generate", None)
    vars(model).pop("init_continuous_batching", None)
    return model


def _generate(model, generate, inputs=None, generation_config=None, **kwargs):
    """``model.generate`` after ``enable``: the fused loop for greedy search and sampling."""
    if kwargs.get("custom_generate") is not None:
        return generate(model, inputs, generation_config, **kwargs)
    if why_not := _version_problem():
        _warn_once(why_not, model=model)
        return generate(model, inputs, generation_config, **kwargs)
    settings = {key: value for key, value in kwargs.items() if key not in _GENERATE_ARGUMENTS}
    config, _ = model._prepare_generation_config(copy.deepcopy(generation_config), **settings)
    mode = config.get_generation_mode(kwargs.get("assistant_model"))
    if mode.name not in _FUSED_MODES:
        _warn_once(f"{mode.name.lower()} is not fused", model=model)
        return generate(model, inputs, generation_config, **kwargs)
    if config.cache_implementation is None and kwargs.get(_cache_key()) is None:
        kwargs["cache_implementation"] = "static"
    # generate would keep the streamer from a custom_generate: it travels under another name.
    kwargs["fused_streamer"] = kwargs.pop("streamer", None)
    return generate(model, inputs, generation_config, custom_generate=fused_generate, **kwargs)


def fused_generate(
    model,
    input_ids: torch.LongTensor,
    logits_processor,
    stopping_criteria,
    generation_config,
    synced_gpus: bool = False,
    streamer=None,
    fused_streamer=None,
    **model_kwargs,
):
    """transformers' greedy / sampling loop (``GenerationMixin._sample``) with each decode
    step's forward and token choice compiled as one graph with ``backend="flashsampling"``.

    Pass it as ``model.generate(..., custom_generate=fused_generate)`` (``enable(model)``
    does that for every call). Returns what ``generate`` returns: the sequences, or a
    ``GenerateDecoderOnlyOutput`` with ``sequences`` and the cache set when
    ``return_dict_in_generate=True``.

    ``generate`` keeps its ``streamer`` argument for itself (it never reaches a
    ``custom_generate``); ``enable`` passes it on as ``fused_streamer``, which gets the
    prompt and then each new token, as ``generate``'s streamer does.
    """
    from transformers.generation.utils import GenerationMixin

    if fused_streamer is not None:
        streamer = fused_streamer
        streamer.put(input_ids.cpu())

    loop_args = dict(
        logits_processor=logits_processor,
        stopping_criteria=stopping_criteria,
        generation_config=generation_config,
        synced_gpus=synced_gpus,
    )
    mode = generation_config.get_generation_mode()
    if mode.name.startswith("BEAM"):
        _warn_once(f"{mode.name.lower()} is not fused", model=model)
        return GenerationMixin._beam_search(model, input_ids, **loop_args, **model_kwargs)
    if mode.name not in _FUSED_MODES:
        raise ValueError(
            f"fused_generate runs sampling and greedy search, not {mode.name.lower()}; "
            "call generate without custom_generate for it"
        )
    sampling = _sampling_settings(logits_processor, generation_config)
    why_not = (
        sampling
        if isinstance(sampling, str)
        else _unfusable_setup(model, generation_config, synced_gpus, model_kwargs)
    )
    if why_not:
        _warn_once(why_not, model=model)
        return GenerationMixin._sample(
            model, input_ids, **loop_args, streamer=streamer, **model_kwargs
        )
    _use_static_cache(model, input_ids, generation_config, model_kwargs)
    return _fused_loop(
        model, input_ids, stopping_criteria, generation_config, sampling, streamer, model_kwargs
    )


@dataclasses.dataclass(frozen=True)
class _Sampling:
    """What generate's logits processors ask for, in the op's terms."""

    temperature: float  # 0: greedy
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1.0: off
    min_p: float = 0.0  # 0.0: off

    def as_tensors(self, device: torch.device, python_top_k: bool = False) -> dict:
        """Every knob as a 0-d device tensor, a knob that is off at its off value (top-k 0,
        top-p 1, min-p 0) and greedy as temperature 0: one graph serves every setting, and
        neither a new value nor a knob turned on or off, nor greedy against sampling,
        recompiles. The kernels read the knobs on the device and take their plain path for
        rows every knob leaves off (no host sync); what that costs a plain-sampling step
        against knobs passed as None is in docs/performance.md ("off" values).

        With ``python_top_k`` (an LM head sharded by vocabulary: ``_vocabulary_sharded``)
        top-k stays a Python int: tensor-parallel sampling sends k scores a row to every
        rank, a size the graph must hold (another k compiles the step again), and it takes
        top-p only after a top-k; there a knob that is off is None, so turning top-k, top-p
        or min-p on or off compiles the step once more per on/off state (at most 2^3)."""

        def scalar(value, dtype):
            return torch.tensor(value, dtype=dtype, device=device)

        temperature = scalar(self.temperature, torch.float32)
        if not python_top_k:
            return dict(
                temperature=temperature,
                top_k=scalar(self.top_k, torch.int64),
                top_p=scalar(self.top_p, torch.float32),
                min_p=scalar(self.min_p, torch.float32),
            )
        return dict(
            temperature=temperature,
            top_k=self.top_k or None,
            top_p=scalar(self.top_p, torch.float32) if self.top_p < 1.0 else None,
            min_p=scalar(self.min_p, torch.float32) if self.min_p > 0.0 else None,
        )


def _vocabulary_sharded(model) -> bool:
    """Whether the model's LM head is sharded by vocabulary over ranks (a DTensor weight
    with a Shard placement: transformers' ``tp_plan``), so that its logits are gathered."""
    head = model.get_output_embeddings()
    placements = getattr(getattr(head, "weight", None), "placements", ())
    return any(getattr(placement, "dim", None) == 0 for placement in placements)


def _sampling_settings(logits_processor, generation_config) -> _Sampling | str:
    """-> the sampling the processors ask for, or why the op cannot draw it."""
    from transformers.generation.logits_process import (
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    if not generation_config.do_sample:
        processors = [type(p).__name__ for p in logits_processor]
        if processors:
            return f"the logits processors {processors} are not fused"
        return _Sampling(temperature=0.0)
    # transformers applies temperature, then top-k, top-p, min-p: the op's order.
    order = (TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper, MinPLogitsWarper)
    temperature, top_k, top_p, min_p, last = 1.0, 0, 1.0, 0.0, -1
    for processor in logits_processor:
        kind = type(processor)
        position = order.index(kind) if kind in order else None
        if position is None:
            return f"the logits processor {kind.__name__} is not fused"
        if position < last or (position > 0 and position == last):
            names = [type(p).__name__ for p in logits_processor]
            return f"the logits processors {names} come in an order the op does not draw"
        if kind is not TemperatureLogitsWarper and processor.filter_value != -float("inf"):
            return f"{kind.__name__} with filter_value={processor.filter_value} is not fused"
        if kind is TemperatureLogitsWarper:
            temperature *= float(processor.temperature)  # scores / T1 / T2 = scores / (T1 T2)
        elif kind is TopKLogitsWarper:
            top_k = int(processor.top_k)
        elif processor.min_tokens_to_keep != 1:
            name = "top-p" if kind is TopPLogitsWarper else "min-p"
            return f"{name} with min_tokens_to_keep={processor.min_tokens_to_keep} is not fused"
        elif kind is TopPLogitsWarper:
            top_p = float(processor.top_p)
        else:
            min_p = float(processor.min_p)
        last = position
    return _Sampling(temperature, top_k, top_p, min_p)


def _unfusable_setup(model, generation_config, synced_gpus, model_kwargs) -> str:
    """Why this call cannot run the fused loop, or ""."""
    config = generation_config
    if why_not := _version_problem():
        return why_not
    if model.config.is_encoder_decoder:
        return "encoder-decoder models are not fused"
    if synced_gpus:
        return "synced_gpus is set"
    if config.disable_compile:
        return "disable_compile is set"
    if config.return_dict_in_generate and (
        config.output_scores
        or config.output_logits
        or config.output_attentions
        or config.output_hidden_states
    ):
        return "scores, logits, attentions or hidden states are returned"
    if not model_kwargs.get("use_cache", True):
        return "use_cache=False"
    cache = model_kwargs.get(_cache_key())
    if cache is None:
        return "the model keeps no cache"
    if getattr(cache, "_is_user_defined", False) and not _is_static(cache):
        return f"the cache passed in ({type(cache).__name__}) is not a static cache"
    if "flash" in str(getattr(model.config, "_attn_implementation", "")):
        return "flash attention breaks the compiled graph"
    return ""


def _is_static(cache) -> bool:
    from transformers import DynamicCache

    return bool(cache.is_compileable) and type(cache) is not DynamicCache


def _use_static_cache(model, input_ids, generation_config, model_kwargs) -> None:
    """The fused step is compiled for a static cache: a fresh dynamic cache that generate made
    for this call becomes the static cache transformers makes for ``cache_implementation=
    "static"`` (reused across calls, sized for the longest call so far)."""
    if _is_static(model_kwargs[_cache_key()]):
        return
    config = copy.copy(generation_config)
    config.cache_implementation = "static"
    del model_kwargs[_cache_key()]
    expand = max(config.num_beams or 1, config.num_return_sequences or 1)
    model._prepare_cache_for_generation(
        config,
        model_kwargs,
        config.get_generation_mode(),
        input_ids.shape[0] // expand,
        config.max_length - 1,
    )


def _fused_loop(model, input_ids, stopping_criteria, generation_config, sampling, streamer, kw):
    """``_sample``'s loop for greedy search and sampling, the decode step compiled."""
    from transformers.generation.utils import GenerateDecoderOnlyOutput, StopCheck

    batch_size, device = input_ids.shape[0], input_ids.device
    pad_token_id = generation_config._pad_token_tensor
    has_eos_stopping_criteria = any(hasattr(c, "eos_token_id") for c in stopping_criteria)
    unfinished_sequences = torch.ones(batch_size, dtype=torch.long, device=device)
    knobs = sampling.as_tensors(model.device, python_top_k=_vocabulary_sharded(model))
    step = _reporting_first_call(model, _compiled_step(model, generation_config))
    cache_key = _cache_key()
    cache = kw[cache_key]

    # The prompt: transformers' own (eager) prefill, its token drawn from its logits.
    outputs = model._prefill(input_ids, generation_config, kw, is_first_iteration=True)
    kw = model._update_model_kwargs_for_generation(outputs, kw)
    # (its knobs as Python numbers, checked on the host: as device tensors a kernel of their
    # own would check them, compiled and its launcher built during the first call's prefill;
    # the tokens are the same, the op reads both forms as the same per-row values. On the
    # kernels once they are compiled, tens of us where the reference takes 0.5-13 ms; until
    # then, the first generate of a kind, on the reference while they compile behind it:
    # their first compile takes 2.5-7 s on an H200, docs/operator.md.)
    prompt_knobs = dataclasses.asdict(sampling)
    prompt_logits = outputs.logits[:, -1, :]
    next_tokens = sample_logits_without_waiting(prompt_logits, **prompt_knobs).squeeze(1)
    next_tokens = next_tokens.to(device)
    del outputs  # the prompt's logits
    # The stop decision read one step late lets the host queue a step while the device runs
    # the previous one; the late read costs one step past the stop, which is dropped. That
    # step's token would reach a streamer and its cache entry a cache the caller keeps: they
    # read the decision on time.
    cache_is_kept = generation_config.return_dict_in_generate or getattr(
        cache, "_is_user_defined", False
    )
    late_stop = None if streamer is not None or cache_is_kept else _LateStop(device)
    stop_check = StopCheck(streamer)
    max_length = stopping_criteria.max_length
    with model._optimize_model_for_decode():
        while True:
            if has_eos_stopping_criteria:  # finished rows get padding, as in generate
                next_tokens = next_tokens * unfinished_sequences + pad_token_id.to(device) * (
                    1 - unfinished_sequences
                )
            input_ids = torch.cat([input_ids, next_tokens[:, None]], dim=-1)
            unfinished_sequences = unfinished_sequences & ~stopping_criteria(input_ids, None)
            if late_stop is None:
                if stop_check(unfinished_sequences, next_tokens, input_ids.shape[1]):
                    break
            elif late_stop(unfinished_sequences):
                input_ids = input_ids[:, :-1]  # the step past the stop
                break
            elif max_length is not None and input_ids.shape[1] >= max_length:
                break
            inputs = model.prepare_inputs_for_generation(input_ids, next_sequence_length=1, **kw)
            next_tokens = step(inputs, **knobs).to(device)
            kw = model._update_model_kwargs_for_generation(_StepOutput({cache_key: cache}), kw)
    if streamer is not None:
        streamer.end()
    if generation_config.return_dict_in_generate:
        return GenerateDecoderOnlyOutput(sequences=input_ids, **{cache_key: cache})
    return input_ids


def _decode_step(model, inputs: dict, temperature, top_k, top_p, min_p) -> torch.Tensor:
    """One decode step: the forward and the token choice, one graph. -> tokens [B]."""
    logits = model(**inputs, return_dict=True).logits[:, -1, :]
    tokens = sample_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    return tokens.squeeze(1)


def _compiled_step(model, generation_config):
    """The decode step compiled as transformers compiles its own (its ``compile_config``,
    CUDA graphs under ``mode="reduce-overhead"``), with ``backend="flashsampling"`` and
    fullgraph: forward and sampling must be one graph for the pass to fuse them. Kept on
    the model, as transformers keeps its compiled forward. Off CUDA there are no CUDA
    graphs: the step compiles without them."""
    from transformers import CompileConfig

    config = generation_config.compile_config or CompileConfig()
    mode = config.mode if model.device.type == "cuda" else None
    key = (mode, config.dynamic, repr(config.options))
    cached = getattr(model, "_flashsampling_step", None)
    if cached is None or cached[0] != key:

        def decode_step(inputs: dict, temperature, top_k, top_p, min_p) -> torch.Tensor:
            # A function of its own (not a functools.partial): Dynamo's record of which sizes
            # changed between runs (automatic dynamic shapes, kept across processes) is keyed
            # on the compiled code, so this step's record is its own.
            return _decode_step(model, inputs, temperature, top_k, top_p, min_p)

        compiled = torch.compile(
            decode_step,
            backend="flashsampling",
            fullgraph=True,
            dynamic=config.dynamic,
            mode=mode,
            options=config.options,
        )
        model._flashsampling_step = cached = (key, _mark_steps(compiled, mode))
        if mode is not None and torch.distributed.is_initialized():
            # The step's CUDA graphs capture the model's collectives, which block the
            # group's destruction while the graphs live (teardown.py): freed before it.
            teardown.release_before_destroy()
    return cached[1]


def _mark_steps(compiled, mode):
    """The compiled step as the loop calls it.

    Each first sight of a new batch size or cache length before Dynamo makes that dimension
    dynamic is a graph of its own, and so, under a vocabulary-sharded LM head only, is each
    on/off state of top-k, top-p and min-p (None when off there) and each k
    (``_Sampling.as_tensors``): a long-lived model meeting many shapes can need more graphs
    than Dynamo's default limit (8), past which a fullgraph compile fails. The bound is
    known (a few shape changes, 2^3 knob states), so the step's limit is raised to cover it.
    Under CUDA graphs each decode step is a new iteration: the previous step's output (the
    tokens, already copied into input_ids) may be overwritten."""
    cuda_graphs = mode is not None and "reduce-overhead" in mode
    # One patch object for every step: building it costs 24-38 us of host time per step,
    # entering a built one ~7 (2-core CPU, torch 2.13); steps are never nested.
    limit = torch._dynamo.config.patch(recompile_limit=_STEP_GRAPHS_LIMIT)

    def step(*args, **kwargs):
        with limit:
            if cuda_graphs:
                torch.compiler.cudagraph_mark_step_begin()
            return compiled(*args, **kwargs)

    return step


class _LateStop:
    """Whether every row had finished one step ago: each call queues an asynchronous copy of
    this step's "all finished" flag and reads the previous step's, so the host waits for the
    device to finish the step before last, never the one it has just queued. Two flags in
    turn: a flag is rewritten only after it was read."""

    def __init__(self, device: torch.device):
        on_cuda = device.type == "cuda"
        self._flags = [torch.zeros((), dtype=torch.bool, pin_memory=on_cuda) for _ in range(2)]
        self._copied = [torch.cuda.Event() for _ in range(2)] if on_cuda else None
        self._step = 0

    def __call__(self, unfinished_sequences: torch.Tensor) -> bool:
        now, before = self._step % 2, (self._step + 1) % 2
        self._flags[now].copy_(unfinished_sequences.max() == 0, non_blocking=True)
        if self._copied is not None:
            self._copied[now].record()
        self._step += 1
        if self._step == 1:
            return False
        if self._copied is not None:
            self._copied[before].synchronize()
        return bool(self._flags[before])


class _StepOutput(dict):
    """What ``_update_model_kwargs_for_generation`` reads of a model output: ``name in
    output`` and ``output.name``."""

    __getattr__ = dict.__getitem__


# ---------------------------------------------------------------------------------------------
# Continuous batching (generate_batch, ContinuousBatchingManager)

# transformers' continuous-batching warpers, by class name, and the knob each one sets. Each
# reads its per-request value from one row of the step's ``logits_processor_args``.
_PER_REQUEST_WARPERS = {
    "ContinuousBatchingTemperatureLogitsWarper": "temperature",
    "ContinuousBatchingTopKLogitsWarper": "top_k",
    "ContinuousBatchingTopPLogitsWarper": "top_p",
}
_KNOB_ORDER = ("temperature", "top_k", "top_p", "min_p")  # transformers' and the op's order


@dataclasses.dataclass(frozen=True)
class _RowKnobs:
    """Where each knob of a continuous-batching step comes from: ``rows``, the knobs that
    are per request, each with the row of the step's ``logits_processor_args`` that holds
    its values (fp32 bits for temperature and top-p, int32 for top-k); ``values``, the knobs
    one warper of the manager's generation config sets for every request. A knob in neither
    is off; ``greedy``: the manager does not sample."""

    rows: tuple[tuple[str, int], ...] = ()
    values: tuple[tuple[str, float], ...] = ()
    greedy: bool = False
    # transformers' logprobs, when asked: log softmax of the warped scores ("processed"), of
    # the raw ones for a manager that does not sample (no warpers)
    logprobs: str | None = None

    def tensors(self, processor_args, rows: int) -> dict:
        """The op's knobs for a step of ``rows`` logits rows (padding rows hold the defaults
        transformers fills in)."""
        if self.greedy:
            return dict(temperature=0.0)
        knobs = {name: int(v) if name == "top_k" else v for name, v in self.values}
        for name, row in self.rows:
            per_request = processor_args[row, :rows]
            dtype = torch.int64 if name == "top_k" else None
            knobs[name] = per_request.to(dtype) if dtype else per_request.view(torch.float32)
        return knobs


def _row_knobs(logit_processor, do_sample: bool) -> _RowKnobs | str:
    """-> where a continuous-batching manager's knobs come from, or why the op cannot draw
    what its logits processors ask for."""
    from transformers.generation.logits_process import (
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    processors = list(logit_processor.logits_processor)
    if not do_sample:
        if processors:
            return f"the logits processors {[type(p).__name__ for p in processors]} are not fused"
        return _RowKnobs(greedy=True)
    plain = {
        TemperatureLogitsWarper: "temperature",
        TopKLogitsWarper: "top_k",
        TopPLogitsWarper: "top_p",
        MinPLogitsWarper: "min_p",
    }
    rows, values, last = [], [], -1
    names = [type(p).__name__ for p in processors]
    for processor in processors:
        kind = type(processor)
        if kind.__name__ in _PER_REQUEST_WARPERS:
            knob = _PER_REQUEST_WARPERS[kind.__name__]
            rows.append((knob, len(rows)))
        elif kind in plain:
            knob = plain[kind]
            values.append((knob, float(getattr(processor, knob))))
        else:
            return f"the logits processor {kind.__name__} is not fused"
        if _KNOB_ORDER.index(knob) <= last:
            return f"the logits processors {names} come in an order the op does not draw"
        last = _KNOB_ORDER.index(knob)
        if getattr(processor, "filter_value", -float("inf")) != -float("inf"):
            return f"{kind.__name__} with filter_value={processor.filter_value} is not fused"
        keep = getattr(processor, "min_tokens_to_keep", 1)
        if knob in ("top_p", "min_p") and keep != 1:
            return f"{kind.__name__} with min_tokens_to_keep={keep} is not fused"
    return _RowKnobs(rows=tuple(rows), values=tuple(values))


def _init_continuous_batching(model, init, *args, **kwargs):
    """``model.init_continuous_batching`` after ``enable``: transformers' manager, fused."""
    manager = init(model, *args, **kwargs)
    if not getattr(manager, "_flashsampling_seen", False):
        manager._flashsampling_seen = True
        _fuse_continuous_batching(manager)
    return manager


def _fuse_continuous_batching(manager) -> None:
    """Make a continuous-batching manager run a fused step, or say once why it cannot.

    transformers' step (``ModelRunner._forward_process_and_sample``: forward, per-request
    warpers, softmax, ``torch.multinomial``) becomes the forward and one ``sample_logits``
    call with each knob a per-request [B] tensor (``_RowKnobs``: no setting of any request
    is a graph of its own), compiled with ``backend="flashsampling"``, whose pass fuses the
    LM head and ``sample_logits``. Each path (prefill "varlen", decode) keeps the compile
    config transformers resolved for it, its backend swapped; a path that transformers would
    run eagerly is compiled as transformers' ``default_compile_level=1`` compiles it. The
    manager's batch processor is made lazily (in ``warmup`` or the generation thread): its
    model runner is fused as it is made. With ``return_logprobs`` the draw also returns the
    logprobs transformers returns, from the same fused call.
    """
    config = manager.continuous_batching_config
    why_not = _version_problem()
    if not why_not and getattr(manager.distributed_helper, "tp_size", 1) > 1:
        why_not = "tensor parallelism is not fused"
    knobs = why_not or _row_knobs(manager.logit_processor, manager.generation_config.do_sample)
    if isinstance(knobs, str):
        _warn_once(knobs, "continuous batching runs transformers' own step", manager.model)
        return
    if config.return_logprobs:
        knobs = dataclasses.replace(knobs, logprobs="raw" if knobs.greedy else "processed")
    from transformers import CompileConfig

    default = CompileConfig(mode="default", fullgraph=False, dynamic=True)
    config.varlen_compile_config = _with_our_backend(config.varlen_compile_config or default)
    if config.max_blocks_per_request > 0:  # the decode fast path exists
        config.decode_compile_config = _with_our_backend(config.decode_compile_config or default)
    create = manager._create_batch_processor

    def create_fused():
        processor = create()
        _fuse_model_runner(processor.model_runner, knobs, manager.model)
        return processor

    manager._create_batch_processor = create_fused


def _with_our_backend(config):
    config = copy.deepcopy(config)
    config.backend = "flashsampling"
    return config


def _fuse_model_runner(runner, knobs: _RowKnobs, model) -> None:
    """Give a ModelRunner the fused step, compiled with its paths' (fused) compile configs;
    each path's first call says whether it ran fused and ``is_fused(model)`` tells the same."""
    if getattr(runner, "_flashsampling_knobs", None) is not None:
        return  # a batch processor made before and reset
    runner._flashsampling_knobs = knobs
    runner._forward_process_and_sample = functools.partial(
        _batching_step, runner.inputs_and_outputs, knobs
    )
    for path in ("varlen", "decode"):
        config = getattr(runner.cb_config, f"{path}_compile_config")
        if config is not None:
            step = functools.partial(_compiled_batching_step(config), runner.inputs_and_outputs)
            step = _reporting_first_call(model, functools.partial(step, knobs))
            setattr(runner, f"_compiled_{path}", step)


def _batching_step(io, knobs, model, batch_data, carry_over_ids, prev_output_ids, output_ids):
    """transformers' ``_forward_process_and_sample`` with the warpers, the softmax and the
    draw one ``sample_logits`` call (the inputs and outputs object and the knobs are
    arguments, not closure cells: every manager of a model shares one compiled step)."""
    io.carry_over_tokens(batch_data["input_ids"], carry_over_ids, prev_output_ids)
    logits = model(**batch_data).logits  # [1, rows, V]
    if "logits_to_keep" not in batch_data:
        logits = logits[:, batch_data["logits_indices"], :]
    rows = logits.shape[1]
    settings = knobs.tensors(batch_data.get("logits_processor_args"), rows)
    if knobs.logprobs is None:
        tokens = sample_logits(logits[0], **settings).squeeze(1)
    else:
        tokens, logprobs = sample_logits(logits[0], **settings, return_logprobs=knobs.logprobs)
        tokens = tokens.squeeze(1)
        # transformers keeps the fp32 logprobs' bits in its int32 output row
        output_ids[1, :rows].copy_(logprobs.squeeze(1).view(torch.int32))
    output_ids[0, :rows].copy_(tokens)


def _compiled_batching_step(config):
    """The step compiled with ``config`` (its backend already ours), as transformers runs its
    own: graph breaks at the paged attention, which transformers keeps out of the graphs. The
    LM head and ``sample_logits`` must still land in one graph for the pass to fuse them:
    Dynamo's nested graph breaks resume tracing inside the model's forward after a break, so
    its last graph runs from the last attention to the draw."""
    from torch.fx.experimental import _config as shapes_config

    compiled = torch.compile(_batching_step, **config.to_dict())
    # Floats as constants: with dynamic shapes Dynamo makes the modules' float attributes
    # (epsilons, scalings) symbols, fails to turn some into tensors and traces the whole step
    # a second time ("Restarting analysis due to _tensorify_python_scalars"; transformers 5.17,
    # CPU). Every knob of the step is a tensor: no float of it changes between calls.
    settings = dict(recompile_limit=_STEP_GRAPHS_LIMIT, specialize_float=True)
    if hasattr(torch._dynamo.config, "nested_graph_breaks"):  # torch >= 2.9
        settings["nested_graph_breaks"] = True
    patch = torch._dynamo.config.patch(**settings)
    # The manager pads a step's query tokens to multiples of 64 and its rows to min(query
    # tokens, max requests). With duck sizing a first compile where the two are equal makes
    # them one symbol, and the first step where they differ compiles every graph again
    # (minutes for the fused step; seen on the CPU with transformers 5.17). Entered at each
    # call: config overrides are per thread, and the step runs in the manager's thread.
    sizes = shapes_config.patch(use_duck_shape=False)

    def step(*args):
        with patch, sizes:
            return compiled(*args)

    return step


def _cache_key() -> str:
    """The name generate keeps the cache under in its model kwargs, forwards and outputs:
    ``past_key_values`` up to transformers 5.23, ``cache`` from 5.24."""
    from transformers.generation.utils import ALL_CACHE_NAMES

    return ALL_CACHE_NAMES[0]


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def _version_problem() -> str:
    """ "" for the transformers versions whose ``_sample`` loop the fused loop mirrors."""
    version = _transformers_version()
    major, minor = (int(part) for part in version.split(".")[:2])
    if major == 5 and (major, minor) >= _OLDEST_LOOP:
        return ""
    oldest = ".".join(map(str, _OLDEST_LOOP))
    return f"transformers {version} is not supported (the fused loop follows 5.x from {oldest})"


def _warn_once(
    why_not: str, what: str = "generate runs transformers' own loop", model=None
) -> None:
    if model is not None:  # what is_fused(model) says
        model._flashsampling_fusion = Fusion(False, f"{what}: {why_not}")
    if (what, why_not) not in _warned:
        _warned.add((what, why_not))
        log.warning("flashsampling: %s: %s", what, why_not)


@dataclasses.dataclass(frozen=True)
class Fusion:
    """Whether ``generate`` ran its decode step fused (true as a bool), and if not, why."""

    fused: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.fused

    def __str__(self) -> str:
        if self.fused:
            return "the decode step is fused: its LM head and sampling are one call"
        return f"the decode step is not fused: {self.reason}"


def is_fused(model) -> Fusion:
    """Whether the last ``generate`` on ``model``, or the last compiled step of a
    continuous-batching manager made on it, ran fused, and if not, why (what their first call
    after ``enable`` logs, at INFO or WARNING)."""
    if "generate" not in vars(model):
        return Fusion(False, "flashsampling_inductor.hf.enable(model) was not called")
    fusion = vars(model).get("_flashsampling_fusion")
    if fusion is None:
        return Fusion(False, "neither generate nor a continuous-batching step has run yet")
    return fusion


def _reporting_first_call(model, step):
    """``step``, whose first call in this ``generate`` records whether the graph it runs is
    fused: the pass's sites when it compiles, else (a graph loaded from Inductor's caches,
    which hold no graph with an unfused sampling op) the device's rule. Said when it changes."""
    first = True

    def watched(*args, **kwargs):
        nonlocal first
        if not first:
            return step(*args, **kwargs)
        first = False
        with recording() as sites:
            tokens = step(*args, **kwargs)
        fusion = _fusion(sites, model.device)
        if fusion is None:  # a step compiled by an earlier generate: what was found then
            fusion = vars(model).get("_flashsampling_step_fusion")
        previous = vars(model).get("_flashsampling_fusion")
        model._flashsampling_step_fusion = model._flashsampling_fusion = fusion
        if fusion is not None and fusion != previous:
            log.log(logging.INFO if fusion else logging.WARNING, "flashsampling: %s", fusion)
        return tokens

    return watched


def _fusion(sites: Explanation, device: torch.device) -> Fusion | None:
    """-> what the sites (or cache hits) of a first call say; None: nothing was compiled."""
    if sites:
        missed = [site for site in sites if site.sampling and not site.rewritten]
        if missed or not any(site.rewritten for site in sites):
            return Fusion(False, missed[0].reason if missed else "no sampling op was rewritten")
        return Fusion(True)
    if sites.cache_hits:
        why_not = why_not_fused_on(device)
        return Fusion(not why_not, why_not)
    return None
