"""Compile the swapped Hopper stage 1 (hopper_swap_kernel) for sm_90a on any machine and print
its registers, spill stack, shared memory and SASS instruction count per schedule.

    python benchmarks/probes/swap_kernel_sass.py [--batches 144,160,192] [--hidden-size 4096]
        [--schedules ping-pong,ping-pong-wide] [--forms plain,greedy,rowsT,k50bf16,p09bf16]

No GPU needed (Triton ships ptxas and cuobjdump); the figures are the installed Triton's (the
GPU machines run Triton 3.6, this repository's CPU set-up 3.9). A consumer holding more
registers than it may (``hopper_kernel.CONSUMER_REGISTERS``) spills: STACK > 0.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

if os.environ.get("TRITON_INTERPRET") == "1":
    raise SystemExit("unset TRITON_INTERPRET: this compiles the kernel for a real GPU")

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a plain checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_sass import describe  # noqa: E402  (this folder)

from flashsampling_inductor import hopper_kernel as hk  # noqa: E402
from flashsampling_inductor import hopper_swap_kernel as sk  # noqa: E402

POINTERS = {
    "seed_ptr": "*i64", "cand_index_ptr": "*i32", "top_m_key_ptr": "*i32",
    "top_m_index_ptr": "*i32", "hidden_key_ptr": "*i32", "top_k_ptr": "*i64",
}  # fmt: skip
NO_KNOBS = dict(
    top_k_ptr=None, top_p_ptr=None, min_p_ptr=None, TOP_K_MODE=0, TOP_P_MODE=0, MIN_P_MODE=0
)
FORMS = {  # the constexprs of each kind of call (no bias, one sample)
    "plain": dict(TEMPERATURE_MODE=0, SEED_MODE=1),
    "greedy": dict(TEMPERATURE_MODE=3, SEED_MODE=0),
    "rowsT": dict(TEMPERATURE_MODE=2, SEED_MODE=2),
    "k50bf16": dict(PLAIN=False, TOP_M=4, KEY_LOW_BITS=16, LOGITS_DTYPE=hk.gl.bfloat16),
    "p09bf16": dict(
        PLAIN=False, TOP_M=4, ROW_MASS=True, KEY_LOW_BITS=16, LOGITS_DTYPE=hk.gl.bfloat16
    ),
}


def compile_swapped(batch: int, hidden_size: int, schedule: str, form: str):
    kernel = sk._swapped_stage1
    extra = sk.extra_rows(batch)
    coop, wide = schedule == "cooperative", schedule == "ping-pong-wide"
    constants = dict(
        HAS_BIAS=False, TEMPERATURE_MODE=0, SEED_MODE=1, LOGITS_DTYPE=None, EVEN_V=False,
        STAGES=sk._stages(extra, coop or wide), NB=extra, COOP=coop, WIDE_TILE=wide,
        SWIZZLE=sk.swizzled(batch, hidden_size), CONSUMER_REGISTERS=hk.CONSUMER_REGISTERS,
        LOADER_REGISTERS=hk.LOADER_REGISTERS, PLAIN=True, TOP_M=0, ROW_MASS=False,
        KEY_LOW_BITS=0, BATCH_TRUNCATES=0, **NO_KNOBS,
    )  # fmt: skip
    constants.update(FORMS[form])
    boxes = {
        "ha_desc": sk.MAIN_ROWS, "hb_desc": extra, "w_desc": (1 + (coop or wide)) * sk.VOCAB_TILE
    }  # fmt: skip
    signature = {}
    for name in kernel.arg_names:
        if name in constants:
            signature[name] = "constexpr"
        elif name in boxes:
            layout = hk._shared_layout(boxes[name], torch.bfloat16)
            signature[name] = f"tensordesc<bf16[{boxes[name]}, {sk.BLOCK_D}],{layout!r}>"
        elif name.endswith("_ptr"):
            signature[name] = POINTERS.get(name, "*fp32")
        else:
            signature[name] = "fp32" if name == "scalar_temperature" else "i32"
    constexprs = {(kernel.arg_names.index(n),): v for n, v in constants.items()}
    from triton.experimental.gluon._runtime import GluonASTSource

    source = GluonASTSource(kernel, signature, constexprs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", default="144,160,192")
    parser.add_argument("--hidden-size", type=int, default=4096)
    parser.add_argument("--schedules", default="ping-pong,ping-pong-wide")
    parser.add_argument("--forms", default="plain,greedy")
    args = parser.parse_args()
    if not hk.AVAILABLE:
        print("this Triton has no Gluon: nothing compiled")
        return
    print("triton", triton.__version__, "D", args.hidden_size)
    for batch in (int(b) for b in args.batches.split(",")):
        for schedule in args.schedules.split(","):
            for form in args.forms.split(","):
                resources, opcodes = describe(
                    compile_swapped(batch, args.hidden_size, schedule, form)
                )
                print(
                    f"B={batch} {schedule:15s} {form:8s} {resources} SASS {sum(opcodes.values())}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
