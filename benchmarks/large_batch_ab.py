"""Stage-1 choices at 129-256 rows against the default and cuBLAS, in one process, with the
tokens of every choice checked against the default's (they must not depend on the tiling).

    python benchmarks/large_batch_ab.py [--budget 180] [--rounds 2] [--out-dir DIR]
        [--batches 128,144,160,192,224,256] [--shapes 2048x151936,8192x128256,4096x151936]

Per shape and batch size: cuBLAS ``hidden @ W.T``; plain sampling (T = 1, a 0-d device seed)
with the default and with the Gluon kernel (``hopper_kernel``) on 64- or 128-row tiles, each
with two m64n64 MMAs a step (the kernel's own) or one m64n128 (``hopper_kernel.WIDE_MMA``);
top-k 50 with the default, those Gluon tiles and the swapped kernel's top-m epilogue
(``dispatch.SWAP_TRUNCATING``). CUDA-graph medians, round-robin over ``--rounds``; a CSV row
per timing (``large_batch_ab.csv``) and a summary line per point (ratio to cuBLAS). Points are
skipped once ``--budget`` seconds are near (the job is killed at its budget). Needs a Hopper
GPU (elsewhere it says so and exits 0).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a plain checkout
from sweep_configs import graph_median_us  # noqa: E402  (this folder)

from flashsampling_inductor import dispatch, hopper_kernel, hopper_swap_kernel  # noqa: E402
from flashsampling_inductor.dispatch import SampleConfig, triton_fused_sample  # noqa: E402
from flashsampling_inductor.launch import compile_ahead  # noqa: E402
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


def check_tokens(timed) -> list[str]:
    """Names whose tokens differ from their mode's default (one call each)."""
    differ = []
    for mode in ("plain", "k50"):
        expected = timed[f"{mode}_default"]()
        for name, fn in timed.items():
            if name.startswith(mode + "_") and name != f"{mode}_default":
                if not torch.equal(fn(), expected):
                    differ.append(name)
    return differ


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget", type=float, default=180.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out-dir", default=".")
    parser.add_argument("--batches", default="128,144,160,192,224,256")
    parser.add_argument("--shapes", default="2048x151936,8192x128256,4096x151936")
    args = parser.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("large_batch_ab.py needs a Hopper GPU; there is none here: nothing run")
        return
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    batches = [int(b) for b in args.batches.split(",")]
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    generator = torch.Generator(device="cuda").manual_seed(0)
    failures = 0
    with open(out / "large_batch_ab.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["D", "V", "B", "provider", "round", "us"])
        for hidden_size, vocab in shapes:
            if time.time() - START > args.budget - 40:
                print(f"D={hidden_size}: skipped (budget)", flush=True)
                continue
            weight = torch.randn(vocab, hidden_size, generator=generator, device="cuda")
            weight = (weight * (5 / hidden_size**0.5)).bfloat16()
            points = []
            for batch in batches:
                hidden = torch.randn(batch, hidden_size, generator=generator, device="cuda")
                points.append((batch, providers(batch, hidden.bfloat16(), weight)))
            started = time.time()
            try:
                with compile_ahead(threads=16):
                    for _, timed in points:
                        for name, fn in timed.items():
                            if name != "matmul":
                                fn()
            except Exception:  # noqa: BLE001 - they then compile at their first launch
                traceback.print_exc()
            torch.cuda.synchronize()
            print(f"D={hidden_size}: compiled ahead in {time.time() - started:.1f} s", flush=True)
            for batch, timed in points:
                if time.time() - START > args.budget - 12:
                    print(f"D={hidden_size} B={batch}: skipped (budget)", flush=True)
                    continue
                for name, fn in list(timed.items()):
                    try:
                        fn()
                    except Exception:  # noqa: BLE001 - logged, the others go on
                        traceback.print_exc()
                        del timed[name]
                differ = check_tokens(timed)
                failures += len(differ)
                times = {name: [] for name in timed}
                for round_index in range(args.rounds):
                    for name, fn in timed.items():
                        us = graph_median_us(fn)
                        times[name].append(us)
                        writer.writerow([hidden_size, vocab, batch, name, round_index, f"{us:.2f}"])
                f.flush()
                med = {n: statistics.median(t) for n, t in times.items()}
                mm = med["matmul"]
                line = f"D={hidden_size} B={batch} matmul {mm:.1f}us | " + " ".join(
                    f"{n} {u / mm:.3f}" for n, u in med.items() if n != "matmul"
                )
                if differ:
                    line += f" | TOKENS DIFFER: {','.join(differ)}"
                print(line, flush=True)
                with open(out / "large_batch_ab_summary.txt", "a") as summary:
                    summary.write(line + "\n")
            del weight, points
            torch.cuda.empty_cache()
    print(
        f"done in {time.time() - START:.0f} s; token mismatches: {failures}; gluon disabled by:"
        f" {hopper_kernel._disabled_by}; swap disabled by: {hopper_swap_kernel._disabled_by}"
    )


if __name__ == "__main__":
    main()
