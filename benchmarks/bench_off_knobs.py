"""What a plain-sampling batch pays for carrying its truncation knobs as per-row tensors at
their "off" values (top_k 0, top_p 1.0, min_p 0.0), as one compiled serving step does so that
no setting is a graph of its own. Kernel level, one GPU call (CUDA only; without CUDA it
says so and exits 0).

Per shape and batch size B: ``fused_sample(hidden [B, D], weight [V, D])`` bf16 with a [B]
temperature tensor and a device seed, then the same call with ``top_k=zeros[B]``,
``top_p=ones[B]``, ``min_p=zeros[B]`` (which the op cannot tell from truncating knobs at
launch: it takes the truncating kernels, which draw those rows untruncated). Times are
``triton.testing.do_bench`` medians, the two calls interleaved over --rounds rounds.
Goal of issue 35: <= 1% at B <= 64.

    python benchmarks/bench_off_knobs.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import csv
import functools
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # a checkout

SHAPES = {"qwen3-1.7b": (2048, 151936), "llama-3.1-8b": (4096, 128256)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--shapes", default="qwen3-1.7b,llama-3.1-8b", help="of " + str(SHAPES))
    parser.add_argument("--batches", default="1,16,32,64,128,256")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds")
    parser.add_argument("--out", default="benchmarks/results", help="folder of the CSV")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_off_knobs.py needs a CUDA GPU: nothing to run here")
        return
    import triton

    from flashsampling_inductor import fused_sample

    device_name = torch.cuda.get_device_name().lower().replace(" ", "-")
    stamp = time.strftime("%Y%m%d-%H%M", time.gmtime())
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"bench_off_knobs_{device_name}_{stamp}.csv")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__} -> {path}", flush=True)
    fields = ["shape", "batch", "plain_us", "off_tensors_us", "ratio"]
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        for shape in args.shapes.split(","):
            hidden_size, vocab = SHAPES[shape]
            weight = torch.randn(vocab, hidden_size, device="cuda", dtype=torch.bfloat16)
            for batch in (int(b) for b in args.batches.split(",")):
                hidden = torch.randn(batch, hidden_size, device="cuda", dtype=torch.bfloat16)
                common = dict(
                    temperature=torch.full((batch,), 0.7, device="cuda"),
                    seed=torch.tensor(7, device="cuda"),
                )
                off = dict(
                    top_k=torch.zeros(batch, dtype=torch.int64, device="cuda"),
                    top_p=torch.ones(batch, device="cuda"),
                    min_p=torch.zeros(batch, device="cuda"),
                )
                calls = {
                    "plain_us": functools.partial(fused_sample, hidden, weight, **common),
                    "off_tensors_us": functools.partial(
                        fused_sample, hidden, weight, **common, **off
                    ),
                }
                if not torch.equal(calls["plain_us"](), calls["off_tensors_us"]()):
                    print(f"{shape} B={batch}: the two calls drew different tokens", flush=True)
                times = {name: [] for name in calls}
                for _ in range(args.rounds):
                    for name, call in calls.items():
                        times[name].append(1e3 * triton.testing.do_bench(call, rep=50))
                row = dict(shape=shape, batch=batch)
                row.update({name: round(statistics.median(t), 1) for name, t in times.items()})
                row["ratio"] = round(row["off_tensors_us"] / row["plain_us"], 3)
                writer.writerow(row)
                handle.flush()
                print(row, flush=True)


if __name__ == "__main__":
    main()
