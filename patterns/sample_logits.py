"""``sample_logits(lm_head(h), ...)``: the op on logits the program materializes itself.

``flashsampling_inductor.sample_logits`` samples from logits that already exist (a logits
processor's output, a model that returns them). When a compiled graph makes those logits with
an LM-head matmul just before, the call and the matmul become one ``fused_sample`` that
carries everything the call asked for (temperature, top_k, top_p, min_p, softcap, seed,
num_samples, impl; per-row tensors passed through) and never writes the logits. It draws the
same tokens on the same seed: the op's contract (``sample_logits`` draws what
``fused_sample`` draws on logits equal to ``hidden @ weight.T``).

The chain to the matmul is any ``match_lm_head`` accepts: row selections, casts (bf16/fp16
rounding becomes ``logits_dtype``), a bias, a temperature division. A chain temperature
``T_c`` and the call's own ``T`` multiply: ``softmax((l / T_c) / T)``, and top-k on
``l / T_c`` keeps what top-k on ``l`` keeps for ``T_c > 0`` (a negative tensor ``T_c`` is
folded into the hidden state's sign, as for every idiom). A top-k / top-p / min-p mask on
the chain next to the call's own truncation is refused: the op applies one of each. The
call's ``softcap`` caps the logits it is given, so the chain before it must not scale, mask
or soft-cap them (the op soft-caps the raw logits, first).
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch.fx import Node

from .. import op
from ._lm_head import match_lm_head
from ._rewrite import SamplingMatch
from ._walk import NoMatch, Walk

IDIOM = "sample_logits"
TARGET = torch.ops.flashsampling.sample_logits.default
# ``sample_logits(return_logprobs=...)``: the same arguments and ``logprobs``, two outputs.
TARGETS = (TARGET, torch.ops.flashsampling.sample_logits_logprobs.default)


def search(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    """The idiom as users write it (Qwen3's generation config)."""
    logits = F.linear(hidden, weight).float()
    return op.sample_logits(logits, temperature=temperature, top_k=20, top_p=0.95)


def example_inputs() -> tuple:
    """Arguments ``search`` is traced with in the tests."""
    return torch.randn(3, 24), torch.randn(1000, 24), 0.6


def check(walk: Walk) -> SamplingMatch:
    call = walk.terminal
    schema = [argument.name for argument in call.target._schema.arguments]
    args = dict(zip(schema, call.args, strict=False), **call.kwargs)
    num_samples = args["num_samples"]
    if not isinstance(num_samples, int):
        raise NoMatch(f"num_samples={num_samples} is not a Python int")
    top_k = _knob(args.get("top_k"), args.get("scalar_top_k", 0), off=0)
    top_p = _knob(args.get("top_p"), args.get("scalar_top_p", 1.0), off=1.0)
    min_p = _knob(args.get("min_p"), args.get("scalar_min_p", 0.0), off=0.0)
    softcap = args.get("softcap", 0.0)
    head = match_lm_head(walk, args["logits"])
    if head.weight is None:
        raise NoMatch(
            f"{head.given}: no LM-head matmul to fuse, and the call runs the op's own kernels"
            " already"
        )
    masked = (head.top_k, head.top_p, head.min_p) != (None, None, None)
    if masked and (top_k, top_p, min_p) != (None, None, None):
        raise NoMatch(f"the logits are masked before {call.name} truncates them again")
    if isinstance(softcap, Node) or not 0.0 <= softcap < math.inf:
        raise NoMatch(f"softcap={softcap} is not a constant >= 0")
    if softcap != 0.0:
        if masked or head.softcap is not None or head.temperature != 1.0:
            raise NoMatch(
                f"{call.name} soft-caps logits that the chain already scaled, masked or"
                " soft-capped (the op soft-caps the raw logits, first)"
            )
        head = replace(head, softcap=softcap)
    temperature = _knob(args["temperature"], args["scalar_temperature"], off=None)
    # (the schema's default "raw" is left out of the call)
    mode = args.get("logprobs", "raw") if call.target == TARGETS[1] else None
    if (head.top_p, head.min_p) != (None, None) and temperature != 1.0:
        raise NoMatch(
            f"{call.name} applies its temperature after a top-p / min-p mask, which kept the"
            " tokens of the distribution before it (the op measures them after)"
        )
    own_knobs = (top_k, top_p, min_p) != (None, None, None)
    return SamplingMatch(
        head,
        num_samples=num_samples,
        top_p_whole_row=args.get("top_p_whole_row", False) if own_knobs else head.top_p_whole_row,
        top_k=head.top_k if top_k is None else top_k,
        top_p=head.top_p if top_p is None else top_p,
        min_p=head.min_p if min_p is None else min_p,
        temperature=temperature,
        seed=_knob(args["seed"], args["scalar_seed"], off=None),
        impl=args.get("impl", "auto"),
        knobs_checked=own_knobs,
        logprobs=_logprobs(call, mode, head, (top_k, top_p, min_p, temperature)),
        returns_logprobs=mode is not None,
    )


def _logprobs(call: Node, mode: str | None, head, own: tuple) -> str | None:
    """The op's ``return_logprobs`` for the call's: "processed" is the same distribution
    (the chain's temperature and masks are the op's too); "raw", the log-softmax of the
    logits the call is given, is the op's raw one when those are the raw logits, and its
    processed one when the call adds nothing to the chain (temperature 1, no truncation or
    soft-cap of its own)."""
    if mode in (None, "processed"):
        return mode
    if head.scores in head.raw_logits:
        return "raw"
    if own == (None, None, None, 1.0) and head.softcap is None:
        return "processed"
    raise NoMatch(
        f"{call.name} returns the log-softmax of logits the chain scaled, soft-capped or"
        " masked, under which it then samples with its own temperature or truncation: the"
        " op's raw logprobs are of the raw logits, its processed ones of what it samples"
    )


def _knob(tensor: Node | None, scalar, off):
    """The op's (per-row tensor, scalar) pair as one value: the tensor when given, else the
    scalar; None if that is the value that turns the knob off."""
    if tensor is not None:
        return tensor
    return None if off is not None and scalar == off else scalar
