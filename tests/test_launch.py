"""The fast launcher's specialization key (flashsampling_inductor/launch.py): a cached kernel
must never meet arguments Triton would have compiled another kernel for. The launch itself
runs on CUDA only (the GPU tests take it on every call after the first)."""

from __future__ import annotations

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from flashsampling_inductor import sampling_device, truncation_kernel
from flashsampling_inductor.launch import _argument_key, _key


def test_key_separates_what_triton_specializes_on():
    base = torch.zeros(64, dtype=torch.float32)
    assert _argument_key(base) != _argument_key(base[1:])  # 16-byte alignment
    assert _argument_key(base) != _argument_key(base.int())  # dtype
    assert _argument_key(base) == _argument_key(torch.ones(8))
    keys = {_argument_key(v) for v in (1, 2, 16, 32, 2**31, -(2**31) - 1, 2**63)}
    assert len(keys) == 6  # 1; 2; 16 and 32 alike; two int64s (one divides by 16); uint64
    assert _argument_key(True) != _argument_key(1)
    assert _argument_key(0.5) == _argument_key(2.0)
    assert _argument_key(None) == ("none",)


class _Kernel:
    """A stand-in for a JITFunction: its signature's names, hashable by identity."""

    arg_names = ["w", "n", "BLOCK"]


def test_key_of_descriptors_and_unknown_arguments():
    weight = torch.zeros(256, 64, dtype=torch.bfloat16)
    a = TensorDescriptor.from_tensor(weight, [64, 64])
    b = TensorDescriptor.from_tensor(weight, [128, 64])
    assert _argument_key(a) != _argument_key(b)
    assert _argument_key(a) == _argument_key(TensorDescriptor.from_tensor(weight.clone(), [64, 64]))
    assert _argument_key(object()) is None
    kernel = _Kernel()
    assert _key(kernel, 0, (weight, object()), {"BLOCK": 64}) is None  # Triton's own path
    block_64, block_32 = ({"BLOCK": block} for block in (64, 32))
    assert _key(kernel, 0, (weight, 3), block_64) != _key(kernel, 0, (weight, 3), block_32)
    assert _key(kernel, 0, (weight, 3), {"BLOCK": [64]}) is None  # unhashable
    # An argument left to its default: the fast path could not pass it, so Triton binds it.
    assert _key(kernel, 0, (weight, 3), {}) is None
    assert _key(kernel, 0, (weight, 3), {"BLOCK": 64, "num_warps": 4}) is not None


def test_programmatic_dependent_launch_is_off_off_hopper_and_when_asked(monkeypatch):
    """The kernels after stage 1 go out as programmatic dependents only on CUDA sm_90+ with a
    Triton that has launch_pdl: never on the interpreter, never with FLASHSAMPLING_PDL=0,
    and the launch option is part of the fast launcher's key."""
    assert sampling_device.pdl_launch(torch.device("cpu")) == {"PDL": False}
    monkeypatch.setenv("FLASHSAMPLING_PDL", "0")
    sampling_device._pdl_supported.cache_clear()
    try:
        # (decided before asking CUDA anything: this runs on CPU-only machines too)
        assert sampling_device.pdl_launch(torch.device("cuda", 0)) == {"PDL": False}
    finally:
        sampling_device._pdl_supported.cache_clear()
    kernel, weight = _Kernel(), torch.zeros(4)
    on = {"BLOCK": 64, "PDL": True, "launch_pdl": True}
    assert _key(kernel, 0, (weight, 3), on) != _key(kernel, 0, (weight, 3), {"BLOCK": 64})


def test_the_truncating_tail_schedules_its_next_kernel_first_up_to_64_rows(monkeypatch):
    """Where PDL is on, the kernels after a truncating stage 1 go out with PDL 2 (the next
    kernel's programs scheduled before each waits: TAIL_TRIGGER_FIRST) up to
    TAIL_TRIGGER_FIRST_ROWS_MAX rows, where it was measured, and wait-then-signal above;
    TAIL_TRIGGER_FIRST off keeps the latter everywhere. Off CUDA, PDL stays off."""
    assert truncation_kernel._tail_pdl(torch.device("cpu"), 1) == {"PDL": False}
    monkeypatch.setattr(sampling_device, "_pdl_supported", lambda device: True)
    cuda = torch.device("cuda", 0)
    assert truncation_kernel._tail_pdl(cuda, 64) == {"PDL": 2, "launch_pdl": True}
    assert truncation_kernel._tail_pdl(cuda, 65) == {"PDL": True, "launch_pdl": True}
    monkeypatch.setattr(truncation_kernel, "TAIL_TRIGGER_FIRST", False)
    assert truncation_kernel._tail_pdl(cuda, 1) == {"PDL": True, "launch_pdl": True}


def test_every_launch_of_a_call_takes_the_fast_path(monkeypatch):
    """Every kernel parameter is passed at every launch of the op's host code, so that
    ``launch`` keys it: one left to its default sends that launch through Triton's own path
    every call (stage 1's PDL and LOGITS_IN switches did so: 0.1-0.3 ms of an eager call's
    host time on an H200, benchmarks/probes/eager_host_time.py). The launches are recorded,
    not made (the kernels' results do not matter here), for plain, truncating, per-row,
    log-probability and written-logits calls."""
    import flashsampling_inductor as fs
    from flashsampling_inductor import (
        exchange,
        hopper_kernel,
        hopper_swap_kernel,
        knob_check,
        sampling_kernel,
        tp_truncation,
    )

    unkeyed = []

    def record(kernel, grid, *args, **kwargs):
        if _key(kernel, 0, args, kwargs) is None:
            names = kernel.arg_names[len(args) :]
            unkeyed.append((kernel.__name__, [name for name in names if name not in kwargs]))

    modules = (exchange, hopper_kernel, hopper_swap_kernel, knob_check, sampling_kernel,
               tp_truncation, truncation_kernel)  # fmt: skip
    for module in modules:
        monkeypatch.setattr(module, "launch", record)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # (impl="triton" on CPU tensors)
    torch.manual_seed(0)
    hidden, weight = torch.randn(3, 64), torch.randn(700, 64)
    rows = torch.tensor([0, 20, 5])
    forms = [
        {}, {"temperature": 0.0}, {"top_k": 50}, {"top_p": 0.9}, {"min_p": 0.1},
        {"top_k": 20, "top_p": 0.9, "return_logprobs": "processed"},
        {"top_k": rows, "temperature": torch.tensor([0.5, 1.0, 0.0])},
        {"softcap": 30.0, "return_logprobs": "raw", "num_samples": 2},
    ]  # fmt: skip
    for knobs in forms:
        fs.fused_sample(hidden, weight, seed=1, impl="triton", **knobs)
        fs.sample_logits(hidden @ weight.T, seed=1, impl="triton", **knobs)
    assert not unkeyed, unkeyed
