"""Where a call's time goes, kernel by kernel: large_batch_ab.py's providers under
torch.profiler, with the rows stage 2 flags for the exact fallback (overflow) of truncating
calls.

    python benchmarks/probes/large_batch_profile.py [--what rounding] [--shape 4096x151936]
        [--batch 144] [--calls 5] [--providers NAME,...] [--out-dir DIR]

Per provider: the mean CUDA time per call of each kernel (by name, largest first) and, for a
truncating call, how many rows its stage 2 sent to the fallback in one call (those re-read
the weights). Same weights and inputs as large_batch_ab.py (std-5 logits). Writes
``large_batch_profile_<what>.txt`` into ``--out-dir``; needs a Hopper GPU (elsewhere it says
so and exits 0).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a plain checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))
import large_batch_ab  # noqa: E402  (this folder)
from ab_rounds import kernel_times  # noqa: E402  (this folder)

from flashsampling_inductor import truncation_kernel  # noqa: E402


def flagged_rows(fn) -> int | None:
    """Rows stage 2 flagged for the fallback in one call of ``fn`` (None: no stage 2)."""
    seen = []
    launch_fallback = truncation_kernel.launch_fallback

    def counting(*args, **kwargs):
        seen.append(int((args[6] != 0).sum()))  # (overflow: the seventh argument)
        return launch_fallback(*args, **kwargs)

    with large_batch_ab.patched(truncation_kernel, "launch_fallback", counting):
        fn()
    return seen[0] if seen else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--what",
        default="rounding",
        choices=["rounding", "diagnose", "variants", "truncating", "swapped"],
    )
    parser.add_argument("--shape", default="4096x151936")
    parser.add_argument("--batch", type=int, default=144)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--providers", help="comma-separated names: only these (default all)")
    parser.add_argument("--out-dir", default=".")
    args = parser.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("large_batch_profile.py needs a Hopper GPU; there is none here: nothing run")
        return
    make_providers = {
        "rounding": large_batch_ab.rounding_providers,
        "diagnose": large_batch_ab.diagnose_providers,
        "variants": large_batch_ab.providers,
        "truncating": large_batch_ab.truncating_providers,
        "swapped": large_batch_ab.swapped_providers,
    }[args.what]
    hidden_size, vocab = (int(x) for x in args.shape.split("x"))
    generator = torch.Generator(device="cuda").manual_seed(0)
    weight = torch.randn(vocab, hidden_size, generator=generator, device="cuda")
    weight = (weight * (5 / hidden_size**0.5)).bfloat16()
    hidden = torch.randn(args.batch, hidden_size, generator=generator, device="cuda").bfloat16()
    lines = [f"D={hidden_size} V={vocab} B={args.batch}, {torch.cuda.get_device_name()}"]
    timed = make_providers(args.batch, hidden, weight)
    if args.providers:
        timed = {name: timed[name] for name in args.providers.split(",") if name in timed}
    for name, fn in timed.items():
        try:
            flagged = flagged_rows(fn) if name != "matmul" else None
            times = kernel_times(fn, args.calls)
        except Exception as error:  # noqa: BLE001 - reported, the others go on
            lines.append(f"{name}: failed: {error!r}"[:300])
            continue
        total = sum(us for _, us in times)
        lines.append(f"{name}: {total:.1f} us in kernels, fallback rows {flagged}")
        lines += [f"    {us:8.1f} us  {kernel}" for kernel, us in times[:6]]
        print("\n".join(lines[-1 - min(6, len(times)) :]), flush=True)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"large_batch_profile_{args.what}.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
