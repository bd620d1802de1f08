"""Stage 1 of the TP step on one vocabulary shard, per candidate tile configuration (issue 39).

    python benchmarks/probes/short_shard_stage1.py [--shapes 4096x37984,8192x32064:144/256]
                                                   [--batches 64,256] [--rounds 3] [--out-dir DIR]
                                                   [--warm-only]

A TP = 4 step with symmetric memory runs stage 1 on its shard (``tile_candidates``: per-tile
candidates, no stage 2) and then the exchange's kernel. This times that stage 1 alone, each
candidate and cuBLAS ``hidden @ W_shard.T`` replayed from CUDA graphs, round-robin over
``--rounds`` rounds (median of the rounds' medians; T = 1, a device seed, the shard starting
at rank 1's offset), and checks that every candidate's best per-tile candidate is the
default's (the tokens do not depend on the tiles). A candidate whose configuration is the
default's is not timed twice. One GPU; without CUDA it says so and exits 0. Writes
``short_shard_stage1_<gpu>_<date>.json``. ``--warm-only`` compiles and checks the candidates
without timing them (several such processes, one per shape, fill Triton's cache in parallel
before the timed run).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a plain checkout
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
from bench_sampling import capture_graph  # noqa: E402  (benchmarks/)

from flashsampling_inductor.dispatch import (  # noqa: E402
    SampleConfig,
    default_config,
    triton_fused_sample,
)
from flashsampling_inductor.params import SamplingParams  # noqa: E402

LARGE = dict(swap_ab=False, num_warps=8, num_stages=3, tma=True)


def candidates(batch: int) -> dict[str, SampleConfig]:
    """Named stage-1 configurations worth trying on a short shard, by batch bucket."""
    if batch <= 64:
        return {
            "triton64x64": SampleConfig(64, 64, 64, swap_ab=False, num_stages=4),
            "triton64x64_s5": SampleConfig(64, 64, 64, swap_ab=False, num_stages=5),
            "triton64x64_w8": SampleConfig(64, 64, 64, swap_ab=False, num_stages=4, num_warps=8),
            "triton64x64_d128": SampleConfig(64, 64, 128, swap_ab=False, num_stages=3),
            "triton64x32": SampleConfig(64, 32, 64, swap_ab=False, num_stages=4),
            "swapab64x64x128": SampleConfig(64, 64, 128, num_warps=8, num_stages=3),
            "gluon64x128": SampleConfig(
                64, 128, 64, swap_ab=False, num_stages=4, warp_specialized_rows=64
            ),
            # Fewer, wider tiles or persistent programs: 37984 / 64 = 594 tiles are 4.5
            # waves on 132 SMs (wave quantization on the TP = 4 shard).
            "gluon64rows": SampleConfig(
                64, 128, 64, swap_ab=False, num_stages=4, tma=True, warp_specialized_rows=64
            ),
            "t64x128_pps2": SampleConfig(
                64, 128, 64, swap_ab=False, num_stages=4, programs_per_sm=2, tma=True
            ),
            "gluon_wide64": gluon_wide(64),
            "t64x64_pps2": SampleConfig(
                64, 64, 64, swap_ab=False, num_stages=4, programs_per_sm=2, tma=True
            ),
            "triton64x128": SampleConfig(64, 128, 64, swap_ab=False, num_stages=3),
        }
    return {
        "t128x128_pps2_c2": SampleConfig(
            128, 128, 64, maxnreg=128, programs_per_sm=2, epilogue_chunks=2, **LARGE
        ),
        "t128x128_pps2_c4": SampleConfig(
            128, 128, 64, maxnreg=128, programs_per_sm=2, epilogue_chunks=4, **LARGE
        ),
        "t128x256_pps1_c4": SampleConfig(
            128, 256, 64, programs_per_sm=1, epilogue_chunks=4, **LARGE
        ),
        "t128x64_pps2": SampleConfig(128, 64, 64, maxnreg=128, programs_per_sm=2, **LARGE),
        "t64x128_pps2": SampleConfig(
            64, 128, 64, swap_ab=False, num_stages=4, programs_per_sm=2, tma=True
        ),
        "gluon64rows": SampleConfig(
            64, 128, 64, swap_ab=False, num_stages=4, tma=True, warp_specialized_rows=64
        ),
        # The Gluon kernel's wide MMA (one m64n128 a k step), 64- and 128-row tiles: what
        # whole vocabularies take at 129-256 rows (dispatch._large_batch_gluon_rows).
        "gluon_wide64": gluon_wide(64),
        "gluon_wide128": gluon_wide(128),
        "swap_pingpong": swapped("ping-pong"),
        "swap_coop": swapped("cooperative"),
    }


def gluon_wide(rows: int) -> SampleConfig:
    """The Gluon kernel with its wide MMA on ``rows``-row tiles (64 or 128)."""
    return SampleConfig(
        128, 128, 64, maxnreg=128, programs_per_sm=2, epilogue_chunks=4,
        warp_specialized_rows=rows, wide_mma=True, **LARGE,
    )  # fmt: skip


def swapped(consumers: str) -> SampleConfig:
    """The swapped Gluon kernel (vocabulary on the MMA's M), whatever the default routes."""
    return SampleConfig(
        128, 128, 64, maxnreg=128, programs_per_sm=2, epilogue_chunks=4,
        warp_specialized_swap=consumers, **LARGE,
    )  # fmt: skip


def _gluon_disabled(config: SampleConfig) -> bool:
    """Whether the Gluon kernel a config asks for failed to compile (the call then ran the
    Triton tiles: not the candidate named)."""
    from flashsampling_inductor import hopper_kernel, hopper_swap_kernel

    if config.warp_specialized_swap:
        return hopper_swap_kernel._disabled_by is not None
    return bool(config.warp_specialized_rows) and hopper_kernel._disabled_by is not None


def graph_us(fn, replays: int = 20) -> float:
    """Median per call of a CUDA graph of ``replays`` calls of fn (captured after warm-up)."""
    graph = capture_graph(lambda: [fn() for _ in range(replays)])
    graph.replay()
    times = []
    for _ in range(7):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / replays)
    return statistics.median(times)


def best(score: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Each lane's best per-tile candidate's global index (ties to the lowest index)."""
    top = score.amax(-1, keepdim=True)
    masked = torch.where(score == top, index.long(), torch.iinfo(torch.int64).max)
    return masked.amin(-1)


def time_point(
    hidden, weight, offset, named, rounds, label, deadline=math.inf
) -> dict[str, list[float]]:
    """Per usable candidate its per-round medians (us), and "matmul": cuBLAS's; a candidate
    that fails, runs another kernel than named, or draws other tokens is left out (said), as
    are those not compiled by ``deadline`` (time.monotonic()) and those whose configuration
    is the default's. ``rounds`` 0: compiled and checked only."""
    params = SamplingParams(None, 1.0, torch.tensor(12345, device=hidden.device), 0, 1)

    def call(config):
        return lambda: triton_fused_sample(
            hidden, weight, None, params, config, vocab_offset=offset, tile_candidates=True
        )

    expected = best(*call(named["default"])())
    usable = {}
    for name, config in named.items():
        if name != "default" and config == named["default"]:
            print(f"{label} {name}: the default's configuration")
            continue
        if time.monotonic() > deadline:
            print(f"{label} {name}: not run (--budget-s spent)")
            continue
        try:
            got = best(*call(config)())
        except Exception as error:  # noqa: BLE001 (a candidate that cannot run)
            print(f"{label} {name}: failed: {type(error).__name__}: {error}")
            continue
        if _gluon_disabled(config):
            print(f"{label} {name}: its Gluon kernel was disabled: {config}")
            continue
        if not torch.equal(got, expected):
            print(f"{label} {name}: OTHER TOKENS than the default")
            continue
        usable[name] = call(config)
    times = {name: [] for name in ["matmul", *usable]}
    for _ in range(rounds):
        times["matmul"].append(graph_us(lambda: hidden @ weight.T))
        for name, fn in usable.items():
            times[name].append(graph_us(fn))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--shapes", default="4096x37984,8192x32064",
        help="DxV_shard list; DxV_shard:B1/B2 times that shard at those batches only",
    )  # fmt: skip
    parser.add_argument("--batches", default="64,256", help="B list")
    parser.add_argument("--rounds", type=int, default=3, help="round-robin rounds")
    parser.add_argument("--only", default="", help="comma-separated candidate names")
    parser.add_argument(
        "--budget-s", type=float, default=0.0,
        help="compile no more candidates after this many seconds (0: no limit); those "
        "compiled are still timed",
    )  # fmt: skip
    parser.add_argument(
        "--warm-only", action="store_true", help="compile and check, time nothing, no JSON"
    )
    parser.add_argument(
        "--out-dir", type=Path, default=Path(__file__).parents[1] / "results", help="JSON's folder"
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("short_shard_stage1.py times kernels on a CUDA GPU; there is none here: nothing run")
        return
    gpu = torch.cuda.get_device_name()
    print(gpu, f"torch {torch.__version__}, triton {triton.__version__}", flush=True)
    only = set(filter(None, args.only.split(",")))
    deadline = time.monotonic() + args.budget_s if args.budget_s else math.inf
    rows = []
    rounds = 0 if args.warm_only else args.rounds
    for shape in args.shapes.split(","):
        shape, _, own_batches = shape.partition(":")
        dim, vocab = map(int, shape.split("x"))
        offset = vocab // 4 * 4  # rank 1's start: global indices past the first shard
        weight = torch.randn(vocab, dim, device="cuda", dtype=torch.bfloat16) * dim**-0.5
        for batch in map(int, (own_batches.replace("/", ",") or args.batches).split(",")):
            hidden = torch.randn(batch, dim, device="cuda", dtype=torch.bfloat16)
            named = {"default": default_config(batch, dim, hidden.device, vocab_size=vocab)}
            named.update(
                (name, config)
                for name, config in candidates(batch).items()
                if not only or name in only
            )
            label = f"D={dim} V_shard={vocab} B={batch}"
            times = time_point(hidden, weight, offset, named, rounds, label, deadline)
            if not rounds:
                print(f"{label}: compiled {', '.join(list(times)[1:])}", flush=True)
                continue
            matmul = statistics.median(times.pop("matmul"))
            print(f"{label}: cuBLAS {matmul:.1f} us", flush=True)
            for name in sorted(times, key=lambda n: statistics.median(times[n])):
                us = statistics.median(times[name])
                print(f"  {name:<18s} {us:7.1f} us  {us / matmul:.3f}x  {named[name]}", flush=True)
                rows.append(dict(D=dim, V=vocab, B=batch, name=name, config=str(named[name]),
                                 us=times[name], matmul_us=matmul))  # fmt: skip
    if not rounds:
        return
    stamp = time.strftime("%Y%m%d-%H%M", time.gmtime())
    path = args.out_dir / f"short_shard_stage1_{gpu.lower().replace(' ', '-')}_{stamp}.json"
    args.out_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(gpu=gpu, torch=torch.__version__, rows=rows), indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
