"""Time candidate stage-1 configurations against cuBLAS, to choose ``default_config``.

    python benchmarks/sweep_configs.py [--batches 64,128,256] [--rounds 3] [--out-dir DIR]
                                       [--shapes 2048x151936,64x151936]

For each shape and batch size: cuBLAS ``hidden @ W.T`` and every candidate (the current
default first), round-robin over several rounds so that clock drift hits all of them alike;
prints the median ratio to the matmul (sampling at T = 1, and greedy, i.e. the kernel with
the noise off) and writes every round to ``kernel_sweep_<gpu>_<date>.json``. Needs a GPU.
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a plain checkout
from flashsampling_inductor.params import SamplingParams  # noqa: E402
from flashsampling_inductor.sampling_kernel import (  # noqa: E402
    SampleConfig,
    default_config,
    triton_fused_sample,
)

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


def median_us(fn) -> float:
    return triton.testing.do_bench(fn, warmup=5, rep=40, return_mode="median") * 1e3


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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,32,64,128,256")
    parser.add_argument(
        "--shapes", default=",".join(f"{d}x{v}" for d, v in SHAPES),
        help="DxV list; a tiny D (64x151936) times the noise and argmax almost alone",
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    gpu = torch.cuda.get_device_name()
    print(gpu, f"torch {torch.__version__}, triton {triton.__version__}", flush=True)

    rows = []
    shapes = [tuple(map(int, shape.split("x"))) for shape in args.shapes.split(",")]
    for dim, vocab in shapes:
        weight = torch.randn(vocab, dim, device="cuda", dtype=torch.bfloat16) * dim**-0.5
        for batch in map(int, args.batches.split(",")):
            hidden = torch.randn(batch, dim, device="cuda", dtype=torch.bfloat16)
            configs = [default_config(batch, dim, hidden.device), *candidates(batch)]
            ratios, greedy = sweep_point(hidden, weight, configs, args.rounds)
            for i, config in enumerate(configs):
                ratio, greedy_ratio = statistics.median(ratios[i]), statistics.median(greedy[i])
                tag = "default" if i == 0 else "       "
                print(
                    f"D={dim} B={batch:<4d} {tag} sample {ratio:.3f}x greedy {greedy_ratio:.3f}x"
                    f" matmul  {config}",
                    flush=True,
                )
                rows.append(dict(D=dim, V=vocab, B=batch, config=str(config), default=i == 0,
                                 ratios=ratios[i], greedy_ratios=greedy[i]))  # fmt: skip
        del weight
    stamp = time.strftime("%Y%m%d-%H%M", time.gmtime())
    path = args.out_dir / f"kernel_sweep_{gpu.lower().replace(' ', '-')}_{stamp}.json"
    args.out_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(gpu=gpu, torch=torch.__version__, triton=triton.__version__,
                                    rows=rows), indent=1))  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
