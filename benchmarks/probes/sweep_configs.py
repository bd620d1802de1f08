"""Time candidate stage-1 configurations against cuBLAS, to choose ``default_config``.

    python benchmarks/probes/sweep_configs.py [--batches 64,128,256] [--rounds 3] [--out-dir DIR]
                                       [--shapes 2048x151936,64x151936] [--top-k 50]

For each shape and batch size: cuBLAS ``hidden @ W.T`` and every candidate (the current
default first), round-robin over several rounds so that clock drift hits all of them alike;
prints the median ratio to the matmul (sampling at T = 1, and greedy, i.e. the kernel with
the noise off) and writes every round to ``kernel_sweep_<gpu>_<date>.json``. Needs a CUDA
GPU (without one it says so and exits 0).

With ``--top-k K`` the candidates are those of a truncating call (stage 1 keeps each tile's
few largest scores and draws no noise; stage 2, its merge and the fallback's launches
follow), timed as whole calls replayed from a CUDA graph, with logits of std 5 (~3.6 nats,
as bench_sampling's --logit-std 5) so that no row leaves the fast path; the "greedy" column
is then the plain call (T = 1, no top-k) under the same default.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a plain checkout
from flashsampling_inductor.dispatch import (  # noqa: E402
    SampleConfig,
    default_config,
    triton_fused_sample,
)
from flashsampling_inductor.params import SamplingParams  # noqa: E402

SHAPES = [(2048, 151936), (4096, 151936), (8192, 128256)]


def candidates(batch: int) -> list[SampleConfig]:
    """The configurations the committed sweeps compared, by batch bucket."""
    if batch <= 32:
        block_b = max(16, triton.next_power_of_2(batch))
        return [SampleConfig(block_b, 64, 128, num_stages=4, tma=True)]
    if batch <= 64:
        return [
            SampleConfig(64, 128, 64, swap_ab=False, num_stages=4, programs_per_sm=2),
            SampleConfig(64, 128, 64, swap_ab=False, num_stages=4, tma=True, epilogue_chunks=2),
            SampleConfig(64, 64, 64, swap_ab=False, num_stages=4),
        ]
    large = dict(swap_ab=False, num_warps=8, num_stages=3, tma=True)
    return [
        SampleConfig(128, 128, 64, maxnreg=128, programs_per_sm=2, epilogue_chunks=2, **large),
        SampleConfig(128, 256, 64, epilogue_chunks=4, **large),
        SampleConfig(128, 256, 64, programs_per_sm=1, epilogue_chunks=4, **large),
        SampleConfig(128, 128, 64, maxnreg=128, epilogue_chunks=4, **large),
    ]


def truncation_candidates(batch: int) -> list[SampleConfig]:
    """Stage-1 configurations for a truncating call: its epilogue selects each tile's few
    largest scores instead of drawing noise, so the plain call's choice need not carry over
    (the Gluon kernel has no truncating epilogue)."""
    if batch <= 32:
        return candidates(batch)
    if batch <= 64:
        return [
            SampleConfig(64, 64, 128, num_stages=4),
            SampleConfig(64, 64, 128, num_stages=4, tma=True),
            SampleConfig(64, 64, 128, num_stages=3, num_warps=8),
            SampleConfig(32, 64, 128, num_stages=4),
            SampleConfig(64, 128, 64, swap_ab=False, num_stages=4, tma=True),
            SampleConfig(64, 128, 64, swap_ab=False, num_stages=4, programs_per_sm=2),
            SampleConfig(64, 64, 64, swap_ab=False, num_stages=4),
            SampleConfig(64, 128, 64, swap_ab=False, num_stages=4, num_warps=8),
        ]
    return candidates(batch)


def median_us(fn) -> float:
    return triton.testing.do_bench(fn, warmup=5, rep=40, return_mode="median") * 1e3


def graph_median_us(fn) -> float:
    """Median of CUDA-graph replays of one call of fn (captured after warm-up)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return median_us(graph.replay)


def sweep_truncation(hidden, weight, configs, rounds, top_k):
    """Per config, the ratio to the matmul in each round of a top-k call, and of the plain
    call with the default configuration (the same for every config: a reference line)."""
    truncating = SamplingParams(None, 1.0, None, 1, 1, top_k=None, scalar_top_k=top_k)
    plain = SamplingParams(None, 1.0, None, 1, 1)
    calls = [
        lambda c=config: triton_fused_sample(hidden, weight, None, truncating, c)
        for config in configs
    ]
    expected = calls[0]()
    for config, call in zip(configs, calls, strict=True):  # the tokens do not depend on the tiles
        if not torch.equal(call(), expected):
            raise AssertionError(f"{config} drew other tokens than the default")
    ratios = [[] for _ in configs]
    plain_ratios = [[] for _ in configs]
    for _ in range(rounds):
        matmul = median_us(lambda: hidden @ weight.T)
        plain_us = graph_median_us(lambda: triton_fused_sample(hidden, weight, None, plain))
        for i, call in enumerate(calls):
            ratios[i].append(graph_median_us(call) / matmul)
            plain_ratios[i].append(plain_us / matmul)
    return ratios, plain_ratios


def sweep_point(hidden, weight, configs, rounds):
    """Per config, the ratio to the matmul in each round: sampling at T = 1, and greedy."""

    def sample(config, temperature):
        params = SamplingParams(None, temperature, None, 1, 1)
        return lambda: triton_fused_sample(hidden, weight, None, params, config)

    ratios = [[] for _ in configs]
    greedy = [[] for _ in configs]
    for _ in range(rounds):
        matmul = median_us(lambda: hidden @ weight.T)
        for i, config in enumerate(configs):
            ratios[i].append(median_us(sample(config, 1.0)) / matmul)
            greedy[i].append(median_us(sample(config, 0.0)) / matmul)
    return ratios, greedy


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", default="1,32,64,128,256", help="B list")
    parser.add_argument(
        "--shapes", default=",".join(f"{d}x{v}" for d, v in SHAPES),
        help="DxV list; a tiny D (64x151936) times the noise and argmax almost alone",
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3, help="round-robin rounds (default 3)")
    parser.add_argument("--top-k", type=int, default=0, help="time truncating calls (top-k K)")
    parser.add_argument(
        "--out-dir", type=Path, default=Path(__file__).parents[1] / "results", help="JSON's folder"
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("sweep_configs.py times kernels on a CUDA GPU; there is none here: nothing run")
        return
    gpu = torch.cuda.get_device_name()
    print(gpu, f"torch {torch.__version__}, triton {triton.__version__}", flush=True)

    rows = []
    shapes = [tuple(map(int, shape.split("x"))) for shape in args.shapes.split(",")]
    for dim, vocab in shapes:
        std = 5.0 if args.top_k else 1.0
        weight = torch.randn(vocab, dim, device="cuda", dtype=torch.bfloat16) * std * dim**-0.5
        for batch in map(int, args.batches.split(",")):
            hidden = torch.randn(batch, dim, device="cuda", dtype=torch.bfloat16)
            if args.top_k:
                configs = [None, *truncation_candidates(batch)]  # None: the call's own choice
                ratios, greedy = sweep_truncation(hidden, weight, configs, args.rounds, args.top_k)
            else:
                configs = [default_config(batch, dim, hidden.device), *candidates(batch)]
                ratios, greedy = sweep_point(hidden, weight, configs, args.rounds)
            for i, config in enumerate(configs):
                ratio, greedy_ratio = statistics.median(ratios[i]), statistics.median(greedy[i])
                tag = "default" if i == 0 else "       "
                second = "plain" if args.top_k else "greedy"
                print(
                    f"D={dim} B={batch:<4d} {tag} sample {ratio:.3f}x {second} {greedy_ratio:.3f}x"
                    f" matmul  {config}",
                    flush=True,
                )
                rows.append(dict(D=dim, V=vocab, B=batch, config=str(config), default=i == 0,
                                 ratios=ratios[i], greedy_ratios=greedy[i]))  # fmt: skip
        del weight
    stamp = time.strftime("%Y%m%d-%H%M", time.gmtime())
    kind = f"top_k{args.top_k}_" if args.top_k else ""
    path = args.out_dir / f"kernel_sweep_{kind}{gpu.lower().replace(' ', '-')}_{stamp}.json"
    args.out_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(gpu=gpu, torch=torch.__version__, triton=triton.__version__,
                                    rows=rows), indent=1))  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
