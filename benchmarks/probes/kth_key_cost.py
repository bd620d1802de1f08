"""What ``truncation_kernel._kth_key`` costs lifted out of stage 2 (CUDA only): one program
runs the search R times in a loop over a row's merged candidates in registers (each search's
k depends on the one before, so they cannot overlap), at stage 2's lanes and warps; the
kernel's device time (CUDA events around 20 launches) for R = 65 less R = 1, over 64, us a
search. Beside it the same loop with ``reduction_cost.py``'s two-bit step only, 5 of them a
search. Asked whether the search's 4.5 us inside stage 2 (stage2_phases.py) was the search's
own code or its place in the kernel: neither, those calls had fp32 logits, 12 passes where
these bf16 keys take 4 (docs/performance.md, "Stage 2's searches").

    python benchmarks/probes/kth_key_cost.py
"""

from __future__ import annotations

import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from flashsampling_inductor.truncation_kernel import _kth_key  # noqa: E402


@triton.jit
def _searches(key_ptr, out_ptr, R, k0, N: tl.constexpr, LOW_BITS: tl.constexpr,
              KIND: tl.constexpr):  # fmt: skip
    keys = tl.load(key_ptr + tl.arange(0, N))
    bound = tl.full((), 0, tl.int32)
    for _ in range(R):
        k = k0 + (bound & 1).to(tl.int64)
        if KIND == 0:
            bound = _kth_key(keys, k, LOW_BITS, True)
        elif KIND == 1:
            bound = _kth_key(keys, k, LOW_BITS, False)
        else:
            # five two-bit steps, as reduction_cost.py's sum3i64
            for step in range(5):
                trial = bound + step * 65536
                counts = tl.sum(
                    (keys >= trial).to(tl.int64)
                    + ((keys >= trial + 1024).to(tl.int64) << 16)
                    + ((keys >= trial + 2048).to(tl.int64) << 32)
                )
                bound = tl.where((counts & 0xFFFF) >= k, trial, bound - 1)
    tl.store(out_ptr, bound)


def merged_row_keys(std: float, groups: int = 64, keep: int = 15, vocab: int = 151936):
    """Ordered int32 keys of a std-``std`` bf16 row's merged candidates: each group's ``keep``
    largest, as stage 2 sees them for a Python top-k <= 64 (KEY_PAD past them)."""
    logits = (torch.randn(vocab) * std).to(torch.bfloat16).float()
    per_group = vocab // groups
    top = logits[: per_group * groups].view(groups, per_group).topk(keep, dim=1).values
    keys = top.flatten().contiguous().view(torch.int32)
    keys = torch.where(keys < 0, keys ^ 0x7FFFFFFF, keys)
    lanes = triton.next_power_of_2(keys.numel())
    pad = torch.full((lanes - keys.numel(),), -(2**31), dtype=torch.int32)
    return torch.cat([keys, pad]).cuda()


def time_us(kind, keys, R, warps, k=50):
    out = torch.empty(1, dtype=torch.int32, device="cuda")
    args = (keys, out, R, k)
    kw = dict(N=keys.numel(), LOW_BITS=16, KIND=kind, num_warps=warps)
    _searches[(1,)](*args, **kw)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        _searches[(1,)](*args, **kw)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / 20


def main() -> None:
    if not torch.cuda.is_available():
        print("kth_key_cost.py needs a CUDA GPU: nothing to run here")
        return
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()}: us a search (R = 65 less R = 1, over 64)")
    print("lanes warps  narrow  one-bit  5 x two-bit steps")
    for std in (5.0,):
        keys = merged_row_keys(std)
        for warps in (4, 8, 16):
            cells = []
            for kind in (0, 1, 2):
                t1, t65 = time_us(kind, keys, 1, warps), time_us(kind, keys, 65, warps)
                cells.append(f"{(t65 - t1) / 64:7.3f}")
            print(f"{keys.numel():5d} {warps:5d}  " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
