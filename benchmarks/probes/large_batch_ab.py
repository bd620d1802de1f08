"""Stage-1 choices at 129-256 rows against the default and cuBLAS, in one process, with the
tokens of every choice checked against the first of its mode (they must not depend on the
tiling).

    python benchmarks/probes/large_batch_ab.py
        [--what variants|dispatch|diagnose|rounding|noise|truncating|swapped|wide|mid|
         plain_mid]
        [--budget 180]
        [--rounds 2] [--out-dir DIR] [--batches 128,144,160,192,224,256]
        [--shapes 2048x151936,8192x128256,4096x151936]

Per shape and batch size, cuBLAS ``hidden @ W.T`` and:

* ``variants`` (default): plain sampling (T = 1, a 0-d device seed) with the default and
  with the Gluon kernel (``hopper_kernel``) on 64- or 128-row tiles, each with two m64n64 MMAs
  a step (the kernel's own) or one m64n128 (``hopper_kernel.WIDE_MMA``); top-k 50 with the
  default, those Gluon tiles and the swapped kernel's top-m epilogue
  (``dispatch.SWAP_TRUNCATING``);
* ``dispatch``: the default before and after ``dispatch._large_batch_gluon_rows``
  (``LARGE_BATCH_GLUON``) where they differ, for plain sampling (T = 1, per-row
  temperatures, greedy), top-k 50, top-p 0.9, both, and min-p 0.1;
* ``wide``: the same before and after ``dispatch.swap_wide_tiles`` (``SWAP_WIDE_TILES``),
  the truncating calls on bf16-rounded logits as bench_sampling makes them;
* ``diagnose``: the swapped kernel and the wide Gluon tiles at T = 1 and greedy (the same
  kernels without the noise: the noise's share);
* ``noise``: plain sampling (T = 1) and greedy, the default choice and the wide Gluon tiles
  (64 rows up to 192, else 128), each with this tree's kernels (``*_new``) and with those of
  ``--baseline`` (``*_base``: a copy of another tree's package, e.g. main's, loaded under
  another name), so that a change to the kernels is timed against what it changes;
* ``rounding``: top-k 50 and top-p 0.9 on logits rounded to bf16 first (``logits_dtype``, as
  a bf16 model's step asks): the default and the same with the packed top-m search forced
  on (``hopper_kernel.PACKED_TOP_M_MIN_64_ROWS``: the same keys, so the same tokens), and
  above 128 rows the old choice (``LARGE_BATCH_GLUON`` off) against the wide 64-row Gluon
  tiles;
* ``truncating``: bench_sampling's four truncating calls (top-k 50, top-k 50 + top-p 0.9,
  top-p 0.9, min-p 0.1; logits rounded to bf16, a 0-d seed) with the default against the
  swapped kernel's top-m epilogue (``dispatch.SWAP_TRUNCATING``): ping-pong with the packed
  top-m search (``*_swap``) and on whole keys (``*_swapwhole``:
  ``hopper_swap_kernel.PACKED_TOP_M_MIN``), ping-pong on 128-entry tiles on whole keys
  (``*_swapwide``: the "ping-pong-wide" schedule); top-k 50 also cooperative on whole keys
  (``k50_swapcoop``), on the Gluon kernel's 64-row tiles with two m64n64 MMAs a step
  (``k50_g64``), its wide 128-row tiles (``k50_g128w``) and the Triton tiles
  (``k50_triton``: ``LARGE_BATCH_GLUON`` off);
* ``mid``: 65-128 rows, plain sampling and the four truncating calls, the default against
  the Gluon tiles (64 narrow / wide, 128 wide) and the swapped kernel (64- / 128-entry);
* ``plain_mid``: the default before and after ``dispatch.PLAIN_WIDE_TILES_65_128``, where
  they differ (plain sampling at 65-128 rows);
* ``swapped``: plain sampling (T = 1) and greedy in the swapped kernel, ping-pong (the
  default), ping-pong on 128-entry tiles (``*_swapwide``), cooperative, and the staging
  swizzled or not (``hopper_swap_kernel.SWIZZLE_STAGING``): where the time of the plain
  calls at 129-192 rows goes.

CUDA-graph medians, round-robin over ``--rounds`` in a shuffled order; a CSV row per timing
(``large_batch_<what>.csv``) and a summary line per point (each provider's fastest round over
cuBLAS's). Points are skipped once ``--budget`` seconds are near (the job is killed at its
budget). Needs a Hopper GPU (elsewhere it says so and exits 0).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import importlib
import sys
import time
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a plain checkout
from ab_rounds import time_rounds  # noqa: E402  (this folder)

from flashsampling_inductor import dispatch, hopper_kernel, hopper_swap_kernel  # noqa: E402
from flashsampling_inductor.dispatch import SampleConfig, triton_fused_sample  # noqa: E402
from flashsampling_inductor.params import SamplingParams  # noqa: E402

START = time.time()


def gluon(rows: int) -> SampleConfig:
    return SampleConfig(rows, 128, 64, swap_ab=False, warp_specialized_rows=rows)


@contextlib.contextmanager
def patched(module, name, value):
    before = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, before)


def call(hidden, weight, params, config=None, wide=None, swap_truncating=False):
    """One fused call with the given stage-1 choice (flags set around the call only, so the
    graph capture and every replay see them)."""

    def run():
        with (
            patched(hopper_kernel, "WIDE_MMA", wide),
            patched(dispatch, "SWAP_TRUNCATING", swap_truncating),
        ):
            return triton_fused_sample(hidden, weight, None, params, config)

    return run


def swap_config(batch, hidden_size, device) -> SampleConfig:
    config = dispatch.default_config(batch, hidden_size, device)
    return dataclasses.replace(config, warp_specialized_swap="ping-pong")


def with_dispatch(run, value: bool, flag: str = "LARGE_BATCH_GLUON"):
    """``run`` under ``dispatch``'s ``flag`` (default LARGE_BATCH_GLUON: the choice of 129-256
    rows, new or old)."""

    def call_under():
        with patched(dispatch, flag, value):
            return run()

    return call_under


def dispatch_providers(batch, hidden, weight, flag="LARGE_BATCH_GLUON", truncating_logits=None):
    """The default before and after ``dispatch``'s ``flag`` (``*_old`` / ``*_new``: off / on;
    LARGE_BATCH_GLUON: ``dispatch._large_batch_gluon_rows``) in each mode, where the two
    choose differently; ``truncating_logits``: the truncating calls' ``logits_dtype``."""
    device, hidden_size = hidden.device, hidden.shape[1]
    seed = torch.tensor(7, device=device)
    generator = torch.Generator(device=device).manual_seed(batch)
    modes = {
        "plain": SamplingParams(None, 1.0, seed, 0, 1),
        "rowsT": SamplingParams(
            torch.rand(batch, generator=generator, device=device) + 0.5, 1.0, seed, 0, 1
        ),  # fmt: skip
        "greedy": SamplingParams(None, 0.0, None, 0, 1),
    }
    for mode, knobs in TRUNCATING_FORMS.items():
        modes[mode] = SamplingParams(None, 1.0, seed, 0, 1, truncating_logits, **knobs)
    timed = {"matmul": lambda: hidden @ weight.T}
    for mode, params in modes.items():
        configs = []
        for value in (False, True):
            with patched(dispatch, flag, value):
                configs.append(
                    dispatch.default_config(
                        batch,
                        hidden_size,
                        device,
                        params.truncates,
                        weight.shape[0],
                        dispatch.knobs_may_be_off(params, weight.shape[0]),
                        params.per_row_seed,
                        dispatch.writes_mass_partials(params, weight.shape[0]),
                        params.temperature is None and params.scalar_temperature == 0.0,
                    )  # fmt: skip
                )
        if configs[0] == configs[1]:
            continue
        run = call(hidden, weight, params)
        timed[f"{mode}_old"] = with_dispatch(run, False, flag)
        timed[f"{mode}_new"] = with_dispatch(run, True, flag)
    return timed


def diagnose_providers(batch, hidden, weight):
    """Where the time goes: each kernel choice at T = 1 and greedy (the same kernel without
    the noise), against cuBLAS."""
    seed = torch.tensor(7, device=hidden.device)
    plain = SamplingParams(None, 1.0, seed, 0, 1)
    greedy = SamplingParams(None, 0.0, None, 0, 1)
    swap = swap_config(batch, hidden.shape[1], hidden.device)
    timed = {"matmul": lambda: hidden @ weight.T}
    for mode, params in (("plain", plain), ("greedy", greedy)):
        timed[f"{mode}_swap"] = call(hidden, weight, params, swap)
        timed[f"{mode}_g64w"] = call(hidden, weight, params, gluon(64), wide=True)
        timed[f"{mode}_g128w"] = call(hidden, weight, params, gluon(128), wide=True)
    return timed


def rounding_providers(batch, hidden, weight):
    """Truncating calls with 4 candidates a tile on bf16-rounded logits (top-k 50, top-p
    0.9): the default, the same with the packed top-m search forced on (``*packed``:
    hopper_kernel.PACKED_TOP_M_MIN_64_ROWS 0) and, above 128 rows, the old choice
    (``LARGE_BATCH_GLUON`` off) against the wide 64-row Gluon tiles."""
    seed = torch.tensor(7, device=hidden.device)
    timed = {"matmul": lambda: hidden @ weight.T}
    for mode, knobs in (("k50bf16", dict(scalar_top_k=50)), ("p09bf16", dict(scalar_top_p=0.9))):
        params = SamplingParams(None, 1.0, seed, 0, 1, torch.bfloat16, **knobs)
        if batch > 128:
            timed[f"{mode}_old"] = with_dispatch(call(hidden, weight, params), False)
            tiles, run = "g64w", call(hidden, weight, params, gluon(64), wide=True)
        else:
            tiles, run = "default", call(hidden, weight, params)
        timed[f"{mode}_{tiles}"] = run

        def packed(run=run):
            with patched(hopper_kernel, "PACKED_TOP_M_MIN_64_ROWS", 0):
                return run()

        timed[f"{mode}_{tiles}packed"] = packed
    return timed


def swap_whole_keys(run):
    """``run`` with the swapped kernel's top-m search on whole keys at every m."""

    def call_under():
        with patched(hopper_swap_kernel, "PACKED_TOP_M_MIN", 1 << 30):
            return run()

    return call_under


TRUNCATING_FORMS = {
    "k50": dict(scalar_top_k=50),
    "k50p09": dict(scalar_top_k=50, scalar_top_p=0.9),
    "p09": dict(scalar_top_p=0.9),
    "minp": dict(scalar_min_p=0.1),
}


def truncating_providers(batch, hidden, weight):
    """bench_sampling's truncating calls (bf16-rounded logits, a 0-d seed): the default
    against the swapped kernel's top-m epilogue (packed or whole keys, ping-pong or
    cooperative), and for top-k 50 the narrow 64-row and wide 128-row Gluon tiles and the
    Triton tiles."""
    device, hidden_size = hidden.device, hidden.shape[1]
    seed = torch.tensor(7, device=device)
    swap = swap_config(batch, hidden_size, device)
    coop = dataclasses.replace(swap, warp_specialized_swap="cooperative")
    wide_tiles = dataclasses.replace(swap, warp_specialized_swap="ping-pong-wide")
    timed = {"matmul": lambda: hidden @ weight.T}
    for mode, knobs in TRUNCATING_FORMS.items():
        params = SamplingParams(None, 1.0, seed, 0, 1, torch.bfloat16, **knobs)
        timed[f"{mode}_default"] = call(hidden, weight, params)
        if not 128 < batch <= dispatch._swap_rows_max(hidden_size):
            continue
        swapped = call(hidden, weight, params, swap, swap_truncating=True)
        timed[f"{mode}_swap"] = swapped
        timed[f"{mode}_swapwhole"] = swap_whole_keys(swapped)
        wide = call(hidden, weight, params, wide_tiles, swap_truncating=True)
        timed[f"{mode}_swapwide"] = swap_whole_keys(wide)
        if mode == "k50":
            cooperative = call(hidden, weight, params, coop, swap_truncating=True)
            timed["k50_swapcoop"] = swap_whole_keys(cooperative)
            timed["k50_g64"] = call(hidden, weight, params, gluon(64), wide=False)
            timed["k50_g128w"] = call(hidden, weight, params, gluon(128), wide=True)
            timed["k50_triton"] = with_dispatch(call(hidden, weight, params), False)
    return timed


def mid_providers(batch, hidden, weight):
    """65-128 rows (issue 38's cells at 96 / 128, over 1.05 in every form at D = 2048): plain
    sampling (T = 1) and bench_sampling's four truncating calls (bf16-rounded logits), each
    with the default against the other stage-1 kernels that can take them: the Gluon
    kernel's 64-row tiles (two m64n64 MMAs a step or one wide m64n128), its wide 128-row
    tiles, and the swapped kernel (ping-pong on 64-entry tiles, "ping-pong-wide" on 128;
    truncating calls with its top-m epilogue on whole keys)."""
    device, hidden_size = hidden.device, hidden.shape[1]
    seed = torch.tensor(7, device=device)
    swap = swap_config(batch, hidden_size, device)
    wide_tiles = dataclasses.replace(swap, warp_specialized_swap="ping-pong-wide")
    modes = {"plain": SamplingParams(None, 1.0, seed, 0, 1)}
    for mode, knobs in TRUNCATING_FORMS.items():
        modes[mode] = SamplingParams(None, 1.0, seed, 0, 1, torch.bfloat16, **knobs)
    timed = {"matmul": lambda: hidden @ weight.T}
    for mode, params in modes.items():
        truncating = mode != "plain"
        timed[f"{mode}_default"] = call(hidden, weight, params)
        timed[f"{mode}_g64"] = call(hidden, weight, params, gluon(64), wide=False)
        timed[f"{mode}_g64w"] = call(hidden, weight, params, gluon(64), wide=True)
        timed[f"{mode}_g128w"] = call(hidden, weight, params, gluon(128), wide=True)
        swapped = call(hidden, weight, params, swap, swap_truncating=truncating)
        wide = call(hidden, weight, params, wide_tiles, swap_truncating=truncating)
        timed[f"{mode}_swap"] = swap_whole_keys(swapped) if truncating else swapped
        timed[f"{mode}_swapwide"] = swap_whole_keys(wide) if truncating else wide
    return timed


def swapped_providers(batch, hidden, weight):
    """Plain sampling (T = 1) and greedy in the swapped kernel: ping-pong (the default, its
    staging swizzled per shape: ``hopper_swap_kernel.swizzled``), ping-pong on 128-entry
    tiles, cooperative, and the other staging layout."""
    seed = torch.tensor(7, device=hidden.device)
    swap = swap_config(batch, hidden.shape[1], hidden.device)
    coop = dataclasses.replace(swap, warp_specialized_swap="cooperative")
    wide_tiles = dataclasses.replace(swap, warp_specialized_swap="ping-pong-wide")
    flipped = not hopper_swap_kernel.swizzled(batch, hidden.shape[1])
    timed = {"matmul": lambda: hidden @ weight.T}
    for mode, params in (
        ("plain", SamplingParams(None, 1.0, seed, 0, 1)),
        ("greedy", SamplingParams(None, 0.0, None, 0, 1)),
    ):
        timed[f"{mode}_swap"] = call(hidden, weight, params, swap)
        timed[f"{mode}_swapwide"] = call(hidden, weight, params, wide_tiles)
        timed[f"{mode}_swapcoop"] = call(hidden, weight, params, coop)
        run = call(hidden, weight, params, swap)

        def other_staging(run=run):
            with patched(hopper_swap_kernel, "SWIZZLE_STAGING", flipped):
                return run()

        timed[f"{mode}_swap{'swz' if flipped else 'flat'}"] = other_staging
    return timed


BASELINE = None  # (--baseline) another tree's package, loaded by load_baseline


def load_baseline(folder: str):
    """The package in ``folder`` (a copy of flashsampling_inductor) as its own package named
    after the folder, without its ``__init__`` (which would register the operator a second
    time): its dispatch and kernels beside this tree's."""
    path = Path(folder).resolve()
    package = types.ModuleType(path.name)
    package.__path__ = [str(path)]
    sys.modules[path.name] = package
    return types.SimpleNamespace(
        dispatch=importlib.import_module(f"{path.name}.dispatch"),
        hopper_kernel=importlib.import_module(f"{path.name}.hopper_kernel"),
    )


def call_with(package, hidden, weight, params, config=None):
    """One fused call through ``package``'s dispatch (``config``'s wide_mma set as the
    package's flag around the call)."""
    wide = None if config is None else config.wide_mma or None

    def run():
        with patched(package.hopper_kernel, "WIDE_MMA", wide):
            return package.dispatch.triton_fused_sample(hidden, weight, None, params, config)

    return run


def noise_providers(batch, hidden, weight):
    """Plain sampling and greedy: the default choice and the wide Gluon tiles (64 rows up to
    192, else 128), this tree's kernels against the baseline's."""
    seed = torch.tensor(7, device=hidden.device)
    modes = {
        "plain": SamplingParams(None, 1.0, seed, 0, 1),
        "greedy": SamplingParams(None, 0.0, None, 0, 1),
    }
    timed = {"matmul": lambda: hidden @ weight.T}
    this = types.SimpleNamespace(dispatch=dispatch, hopper_kernel=hopper_kernel)
    packages = {"new": this, **({"base": BASELINE} if BASELINE is not None else {})}
    for mode, params in modes.items():
        rows = 64 if batch <= 192 else 128  # (the wide tiles that could serve this batch)
        for tiles, config in (
            ("default", None),
            (f"g{rows}w", dataclasses.replace(gluon(rows), wide_mma=True)),
        ):
            for name, package in packages.items():
                own = (
                    None
                    if config is None
                    else package.dispatch.SampleConfig(**dataclasses.asdict(config))
                )
                timed[f"{mode}_{tiles}{name}"] = call_with(package, hidden, weight, params, own)
    return timed


def providers(batch, hidden, weight):
    seed = torch.tensor(7, device=hidden.device)
    plain = SamplingParams(None, 1.0, seed, 0, 1)
    top_k = SamplingParams(None, 1.0, seed, 0, 1, scalar_top_k=50)
    hidden_size = hidden.shape[1]
    timed = {"matmul": lambda: hidden @ weight.T}
    for mode, params in (("plain", plain), ("k50", top_k)):
        timed[f"{mode}_default"] = call(hidden, weight, params)
        timed[f"{mode}_g64"] = call(hidden, weight, params, gluon(64), wide=False)
        timed[f"{mode}_g64w"] = call(hidden, weight, params, gluon(64), wide=True)
        timed[f"{mode}_g128w"] = call(hidden, weight, params, gluon(128), wide=True)
    timed["plain_g128"] = call(hidden, weight, plain, gluon(128), wide=False)
    if batch > 128:
        timed["k50_swap"] = call(
            hidden, weight, top_k, swap_config(batch, hidden_size, hidden.device),
            swap_truncating=True,
        )  # fmt: skip
    return timed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget", type=float, default=180.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out-dir", default=".")
    parser.add_argument("--batches", default="128,144,160,192,224,256")
    parser.add_argument("--shapes", default="2048x151936,8192x128256,4096x151936")
    parser.add_argument(
        "--what",
        choices=[
            "variants",
            "dispatch",
            "diagnose",
            "rounding",
            "noise",
            "truncating",
            "swapped",
            "wide",
            "mid",
            "plain_mid",
        ],  # fmt: skip
        default="variants",
    )
    parser.add_argument("--baseline", help="a copy of another tree's package (--what noise)")
    args = parser.parse_args()
    make_providers = {
        "variants": providers,
        "dispatch": dispatch_providers,
        "diagnose": diagnose_providers,
        "rounding": rounding_providers,
        "noise": noise_providers,
        "truncating": truncating_providers,
        "swapped": swapped_providers,
        "mid": mid_providers,
        "plain_mid": functools.partial(dispatch_providers, flag="PLAIN_WIDE_TILES_65_128"),
        "wide": functools.partial(
            dispatch_providers, flag="SWAP_WIDE_TILES", truncating_logits=torch.bfloat16
        ),
    }[args.what]
    if args.baseline:
        global BASELINE
        BASELINE = load_baseline(args.baseline)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("large_batch_ab.py needs a Hopper GPU; there is none here: nothing run")
        return
    failures = time_rounds(
        args.shapes,
        args.batches,
        make_providers,
        lambda name: name.rsplit("_", 1)[0],  # (a mode's providers share its prefix)
        rounds=args.rounds,
        out_dir=args.out_dir,
        stem=f"large_batch_{args.what}",
        budget=args.budget,
        start=START,
    )
    print(
        f"done in {time.time() - START:.0f} s; token mismatches: {failures}; gluon disabled by:"
        f" {hopper_kernel._disabled_by}; swap disabled by: {hopper_swap_kernel._disabled_by}"
    )


if __name__ == "__main__":
    main()
