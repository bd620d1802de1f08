"""The truncating kernels compile for Hopper (sm_90a) without a GPU.

The interpreter runs these kernels as Python, so it accepts code the compiler rejects (a
constexpr reassigned inside a ``static_range`` passed the CPU tests once and failed
``triton.compile``); this compiles stage 1 with the soft-cap and top-m candidates, their merge
per group of tiles, both stage-2 variants of rows without top-k (top-p's pruned wide search,
min-p) and the fallback, with Triton's own ptxas, as ``benchmarks/probes/kernel_sass.py`` does for
plain stage 1.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from flashsampling_inductor import hopper_kernel

SCRIPT = r"""
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from flashsampling_inductor import sampling_kernel, truncation_kernel

HOPPER = GPUTarget("cuda", 90, 32)


def compile_kernel(kernel, signature, constants, **options):
    signature = {**signature, **{name: "constexpr" for name in constants}}
    constexprs = {(kernel.arg_names.index(n),): v for n, v in constants.items()}
    triton.compile(ASTSource(kernel, signature, constexprs), target=HOPPER, options=options)


knob_modes = dict(TEMPERATURE_MODE=2, SEED_MODE=2, TOP_K_MODE=0, TOP_P_MODE=2, MIN_P_MODE=2)
stage2 = {
    "key_ptr": "*i32", "index_ptr": "*i32", "hidden_key_ptr": "*i32", "mass_ptr": "*fp32",
    "temperature_ptr": "*fp32", "seed_ptr": "*i64", "top_p_ptr": "*fp32", "min_p_ptr": "*fp32",
    "out_ptr": "*i64", "overflow_ptr": "*i32", "floor_ptr": "*i32", "compact_key_ptr": "*i32",
    "compact_index_ptr": "*i32", "tile_hidden_ptr": "*i32", "patch_tile_ptr": "*i32",
    "patch_count_ptr": "*i32", "patch_key_ptr": "*i32", "patch_index_ptr": "*i32",
    "num_candidates": "i32", "num_tiles": "i32", "num_plain_tiles": "i32",
    "num_patch_tiles": "i32", "num_mass_tiles": "i32", "V": "i32",
    "scalar_temperature": "fp32", "seed_lo": "i64", "seed_hi": "i64", "scalar_top_k": "i64",
    "scalar_top_p": "fp32", "scalar_min_p": "fp32", "num_samples": "i32", "num_merged": "i32",
    "num_groups": "i32", "route_k_max": "i32",
}
# What every stage-2 variant below shares: per-row temperature, seed, top-p and min-p (no
# top-k), mass partials.
stage2_shared = dict(
    plain_score_ptr=None, plain_index_ptr=None, top_k_ptr=None, **knob_modes,
    log_mass_ptr=None, plain_value_ptr=None, logprob_ptr=None, LOGPROBS=0,  # no logprobs asked
    RAW_LOGIT_LATER=False, PLAIN_BLOCK=16, PREFETCH_PLAIN=False,
    HAS_PLAIN=False, FAST_MATH=True, COMPACT=2048, PDL=True, merged_key_ptr=None,
    merged_index_ptr=None, merged_hidden_ptr=None, merged_mass_ptr=None, MERGED_BLOCK=0,
    MERGED_COMPACT=16, NUCLEUS_NARROW=False, P_WHOLE_ROW=False,
)


def compile_stage2(signature=stage2, num_warps=16, **constants):
    # (a pointer the signature names is an argument, not the shared None)
    shared = {k: v for k, v in stage2_shared.items() if k not in signature}
    compile_kernel(
        truncation_kernel._truncated_stage2, signature, {**shared, **constants},
        num_warps=num_warps,
    )


first_pass = dict(compact_value_ptr=None, HAS_MASS=True, COMPLETE=False, SINGLE=True, PACK=2048)
# Stage 2 over stage 1's per-tile candidates in registers, listing hiding tiles to patch.
compile_stage2(
    **first_pass, BLOCK=16384, PATCHED=False, PATCH_TILES=16, PATCH_V=64, KEY_LOW_BITS=16
)
# A patched row's second pass: stage 1's candidates with 16 recomputed 128-wide tiles.
compile_stage2(
    **first_pass, BLOCK=8192, PATCHED=True, PATCH_TILES=16, PATCH_V=128, KEY_LOW_BITS=0
)
# The same on merged candidates: 64 groups of 32 in 2048 lanes (no packing there); also
# with the nucleus bound narrowed, two bits a pass (NUCLEUS_NARROW), bf16 and fp32 keys.
for narrow, low_bits in ((False, 16), (True, 16), (True, 0)):
    compile_stage2(
        **first_pass, BLOCK=2048, PATCHED=False, PATCH_TILES=16, PATCH_V=64,
        KEY_LOW_BITS=low_bits, NUCLEUS_NARROW=narrow, num_warps=8,
    )
# Per-row knobs that may be off (continuous batching: every knob a [B] tensor): untruncated
# rows drawn from stage 1's plain candidates first, then top-k per row; also with the
# processed log-probabilities transformers' return_logprobs asks for.
plain = {**stage2, "plain_score_ptr": "*fp32", "plain_index_ptr": "*i32", "top_k_ptr": "*i64"}
with_plain = dict(
    TOP_K_MODE=2, HAS_PLAIN=True,
    PLAIN_BLOCK=2048, BLOCK=16384, PATCHED=False, PATCH_TILES=16, PATCH_V=64, KEY_LOW_BITS=16,
)
compile_stage2(plain, **first_pass, **with_plain)
compile_stage2(plain, **first_pass, **with_plain, PREFETCH_PLAIN=True)
# A per-row k tensor: each row from the merged groups (64 of 32 in 2048 lanes) or, past
# route_k_max, from the per-tile candidates.
compile_stage2(
    {**plain, "merged_key_ptr": "*i32", "merged_index_ptr": "*i32", "merged_hidden_ptr": "*i32",
     "merged_mass_ptr": "*fp32"},
    **first_pass, **with_plain, PREFETCH_PLAIN=True, MERGED_BLOCK=2048, MERGED_COMPACT=2048,
)
compile_stage2(
    {**plain, "log_mass_ptr": "*fp32", "plain_value_ptr": "*fp32", "logprob_ptr": "*fp32"},
    **first_pass, **with_plain, LOGPROBS=2,
)
# Top-p over the whole row's mass next to a per-row top-k (SGLang's order: P_WHOLE_ROW).
compile_stage2(plain, **{**first_pass, **with_plain, "P_WHOLE_ROW": True})
# The fallback's stage 2 over V = 151936 logits, read in chunks and packed above the floor.
compile_stage2(
    {**stage2, "key_ptr": "*fp32", "compact_value_ptr": "*fp32"},
    tile_hidden_ptr=None, patch_tile_ptr=None, patch_count_ptr=None, patch_key_ptr=None,
    patch_index_ptr=None, HAS_MASS=False, COMPLETE=True, SINGLE=False, BLOCK=16384,
    PACK=16384, PATCHED=False, PATCH_TILES=0, PATCH_V=16, KEY_LOW_BITS=0,
)
# Both fallback passes in one launch (patched rows over stage 1's candidates and 16
# recomputed 128-wide tiles, whole rows over V logits), as per-row knobs take them.
fallback_stage2 = {
    "key_ptr": "*i32", "index_ptr": "*i32", "mass_ptr": "*fp32", "compact_key_ptr": "*i32",
    "compact_index_ptr": "*i32", "patch_tile_ptr": "*i32", "patch_count_ptr": "*i32",
    "patch_key_ptr": "*i32", "patch_index_ptr": "*i32", "logits_ptr": "*fp32",
    "full_compact_key_ptr": "*i32", "full_compact_index_ptr": "*i32",
    "full_compact_value_ptr": "*fp32", "temperature_ptr": "*fp32", "seed_ptr": "*i64",
    "top_k_ptr": "*i64", "top_p_ptr": "*fp32", "min_p_ptr": "*fp32", "out_ptr": "*i64",
    "overflow_ptr": "*i32", "floor_ptr": "*i32", "num_candidates": "i32", "num_tiles": "i32",
    "num_mass_tiles": "i32", "V": "i32", "scalar_temperature": "fp32", "seed_lo": "i64",
    "seed_hi": "i64", "scalar_top_k": "i64", "scalar_top_p": "fp32", "scalar_min_p": "fp32",
    "num_samples": "i32",
}
# (also with top-p measured on the whole row's mass: P_WHOLE_ROW)
for whole_row in (False, True):
    compile_kernel(
        truncation_kernel._fallback_stage2, fallback_stage2,
        dict(log_mass_ptr=None, logprob_ptr=None, **{**knob_modes, "TOP_K_MODE": 2},
             HAS_MASS=True, FAST_MATH=True, PATCHED_SINGLE=True, PATCHED_BLOCK=16384,
             PATCHED_COMPACT=2048, PATCH_TILES=16, PATCH_V=128, KEY_LOW_BITS=0,
             COMPLETE_SINGLE=False, COMPLETE_BLOCK=16384, COMPLETE_COMPACT=2048, PACK=16384,
             PDL=True, LOGPROBS=0, RAW_LOGIT_LATER=False, NUCLEUS_NARROW=True,
             P_WHOLE_ROW=whole_row),
        num_warps=16,
    )
# Stage 1's candidates merged per group of tiles for stage 2 (mass partials included).
merge = {
    "key_ptr": "*i32", "index_ptr": "*i32", "hidden_key_ptr": "*i32", "mass_ptr": "*fp32",
    "temperature_ptr": "*fp32", "merged_key_ptr": "*i32", "merged_index_ptr": "*i32",
    "merged_hidden_ptr": "*i32", "merged_mass_ptr": "*fp32", "num_tiles": "i32",
    "tiles_per_group": "i32", "scalar_temperature": "fp32", "scalar_top_k": "i64",
    "scalar_top_p": "fp32", "scalar_min_p": "fp32", "V": "i32", "route_k_max": "i32",
}
compile_kernel(
    truncation_kernel._merge_tiles, merge,
    dict(top_k_ptr=None, top_p_ptr=None, min_p_ptr=None, TEMPERATURE_MODE=2, HAS_MASS=True,
         TOP_M=4, KEEP=32, BLOCK=256, TILE_BLOCK=64, KEY_LOW_BITS=16, PDL=True, ROUTED=False,
         PLAIN_ROWS=False, TOP_K_MODE=0, TOP_P_MODE=0, MIN_P_MODE=0),
    num_warps=2,
)
# Only the rows a per-row k tensor routes to the merged candidates, and of those the
# truncated ones.
compile_kernel(
    truncation_kernel._merge_tiles,
    {**merge, "top_k_ptr": "*i64", "top_p_ptr": "*fp32", "min_p_ptr": "*fp32"},
    dict(TEMPERATURE_MODE=1, HAS_MASS=True, TOP_M=6, KEEP=32, BLOCK=256, TILE_BLOCK=64,
         KEY_LOW_BITS=16, PDL=True, ROUTED=True, PLAIN_ROWS=True, TOP_K_MODE=1, TOP_P_MODE=1,
         MIN_P_MODE=1),
    num_warps=1,
)
# The same letting the next kernel be scheduled before it waits (PDL 2: TAIL_TRIGGER_FIRST).
compile_kernel(
    truncation_kernel._merge_tiles,
    {**merge, "top_k_ptr": "*i64", "top_p_ptr": "*fp32", "min_p_ptr": "*fp32"},
    dict(TEMPERATURE_MODE=1, HAS_MASS=True, TOP_M=6, KEEP=32, BLOCK=256, TILE_BLOCK=64,
         KEY_LOW_BITS=16, PDL=2, ROUTED=True, PLAIN_ROWS=True, TOP_K_MODE=1, TOP_P_MODE=1,
         MIN_P_MODE=1),
    num_warps=1,
)
stage1 = {
    "hidden_ptr": "*bf16", "weight_ptr": "*bf16", "temperature_ptr": "*fp32",
    "seed_ptr": "*i64", "top_m_key_ptr": "*i32", "top_m_index_ptr": "*i32",
    "hidden_key_ptr": "*i32", "mass_ptr": "*fp32", "B": "i32", "V": "i32", "D": "i32",
    "stride_hb": "i32", "stride_hd": "i32", "stride_wv": "i32", "stride_wd": "i32",
    "scalar_temperature": "fp32", "seed_lo": "i64", "seed_hi": "i64", "num_samples": "i32",
    "vocab_offset": "i32", "softcap": "fp32",
}
stage1_constants = dict(
    hidden_desc=None, weight_desc=None, bias_ptr=None, cand_score_ptr=None,
    cand_index_ptr=None, HAS_BIAS=False, HAS_SOFTCAP=True, TEMPERATURE_MODE=2, SEED_MODE=2,
    LOGITS_DTYPE=None, DOT_PRECISION="ieee", SWAP_AB=True, USE_TMA=False, EPILOGUE_CHUNKS=1,
    EVEN_D=True, EVEN_V=False, INTERPRETER=False, BLOCK_B=16, BLOCK_V=64, BLOCK_D=128,
    PLAIN=False, TOP_M=4, ROW_MASS=True, KEY_LOW_BITS=0, cand_value_ptr=None, log_mass_ptr=None,
    LOGPROBS=0, top_k_ptr=None, top_p_ptr=None, min_p_ptr=None, TOP_K_MODE=0, TOP_P_MODE=0,
    MIN_P_MODE=0, BATCH_TRUNCATES=0, SIGNAL_DEPENDENTS=False, WAIT_PREVIOUS=False,
    LOGITS_IN=False,
)
compile_kernel(sampling_kernel._sample_stage1, stage1, stage1_constants, num_warps=4, num_stages=4)
# sample_logits: the tiles of written logits read, not computed (LOGITS_IN), plain and top-m.
for plain in (True, False):
    compile_kernel(
        sampling_kernel._sample_stage1,
        {**stage1, "cand_score_ptr": "*fp32", "cand_index_ptr": "*i32"} if plain else stage1,
        {key: value for key, value in stage1_constants.items()
         if not (plain and key in ("cand_score_ptr", "cand_index_ptr"))}
        | dict(LOGITS_IN=True, SWAP_AB=False, BLOCK_B=32, BLOCK_V=256, BLOCK_D=16,
               PLAIN=plain, TOP_M=0 if plain else 4, ROW_MASS=not plain, HAS_SOFTCAP=False),
        num_warps=4, num_stages=1,
    )  # fmt: skip
# Per-row knobs that may be off: both epilogues, each where a row of the tile needs it.
compile_kernel(
    sampling_kernel._sample_stage1,
    {**stage1, "cand_score_ptr": "*fp32", "cand_index_ptr": "*i32", "top_k_ptr": "*i64",
     "top_p_ptr": "*fp32", "min_p_ptr": "*fp32"},
    {key: value for key, value in stage1_constants.items()
     if key not in ("cand_score_ptr", "cand_index_ptr", "top_k_ptr", "top_p_ptr", "min_p_ptr")}
    | dict(PLAIN=True, TOP_M=8, TOP_K_MODE=2, TOP_P_MODE=1, MIN_P_MODE=2),
    num_warps=4, num_stages=4,
)
# The same split in two launches (dispatch._split_stage1): the plain kernel that runs only
# if no row of the batch is truncated, then both epilogues only if some row is.
for plain_half in (True, False):
    compile_kernel(
        sampling_kernel._sample_stage1,
        {**stage1, "cand_score_ptr": "*fp32", "cand_index_ptr": "*i32", "top_k_ptr": "*i64",
         "top_p_ptr": "*fp32", "min_p_ptr": "*fp32"},
        {key: value for key, value in stage1_constants.items()
         if key not in ("cand_score_ptr", "cand_index_ptr", "top_k_ptr", "top_p_ptr",
                        "min_p_ptr")}
        | dict(PLAIN=True, TOP_M=0 if plain_half else 8, ROW_MASS=not plain_half,
               TOP_K_MODE=2, TOP_P_MODE=1, MIN_P_MODE=2, BATCH_TRUNCATES=2 - plain_half),
        num_warps=4, num_stages=4,
    )
# bf16 logits without a soft-cap: the top-m search on keys packed with their column; also
# with the mass partials' maximum from the largest key (ROW_MASS 2: MASS_MAX_FROM_TOP_KEY),
# and that on fp32 keys.
for row_mass, low_bits in ((True, 16), (2, 16), (2, 0)):
    compile_kernel(
        sampling_kernel._sample_stage1, stage1,
        {**stage1_constants, "HAS_SOFTCAP": False, "LOGITS_DTYPE": tl.bfloat16,
         "KEY_LOW_BITS": low_bits, "ROW_MASS": row_mass},
        num_warps=4, num_stages=4,
    )
fallback = {
    "hidden_ptr": "*bf16", "weight_ptr": "*bf16", "overflow_ptr": "*i32",
    "scratch_ptr": "*fp32", "patch_tile_ptr": "*i32", "patch_count_ptr": "*i32",
    "patch_key_ptr": "*i32", "patch_index_ptr": "*i32", "B": "i32", "V": "i32", "D": "i32",
    "stride_hb": "i32", "stride_hd": "i32", "stride_wv": "i32", "stride_wd": "i32",
    "softcap": "fp32", "num_full_programs": "i32",
}
compile_kernel(
    truncation_kernel._fallback_logits, fallback,
    dict(bias_ptr=None, HAS_BIAS=False, LOGITS_DTYPE=None, HAS_SOFTCAP=True,
         DOT_PRECISION="ieee", INTERPRETER=False, BLOCK_B=16, BLOCK_V=128, BLOCK_D=64,
         SCAN=256, PATCH_TILES=16, PATCH_V=128, PDL=True, LOGITS_IN=False),
    num_warps=4, num_stages=3,
)
compile_kernel(  # (sample_logits: the written logits read, not recomputed)
    truncation_kernel._fallback_logits, fallback,
    dict(bias_ptr=None, HAS_BIAS=False, LOGITS_DTYPE=None, HAS_SOFTCAP=False,
         DOT_PRECISION="ieee", INTERPRETER=False, BLOCK_B=16, BLOCK_V=128, BLOCK_D=64,
         SCAN=256, PATCH_TILES=16, PATCH_V=128, PDL=True, LOGITS_IN=True),
    num_warps=4, num_stages=3,
)
# Tensor parallelism with top-k: one shard's masked draw over its materialized logits.
masked = {
    "logits_ptr": "*fp32", "threshold_ptr": "*fp32", "temperature_ptr": "*fp32",
    "seed_ptr": "*i64", "score_ptr": "*fp32", "index_ptr": "*i32", "V": "i32",
    "vocab_start": "i32", "num_chunks": "i32", "num_samples": "i32",
}
for seed_mode in (1, 2):
    compile_kernel(
        truncation_kernel._masked_gumbel_argmax, masked,
        dict(SEED_MODE=seed_mode, FAST_MATH=True, BLOCK_V=1024), num_warps=4,
    )
# Plain sampling's stage 2 (a programmatic dependent launch, as every kernel after stage 1).
compile_kernel(
    sampling_kernel._sample_stage2,
    {"cand_score_ptr": "*fp32", "cand_index_ptr": "*i32", "out_ptr": "*i64",
     "num_candidates": "i32", "scalar_temperature": "fp32", "num_samples": "i32"},
    dict(out_score_ptr=None, cand_value_ptr=None, log_mass_ptr=None, logprob_ptr=None,
         temperature_ptr=None, HAS_SCORE=False, BLOCK_C=4096, PDL=True, LOGPROBS=0,
         TEMPERATURE_MODE=0), num_warps=4,
)
# Every knob tensor of a call checked in one kernel (op.py, knob_check.py).
from flashsampling_inductor import knob_check

knob_check_signature = {
    "temperature_ptr": "*fp32", "top_k_ptr": "*i64", "top_p_ptr": "*fp32", "min_p_ptr": "*fp32",
    "ok_ptr": "*i32", "temperature_count": "i32", "top_k_count": "i32", "top_p_count": "i32",
    "min_p_count": "i32", "temperature_stride": "i32", "top_k_stride": "i32",
    "top_p_stride": "i32", "min_p_stride": "i32", "longest": "i32",
}
compile_kernel(
    knob_check._all_in_range, knob_check_signature, dict(BLOCK=1024, MESSAGE=""), num_warps=4
)
# ... with the verdict asserted in the kernel (knob_check.FUSED_ASSERT, Triton's debug option)
compile_kernel(
    knob_check._all_in_range, {k: v for k, v in knob_check_signature.items() if k != "ok_ptr"},
    dict(ok_ptr=None, BLOCK=1024, MESSAGE="flashsampling: top_p must be in (0, 1] in every row"),
    num_warps=4, debug=True,
)
print("compiled")
"""


def test_truncating_kernels_compile_for_hopper():
    """Stage 1 (soft-cap, top-m, mass partials), stage 2 (per-row top-p and min-p, no
    top-k; on candidates in registers, and the fallback's over V in chunks), the
    fallback's logits (soft-cap, MMA tiles), the TP shard's masked draw and plain
    stage 2 compile for sm_90a, the kernels after stage 1 as programmatic dependents."""
    _compile_in_a_child(SCRIPT)


GLUON_SCRIPT = r"""
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource

from flashsampling_inductor import hopper_kernel as hk, hopper_swap_kernel as sk

kernel = hk._hopper_stage1
pointers = {"seed_ptr": "*i64", "cand_index_ptr": "*i32", "top_m_key_ptr": "*i32",
            "top_m_index_ptr": "*i32", "hidden_key_ptr": "*i32", "top_k_ptr": "*i64"}
no_knobs = dict(top_k_ptr=None, top_p_ptr=None, min_p_ptr=None, TOP_K_MODE=0, TOP_P_MODE=0,
                MIN_P_MODE=0)
layout_64 = hk._shared_layout(64, torch.bfloat16)
layout_v = hk._shared_layout(hk.BLOCK_V, torch.bfloat16)
base = dict(
    HAS_BIAS=True, TEMPERATURE_MODE=2, SEED_MODE=2, LOGITS_DTYPE=hk.gl.bfloat16, EVEN_V=False,
    STAGES=hk.STAGES[64], CONSUMER_REGISTERS=hk.CONSUMER_REGISTERS,
    LOADER_REGISTERS=hk.LOADER_REGISTERS, BATCH_TRUNCATES=0, WIDE_MMA=False,
    WAIT_PREVIOUS=False, SIGNAL_DEPENDENTS=False, AWAIT_LAST=False,
)
variants = [
    dict(PLAIN=False, TOP_M=4, ROW_MASS=False, KEY_LOW_BITS=16, **no_knobs),  # top-k 50
    # per row: each epilogue where a row of the tile needs it
    dict(PLAIN=True, TOP_M=8, ROW_MASS=True, KEY_LOW_BITS=0, LOGITS_DTYPE=None, TOP_K_MODE=2,
         TOP_P_MODE=2, MIN_P_MODE=1),
    # the same split in two launches (dispatch._split_stage1): the plain half, the other
    dict(PLAIN=True, TOP_M=0, ROW_MASS=False, KEY_LOW_BITS=0, TOP_K_MODE=1, TOP_P_MODE=1,
         MIN_P_MODE=0, BATCH_TRUNCATES=1, TEMPERATURE_MODE=0),
    dict(PLAIN=True, TOP_M=8, ROW_MASS=True, KEY_LOW_BITS=16, TOP_K_MODE=1, TOP_P_MODE=1,
         MIN_P_MODE=1, BATCH_TRUNCATES=2),
    # ... as programmatic dependents (dispatch.GLUON_SPLIT_PDL)
    dict(PLAIN=True, TOP_M=0, ROW_MASS=False, KEY_LOW_BITS=0, TOP_K_MODE=1, TOP_P_MODE=1,
         MIN_P_MODE=0, BATCH_TRUNCATES=1, TEMPERATURE_MODE=0, SIGNAL_DEPENDENTS=True),
    dict(PLAIN=True, TOP_M=8, ROW_MASS=True, KEY_LOW_BITS=16, TOP_K_MODE=1, TOP_P_MODE=1,
         MIN_P_MODE=1, BATCH_TRUNCATES=2, AWAIT_LAST=True),
    # greedy (the noise scale's zeros: a layout passed on, which Triton 3.6 once rejected)
    dict(PLAIN=True, TOP_M=0, ROW_MASS=False, KEY_LOW_BITS=0, TEMPERATURE_MODE=3, SEED_MODE=0,
         **no_knobs),
    # one m64n128 MMA a step (WIDE_MMA): plain, and top-k 50
    dict(PLAIN=True, TOP_M=0, ROW_MASS=False, KEY_LOW_BITS=0, WIDE_MMA=True, **no_knobs),
    dict(PLAIN=False, TOP_M=4, ROW_MASS=False, KEY_LOW_BITS=16, WIDE_MMA=True, **no_knobs),
    # top-p alone: the mass partials with their own maximum (1) or the largest key's (2:
    # MASS_MAX_FROM_TOP_KEY), packed bf16 and fp32 keys
    dict(PLAIN=False, TOP_M=4, ROW_MASS=1, KEY_LOW_BITS=16, **no_knobs),
    dict(PLAIN=False, TOP_M=4, ROW_MASS=2, KEY_LOW_BITS=16, **no_knobs),
    dict(PLAIN=False, TOP_M=4, ROW_MASS=2, KEY_LOW_BITS=0, LOGITS_DTYPE=None, **no_knobs),
    # the TP step's (tp.py): a programmatic dependent of the seed's draw that signals the
    # exchange after it (WAIT_PREVIOUS, SIGNAL_DEPENDENTS), on the wide MMA
    dict(PLAIN=True, TOP_M=0, ROW_MASS=False, KEY_LOW_BITS=0, WIDE_MMA=True, SEED_MODE=1,
         WAIT_PREVIOUS=True, SIGNAL_DEPENDENTS=True, **no_knobs),
]
for variant in variants:
    constants = {**base, **variant}
    signature = {}
    for name in kernel.arg_names:
        if name in constants:
            signature[name] = "constexpr"
        elif name == "h_desc":
            signature[name] = f"tensordesc<bf16[64, {hk.BLOCK_D}],{layout_64!r}>"
        elif name == "w_desc":
            signature[name] = f"tensordesc<bf16[{hk.BLOCK_V}, {hk.BLOCK_D}],{layout_v!r}>"
        elif name.endswith("_ptr"):
            signature[name] = pointers.get(name, "*fp32")
        else:
            signature[name] = "fp32" if name == "scalar_temperature" else "i32"
    constexprs = {(kernel.arg_names.index(n),): v for n, v in constants.items()}
    ptx = triton.compile(
        GluonASTSource(kernel, signature, constexprs), target=GPUTarget("cuda", 90, 32),
        options={"num_warps": 4},
    ).asm["ptx"]
    wait = constants["WAIT_PREVIOUS"]
    assert ("griddepcontrol.wait" in ptx) == (wait or constants["AWAIT_LAST"])
    assert ("griddepcontrol.launch_dependents" in ptx) == constants["SIGNAL_DEPENDENTS"]
    if wait:  # (before any load or copy: the kernel before it may write what it reads)
        first_read = min(ptx.find(op) for op in ("ld.global", "cp.async.bulk") if op in ptx)
        assert ptx.index("griddepcontrol.wait") < first_read, "a read before the wait"

# The swapped kernel (hopper_swap_kernel, 129-256 rows), a second accumulator of 32 rows.
kernel = sk._swapped_stage1
extra = sk.extra_rows(150)
swap_base = dict(
    HAS_BIAS=True, TEMPERATURE_MODE=2, SEED_MODE=2, LOGITS_DTYPE=hk.gl.bfloat16, EVEN_V=False,
    STAGES=sk._stages(extra), NB=extra, COOP=False, WIDE_TILE=False, SWIZZLE=False,
    CONSUMER_REGISTERS=hk.CONSUMER_REGISTERS, LOADER_REGISTERS=hk.LOADER_REGISTERS,
    PLAIN=True, TOP_M=0, ROW_MASS=False, KEY_LOW_BITS=0, BATCH_TRUNCATES=0,
)
# plain, then knob tensors that may be off (both epilogues, the second half of a split stage 1;
# swizzled staging), a truncating call alone, greedy on the cooperative schedule, and the
# plain half of a split stage 1 (dispatch.SWAP_SPLIT / SWAP_PLAIN_HALF), and plain sampling on
# 128-entry tiles (the "ping-pong-wide" schedule)
swap_variants = [
    dict(**no_knobs),
    dict(PLAIN=True, TOP_M=8, ROW_MASS=True, KEY_LOW_BITS=0, LOGITS_DTYPE=None, TOP_K_MODE=1,
         TOP_P_MODE=1, MIN_P_MODE=1, SWIZZLE=True, BATCH_TRUNCATES=2),
    dict(PLAIN=False, TOP_M=3, ROW_MASS=False, KEY_LOW_BITS=16, NB=8, STAGES=sk._stages(8),
         **no_knobs),
    dict(TEMPERATURE_MODE=3, SEED_MODE=0, COOP=True, STAGES=sk._stages(extra, True), **no_knobs),
    dict(TOP_K_MODE=1, TOP_P_MODE=2, MIN_P_MODE=1, BATCH_TRUNCATES=1),
    dict(WIDE_TILE=True, STAGES=sk._stages(extra, True), **no_knobs),
]
for variant in swap_variants:
    constants = {**swap_base, **variant}
    w_rows = (1 + (constants["COOP"] or constants["WIDE_TILE"])) * sk.VOCAB_TILE
    boxes = {"ha_desc": sk.MAIN_ROWS, "hb_desc": constants["NB"], "w_desc": w_rows}
    signature = {}
    for name in kernel.arg_names:
        if name in constants:
            signature[name] = "constexpr"
        elif name in boxes:
            layout = hk._shared_layout(boxes[name], torch.bfloat16)
            signature[name] = f"tensordesc<bf16[{boxes[name]}, {sk.BLOCK_D}],{layout!r}>"
        elif name.endswith("_ptr"):
            signature[name] = pointers.get(name, "*fp32")
        else:
            signature[name] = "fp32" if name == "scalar_temperature" else "i32"
    constexprs = {(kernel.arg_names.index(n),): v for n, v in constants.items()}
    triton.compile(
        GluonASTSource(kernel, signature, constexprs), target=GPUTarget("cuda", 90, 32),
        options={"num_warps": 4},
    )
print("compiled")
"""


def test_hopper_truncating_epilogue_compiles():
    """The Gluon stage 1 with its top-m epilogue (packed bf16 keys; fp32 keys with the mass
    partials and the sampling epilogue beside it, as per-row knobs need) and the swapped
    stage 1 of 129-256 rows (hopper_swap_kernel: per-row temperatures and seeds, bias,
    rounded logits, a ragged vocabulary) compile for sm_90a: Gluon has no interpreter, so
    this is the CPU's only check of that code."""
    if not hopper_kernel.AVAILABLE:
        pytest.skip("this Triton has no Gluon")
    _compile_in_a_child(GLUON_SCRIPT)


def _compile_in_a_child(script: str) -> None:
    """Run ``script`` in a fresh interpreter without TRITON_INTERPRET (this process may have
    it set, and the compiler must see real kernels); it prints "compiled" at its end."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    child = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=root
    )
    assert child.returncode == 0, child.stderr[-3000:]
    assert "compiled" in child.stdout
