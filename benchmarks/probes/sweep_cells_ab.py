"""Single cells of a bench_sampling sweep on its inputs (--data-seed 0), each of the day's
levers set back one at a time, in one process (issue 38: the cells of the 14:49 H200 sweep
that were slower in us than at 06:29).

    python benchmarks/probes/sweep_cells_ab.py [--cells 2048x64xp09,8192x192xk50]
        [--budget 180] [--rounds 3] [--levers notrig,warps8] [--profile] [--out-dir DIR]

A cell is ``DxBxMODE`` (``p09`` top-p 0.9 alone, ``k50`` top-k 50, ``k50p09``, ``minp``
min-p 0.1: bench_sampling's fused_topp09 / fused_topk50 / ... providers). Inputs as
bench_sampling.py makes them with its default --data-seed 0 (its torch generator stream: the
copy bandwidth's 2**28 values, then per shape of D = 2048 / 4096 / 8192 the bf16 weight of
std-5 logits and one bf16 hidden per default batch size, in order), so a cell sees the very
rows such a sweep times; ``*_other`` times the default on other rows (ab_rounds' generator,
seeded 0) beside them. Calls as its providers make them: logits rounded to bf16
(``logits_dtype``), a fixed 0-d seed. Per cell cuBLAS, the default, the default once more
(``again``: the spread of one process) and each lever of ``LEVERS`` and ``EXTRA`` that
applies set back to before (module flags around the call only, so the graph capture and
every replay see them), and ``before``: all of them at once. CUDA-graph medians round-robin
(ab_rounds.time_rounds), tokens checked against the default's (``--levers``: only those
levers). Also per provider the rows stage 2 sent to the exact fallback in one call
(``sweep_cells_notes.txt``: full / patched), and with ``--profile`` the default's and
``before``'s kernels (torch.profiler). Needs a Hopper GPU (elsewhere it says so and exits
0).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a plain checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab_rounds import flags, kernel_times, time_rounds  # noqa: E402  (this folder)

from flashsampling_inductor import (  # noqa: E402
    dispatch,
    fused_sample,
    hopper_kernel,
    truncation_kernel,
)

START = time.time()
BENCH_SHAPES = ((2048, 151936), (4096, 151936), (8192, 128256))  # bench_sampling's order
BENCH_BATCHES = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 144, 160, 192, 224, 256)
MODES = {
    "p09": dict(top_p=0.9),
    "k50": dict(top_k=50),
    "k50p09": dict(top_k=50, top_p=0.9),
    "minp": dict(min_p=0.1),
}
FOUR_SLOTS = ("p09", "k50", "k50p09", "minp")  # (m = 4 candidates a tile: top-k <= 64 or none)


def _gluon_64_row_tiles(batch: int, mode: str) -> bool:
    """Whether today's default runs this cell on the Gluon kernel's 64-row tiles."""
    return 17 <= batch <= 64 or (64 < batch <= 128 and mode == "p09") or 128 < batch <= 192


# name -> (applies(batch, mode), [(module, attribute, value before)]): the levers of the
# commits between the 06:29 and 14:49 sweeps (11110da..d8e0a36) that change these cells
LEVERS = {
    # knobs9 (94316a6, 11c2249): PDL 2 on the kernels after stage 1, up to 64 rows
    "notrig": (
        lambda b, m: b <= truncation_kernel.TAIL_TRIGGER_FIRST_ROWS_MAX,
        [(truncation_kernel, "TAIL_TRIGGER_FIRST", False)],
    ),
    # topp9 (89d7b24): the Gluon mass partials' maximum from the top key
    "gluonmass1": (
        lambda b, m: b > 16 and m == "p09",
        [(hopper_kernel, "MASS_MAX_FROM_TOP_KEY", False)],
    ),
    # topp9 (89d7b24): 16 stage-2 warps for Python top-p / min-p alone
    "warps8": (
        lambda b, m: m in ("p09", "minp"),
        [(truncation_kernel, "STAGE2_WARPS_WITHOUT_TOP_K", 8)],
    ),
    # big9 (a7043f6): the packed top-m search at 4 slots on 64-row tiles (bf16 logits)
    "packed": (
        lambda b, m: m in FOUR_SLOTS and _gluon_64_row_tiles(b, m),
        [(hopper_kernel, "PACKED_TOP_M_MIN_64_ROWS", 0)],
    ),
    # big8 / big9 (6f50f86, 83e32e4): the stage 1 of 129-256 rows before the wide Gluon tiles
    "oldroute": (lambda b, m: b > 128, [(dispatch, "LARGE_BATCH_GLUON", False)]),
    # topp9 (d3b7235): 128-row tiles at 65-128 rows (not for top-p alone)
    "rows64": (
        lambda b, m: 64 < b <= 128 and m != "p09",
        [(dispatch, "TRUNCATING_TILE_ROWS_65_128", 64)],
    ),
}
# Not levers of that day: big10's from its round 1 (16:25 UTC), set back (at 193-256 rows top-p
# alone's mass partials on 128-row tiles, as the other truncating calls; above 128 rows 16
# stage-2 warps without top-k), and asked in round 1 (``wide64``: 64-row wide tiles at
# 193-256 rows for every mode)
EXTRA = {
    "wide64": (
        lambda b, m: b > 192 and m != "p09",
        [(dispatch, "_large_batch_gluon_rows", lambda batch, *args, **kwargs: 64)],
    ),
    "mass128": (lambda b, m: b > 192 and m == "p09", [(dispatch, "MASS_TILE_ROWS_193_256", 128)]),
    "warps16": (
        lambda b, m: b > 128 and m in ("p09", "minp"),
        [(truncation_kernel, "STAGE2_WARPS_WITHOUT_TOP_K_ROWS_MAX", 256)],
    ),
}


def bench_inputs() -> dict[int, tuple[torch.Tensor, dict[int, torch.Tensor]]]:
    """bench_sampling.py's weights and hidden states (--logit-std 5, default batches, its
    default --data-seed 0), drawn in its order: D -> (weight, {B: hidden}). (Before that
    seed, torch seeded each process at random: the rounds of 2026-11-28 16:25 / 16:44 / 17:2x
    timed other rows each, and none the 14:49 sweep's.)"""
    torch.manual_seed(0)  # (bench_sampling's --data-seed)
    torch.randn(2**28, device="cuda")  # (copy_bandwidth's source)
    drawn = {}
    for dim, vocab in BENCH_SHAPES:
        weight = torch.randn(vocab, dim, device="cuda", dtype=torch.bfloat16)
        weight.mul_(5 * dim**-0.5)
        drawn[dim] = (
            weight,
            {b: torch.randn(b, dim, device="cuda", dtype=torch.bfloat16) for b in BENCH_BATCHES},
        )
    return drawn


def parse_cells(text: str) -> list[tuple[int, int, str]]:
    cells = []
    for cell in text.split(","):
        dim, batch, mode = cell.split("x")
        if mode not in MODES:
            raise SystemExit(f"unknown mode {mode!r} in {cell!r}: one of {', '.join(MODES)}")
        cells.append((int(dim), int(batch), mode))
    return cells


def cell_providers(batch, hidden, weight, modes, seed, other_hidden, levers=None):
    """cuBLAS, then per mode the default, again, each applicable lever of ``levers`` (names
    of LEVERS and EXTRA; None: all) set back, all of LEVERS' at once (``before``) and the
    default on other rows (``<mode>other_default``)."""
    timed = {"matmul": lambda: hidden @ weight.T}
    for mode in modes:
        knobs = MODES[mode]

        def call(settings=(), rows=hidden, knobs=knobs):
            def run():
                with flags(settings):
                    return fused_sample(
                        rows, weight, logits_dtype=torch.bfloat16, seed=seed, **knobs
                    )

            return run

        timed[f"{mode}_default"] = call()
        timed[f"{mode}_again"] = call()
        applied = []
        for name, (applies, settings) in (LEVERS | EXTRA).items():
            if applies(batch, mode) and (levers is None or name in levers):
                timed[f"{mode}_{name}"] = call(settings)
                if name in LEVERS:
                    applied += settings
        if len(applied) > 1:
            timed[f"{mode}_before"] = call(applied)
        if other_hidden is not None:
            timed[f"{mode}other_default"] = call(rows=other_hidden)
    return timed


def fallback_rows(fn) -> str:
    """Rows stage 2 flagged in one call of ``fn``: "full/patched" (none: no stage 2)."""
    seen = []
    launch = truncation_kernel.launch_fallback

    def counting(*args, **kwargs):
        overflow = args[6]  # (the seventh argument)
        seen.append(f"{int((overflow == 1).sum())}/{int((overflow == 2).sum())}")
        return launch(*args, **kwargs)

    with flags([(truncation_kernel, "launch_fallback", counting)]):
        fn()
    return seen[0] if seen else "none"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--cells",
        default="2048x64xp09,2048x160xp09,2048x224xp09,8192x160xp09,8192x192xk50,4096x192xminp",
    )
    parser.add_argument("--budget", type=float, default=180.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--levers", help="names of LEVERS and EXTRA (default: all of them)")
    parser.add_argument("--out-dir", default=".")
    args = parser.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("sweep_cells_ab.py needs a Hopper GPU; there is none here: nothing run")
        return
    cells = parse_cells(args.cells)
    levers = set(args.levers.split(",")) if args.levers else None
    drawn = bench_inputs()
    other = torch.Generator(device="cuda").manual_seed(0)
    out = Path(args.out_dir)
    seed = torch.tensor(1234, dtype=torch.int64, device="cuda")  # (bench_sampling's)
    failures = 0
    notes = []
    for dim in dict.fromkeys(dim for dim, _, _ in cells):  # (shapes in the cells' order)
        vocab = dict(BENCH_SHAPES)[dim]
        weight, hiddens = drawn[dim]
        batches = list(dict.fromkeys(b for d, b, _ in cells if d == dim))
        modes_of = {b: [m for d, bb, m in cells if d == dim and bb == b] for b in batches}
        others = {
            b: torch.randn(b, dim, generator=other, device="cuda").bfloat16() for b in batches
        }
        providers = {}

        def make_timed(batch, hidden, weight, modes_of=modes_of, others=others, keep=providers):
            keep[batch] = cell_providers(
                batch, hidden, weight, modes_of[batch], seed, others[batch], levers
            )
            return dict(keep[batch])

        failures += time_rounds(
            f"{dim}x{vocab}",
            ",".join(map(str, batches)),
            make_timed,
            lambda name: name.split("_", 1)[0],
            rounds=args.rounds,
            out_dir=args.out_dir,
            stem=f"sweep_cells_ab_d{dim}",
            budget=args.budget - (8 if args.profile else 2) * len(batches),  # (then the notes)
            start=START,
            inputs=lambda d, v, bs, weight=weight, hiddens=hiddens: (
                weight,
                [hiddens[b] for b in bs],
            ),
        )
        for batch, timed in providers.items():
            for name, fn in timed.items():
                if name == "matmul" or time.time() - START > args.budget - 5:
                    continue
                notes.append(f"D={dim} B={batch} {name}: fallback rows {fallback_rows(fn)}")
                print(notes[-1], flush=True)
            if args.profile:
                for name in [n for n in timed if n.endswith(("_default", "_before"))]:
                    if time.time() - START > args.budget - 10:
                        continue
                    times = kernel_times(timed[name])
                    notes.append(f"D={dim} B={batch} {name}: {sum(u for _, u in times):.1f} us")
                    notes += [f"    {us:8.1f} us  {kernel}" for kernel, us in times[:7]]
                    print("\n".join(notes[-1 - min(7, len(times)) :]), flush=True)
        (out / "sweep_cells_notes.txt").write_text("\n".join(notes) + "\n")
        del weight, hiddens, providers
        drawn.pop(dim)
        torch.cuda.empty_cache()
    print(f"done in {time.time() - START:.0f} s; token mismatches: {failures}")


if __name__ == "__main__":
    main()
