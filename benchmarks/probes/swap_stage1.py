"""The swapped warp-specialized stage 1 (``hopper_swap_kernel``, 129-256 rows) against the
current default and cuBLAS, and its exactness.

    python benchmarks/probes/swap_stage1.py exact [--modes main|all] [--out-dir DIR]
    python benchmarks/probes/swap_stage1.py time [--rounds 3] [--out-dir DIR]

``exact``: for B in 129-256 and the three benchmark shapes (D = 2048 / 4096, V = 151936; D =
8192, V = 128256), logits of std 5, the swapped kernel's tokens against the Triton stage 1's
and the default's, and its per-half-tile candidates bit for bit against the Gluon kernel's
(``hopper_kernel``, 64-row tiles), which writes the same layout. ``--modes all`` adds per-row
temperatures (some 0: greedy rows) and seeds, greedy, two samples with a Python seed, and a
bias with bf16-rounded logits. ``time``: CUDA-graph replays (median), round-robin over
rounds: cuBLAS ``hidden @ W.T``, the default (``default_config``), and the swapped kernel,
sampling at T = 1 with a device seed, with per-row temperatures and seeds, and greedy (the
same kernels without the noise). Each writes a CSV to ``--out-dir``. Needs a Hopper GPU
(elsewhere it says so and exits 0).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import functools
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a plain checkout
from sweep_configs import graph_median_us  # noqa: E402  (this folder)

from flashsampling_inductor import hopper_kernel, hopper_swap_kernel  # noqa: E402
from flashsampling_inductor.dispatch import (  # noqa: E402
    SampleConfig,
    default_config,
    triton_fused_sample,
)
from flashsampling_inductor.launch import compile_ahead  # noqa: E402
from flashsampling_inductor.params import SamplingParams  # noqa: E402

SHAPES = [(2048, 151936), (4096, 151936), (8192, 128256)]
EXACT_BATCHES = [129, 144, 160, 192, 224, 256]
TIME_BATCHES = [129, 144, 160, 192, 224, 256]
# The Triton stage 1 (default_config's large-batch tiles without the Gluon kernels).
TRITON = SampleConfig(
    128, 128, 64, swap_ab=False, num_warps=8, num_stages=3, maxnreg=128, tma=True,
    programs_per_sm=2, epilogue_chunks=4,
)  # fmt: skip
GLUON_64 = SampleConfig(64, 128, 64, swap_ab=False, warp_specialized_rows=64)
# hopper_swap_kernel's consumers (+swizzle: its experimental staging layout)
SCHEDULES = ["ping-pong", "cooperative", "ping-pong+swizzle"]

_swap_launches = 0
_launch = hopper_swap_kernel.launch_stage1


def _counting_launch(*args, **kwargs):
    global _swap_launches
    _swap_launches += 1
    return _launch(*args, **kwargs)


hopper_swap_kernel.launch_stage1 = _counting_launch


def swap_config(batch, hidden_size, device, schedule="ping-pong") -> SampleConfig:
    config = default_config(batch, hidden_size, device)
    return dataclasses.replace(config, warp_specialized_swap=schedule.split("+")[0])


def swizzled(schedule, call):
    """``call`` with hopper_swap_kernel's swizzled staging where ``schedule`` asks for it
    (otherwise the kernel's own choice, ``hopper_swap_kernel.swizzled``)."""
    if not schedule.endswith("+swizzle"):
        return call

    def with_swizzle():
        before = hopper_swap_kernel.SWIZZLE_STAGING
        hopper_swap_kernel.SWIZZLE_STAGING = True
        try:
            return call()
        finally:
            hopper_swap_kernel.SWIZZLE_STAGING = before

    return with_swizzle


def precompile(calls) -> None:
    """Compile every kernel the calls launch, 16 at a time (a dry run of their host code)."""
    start = time.time()
    try:
        with compile_ahead(threads=16):
            for call in calls:
                call()
    except Exception:  # noqa: BLE001 - they then compile at their first launch
        traceback.print_exc()
    torch.cuda.synchronize()
    print(f"compiled ahead in {time.time() - start:.1f} s", flush=True)


def problem(batch, hidden_size, vocab, generator):
    """hidden and W (bf16) whose logits have std ~5."""
    hidden = torch.randn(batch, hidden_size, generator=generator, device="cuda")
    weight = torch.randn(vocab, hidden_size, generator=generator, device="cuda")
    weight *= 5 / hidden_size**0.5
    return hidden.bfloat16(), weight.bfloat16()


def params_cases(batch, device, generator, modes):
    seed = torch.tensor(1234567, device=device)
    cases = {
        "T1_seed": (
            SamplingParams(temperature=None, scalar_temperature=1.0, seed=seed, scalar_seed=0,
                           num_samples=1),
            None, None,
        ),
    }  # fmt: skip
    if modes == "all":
        temperature = torch.rand(batch, generator=generator, device=device) * 1.5
        temperature[::7] = 0.0  # greedy rows
        seeds = torch.randint(0, 2**62, (batch,), generator=generator, device=device)
        cases["row_T_row_seed"] = (
            SamplingParams(temperature=temperature, scalar_temperature=1.0, seed=seeds,
                           scalar_seed=0, num_samples=1),
            None, None,
        )  # fmt: skip
        cases["greedy"] = (
            SamplingParams(temperature=None, scalar_temperature=0.0, seed=None, scalar_seed=0,
                           num_samples=1),
            None, None,
        )  # fmt: skip
        cases["py_seed_2_samples_T0.7"] = (
            SamplingParams(temperature=None, scalar_temperature=0.7, seed=None,
                           scalar_seed=987654321123, num_samples=2),
            None, None,
        )  # fmt: skip
        cases["bias_bf16_logits"] = (
            SamplingParams(temperature=None, scalar_temperature=1.0, seed=seed, scalar_seed=0,
                           num_samples=1, logits_dtype=torch.bfloat16),
            "bias", None,
        )  # fmt: skip
    return cases


def exact(args) -> None:
    out = Path(args.out_dir) / f"swap_exact_{args.modes}.csv"
    generator = torch.Generator(device="cuda").manual_seed(0)
    failures = 0
    with open(out, "w", newline="") as f:
        writer = csv.writer(f)
        columns = ["schedule", "tokens_vs_triton", "tokens_vs_default", "cand_vs_gluon64", "ran"]
        writer.writerow(["D", "V", "B", "case", *columns * len(SCHEDULES), "seconds", "error"])
        for hidden_size, vocab in SHAPES:
            _, weight = problem(1, hidden_size, vocab, generator)
            bias = (torch.randn(vocab, generator=generator, device="cuda") * 2).bfloat16()
            problems = []
            for batch in EXACT_BATCHES:
                hidden = torch.randn(batch, hidden_size, generator=generator, device="cuda")
                hidden = hidden.bfloat16()
                cases = params_cases(batch, hidden.device, generator, args.modes)
                if args.modes == "all":
                    del cases["T1_seed"]  # (the main run's)
                problems.append((batch, hidden, cases))
            configs = [TRITON, None, GLUON_64]
            precompile(
                swizzled(s, _call(hidden, weight, params, c, bias if with_bias else None))
                for batch, hidden, cases in problems
                for params, with_bias, _ in cases.values()
                for s, c in [("", config) for config in configs]
                + [(s, swap_config(batch, hidden_size, hidden.device, s)) for s in SCHEDULES]
            )
            for batch, hidden, cases in problems:
                for name, (params, with_bias, _) in cases.items():
                    if with_bias and hidden_size != 2048:
                        continue
                    b = bias if with_bias else None
                    start = time.time()
                    row = [hidden_size, vocab, batch, name]
                    try:
                        reference = triton_fused_sample(hidden, weight, b, params, TRITON)
                        default = triton_fused_sample(hidden, weight, b, params)
                        cand_gluon = triton_fused_sample(
                            hidden, weight, b, params, GLUON_64, tile_candidates=True
                        )
                        for schedule in SCHEDULES:
                            config = swap_config(batch, hidden_size, hidden.device, schedule)
                            before = _swap_launches
                            swap = swizzled(schedule, _call(hidden, weight, params, config, b))()
                            ran = _swap_launches > before
                            cand_swap = swizzled(
                                schedule,
                                functools.partial(
                                    triton_fused_sample, hidden, weight, b, params, config,
                                    tile_candidates=True,
                                ),
                            )()  # fmt: skip
                            same_tokens = torch.equal(swap, reference)
                            same_default = torch.equal(swap, default)
                            same_cand = torch.equal(cand_swap[0], cand_gluon[0]) and torch.equal(
                                cand_swap[1], cand_gluon[1]
                            )
                            if not same_cand and cand_swap[1].shape == cand_gluon[1].shape:
                                diff = (cand_swap[1] != cand_gluon[1]).nonzero()
                                print(f"  {schedule} candidates differ at {diff.shape[0]}:"
                                      f" first {diff[:4].tolist()}")  # fmt: skip
                            row += [schedule, same_tokens, same_default, same_cand, ran]
                            failures += not (same_tokens and same_default and same_cand and ran)
                        row += [f"{time.time() - start:.1f}", ""]
                    except Exception as error:  # noqa: BLE001 - logged, the sweep goes on
                        traceback.print_exc()
                        row += [f"{time.time() - start:.1f}", repr(error)[:300]]
                        failures += 1
                    print(*row, flush=True)
                    writer.writerow(row)
                    f.flush()
    print(f"exact {args.modes}: {failures} failing cases; swap disabled by:",
          hopper_swap_kernel._disabled_by, "; gluon:", hopper_kernel._disabled_by)  # fmt: skip


def time_rounds(providers: dict, rounds: int, writer, point: tuple, summary_path: Path) -> None:
    """Each provider's graph-timed median ``rounds`` times in turns, a CSV row each (``point``
    = D, V, B first), then one line of medians over matmul's to stdout and ``summary_path``."""
    hidden_size, vocab, batch = point
    times = {name: [] for name in providers}
    for round_index in range(rounds):
        for name, fn in providers.items():
            try:
                us = graph_median_us(fn)
            except Exception:  # noqa: BLE001 - logged, the others go on
                traceback.print_exc()
                continue
            times[name].append(us)
            writer.writerow([*point, name, round_index, f"{us:.2f}"])
    med = {n: statistics.median(t) for n, t in times.items() if t}
    mm = med.get("matmul", float("nan"))
    line = f"D={hidden_size} B={batch}: " + "  ".join(
        f"{n} {u:.1f}us ({u / mm:.3f}x)" for n, u in med.items()
    )
    print(line, flush=True)
    with open(summary_path, "a") as summary:
        summary.write(line + "\n")


def matmul(hidden, weight):
    return lambda: hidden @ weight.T


def _call(hidden, weight, params, config, bias=None):
    return lambda: triton_fused_sample(hidden, weight, bias, params, config)


def _providers(batch, hidden_size, weight, generator) -> dict:
    """The timed calls at one point: cuBLAS, and per kernel choice three sampling modes."""
    hidden = torch.randn(batch, hidden_size, generator=generator, device="cuda").bfloat16()
    seed = torch.tensor(7, device="cuda")
    plain = SamplingParams(temperature=None, scalar_temperature=1.0, seed=seed, scalar_seed=0,
                           num_samples=1)  # fmt: skip
    rows = SamplingParams(
        temperature=torch.rand(batch, generator=generator, device="cuda") + 0.5,
        scalar_temperature=1.0,
        seed=torch.randint(0, 2**62, (batch,), generator=generator, device="cuda"),
        scalar_seed=0, num_samples=1,
    )  # fmt: skip
    greedy = dataclasses.replace(plain, scalar_temperature=0.0)
    configs = {
        "default": None,
        "swap": swap_config(batch, hidden_size, hidden.device),
        "coop": swap_config(batch, hidden_size, hidden.device, "cooperative"),
    }
    providers = {"matmul": matmul(hidden, weight)}
    for suffix, params in (("", plain), ("_rows", rows), ("_greedy", greedy)):
        for name, config in configs.items():
            providers[name + suffix] = _call(hidden, weight, params, config)
    providers["swap_swizzle"] = swizzled("+swizzle", _call(hidden, weight, plain, configs["swap"]))
    return providers


def timing(args) -> None:
    out = Path(args.out_dir) / "swap_time.csv"
    generator = torch.Generator(device="cuda").manual_seed(1)
    with open(out, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["D", "V", "B", "provider", "round", "us"])
        for hidden_size, vocab in reversed(SHAPES):  # (the longest first)
            _, weight = problem(1, hidden_size, vocab, generator)
            points = []
            for batch in TIME_BATCHES:
                points.append((batch, _providers(batch, hidden_size, weight, generator)))
            precompile(
                fn for _, providers in points for name, fn in providers.items() if name != "matmul"
            )
            for batch, providers in points:
                for name, fn in list(providers.items()):
                    try:
                        fn()
                        torch.cuda.synchronize()
                    except Exception:  # noqa: BLE001 - logged, the others go on
                        traceback.print_exc()
                        del providers[name]
                time_rounds(
                    providers, args.rounds, writer, (hidden_size, vocab, batch),
                    Path(args.out_dir) / "swap_time_summary.txt",
                )  # fmt: skip
                f.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["exact", "time"])
    parser.add_argument("--modes", choices=["main", "all"], default="main")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out-dir", default=".")
    args = parser.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("swap_stage1.py needs a Hopper GPU; there is none here: nothing run")
        return
    Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    exact(args) if args.what == "exact" else timing(args)


if __name__ == "__main__":
    main()
