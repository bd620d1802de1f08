"""What one block-wide step of a stage-2 search costs inside one program (CUDA only): a
loop of R dependent steps over a row of N int32 keys in registers, per kind of step, at
8 and 16 warps; the kernel's device time (CUDA events around 20 launches, one program) over
R, us. Tells a search's passes apart from the rest of stage 2 (benchmarks/probes/
stage2_phases.py) and prices the alternatives to a bit-by-bit search.

    python benchmarks/probes/reduction_cost.py

Steps: sum1 (count of keys >= a trial: one int32 sum, a one-bit pass of _kth_key), sum3i64
(three counts packed in an int64: a two-bit pass of its NARROW search), fsum (a float mass
above a trial: a one-bit pass of _nucleus_bound), fsum3 (three masses, one tuple reduce: a
two-bit pass of its NARROW), fsum7 (seven masses: a three-bit pass), hist256 (tl.histogram of
an 8-bit digit of the masked keys, then a cumsum over the bins and a count: a radix-select
pass), sort (tl.sort of the row, descending, then a cumsum of weights: a whole nucleus),
empty (the loop alone).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _add3(a0, b0, c0, a1, b1, c1):
    return a0 + a1, b0 + b1, c0 + c1


@triton.jit
def _add7(a0, b0, c0, d0, e0, f0, g0, a1, b1, c1, d1, e1, f1, g1):
    return a0 + a1, b0 + b1, c0 + c1, d0 + d1, e0 + e1, f0 + f1, g0 + g1


@triton.jit
def _above(keys, weights, trial, step: tl.constexpr):
    return tl.where(keys >= trial + step * 1024, weights, 0.0)


@triton.jit
def _steps(key_ptr, out_ptr, R, N: tl.constexpr, KIND: tl.constexpr):
    offs = tl.arange(0, N)
    keys = tl.load(key_ptr + offs)
    weights = tl.exp2((keys & 1023).to(tl.float32) * -0.01)
    bound = tl.full((), 0, tl.int32)
    acc = tl.zeros((), tl.float32)
    for r in range(R):
        trial = bound + (r & 255) * 4096
        if KIND == 0:
            count = tl.sum((keys >= trial).to(tl.int32))
            bound = tl.where(count >= N // 2, trial, bound - 1)
        elif KIND == 1:
            one = tl.full((), 1, tl.int64)
            counts = tl.sum(
                (keys >= trial).to(tl.int64)
                + ((keys >= trial + 1024).to(tl.int64) << 16)
                + ((keys >= trial + 2048).to(tl.int64) << 32)
            )
            bound = tl.where((counts & 0xFFFF) >= N // 2, trial, bound - 1) + (
                (counts >> 32) & one
            ).to(tl.int32)
        elif KIND == 2:
            mass = tl.sum(tl.where(keys >= trial, weights, 0.0))
            bound = tl.where(mass >= 10.0, trial, bound - 1)
        elif KIND == 3:
            m0, m1, m2 = tl.reduce(
                (_above(keys, weights, trial, 0), _above(keys, weights, trial, 1),
                 _above(keys, weights, trial, 2)), 0, _add3,
            )  # fmt: skip
            bound = tl.where(m0 + m1 + m2 >= 10.0, trial, bound - 1)
        elif KIND == 4:
            m0, m1, m2, m3, m4, m5, m6 = tl.reduce(
                (_above(keys, weights, trial, 0), _above(keys, weights, trial, 1),
                 _above(keys, weights, trial, 2), _above(keys, weights, trial, 3),
                 _above(keys, weights, trial, 4), _above(keys, weights, trial, 5),
                 _above(keys, weights, trial, 6)), 0, _add7,
            )  # fmt: skip
            bound = tl.where(m0 + m1 + m2 + m3 + m4 + m5 + m6 >= 10.0, trial, bound - 1)
        elif KIND == 5:
            digit = (keys >> 8) & 255
            hist = tl.histogram(digit, 256, mask=keys >= trial)
            above = tl.cumsum(hist, 0)
            count = tl.sum((above >= N // 4).to(tl.int32))
            bound = tl.where(count >= 8, trial, bound - 1)
        elif KIND == 6:
            sorted_keys = tl.sort(keys + bound, 0, descending=True)
            mass = tl.cumsum(tl.exp2((sorted_keys & 1023).to(tl.float32) * -0.01), 0)
            bound = tl.sum((mass >= 10.0).to(tl.int32))
        else:
            bound = bound + 1
        acc += bound.to(tl.float32)
    tl.store(out_ptr, acc)


KINDS = ["sum1", "sum3i64", "fsum", "fsum3", "fsum7", "hist256", "sort", "empty"]


def main() -> None:
    if not torch.cuda.is_available():
        print("reduction_cost.py needs a CUDA GPU: nothing to run here")
        return
    out = torch.empty(1, device="cuda")
    print(f"{torch.cuda.get_device_name()}: us per step (one program; R = 1024 and 256 steps)")
    print("N     warps " + " ".join(f"{k:>8s}" for k in KINDS))
    for n in (1024, 2048):
        keys = torch.randint(0, 2**20, (n,), dtype=torch.int32, device="cuda")
        for warps in (8, 16):
            row = []
            for kind in range(len(KINDS)):
                times = []
                try:
                    for steps in (1024, 256):
                        _steps[(1,)](keys, out, steps, N=n, KIND=kind, num_warps=warps)
                        torch.cuda.synchronize()
                        start, end = torch.cuda.Event(True), torch.cuda.Event(True)
                        start.record()
                        for _ in range(20):
                            _steps[(1,)](keys, out, steps, N=n, KIND=kind, num_warps=warps)
                        end.record()
                        torch.cuda.synchronize()
                        times.append(start.elapsed_time(end) * 1e3 / 20)
                    row.append(f"{(times[0] - times[1]) / 768:8.3f}")
                except Exception as error:  # (a kind this Triton cannot compile)
                    row.append(f"{'err':>8s}")
                    print(f"  {KINDS[kind]}: {type(error).__name__}: {str(error)[:200]}")
            print(f"{n:5d} {warps:5d} " + " ".join(row), flush=True)


if __name__ == "__main__":
    main()
