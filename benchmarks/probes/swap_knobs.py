"""Truncation knobs at 129-256 rows: each stage 1 that can take them (``--routes``), timed
against cuBLAS, their tokens against the Triton kernel's, and where the time goes.

    python benchmarks/probes/swap_knobs.py exact [--batches 144,256] [--routes default,swap,gluon]
    python benchmarks/probes/swap_knobs.py time [--batches 144,192,256] [--rounds 3] [--out-dir DIR]
    python benchmarks/probes/swap_knobs.py profile [--batches 256] [--routes default,persistent]

The knobs as ``generate`` after ``hf.enable`` passes them (0-d tensors, each knob at its off
value when off): ``off`` (every knob off), ``k50`` (top-k 50, generate's default), ``qwen3``
(top-k 20, top-p 0.95), ``p09`` (top-p 0.9 alone), ``minp`` (min-p 0.1), ``greedy`` (a 0-d
temperature of 0, knobs off); as continuous batching passes them, [B] tensors: ``mixed``
(every fourth row top-k 50 / top-p 0.9, per-row temperatures with greedy rows, per-row seeds);
and scalar knobs, which truncate every row (``scalar_k50``, ``scalar_p09``: the swapped kernel
only with ``dispatch.SWAP_TRUNCATING``), and plain greedy (``scalar_greedy``). Routes
(``ROUTES``): ``default`` (dispatch's choice), ``main`` (main ccf987c's), ``swap`` (the
swapped Gluon kernel, its top-m epilogue), ``gluon`` (the Gluon kernel's 64-row tiles),
``persistent`` (main ccf987c's Triton tiles: persistent above 64 rows), ``triton64`` (64 x 64
Triton tiles, eight warps), ``split`` (the Gluon kernel's split stage 1, its plain half in
the swapped kernel), ``swapsplit`` (the swapped kernel's stage 1 as two launches, plain then
top-m, each leaving at once unless the batch's knobs want it).

``exact``: each route draws the Triton kernel's tokens (all kernels are exact and share the
noise) and which stage 1 ran, per ``--shapes`` (DxV; the default's V = 50200 is ragged: its
last 64-wide tile lies past V). ``time``: CUDA-graph medians, round-robin, with cuBLAS
``hidden @ W.T`` and the plain call (0-d temperature and seed alone) beside. ``profile``: the
kernels of five calls (torch.profiler). Files to ``--out-dir``. Needs a Hopper GPU (elsewhere
it says so and exits 0).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a plain checkout
from swap_stage1 import matmul, problem, time_rounds  # noqa: E402  (this folder)

from flashsampling_inductor import dispatch, hopper_kernel, hopper_swap_kernel  # noqa: E402
from flashsampling_inductor.launch import compile_ahead  # noqa: E402
from flashsampling_inductor.params import SamplingParams  # noqa: E402

CASES = [
    "off", "k50", "qwen3", "p09", "minp", "greedy", "mixed", "scalar_k50", "scalar_p09",
    "scalar_greedy",
]  # fmt: skip
ZERO_D = {
    "off": dict(top_k=0, top_p=1.0, min_p=0.0),
    "k50": dict(top_k=50, top_p=1.0, min_p=0.0),
    "qwen3": dict(top_k=20, top_p=0.95, min_p=0.0),
    "p09": dict(top_k=0, top_p=0.9, min_p=0.0),
    "minp": dict(top_k=0, top_p=1.0, min_p=0.1),
    "greedy": dict(top_k=0, top_p=1.0, min_p=0.0),
}

_launches = {"swap": 0, "gluon": 0}


def _counting(name, launch):
    def counted(*args, **kwargs):
        _launches[name] += 1
        return launch(*args, **kwargs)

    return counted


hopper_swap_kernel.launch_stage1 = _counting("swap", hopper_swap_kernel.launch_stage1)
hopper_kernel.launch_stage1 = _counting("gluon", hopper_kernel.launch_stage1)
_default_config = dispatch.default_config


def _persistent(batch, hidden_size, device, truncates=False, vocab_size=None, *_):
    """main ccf987c's Triton tiles (no knobs_per_row): persistent above 64 rows."""
    config = _default_config(batch, hidden_size, device, truncates, vocab_size)
    return dataclasses.replace(config, warp_specialized_swap="", warp_specialized_rows=0)


# The kernel a route forces (a config from default_config's arguments); "default" forces none.
ROUTES = {
    "default": None,
    # main ccf987c's choice: default_config without knobs_per_row, SWAP_KNOBS off (its
    # knob calls' routes; plain ones now also differ from ccf987c's nowhere)
    "main": lambda batch, hidden_size, device, truncates=False, vocab_size=None, *_: (
        _default_config(batch, hidden_size, device, truncates, vocab_size)
    ),
    "persistent": _persistent,
    "gluon": lambda *a: dataclasses.replace(
        _default_config(*a), warp_specialized_swap="", warp_specialized_rows=64
    ),
    "swap": lambda *a: dataclasses.replace(_default_config(*a), warp_specialized_swap="ping-pong"),
    "triton64": lambda *a: dispatch.SampleConfig(64, 64, 128, num_warps=8, num_stages=3),
    # the swapped kernel's stage 1 split in two launches (plain, then top-m)
    "swapsplit": lambda *a: dataclasses.replace(
        _default_config(*a), warp_specialized_swap="ping-pong"
    ),
    # the Gluon kernel's split stage 1 with the swapped kernel as its plain half
    "split": lambda *a: dataclasses.replace(
        _default_config(*a), warp_specialized_swap="", warp_specialized_rows=64
    ),
    # the reference of ``exact``: the Triton kernel alone, default_config's tiles
    "triton": lambda *a: dataclasses.replace(
        _default_config(*a), warp_specialized_swap="", warp_specialized_rows=0
    ),
}


_FLAGS = ("SWAP_TRUNCATING", "SWAP_KNOBS", "SWAP_SPLIT", "SWAP_PLAIN_HALF")


def routed(call, route: str):
    """``call`` with stage 1 forced onto ``route``'s kernel (ROUTES) and dispatch's flags set
    for it ("swap": unsplit, and scalar truncation too; "gluon": its own plain half)."""

    def run():
        flags = {name: getattr(dispatch, name) for name in _FLAGS}
        if ROUTES[route] is not None:  # (default: dispatch's own flags)
            dispatch.default_config = ROUTES[route]
            dispatch.SWAP_TRUNCATING = route == "swap"
            dispatch.SWAP_KNOBS = route != "main"
            dispatch.SWAP_SPLIT = route == "swapsplit"
            dispatch.SWAP_PLAIN_HALF = route == "split"
        try:
            return call()
        finally:
            dispatch.default_config = _default_config
            for name, value in flags.items():
                setattr(dispatch, name, value)

    return run


def _ran(call) -> tuple[torch.Tensor, str]:
    """``call``'s tokens and which stage 1 it launched."""
    before = dict(_launches)
    out = call()
    ran = [name for name in _launches if _launches[name] > before[name]]
    return out, "+".join(ran) or "triton"


def knobs(case: str, batch: int, generator) -> SamplingParams:
    """The call's options for ``case`` (the op's validated form: the knob check, which a dry
    run of compile_ahead does not launch, is left out)."""
    cuda = "cuda"
    seed = torch.tensor(1234567, device=cuda)
    if case in ZERO_D:
        temperature = torch.tensor(0.0 if case == "greedy" else 0.7, device=cuda)
        values = {
            name: torch.tensor(value, dtype=torch.int64 if name == "top_k" else None, device=cuda)
            for name, value in ZERO_D[case].items()
        }
        return SamplingParams(temperature, 1.0, seed, 0, 1, **values)
    if case == "plain":
        return SamplingParams(torch.tensor(0.7, device=cuda), 1.0, seed, 0, 1)
    if case == "mixed":
        on = torch.arange(batch, device=cuda) % 4 == 0
        temperature = torch.rand(batch, generator=generator, device=cuda) + 0.3
        temperature[1::7] = 0.0  # greedy rows
        seeds = torch.randint(0, 2**62, (batch,), generator=generator, device=cuda)
        return SamplingParams(
            temperature, 1.0, seeds, 0, 1, top_k=torch.where(on, 50, 0).to(torch.int64),
            top_p=torch.where(on, 0.9, 1.0), min_p=torch.zeros(batch, device=cuda),
        )  # fmt: skip
    if case == "scalar_k50":
        return SamplingParams(None, 0.7, seed, 0, 1, scalar_top_k=50)
    if case == "scalar_p09":
        return SamplingParams(None, 0.7, seed, 0, 1, scalar_top_p=0.9)
    if case == "scalar_greedy":
        return SamplingParams(None, 0.0, None, 5, 1)
    raise ValueError(case)


def precompile(calls) -> None:
    start = time.time()
    try:
        with compile_ahead(threads=16):
            for call in calls:
                call()
    except Exception:  # noqa: BLE001 - they then compile at their first launch
        traceback.print_exc()
    torch.cuda.synchronize()
    print(f"compiled ahead in {time.time() - start:.1f} s", flush=True)


def _call(hidden, weight, params):
    return lambda: dispatch.triton_fused_sample(hidden, weight, None, params)


def _points(args, shapes):
    generator = torch.Generator(device="cuda").manual_seed(0)
    cases = args.cases.split(",")
    for hidden_size, vocab in shapes:
        _, weight = problem(1, hidden_size, vocab, generator)
        points = []
        for batch in (int(b) for b in args.batches.split(",")):
            hidden, _ = problem(batch, hidden_size, 1, generator)
            calls = {
                case: _call(hidden, weight, knobs(case, batch, generator))
                for case in cases + (["plain"] if args.what == "time" else [])
            }
            points.append((batch, hidden, calls))
        yield hidden_size, vocab, weight, points


def exact(args) -> None:
    """Per point, case and route: the tokens against the Triton kernel's, and which stage 1
    ran (a forced route must run its kernel; "default" shows dispatch's choice)."""
    shapes = [(int(d), int(v)) for d, v in (s.split("x") for s in args.shapes.split(","))]
    routes = args.routes.split(",")
    failures = 0
    with open(Path(args.out_dir) / "swap_knobs_exact.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["D", "V", "B", "case", "route", "same", "ran", "error"])
        for hidden_size, vocab, _, points in _points(args, shapes):
            precompile(
                routed(call, route)
                for _, _, calls in points
                for call in calls.values()
                for route in ["triton", *routes]
            )
            for batch, _, calls in points:
                for case, call in calls.items():
                    try:
                        reference = routed(call, "triton")()
                    except Exception as error:  # noqa: BLE001 - logged, the sweep goes on
                        traceback.print_exc()
                        writer.writerow(
                            [hidden_size, vocab, batch, case, "triton", "", "", repr(error)[:300]]
                        )
                        failures += 1
                        continue
                    for route in routes:
                        row = [hidden_size, vocab, batch, case, route]
                        try:
                            tokens, ran = _ran(routed(call, route))
                            same = torch.equal(reference, tokens)
                            if not same:
                                rows = (reference != tokens).any(dim=1).nonzero().flatten()
                                print(
                                    f"  {case} B={batch} {route}: rows differ {rows[:8].tolist()}"
                                )
                            row += [same, ran, ""]
                            failures += not same
                        except Exception as error:  # noqa: BLE001 - logged, the sweep goes on
                            traceback.print_exc()
                            row += ["", "", repr(error)[:300]]
                            failures += 1
                        print(*row, flush=True)
                        writer.writerow(row)
                        f.flush()
    print(
        f"exact: {failures} failing cases; disabled by: swap {hopper_swap_kernel._disabled_by},"
        f" gluon {hopper_kernel._disabled_by}"
    )


def timing(args) -> None:
    shapes = [(int(d), int(v)) for d, v in (s.split("x") for s in args.shapes.split(","))]
    routes = args.routes.split(",")
    with open(Path(args.out_dir) / "swap_knobs_time.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["D", "V", "B", "provider", "round", "us"])
        for hidden_size, vocab, weight, points in _points(args, shapes):
            providers_at = []
            for batch, hidden, calls in points:
                providers = {"matmul": matmul(hidden, weight)}
                for case, call in calls.items():
                    if case == "plain":
                        providers["plain"] = call
                        continue
                    for route in routes:
                        providers[f"{case}_{route}"] = routed(call, route)
                providers_at.append((batch, providers))
            precompile(
                fn for _, providers in providers_at for n, fn in providers.items() if n != "matmul"
            )
            for batch, providers in providers_at:
                time_rounds(
                    providers, args.rounds, writer, (hidden_size, vocab, batch),
                    Path(args.out_dir) / "swap_knobs_summary.txt",
                )  # fmt: skip
                f.flush()


def profile(args) -> None:
    """Per point, case and route: the kernels of 5 calls (torch.profiler, CUDA time)."""
    shapes = [(int(d), int(v)) for d, v in (s.split("x") for s in args.shapes.split(","))]
    routes = args.routes.split(",")
    with open(Path(args.out_dir) / "swap_knobs_profile.txt", "w") as f:
        for hidden_size, vocab, _, points in _points(args, shapes):
            for batch, _, calls in points:
                for case, call in calls.items():
                    for route in routes:
                        run = routed(call, route)
                        _, ran = _ran(run)
                        torch.cuda.synchronize()
                        activities = [torch.profiler.ProfilerActivity.CUDA]
                        with torch.profiler.profile(activities=activities) as prof:
                            for _ in range(5):
                                run()
                            torch.cuda.synchronize()
                        table = prof.key_averages().table(
                            sort_by="cuda_time_total", row_limit=8, max_name_column_width=60
                        )
                        point = f"D={hidden_size} V={vocab} B={batch} {case} {route}"
                        head = f"== {point} (ran {ran}), 5 calls"
                        print(head, flush=True)
                        f.write(head + "\n" + table + "\n")
                        f.flush()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("what", choices=["exact", "time", "profile"])
    parser.add_argument("--routes", default="default,swap,gluon", help=f"of {list(ROUTES)}")
    parser.add_argument("--batches", default="144,256")
    parser.add_argument("--cases", default=",".join(CASES), help=f"of {CASES}")
    parser.add_argument("--shapes", default="2048x151936,4096x151936,2048x50200", help="DxV,...")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out-dir", default=".")
    args = parser.parse_args()
    if not (torch.cuda.is_available() and hopper_swap_kernel.supported(
        torch.empty(1, 64, device="cuda", dtype=torch.bfloat16),
        torch.empty(64, 64, device="cuda", dtype=torch.bfloat16),
    )):  # fmt: skip
        print("swap_knobs.py needs a Hopper GPU with Gluon: nothing to run here")
        return
    Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    {"exact": exact, "time": timing, "profile": profile}[args.what](args)


if __name__ == "__main__":
    main()
