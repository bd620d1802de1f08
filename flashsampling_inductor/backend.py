"""``flashsampling_backend``: stock Inductor plus the FlashSampling graph pass."""

from __future__ import annotations

import os
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

import torch
from torch._dynamo.backends.registry import register_backend

__all__ = ["flashsampling_backend"]

BACKEND_NAME = "flashsampling"
# FLASHSAMPLING_DETERMINISTIC=1: Inductor's deterministic mode (no kernel configuration chosen
# by timing), so the same seed draws the same tokens in every process. Opt-in, as in stock
# Inductor: it also changes the rest of the step's kernels (and max-autotune's GEMM choice),
# and what it costs a decode step is not measured yet (docs/exactness.md).
_DETERMINISTIC = os.environ.get("FLASHSAMPLING_DETERMINISTIC", "0") == "1"


def flashsampling_backend(
    gm: torch.fx.GraphModule,
    example_inputs: list[Any],
    *,
    mode: str | None = None,
    options: dict[str, Any] | None = None,
) -> Callable:
    """Compile ``gm`` with Inductor, rewriting sampling idioms into one fused-op call.

    Use as ``torch.compile(step, backend=flashsampling_backend)`` or
    ``backend="flashsampling"``; ``mode`` and ``options`` mean what they mean for
    ``backend="inductor"`` (``mode="reduce-overhead"`` still captures CUDA graphs). A
    ``joint_custom_pre_pass`` already set, in ``options`` or in ``torch._inductor.config``,
    runs after the FlashSampling pass.
    """
    # Imported here, as torch's own inductor backend does: importing the package for the eager
    # op should not load Inductor and the pattern matcher.
    from torch._inductor import list_mode_options
    from torch._inductor.compile_fx import compile_fx

    from . import ahead
    from .graph_pass import FlashSamplingPass

    if _on_cuda(example_inputs) and _may_sample(gm):
        # (the compile ahead's child processes import while AOT traces the graph: the pass
        # hands them its calls 5-10 s later)
        ahead.prestart()
    config_patches = {**(list_mode_options(mode) if mode else {}), **(options or {})}
    if _DETERMINISTIC and hasattr(torch._inductor.config, "deterministic"):
        # Same seed, same tokens, in every process: Inductor otherwise picks a reduction's
        # RBLOCK and warps (and GEMM templates, matmul padding) by timing them on this
        # process's GPU, which reorders fp32 sums; a hidden state one bf16 ulp apart moves the
        # rounded logits, and Gumbel-max flips near-ties (docs/exactness.md). The user's
        # options={"deterministic": ...} wins; so does torch's own config.
        config_patches.setdefault("deterministic", True)
    user_pass = config_patches.get(
        "joint_custom_pre_pass", torch._inductor.config.joint_custom_pre_pass
    )
    config_patches["joint_custom_pre_pass"] = FlashSamplingPass(then=user_pass)
    if ahead.HANDOFF == "late":
        with ahead.backend_hands_off():
            return compile_fx(
                gm, example_inputs, inner_compile=_handing_off_first, config_patches=config_patches
            )
    return compile_fx(gm, example_inputs, config_patches=config_patches)


def _handing_off_first(gm: torch.fx.GraphModule, example_inputs: list[Any], **options) -> Any:
    """Inductor's inner compile, after the compile ahead is handed the calls the pass kept
    (``FLASHSAMPLING_COMPILE_AHEAD_HANDOFF=late``, the default): it starts after the joint
    graph passes, before the post-grad passes and codegen (~13 s on an H200 at B = 1; the
    children's compiles took ~10 s there)."""
    from torch._inductor.compile_fx import compile_fx_inner

    from . import ahead

    ahead.hand_off()
    return compile_fx_inner(gm, example_inputs, **options)


# Names in a traced graph's calls that a sampling site of the catalog calls (a miss only
# leaves the compile ahead's children to start when the pass has rewritten a call).
_SAMPLING_CALLS = ("multinomial", "argmax", "exponential", "sample", "rand", "topk", "max")


def _on_cuda(example_inputs: list[Any]) -> bool:
    return any(isinstance(value, torch.Tensor) and value.is_cuda for value in example_inputs)


def _may_sample(gm: torch.fx.GraphModule) -> bool:
    """Whether Dynamo's graph calls something a sampling site calls (by name)."""
    for node in gm.graph.nodes:
        if node.op in ("call_function", "call_method"):
            name = node.target if isinstance(node.target, str) else repr(node.target)
            if any(call in name for call in _SAMPLING_CALLS):
                return True
    return False


def _register() -> None:
    """Make ``backend="flashsampling"`` work after ``import flashsampling_inductor``.

    An installed package declares the name as an entry point, which dynamo loads and
    registers itself on first use; registering it here too would be a duplicate.
    """
    if BACKEND_NAME not in entry_points(group="torch_dynamo_backends").names:
        register_backend(flashsampling_backend, name=BACKEND_NAME)


def _trace_the_gather_relayout() -> None:
    """Let Dynamo trace the re-layout inside the functional collectives' ``all_gather_tensor``.

    Gathering along the vocabulary (``gather_dim=-1``) ends in ``torch._utils.
    _maybe_view_chunk_cat``, which torch before 2.13 marks as never traced: Dynamo breaks the
    graph there, the gather and the sampling land in different graphs, and the TP pass cannot
    rewrite them. torch 2.13 traces it through a rule in ``trace_rules``; older versions get
    the same rule here, so users need not change their code.
    """
    from torch._dynamo import trace_rules
    from torch._dynamo.variables import UserFunctionVariable

    name = "torch._utils._maybe_view_chunk_cat"
    if name in trace_rules.manual_torch_name_rule_map:
        return
    if not hasattr(torch._utils, name.rsplit(".", 1)[1]):
        return
    trace_rules.manual_torch_name_rule_map[name] = UserFunctionVariable
    trace_rules.get_torch_obj_rule_map.cache_clear()  # rebuilt from the rules on next use


_register()
_trace_the_gather_relayout()
