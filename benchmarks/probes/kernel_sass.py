"""Compile stage 1 for Hopper (sm_90a) on any machine and show what ptxas made of it.

    python benchmarks/probes/kernel_sass.py [--batch 256] [--hidden-size 2048] [--top 12]

No GPU needed: Triton ships ptxas, nvdisasm and cuobjdump. For ``default_config(batch)`` on
an H100/H200 it prints, sampling at T = 1 and greedy (the same kernel with the noise off),
the registers and spill stack per thread, the shared memory and the SASS instructions per
thread by opcode. Sampling minus greedy is the noise's cost per tile: the number to lower
while the noise is bound by instruction issue (docs/performance.md).

The counts come from the Triton installed here. Triton 3.9 (this repository's CPU set-up)
does not software-pipeline the pointer-load path of the small-batch configs the way the GPU
machine's Triton 3.6 does, so for those its registers and spills are not what runs. The
large-batch (TMA) configs are pipelined by both, but spills still differ (128 against 16
bytes of stack for the large-batch kernel before the cheaper noise): read them as relative.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

if os.environ.get("TRITON_INTERPRET") == "1":
    raise SystemExit("unset TRITON_INTERPRET: this compiles the kernel for a real GPU")

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a plain checkout
from flashsampling_inductor import dispatch, sampling_kernel  # noqa: E402

NVIDIA_BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
HOPPER = GPUTarget("cuda", 90, 32)
VOCAB = 151936
# The runtime arguments of _sample_stage1 as the op passes them for bf16 inputs.
RUNTIME_SIGNATURE = {
    "hidden_ptr": "*bf16", "weight_ptr": "*bf16", "bias_ptr": "*bf16",
    "temperature_ptr": "*fp32", "seed_ptr": "*i64",
    "cand_score_ptr": "*fp32", "cand_index_ptr": "*i32",
    "B": "i32", "V": "i32", "D": "i32",
    "stride_hb": "i32", "stride_hd": "i32", "stride_wv": "i32", "stride_wd": "i32",
    "scalar_temperature": "fp32", "seed_lo": "i64", "seed_hi": "i64", "num_samples": "i32",
    "vocab_offset": "i32", "softcap": "fp32",
}  # fmt: skip


def compile_stage1(config: dispatch.SampleConfig, hidden_size: int, greedy: bool):
    """The compiled kernel for this config: one sample, a device seed, no bias."""
    kernel = sampling_kernel._sample_stage1
    signature = dict(RUNTIME_SIGNATURE)
    constants = {
        "HAS_BIAS": False,
        "HAS_SOFTCAP": False,
        "TEMPERATURE_MODE": 3 if greedy else 0,
        "SEED_MODE": 1,
        "LOGITS_DTYPE": None,
        "DOT_PRECISION": "ieee",
        "SWAP_AB": config.swap_ab,
        "USE_TMA": config.tma,
        "EPILOGUE_CHUNKS": config.epilogue_chunks,
        "EVEN_D": hidden_size % config.block_d == 0,
        "EVEN_V": VOCAB % config.block_v == 0,
        "INTERPRETER": False,
        "BLOCK_B": config.block_b,
        "BLOCK_V": config.block_v,
        "BLOCK_D": config.block_d,
    }
    if config.tma:
        signature["hidden_desc"] = f"tensordesc<bf16[{config.block_b}, {config.block_d}]>"
        signature["weight_desc"] = f"tensordesc<bf16[{config.block_v}, {config.block_d}]>"
    else:
        constants.update(hidden_desc=None, weight_desc=None)
    # Plain sampling: no truncation buffers (truncation_kernel.py).
    constants.update(
        top_m_key_ptr=None, top_m_index_ptr=None, hidden_key_ptr=None, mass_ptr=None,
        PLAIN=True, TOP_M=0, ROW_MASS=False, KEY_LOW_BITS=0,
        # No logprobs asked (return_logprobs=None): the plain call's stage 1.
        cand_value_ptr=None, log_mass_ptr=None, LOGPROBS=0,
        top_k_ptr=None, top_p_ptr=None, min_p_ptr=None, TOP_K_MODE=0, TOP_P_MODE=0,
        MIN_P_MODE=0, BATCH_TRUNCATES=0, SIGNAL_DEPENDENTS=False, WAIT_PREVIOUS=False,
        LOGITS_IN=False,
    )  # fmt: skip
    signature.update({name: "constexpr" for name in constants})
    source = ASTSource(
        fn=kernel,
        signature=signature,
        constexprs={(kernel.arg_names.index(name),): value for name, value in constants.items()},
    )
    options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
    if config.maxnreg:
        options["maxnreg"] = config.maxnreg
    return triton.compile(source, target=HOPPER, options=options)


def describe(compiled) -> tuple[str, collections.Counter]:
    """(registers / stack / shared line, SASS opcode counts) of a compiled kernel."""
    with tempfile.TemporaryDirectory() as folder:
        cubin = Path(folder) / "stage1.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        usage = subprocess.run(
            [NVIDIA_BIN / "cuobjdump", "--dump-resource-usage", cubin],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        sass = subprocess.run(
            [NVIDIA_BIN / "nvdisasm", cubin], capture_output=True, text=True, check=True
        ).stdout
    resources = " ".join(
        word
        for line in usage.splitlines()
        if "REG:" in line
        for word in line.split()
        if word.startswith(("REG:", "STACK:", "SHARED:"))
    )
    opcodes = collections.Counter()
    for line in sass.splitlines():
        # "/*0120*/  @!P0 IMAD.WIDE.U32 R4, ..." -> IMAD
        match = re.match(r"\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
        if match:
            opcodes[match.group(1)] += 1
    return f"{resources} dynamic-shared:{compiled.metadata.shared}", opcodes


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--batch", type=int, default=256, help="rows, which pick default_config (default 256)"
    )
    parser.add_argument("--hidden-size", type=int, default=2048, help="D (default 2048)")
    parser.add_argument("--top", type=int, default=12, help="opcodes to list")
    args = parser.parse_args()
    config = dispatch.default_config(args.batch, args.hidden_size, torch.device("cuda"))
    print(f"sm_90a, triton {triton.__version__}, B={args.batch} D={args.hidden_size}: {config}")
    counts = {}
    for name, greedy in (("sample", False), ("greedy", True)):
        resources, counts[name] = describe(compile_stage1(config, args.hidden_size, greedy))
        print(f"{name:7s} {sum(counts[name].values()):6d} instructions  {resources}")
    noise = counts["sample"].copy()
    noise.subtract(counts["greedy"])
    scores = config.block_b * config.block_v / (32 * config.num_warps)  # per thread per tile
    total = sum(noise.values())
    print(f"noise   {total:6d} instructions per thread per tile, {total / scores:.1f} per score")
    print("        " + ", ".join(f"{op} {n}" for op, n in noise.most_common(args.top)))


if __name__ == "__main__":
    main()
