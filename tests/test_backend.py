"""``flashsampling_backend``: the name, the mode and options, chaining a user's pass, and the
pass's cache key."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.backends.registry import lookup_backend
from torch._inductor.custom_graph_pass import CustomGraphPass

from flashsampling_inductor import backend, flashsampling_backend, patterns
from flashsampling_inductor.graph_pass import FlashSamplingPass

from .test_patterns import hidden, nanogpt


class _Spy(CustomGraphPass):
    """A user's own pass: records what it saw, then stops the compilation."""

    def __init__(self) -> None:
        self.saw_fused_call = None
        self.config = {}
        self.deterministic = None

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.saw_fused_call = "flashsampling.fused_sample" in str(graph)
        cfg = torch._inductor.config
        self.config = {"max_autotune": cfg.max_autotune, "cudagraphs": cfg.triton.cudagraphs}
        self.deterministic = getattr(cfg, "deterministic", None)
        raise RuntimeError("stop")

    def uuid(self) -> str:
        return "spy"


def _compile_until_spy(**compile_kwargs) -> None:
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed), torch.no_grad():
        torch.compile(nanogpt, fullgraph=True, **compile_kwargs)(hidden(3, 5, 24))


def test_backend_name_resolves():
    assert lookup_backend("flashsampling") is flashsampling_backend


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("reduce-overhead", {"max_autotune": False, "cudagraphs": True}),
        ("max-autotune", {"max_autotune": True, "cudagraphs": True}),
    ],
)
def test_mode_reaches_inductor_and_user_pass_is_chained(mode, expected):
    spy = _Spy()
    with torch._inductor.config.patch(joint_custom_pre_pass=spy):
        _compile_until_spy(backend="flashsampling", mode=mode)
    assert spy.saw_fused_call  # the user's pass runs after the rewrite
    assert spy.config == expected


def test_user_pass_in_options_is_chained():
    spy = _Spy()
    _compile_until_spy(backend=flashsampling_backend, options={"joint_custom_pre_pass": spy})
    assert spy.saw_fused_call


def test_uuid_follows_the_pattern_set_and_the_chained_pass(monkeypatch):
    base = FlashSamplingPass().uuid()
    assert base == FlashSamplingPass().uuid()
    assert FlashSamplingPass(then=_Spy()).uuid() not in (None, base)
    assert FlashSamplingPass(then=lambda graph: None).uuid() is None  # unknown: no caching
    monkeypatch.setattr(patterns, "source_hash", lambda: "another pattern set")
    assert FlashSamplingPass().uuid() != base


@pytest.mark.skipif(
    not hasattr(torch._inductor.config, "deterministic"), reason="no deterministic mode"
)
@pytest.mark.parametrize("mode", [None, "reduce-overhead", "max-autotune"])
def test_deterministic_mode_reaches_inductor(mode, monkeypatch):
    """FLASHSAMPLING_DETERMINISTIC=1: no kernel configuration chosen by timing (a reduction's
    RBLOCK and warps reorder its fp32 sums): the same seed draws the same tokens in every
    process."""
    monkeypatch.setattr(backend, "_DETERMINISTIC", True)
    spy = _Spy()
    with torch._inductor.config.patch(joint_custom_pre_pass=spy):
        _compile_until_spy(backend="flashsampling", mode=mode)
    assert spy.deterministic is True
    assert torch._inductor.config.deterministic is False  # (only while compiling)


def test_inductors_timing_is_kept_by_default():
    """Opt-in, as in stock Inductor: the mode changes the whole step's kernels."""
    spy = _Spy()
    _compile_until_spy(backend=flashsampling_backend, options={"joint_custom_pre_pass": spy})
    assert not spy.deterministic


def test_options_keep_inductors_timing(monkeypatch):
    monkeypatch.setattr(backend, "_DETERMINISTIC", True)
    spy = _Spy()
    options = {"joint_custom_pre_pass": spy, "deterministic": False}
    _compile_until_spy(backend=flashsampling_backend, options=options)
    assert spy.deterministic is False
