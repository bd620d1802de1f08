"""Registers, spills and shared memory of every stage-1 and tail kernel that plain sampling
and off-valued 0-d knobs compile at B rows, as this machine's Triton made them (issue 35
item 2: what carrying both epilogues costs stage 1). One GPU; a line per compiled kernel.

    python benchmarks/jobs/knobs9_regs.py [--batches 1,16,64] [--hidden-size 2048]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

SHOWN = (
    "PLAIN", "TOP_M", "BATCH_TRUNCATES", "AWAIT_LAST", "SIGNAL_DEPENDENTS", "BLOCK_B", "BLOCK_V",
    "maxnreg", "num_warps", "TOP_K_MODE", "PDL",
)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--hidden-size", type=int, default=2048)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("knobs9_regs.py needs a CUDA GPU: nothing to run here")
        return
    from flashsampling_inductor import fused_sample, launch

    weight = torch.randn(151936, args.hidden_size, device="cuda", dtype=torch.bfloat16)
    off = dict(
        top_k=torch.tensor(0, device="cuda"), top_p=torch.tensor(1.0, device="cuda"),
        min_p=torch.tensor(0.0, device="cuda"),
    )  # fmt: skip
    for batch in (int(b) for b in args.batches.split(",")):
        hidden = torch.randn(batch, args.hidden_size, device="cuda", dtype=torch.bfloat16)
        common = dict(
            temperature=torch.tensor(0.7, device="cuda"), seed=torch.tensor(7, device="cuda")
        )
        fused_sample(hidden, weight, **common)
        fused_sample(hidden, weight, **common, **off)
    torch.cuda.synchronize()
    for key, compiled in launch._compiled.items():
        kernel = key[0]
        name = getattr(getattr(kernel, "fn", kernel), "__name__", "?")
        settings = {
            item[0]: item[1]
            for item in key[2:]
            if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
        }
        shown = " ".join(f"{k}={settings[k]}" for k in SHOWN if k in settings)
        try:
            compiled._init_handles()
        except Exception:  # noqa: BLE001 (report what is there)
            pass
        regs = getattr(compiled, "n_regs", "?")
        spills = getattr(compiled, "n_spills", "?")
        shared = getattr(getattr(compiled, "metadata", None), "shared", "?")
        print(f"{name}: regs={regs} spills={spills} shared={shared} | {shown}", flush=True)


if __name__ == "__main__":
    main()
