"""Stage-2 choices of the truncating calls at B <= 128 (issue 38 item 1: top-p alone, and
top-k / top-p / min-p at <= 1.05x of cuBLAS), old against new in one process, with each
variant's tokens checked against its mode's default (they must not depend on the choice).

    python benchmarks/probes/truncation_ab.py [--budget 60] [--rounds 3] [--out-dir DIR]
        [--batches 1,64,128] [--shapes 2048x151936] [--modes p09,k50p09] [--variants wide,...]

Per shape and batch size, cuBLAS ``hidden @ W.T`` and, per mode (``p09`` top-p 0.9 alone,
``k50p09`` top-k 50 + top-p 0.9, ``k50`` top-k 50, ``minp`` min-p 0.1, ``plain``; Python
scalars, a 0-d device seed, bf16 logits as a bf16 LM head's rewrite passes), the default and
each variant of ``VARIANTS`` that applies to it (module flags set around the call only, so
the graph capture and every replay see them). Logits of std 5 (~3.6 nats, as bench_sampling's
--logit-std 5). CUDA-graph medians, round-robin over ``--rounds`` in a shuffled order; a CSV
row per timing (``truncation_ab.csv``) and a summary line per point (each provider's fastest
round over cuBLAS's fastest). Points are skipped once ``--budget`` seconds are near. Needs a
CUDA GPU (without one it says so and exits 0).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a plain checkout
from ab_rounds import flags, time_rounds  # noqa: E402  (this folder)

from flashsampling_inductor import (  # noqa: E402
    dispatch,
    fused_sample,
    hopper_kernel,
    sampling_kernel,
    truncation_kernel,
)

START = time.time()
MODES = {
    "p09": dict(top_p=0.9),
    "k50p09": dict(top_k=50, top_p=0.9),
    "k50": dict(top_k=50),
    "minp": dict(min_p=0.1),
    "plain": {},
}
# name -> (the modes it applies to, [(module, attribute, value)])
# (each variant sets a module flag against today's default; before 2026-11-28 12:30 the
# narrowed search and the key's maximum were the opt-ins, timed as "narrow" and "massmax";
# topp8's round 2 then timed onebit / massreduced / nopatch / warps4, topp9's round 1 (13:51
# UTC) and round 2 (14:16) the levers of ROUND_1_VARIANTS and VARIANTS, five of which are
# defaults since: VARIANTS undo them)
ONE_BIT = (truncation_kernel, "NUCLEUS_NARROW", False)
MASS_REDUCED = (sampling_kernel, "MASS_MAX_FROM_TOP_KEY", False)
NO_PATCH = (dispatch, "patching_pays", lambda params: False)
SWAP_32 = (dispatch, "TRUNCATING_SWAP_ROWS_MAX", 32)
GLUON_MASS_OWN_MAX = (hopper_kernel, "MASS_MAX_FROM_TOP_KEY", False)
NARROW_MMA = (dispatch, "TRUNCATING_WIDE_MMA_65_128", False)
WARPS_8 = (truncation_kernel, "STAGE2_WARPS_WITHOUT_TOP_K", 8)
ROWS_64 = (dispatch, "TRUNCATING_TILE_ROWS_65_128", 64)
ALL = tuple(MODES)
VARIANTS = {
    "swap32": (ALL, [SWAP_32]),  # 17-32 rows on swap-AB Triton tiles, as before
    "gluonmass1": (("p09",), [GLUON_MASS_OWN_MAX]),  # the Gluon partials' own maximum
    "narrowmma": (ALL, [NARROW_MMA]),  # 65-128 rows: two m64n64 MMAs a step, as before
    "warps8": (("p09", "minp"), [WARPS_8]),  # eight stage-2 warps without top-k, as before
    # 65-128 rows on 64-row tiles, as before (top-p alone keeps them: MASS_TILE_ROWS_65_128)
    "rows64": (("k50p09", "minp", "k50", "plain"), [ROWS_64]),
    "before": (ALL, [SWAP_32, GLUON_MASS_OWN_MAX, NARROW_MMA, WARPS_8, ROWS_64]),  # all five
    # 65-128 rows: top-p alone on 128-row tiles too (round 2: 1.46-1.47x against 1.15-1.17x)
    "masstiles128": (("p09",), [(dispatch, "MASS_TILE_ROWS_65_128", 128)]),
}
ROUND_1_VARIANTS = {
    # (round 2, 14:16 UTC: even at B = 1 / 16, not taken) the Triton stage 1's (<= 16 rows)
    # mass sum reduced with the largest key left out
    # top-p / min-p on the heaviest (kept) merged candidates when that few hold them
    "compact256": (("p09", "minp"), [(truncation_kernel, "MERGED_COMPACT_SLOTS", 256)]),
    "compact512": (("p09", "minp"), [(truncation_kernel, "MERGED_COMPACT_SLOTS", 512)]),
    # ... with the narrowed nucleus search, where only the heaviest few weigh
    "compact256narrow": (
        ("p09",),
        [
            (truncation_kernel, "MERGED_COMPACT_SLOTS", 256),
            (truncation_kernel, "NUCLEUS_NARROW", True),
        ],
    ),
    "warps16": (("k50p09",), [(truncation_kernel, "STAGE2_WARPS", 16)]),
    # the Gluon stage 1 (33-64 rows) with one m64n128 MMA a k step
    "wide": (ALL, [(hopper_kernel, "WIDE_MMA", True)]),
}
# Variants that change nothing outside these rows (first, last).
ROWS = {
    "swap32": (17, 32), "gluonmass1": (17, 128), "narrowmma": (65, 128), "wide": (17, 64),
    "rows64": (65, 128), "masstiles128": (65, 128),
}  # fmt: skip
TOPP8_VARIANTS = {
    "onebit": (("k50p09",), [ONE_BIT]),  # stage 2's nucleus search one bit a pass
    "massreduced": (("p09",), [MASS_REDUCED]),  # the mass partials' own max (B <= 16)
    "nopatch": (("p09", "minp"), [NO_PATCH]),  # no tile-level fallback: one launch less
    "warps4": (("p09", "k50p09", "minp"), [(truncation_kernel, "STAGE2_WARPS", 4)]),
}


def providers(batch, hidden, weight, modes, seed, variants):
    timed = {"matmul": lambda: hidden @ weight.T}
    for mode in modes:
        knobs = MODES[mode]

        def call(settings=(), knobs=knobs):
            def run():
                with flags(settings):
                    return fused_sample(
                        hidden, weight, logits_dtype=torch.bfloat16, seed=seed, **knobs
                    )

            return run

        timed[f"{mode}_default"] = call()
        for name, (applies, settings) in variants.items():
            first, last = ROWS.get(name, (1, batch))
            if first <= batch <= last and mode in applies:
                timed[f"{mode}_{name}"] = call(settings)
    return timed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--budget", type=float, default=60.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out-dir", default=".")
    parser.add_argument("--batches", default="1,64,128")
    parser.add_argument("--shapes", default="2048x151936")
    parser.add_argument("--modes", default="p09,k50p09")
    parser.add_argument(
        "--variants", default=",".join(VARIANTS),
        help="names of VARIANTS, ROUND_1_VARIANTS or TOPP8_VARIANTS",
    )  # fmt: skip
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("truncation_ab.py needs a CUDA GPU; there is none here: nothing run")
        return
    modes = args.modes.split(",")
    known = VARIANTS | ROUND_1_VARIANTS | TOPP8_VARIANTS
    variants = {name: known[name] for name in args.variants.split(",") if name}
    seed = torch.tensor(7, device="cuda")
    failures = time_rounds(
        args.shapes,
        args.batches,
        lambda batch, hidden, weight: providers(batch, hidden, weight, modes, seed, variants),
        lambda name: name.split("_", 1)[0],  # (a mode's default, then its variants)
        rounds=args.rounds,
        out_dir=args.out_dir,
        stem="truncation_ab",
        budget=args.budget,
        start=START,
    )
    print(f"done in {time.time() - START:.0f} s; token mismatches: {failures}")


if __name__ == "__main__":
    main()
