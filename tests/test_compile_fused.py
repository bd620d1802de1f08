"""benchmarks/compile_fused.py compiles the sweep's kernels from fake tensors, beside another
job's timings on the same GPU: it must not make a CUDA context (520 MiB of an H200 each
process, 2026-11-28). Its steps' 0-d seed is ``torch.tensor(1234, device="cuda")``, which a
plain FakeTensorMode makes on the GPU for real wherever CUDA is available."""

from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensor

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def test_dry_run_mode_keeps_a_device_constant_fake(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_sampling
    import compile_fused

    # As on a GPU machine; a real CUDA tensor would then raise here (a CPU build of torch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with compile_fused.DryRunFakeMode():
        seed = bench_sampling.fused_seed(torch.device("cuda", 0))
    assert isinstance(seed, FakeTensor)
    assert seed.device == torch.device("cuda", 0)
