"""How often the logits-free path of top-p / min-p holds, on realistic and on flat rows.

The truncating kernel keeps each vocabulary tile's m largest scores (``candidates_per_tile``)
and proves in stage 2 that they hold every token the row keeps; a row it cannot prove takes
the exact fallback, which recomputes that row's logits (truncation_kernel.py). This script
counts the rows that stay on the fast path, and of the others those whose few hiding tiles
are recomputed (patched) or whose whole row is, by recording the overflow codes stage 2
hands to the fallback, for:

    zipf-H   Zipf-like rows whose softmax has entropy H nats (H = 1, 2, 3, 4): scores
             -alpha * ln(rank) + N(0, 0.3) jitter, ranks placed at random vocabulary indices
             (alpha solved for H), the shape of an LM's next-token distribution
    flat     N(0, 1) scores (entropy ~ ln V - 0.5)
    uniform  every score equal up to 1e-3 (entropy ln V)

at top_p = 0.9 and min_p = 0.1 (T = 1, no top-k), V = 151936, with the stage-1 tiles the
kernel uses on CUDA for the batch (``default_config``). The logits are exact in the kernel:
weight [V, B] holds row b's scores in column b and hidden is the identity, so the matmul
multiplies by 1 and 0. Only the flags are recorded: the fallback itself is not run. On CPU
the kernels run under the Triton interpreter (B <= 32 there; a few minutes); the counts do
not depend on the device.

Runs on a CUDA GPU (seconds) or on the CPU (the Triton interpreter, set by the script:
about 2 minutes per family at B = 32). Prints a markdown table (rows per family and filter:
fast path, patched, whole row recomputed); ``--out`` also writes it to a file.

    python benchmarks/probes/fast_path_rate.py [--batch 32] [--rows-per-family 32] [--out FILE]
                                        [--families zipf-4,flat]
"""

from __future__ import annotations

import argparse
import os
import time

if __name__ == "__main__" and not __import__("torch").cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch

from flashsampling_inductor import dispatch, truncation_kernel
from flashsampling_inductor.dispatch import default_config, triton_fused_sample
from flashsampling_inductor.params import SamplingParams

VOCAB = 151936
ENTROPIES = (1.0, 2.0, 3.0, 4.0)
JITTER = 0.3


def entropy(scores: torch.Tensor) -> torch.Tensor:
    log_probs = scores.double().log_softmax(-1)
    return -(log_probs.exp() * log_probs).sum(-1)


def zipf_rows(rows: int, target: float, generator: torch.Generator, device) -> torch.Tensor:
    """[rows, V] Zipf-like scores with softmax entropy ``target`` nats (alpha by bisection,
    every row at once, in float64 on ``device``)."""
    log_rank = torch.arange(1, VOCAB + 1, dtype=torch.float64).log().to(device)
    jitter = (torch.randn(rows, VOCAB, generator=generator, dtype=torch.float64) * JITTER).to(
        device
    )
    low = torch.full((rows, 1), 0.1, dtype=torch.float64, device=device)
    high = torch.full((rows, 1), 20.0, dtype=torch.float64, device=device)
    for _ in range(50):
        alpha = (low + high) / 2
        hotter = entropy(-alpha * log_rank + jitter)[:, None] > target
        low, high = torch.where(hotter, alpha, low), torch.where(hotter, high, alpha)
    scores = (-(low + high) / 2 * log_rank + jitter).float().cpu()
    order = torch.stack([torch.randperm(VOCAB, generator=generator) for _ in range(rows)])
    return scores.gather(1, order)


def families(rows: int, seed: int, device="cpu") -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    found = {f"zipf-{h:g}": zipf_rows(rows, h, generator, device) for h in ENTROPIES}
    found["flat"] = torch.randn(rows, VOCAB, generator=generator)
    found["uniform"] = torch.rand(rows, VOCAB, generator=generator) * 1e-3
    return found


def kept_sizes(scores: torch.Tensor, top_p: float, min_p: float) -> torch.Tensor:
    """Per row, how many tokens the filter keeps (float64, T = 1)."""
    probabilities = scores.double().softmax(-1)
    if min_p > 0:
        return (probabilities >= min_p * probabilities.amax(-1, keepdim=True)).sum(-1)
    sorted_probabilities = probabilities.sort(-1, descending=True).values
    larger = sorted_probabilities.cumsum(-1) - sorted_probabilities
    return (larger < top_p).sum(-1)


def overflow_codes(scores: torch.Tensor, batch: int, device, top_p: float, min_p: float):
    """-> int [rows]: 0 where stage 2 proved its candidates complete, else the fallback it
    chose (truncation_kernel.OVERFLOW_PATCH: a few tiles recomputed; OVERFLOW_FULL: the row)."""
    flags = []
    launch = truncation_kernel.launch_fallback

    def record(hidden, weight, bias, params, temperature_mode, out, overflow, *rest):
        flags.append(overflow.clone().cpu())

    truncation_kernel.launch_fallback = record
    try:
        for start in range(0, len(scores), batch):
            chunk = scores[start : start + batch]
            weight = torch.zeros(VOCAB, batch, device=device)
            weight[:, : len(chunk)] = chunk.T.to(device)
            hidden = torch.eye(batch, device=device)[: len(chunk)]
            params = SamplingParams(
                None, 1.0, None, start, 1, None, None, 0, None, top_p, None, min_p
            )
            # The tiles CUDA uses for this batch (default_config's CPU choice differs).
            config = default_config(len(chunk), batch, torch.device("cuda"), truncates=True)
            triton_fused_sample(hidden, weight, None, params, config)
    finally:
        truncation_kernel.launch_fallback = launch
    return torch.cat(flags)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--batch", type=int, default=32, help="rows per call, which picks the tiles (<= 32 on CPU)"
    )
    parser.add_argument(
        "--rows-per-family", type=int, default=32, help="rows drawn per family (default 32)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated rows")
    parser.add_argument("--out", default=None, help="also write the table to this file")
    parser.add_argument(
        "--families", default=None, help="comma list (default all: zipf-1..4, flat, uniform)"
    )
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu" and args.batch > 32:
        parser.error("on CPU --batch must be <= 32 (default_config asks CUDA beyond that)")
    config = default_config(args.batch, args.batch, torch.device("cuda"), truncates=True)
    params = SamplingParams(None, 1.0, None, 0, 1, None, None, 0, None, 0.9)
    m = dispatch.candidates_per_tile(params, config.block_v, VOCAB, args.batch)
    where = torch.cuda.get_device_name() if device.type == "cuda" else "cpu (interpreter)"
    lines = [
        f"# fast_path_rate: V = {VOCAB}, B = {args.batch}, tiles {config.block_v} wide, "
        f"m = {m} candidates per tile, T = 1, {where}, torch {torch.__version__}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"# stage 2 merges candidates in {dispatch.merge_groups(params)} groups per row;"
        f" a flagged row with at most"
        f" {truncation_kernel.PATCH_TILES} hiding tiles is patched (those tiles recomputed)",
        "| rows | entropy (nats) | filter | kept tokens (median, max) | fast path | patched |"
        " whole row recomputed |",
        "|---|---|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    for name, scores in families(args.rows_per_family, args.seed, device).items():
        if args.families and name not in args.families.split(","):
            continue
        h = entropy(scores)
        for filter_name, top_p, min_p in (("top_p 0.9", 0.9, 0.0), ("min_p 0.1", 1.0, 0.1)):
            sizes = kept_sizes(scores, top_p, min_p)
            codes = overflow_codes(scores, args.batch, device, top_p, min_p)
            fast = codes == 0
            patched = int((codes == truncation_kernel.OVERFLOW_PATCH.value).sum())
            full = int((codes == truncation_kernel.OVERFLOW_FULL.value).sum())
            line = (
                f"| {name} | {h.median():.2f} | {filter_name} | {int(sizes.median())}, "
                f"{int(sizes.max())} | {int(fast.sum())}/{len(fast)} "
                f"({100 * fast.double().mean():.0f}%) | {patched} | {full} |"
            )
            lines.append(line)
            print(line, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
