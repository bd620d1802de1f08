"""What ``seed=None`` costs a step: the seed's draw on the device, alone and before stage 1.

    python benchmarks/probes/seed_draw.py [--shape 4096x37984] [--batches 1,64,256]

``fused_sample`` and ``tp_fused_sample`` with ``seed=None`` draw 62 random bits from the
default CUDA generator (``torch.randint``, one launch a call) so that a TP = P step draws
TP = 1's tokens under the same ``torch.manual_seed`` (issue 39 item 4). This times, replayed
from CUDA graphs of 20 calls (median of 7 replays, three rounds round-robin): the draw
alone, ``torch.full`` of a 0-d int64 (what an explicit int seed cost per call before
FLASHSAMPLING_TP_SCALAR_SEED), and the TP step's stage 1 on one shard (per-tile candidates)
with an int seed, after ``torch.full``, and after the draw. One GPU; without CUDA it says
so and exits 0.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a plain checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))
from short_shard_stage1 import graph_us  # noqa: E402  (benchmarks/probes/)

from flashsampling_inductor.dispatch import triton_fused_sample  # noqa: E402
from flashsampling_inductor.params import SamplingParams  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", default="4096x37984", help="DxV_shard")
    parser.add_argument("--batches", default="1,64,256", help="B list")
    parser.add_argument("--rounds", type=int, default=3, help="round-robin rounds")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("seed_draw.py times kernels on a CUDA GPU; there is none here: nothing run")
        return
    device = torch.device("cuda")
    dim, vocab = map(int, args.shape.split("x"))
    weight = torch.randn(vocab, dim, device=device, dtype=torch.bfloat16) * dim**-0.5
    offset = vocab // 4 * 4

    def draw():
        return torch.randint(0, 2**62, (), dtype=torch.int64, device=device)

    def full():
        return torch.full((), 1234, dtype=torch.int64, device=device)

    for batch in map(int, args.batches.split(",")):
        hidden = torch.randn(batch, dim, device=device, dtype=torch.bfloat16)

        def stage1(seed=None, hidden=hidden):
            params = SamplingParams(None, 1.0, seed, 1234, 1)
            return triton_fused_sample(
                hidden, weight, None, params, vocab_offset=offset, tile_candidates=True
            )

        steps = {
            "draw alone": draw,
            "torch.full alone": full,
            "stage 1, int seed": stage1,
            "torch.full + stage 1": lambda: stage1(full()),
            "draw + stage 1": lambda: stage1(draw()),
        }
        times = {name: [] for name in steps}
        for _ in range(args.rounds):
            for name, step in steps.items():
                times[name].append(graph_us(step))
        print(f"D={dim} V_shard={vocab} B={batch}", flush=True)
        for name, us in times.items():
            print(f"  {name:<22s} {statistics.median(us):7.2f} us  rounds {us}", flush=True)


if __name__ == "__main__":
    main()
