"""Where a Hugging Face generate step's time goes, stock compiled against hf.enable: one
Qwen3-1.7B-shaped model, one batch size, torch.profiler over one call of each after both
compiled (GPU kernel time per token, host API calls per token, wall per token), and with
``--syncs`` where each call makes the host wait for the device (CUDA sync debug mode).

Needs a CUDA GPU (without one it says so and exits 0) and transformers; about 2 minutes.
Prints the per-token figures and the profiler's tables; writes nothing.

    python benchmarks/profile_generate.py [--batch 8] [--new-tokens 64] [--syncs] [--rows 8]
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
import traceback
import warnings

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_generate as bench  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=8, help="rows per generate (default 8)")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens per call (default 64)")
    parser.add_argument("--syncs", action="store_true", help="list the host-device syncs")
    parser.add_argument(
        "--rows", type=int, default=8, help="kernels listed by GPU time (default 8)"
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("profile_generate.py profiles generate on a CUDA GPU; there is none here")
        return
    model = bench.build("qwen3-1.7b")
    prompt = torch.randint(0, model.config.vocab_size, (args.batch, bench.PROMPT), device="cuda")
    configs = ("hf_stock", "hf_fused")
    for config in configs:  # compile
        bench.hf_call(model, config, prompt, args.new_tokens)
    for _ in range(3):
        for config in configs:
            wall = bench.timed(bench.hf_call, model, config, prompt, args.new_tokens)
            print(f"{config} wall {1e3 * wall / args.new_tokens:.3f} ms/token", flush=True)
    if args.syncs:
        for config in configs:
            print_syncs(config, lambda c=config: bench.hf_call(model, c, prompt, args.new_tokens))
    for config in configs:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            start = time.perf_counter()
            bench.hf_call(model, config, prompt, args.new_tokens)
            torch.cuda.synchronize()
            wall = time.perf_counter() - start
        events = prof.key_averages()
        gpu_us = sum(e.self_device_time_total for e in events) / args.new_tokens
        print(
            f"\n== {config}: wall {1e3 * wall / args.new_tokens:.3f} ms/token under the "
            f"profiler, GPU kernels {gpu_us / 1e3:.3f} ms/token",
            flush=True,
        )
        print(events.table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=60))
        print(
            events.table(
                sort_by="self_device_time_total", row_limit=args.rows, max_name_column_width=60
            )
        )


def print_syncs(config: str, call) -> None:
    """Run ``call`` with CUDA's sync debug mode on; print each place that synced, by count."""
    places = collections.Counter()

    def record(message, category, filename, lineno, file=None, line=None):
        stack = traceback.extract_stack()[:-2]
        ours = [f for f in stack if "site-packages/torch/" not in f.filename][-4:]
        places[" <- ".join(f"{os.path.basename(f.filename)}:{f.lineno}" for f in ours[::-1])] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            call()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    print(f"\n== {config}: {sum(places.values())} syncs in one call", flush=True)
    for place, count in places.most_common(12):
        print(f"{count:6d}  {place}")


if __name__ == "__main__":
    main()
