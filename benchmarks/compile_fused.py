"""Compile bench_sampling.py's fused providers' Triton kernels without launching any, into
Triton's on-disk cache, so that a later timed call on the same machine image starts warm.

A cold sweep compiles each (shape, batch range, provider) kernel at its first launch, 8-10 s
each for top-p / min-p: minutes of a short lease (sweep_device_run.sh's parallel warm-up
took 80-90 s of GPU time). Here each provider's own step (bench_sampling's builder, so the
same knobs, dtypes and seed) runs as ahead.py's dry run: fake tensors, every launch only
compiles (launch.compile_ahead), no kernel of any kind, so it can run on a GPU machine
beside another job's timings, without a CUDA context. (Each process held one, 520 MiB of an
H200, on 2026-11-28: bench_sampling's ``torch.tensor`` seed, which FakeTensorMode makes on
the GPU for real where CUDA is available; see main.) Several processes split the compiles
(--index / --count, compile_ahead's ``share``). Triton's cache keys are settled first
(ahead._settle_cache_keys), as bench_sampling.py does before it times, so the keys match
whatever ran before. Cached under TRITON_CACHE_DIR: use the same absolute path
when the cache is brought back (its group files hold absolute paths).

    TRITON_CACHE_DIR=/tmp/triton_peers python benchmarks/compile_fused.py --index 0 --count 4
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch._subclasses import fake_tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_sampling as bench  # noqa: E402 (its providers, shapes and batches)

FUSED = ("fused", "fused_topk50", "fused_topk50_topp09", "fused_topp09", "fused_minp01")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", type=bench.parse_shapes, default=bench.SHAPES)
    parser.add_argument("--batches", type=bench.parse_ints, default=bench.BATCHES)
    parser.add_argument("--providers", type=bench.parse_names(FUSED), default=FUSED)
    parser.add_argument("--index", type=int, default=0, help="this process's share")
    parser.add_argument("--count", type=int, default=1, help="processes splitting the compiles")
    parser.add_argument("--threads", type=int, default=4, help="compile threads per process")
    return parser.parse_args(argv)


class DryRunFakeMode(fake_tensor.FakeTensorMode):
    """FakeTensorMode as on a machine without CUDA. Where CUDA is available the mode makes
    ``torch.tensor(data, device="cuda")`` (bench_sampling's 0-d seed) on the GPU for real (its
    constant propagation of the move) before it makes it fake: that one allocation gave each
    process its CUDA context (520 MiB of an H200). Without CUDA the constant stays on the CPU
    and its move to the GPU stays fake, which is all a dry run needs."""

    @property
    def avoid_device_init(self) -> bool:
        return True


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from flashsampling_inductor import ahead, op
    from flashsampling_inductor import launch as launch_module

    # As ahead.child(): a fake CUDA tensor would make a real one (a CUDA context), and
    # Triton's stream query would too; a dry run needs neither.
    fake_tensor.init_gpu_context = lambda device: None
    ahead._no_stream_queries()
    ahead._settle_cache_keys()
    # Fake tensors take the custom op's fake path; real eager tensors go straight to the
    # implementation, and so do these.
    op._plain_eager_call = lambda *tensors: True
    start, failures = time.perf_counter(), 0
    with (
        DryRunFakeMode(),
        launch_module.compile_ahead(threads=args.threads, share=(args.index, args.count)),
    ):
        for dim, vocab in args.shapes:
            weight = torch.empty(vocab, dim, dtype=bench.DTYPE, device=bench.DEVICE)
            for name in args.providers:
                provider = bench.PROVIDERS[name]
                build_args = (bench.FUSED_LOGITS["bf16"],) if provider.truncating else ()
                step = provider.build(weight, *build_args)
                for batch in args.batches:
                    try:
                        step(torch.empty(batch, dim, dtype=bench.DTYPE, device=bench.DEVICE))
                    except Exception as error:  # (its kernels compile at the first launch)
                        failures += 1
                        print(f"D={dim} B={batch} {name}: {bench.one_line(error)}", flush=True)
        print(
            f"share {args.index}/{args.count}: host code done in "
            f"{time.perf_counter() - start:.0f} s, waiting for the compiles",
            flush=True,
        )
    print(
        f"share {args.index}/{args.count}: {time.perf_counter() - start:.0f} s, "
        f"{failures} calls failed",
        flush=True,
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
