"""FlashSampling inside Hugging Face ``model.generate``: one argument, ``custom_generate``.

``generate`` runs the model's forward and the sampling in separate places (the sampling after
the logits processors, outside anything compiled), so the pass never sees an LM head and its
sampling in one graph. ``fused_generate`` is a drop-in decoding loop for transformers'
``custom_generate`` hook (transformers 4.57; other versions run their own loop unfused, with
a warning): the same loop as ``generate``'s own, except that each step's forward and its
token choice are one function compiled with ``backend="flashsampling"``, so the logits of the
step are never written::

    from flashsampling_inductor.hf import fused_generate

    out = model.generate(ids, do_sample=True, temperature=0.7, top_k=0,
                         custom_generate=fused_generate)

It fuses what the op draws exactly: plain temperature sampling (``do_sample=True`` with no
logits processor besides the temperature; note that ``top_k`` defaults to 50, so pass
``top_k=0``) and greedy search. For anything else (top-k/top-p, penalties, returned scores or
logits, ``synced_gpus``, encoder-decoder models) it runs transformers' own loop unchanged and
says why at INFO level on the ``flashsampling_inductor`` logger. Beam search and assisted
decoding are not decoding loops it can stand in for: they raise.
"""

from __future__ import annotations

import logging

import torch

__all__ = ["fused_generate"]

log = logging.getLogger("flashsampling_inductor")

# Names under which transformers' models return their cache (generation/utils.py).
_CACHE_NAMES = ("past_key_values", "cache_params", "state", "mems", "past_buckets_states")


def _forward_and_choose(model, model_inputs: dict, temperature: float, greedy: bool):
    """One decode step as ``generate`` writes it, minus the logits processors."""
    outputs = model(**model_inputs, return_dict=True)
    logits = outputs.logits[:, -1, :].float()
    if greedy:
        tokens = torch.argmax(logits, dim=-1)
    else:
        probs = torch.softmax(logits / temperature, dim=-1)
        tokens = torch.multinomial(probs, num_samples=1).squeeze(1)
    # The cache goes back to generate's bookkeeping; the logits stay inside the graph.
    return tokens, {name: outputs[name] for name in _CACHE_NAMES if name in outputs}


_compiled_step = torch.compile(_forward_and_choose, backend="flashsampling", dynamic=True)


def fused_generate(
    model,
    input_ids: torch.LongTensor,
    logits_processor,
    stopping_criteria,
    generation_config,
    synced_gpus: bool = False,
    streamer=None,
    **model_kwargs,
):
    """transformers' sampling / greedy loop (``GenerationMixin._sample``) with each step's
    forward and token choice compiled as one graph with ``backend="flashsampling"``.

    Pass it as ``model.generate(..., custom_generate=fused_generate)``. Returns what
    ``generate`` returns: the sequences, or a ``GenerateDecoderOnlyOutput`` with only
    ``sequences`` and ``past_key_values`` set when ``return_dict_in_generate=True``.
    """
    import transformers
    from transformers.generation.utils import GenerateDecoderOnlyOutput, GenerationMixin

    mode = generation_config.get_generation_mode()
    if mode.name not in ("SAMPLE", "GREEDY_SEARCH"):
        raise ValueError(
            f"fused_generate runs sampling and greedy search, not {mode.name.lower()}; "
            "call generate without custom_generate for it"
        )
    if not _loop_matches(transformers.__version__):
        # The loop below follows 4.57's _sample and its helpers; 5.x restructured them.
        log.warning(
            "flashsampling: fused_generate follows transformers 4.57's decoding loop, not"
            " %s's; generate runs transformers' own loop (nothing fused)",
            transformers.__version__,
        )
        why_not = "unsupported transformers version"
    else:
        temperature, why_not = _fusable(model, logits_processor, generation_config, synced_gpus)
        if why_not:
            log.info("flashsampling: generate runs transformers' own loop: %s", why_not)
    if why_not:
        return GenerationMixin._sample(
            model,
            input_ids,
            logits_processor=logits_processor,
            stopping_criteria=stopping_criteria,
            generation_config=generation_config,
            synced_gpus=synced_gpus,
            streamer=streamer,
            **model_kwargs,
        )

    greedy = not generation_config.do_sample
    pad_token_id = generation_config._pad_token_tensor
    has_eos_stopping_criteria = any(hasattr(c, "eos_token_id") for c in stopping_criteria)
    batch_size, cur_len = input_ids.shape[:2]
    unfinished_sequences = torch.ones(batch_size, dtype=torch.long, device=input_ids.device)
    model_kwargs = model._get_initial_cache_position(cur_len, input_ids.device, model_kwargs)
    this_peer_finished = False
    while model._has_unfinished_sequences(this_peer_finished, False, device=input_ids.device):
        model_inputs = model.prepare_inputs_for_generation(input_ids, **model_kwargs)
        next_tokens, cache = _compiled_step(model, model_inputs, temperature, greedy)
        model_kwargs = model._update_model_kwargs_for_generation(
            _StepOutput(cache), model_kwargs, is_encoder_decoder=False
        )
        if has_eos_stopping_criteria:  # finished rows get padding, as in generate
            next_tokens = next_tokens * unfinished_sequences + pad_token_id * (
                1 - unfinished_sequences
            )
        input_ids = torch.cat([input_ids, next_tokens[:, None]], dim=-1)
        if streamer is not None:
            streamer.put(next_tokens.cpu())
        unfinished_sequences = unfinished_sequences & ~stopping_criteria(input_ids, None)
        this_peer_finished = unfinished_sequences.max() == 0
    if streamer is not None:
        streamer.end()
    if generation_config.return_dict_in_generate:
        return GenerateDecoderOnlyOutput(
            sequences=input_ids, past_key_values=model_kwargs.get("past_key_values")
        )
    return input_ids


def _loop_matches(version: str) -> bool:
    """True for the transformers versions whose ``_sample`` loop ``fused_generate`` mirrors."""
    return version.startswith("4.57.")


class _StepOutput(dict):
    """What ``_update_model_kwargs_for_generation`` reads of a model output: ``name in
    output`` and ``output.name``."""

    __getattr__ = dict.__getitem__


def _fusable(model, logits_processor, generation_config, synced_gpus) -> tuple[float, str]:
    """-> (temperature, "") if the loop can be fused, else (_, why not)."""
    from transformers.generation.logits_process import TemperatureLogitsWarper

    config = generation_config
    if model.config.is_encoder_decoder:
        return 1.0, "encoder-decoder models are not supported"
    if synced_gpus:
        return 1.0, "synced_gpus is set"
    if config.prefill_chunk_size is not None:
        return 1.0, "prefill_chunk_size is set"
    if config.return_dict_in_generate and (
        config.output_scores
        or config.output_logits
        or config.output_attentions
        or config.output_hidden_states
    ):
        return 1.0, "scores, logits, attentions or hidden states are returned"
    temperature = 1.0
    for processor in logits_processor:
        if isinstance(processor, TemperatureLogitsWarper) and config.do_sample:
            temperature *= float(processor.temperature)  # scores / T1 / T2 = scores / (T1 T2)
        else:
            return 1.0, f"the logits processor {type(processor).__name__} is not fused"
    return temperature, ""
