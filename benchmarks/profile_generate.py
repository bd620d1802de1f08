"""Where a Hugging Face generate step's time goes, stock compiled against hf.enable: one
Qwen3-1.7B-shaped model, one batch size, torch.profiler over one call of each after both
compiled (GPU kernel time per token, host API calls per token, wall per token)."""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_generate as bench  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    model = bench.build("qwen3-1.7b")
    prompt = torch.randint(0, model.config.vocab_size, (args.batch, bench.PROMPT), device="cuda")
    configs = ("hf_stock", "hf_fused")
    for config in configs:  # compile
        bench.hf_call(model, config, prompt, args.new_tokens)
    for _ in range(3):
        for config in configs:
            wall = bench.timed(bench.hf_call, model, config, prompt, args.new_tokens)
            print(f"{config} wall {1e3 * wall / args.new_tokens:.3f} ms/token", flush=True)
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
        print(events.table(sort_by="self_device_time_total", row_limit=8, max_name_column_width=60))


if __name__ == "__main__":
    main()
