"""What the fused op costs on an fp32 LM head (fp32 weight and hidden states) against the
fp32 matmul alone and the stock eager step, with TF32 off (PyTorch's default) and on.

    python benchmarks/probes/fp32_weights.py [--shape 2048x151936] [--batches 1,16,64]

Providers, each captured in a CUDA graph and replayed 50 times between events (median of 5
loops): the fused call plain (T = 1) and with top-k 50, the matmul alone, and the stock eager
step (matmul, softmax, multinomial). One GPU; without CUDA it says so and exits 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a plain checkout
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sampling import capture_graph  # noqa: E402
from whole_row_ab import loop_us  # noqa: E402

from flashsampling_inductor import fused_sample  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", default="2048x151936", help="DxV")
    parser.add_argument("--batches", default="1,16,64")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing run")
        return
    hidden_size, vocab = (int(v) for v in args.shape.split("x"))
    weight = torch.randn(vocab, hidden_size, device="cuda") * 0.04
    seed = torch.tensor(7, device="cuda")
    for tf32 in (False, True):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        for batch in (int(b) for b in args.batches.split(",")):
            h = torch.randn(batch, hidden_size, device="cuda")
            providers = {
                "fused": lambda h=h: fused_sample(h, weight, seed=seed),
                "fused_k50": lambda h=h: fused_sample(h, weight, top_k=50, seed=seed),
                "matmul": lambda h=h: h @ weight.T,
                "stock": lambda h=h: torch.multinomial(torch.softmax(h @ weight.T, -1), 1),
            }
            with torch.no_grad():
                us = {name: loop_us(capture_graph(fn)) for name, fn in providers.items()}
            print(
                f"tf32={tf32} D={hidden_size} V={vocab} B={batch}: "
                + " ".join(f"{name} {value:.1f}" for name, value in us.items())
                + f" us | fused/stock {us['fused'] / us['stock']:.2f}"
                + f" fused/matmul {us['fused'] / us['matmul']:.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
