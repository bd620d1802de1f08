"""Where the first call of ``generate`` spends its time, stock compiled against fused.

Each configuration runs in a fresh process with empty Inductor and Triton caches (a new user's
first call): one ``generate`` (the first call, compiles included, after
``torch.manual_seed(1)``), then a second one. It prints the total of each, the first call's
new tokens (to compare runs of one configuration under different settings),
Dynamo/Inductor's own phase times (``compile_times``), and every Triton compile that ran in
the main process (Inductor compiles its own kernels in worker processes; the op's kernels
compile in the main process, at their first launch or ahead in threads: each line names its
thread), with when it started relative to the call, how long the first launch waited for
the compiles ahead (``FLASHSAMPLING_COMPILE_AHEAD``, flashsampling_inductor/ahead.py), and
how long transformers' eager prefill took; with ``--cprofile``, cProfile's top functions of
the first call (their shares, not their times: cProfile slows the Python-heavy phases).
``FLASHSAMPLING_*`` variables pass through to both.

Needs a CUDA GPU (without one it says so and exits 0) and transformers. Writes nothing; the
output is the report.

    python benchmarks/profile_first_call.py --configs hf_stock,hf_fused --batch 1 --top-k 50
"""

from __future__ import annotations

import argparse
import cProfile
import logging
import os
import pstats
import subprocess
import sys
import tempfile
import threading
import time


def child(config: str, batch: int, top_k: int, new_tokens: int, profile: bool) -> None:
    import torch
    import triton
    import triton.compiler.compiler as triton_compiler

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_generate as bg

    compiles: list[tuple[float, float, str]] = []
    original = triton_compiler.compile
    origin = [0.0]

    def timed_compile(src, *args, **kwargs):
        start = time.perf_counter()
        kernel = original(src, *args, **kwargs)
        name = getattr(getattr(src, "fn", None), "__name__", type(src).__name__)
        thread = threading.current_thread().name
        compiles.append((start - origin[0], time.perf_counter() - start, f"{name} [{thread}]"))
        return kernel

    triton_compiler.compile = timed_compile
    triton.compiler.compile = timed_compile
    waits: list[tuple[float, float]] = []
    dry_runs: list[tuple[float, float, str]] = []
    try:  # (a first launch waiting for the kernels the graph pass started compiling)
        from flashsampling_inductor import launch as fs_launch

        wait = fs_launch.wait_for_compiles

        def timed_wait():
            start = time.perf_counter()
            wait()
            if time.perf_counter() - start > 1e-3:
                waits.append((start - origin[0], time.perf_counter() - start))

        fs_launch.wait_for_compiles = timed_wait
        from flashsampling_inductor import ahead as fs_ahead

        dry_run = fs_ahead._dry_run

        def timed_dry_run(run, kinds):
            start = time.perf_counter()
            dry_run(run, kinds)
            thread = threading.current_thread().name
            dry_runs.append((start - origin[0], time.perf_counter() - start, thread))

        fs_ahead._dry_run = timed_dry_run
        failed = logging.getLogger("flashsampling_inductor")
        failed.setLevel(logging.DEBUG)
        handler = logging.StreamHandler(sys.stdout)
        handler.addFilter(lambda record: "compiled ahead" in record.getMessage())
        failed.addHandler(handler)
    except (ImportError, AttributeError):
        pass

    model = bg.build("qwen3-1.7b")
    prompt = torch.randint(0, 1000, (batch, bg.PROMPT), device="cuda")
    prefills: list[tuple[float, float]] = []
    prefill = model._prefill

    def timed_prefill(*args, **kwargs):
        start = time.perf_counter()
        out = prefill(*args, **kwargs)
        torch.cuda.synchronize()
        prefills.append((start - origin[0], time.perf_counter() - start))
        return out

    model._prefill = timed_prefill
    torch.cuda.synchronize()
    profiler = cProfile.Profile() if profile else None
    origin[0] = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    torch.manual_seed(1)
    outputs = []
    first = bg.timed(
        lambda *a: outputs.append(bg.hf_call(*a)), model, config, prompt, new_tokens, top_k
    )
    if profiler is not None:
        profiler.disable()
    in_first = list(compiles)
    second = bg.timed(bg.hf_call, model, config, prompt, new_tokens, top_k)
    ahead = os.environ.get("FLASHSAMPLING_COMPILE_AHEAD", "1")
    print(f"== {config} B={batch} top_k={top_k} FLASHSAMPLING_COMPILE_AHEAD={ahead}: "
          f"first call {first:.2f} s, second {second:.3f} s")  # fmt: skip
    tokens = outputs[0][:, prompt.shape[1] :]
    print(f"first call's new tokens (torch.manual_seed(1)): sum {int(tokens.sum())}, "
          f"row 0 {tokens[0].tolist()}")  # fmt: skip
    for at, seconds, thread in dry_runs:
        print(f"compile ahead (dry run and its compiles) at {at:.2f} s, {seconds:.2f} s [{thread}]")
    for at, seconds in waits:
        print(f"first launch waited for the compiles ahead: at {at:.2f} s, {seconds:.2f} s")
    triton_s = sum(seconds for _, seconds, _ in in_first)
    print(f"Triton compiles in the main process during the first call: {len(in_first)}, "
          f"{triton_s:.2f} s")  # fmt: skip
    for at, seconds, name in in_first:
        print(f"  at {at:7.2f} s  {seconds:6.2f} s  {name}")
    for at, seconds in prefills[:1]:
        print(f"prefill (eager, transformers' own): at {at:.2f} s, {seconds:.2f} s")
    if profiler is not None:  # (cProfile slows Python-heavy phases: read it as shares)
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(45)
    print(torch._dynamo.utils.compile_times(repr="str", aggregate=True))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--configs", default="hf_stock,hf_fused", help="hf_stock and/or hf_fused")
    parser.add_argument("--batch", type=int, default=1, help="rows per call (default 1)")
    parser.add_argument("--top-k", type=int, default=50, help="generate's top_k (default 50)")
    parser.add_argument("--new-tokens", type=int, default=16, help="tokens per call (default 16)")
    parser.add_argument(
        "--cprofile",
        action="store_true",
        help="also print cProfile's top functions of the first call",
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.batch, args.top_k, args.new_tokens, args.cprofile)
        return
    import torch

    if not torch.cuda.is_available():
        print("profile_first_call.py times a GPU's first generate; there is no GPU here")
        return
    for config in args.configs.split(","):
        with tempfile.TemporaryDirectory() as caches:
            env = dict(
                os.environ,
                TORCHINDUCTOR_CACHE_DIR=os.path.join(caches, "inductor"),
                TRITON_CACHE_DIR=os.path.join(caches, "triton"),
            )
            command = [sys.executable, __file__, "--child", config, "--batch", str(args.batch)]
            command += ["--top-k", str(args.top_k), "--new-tokens", str(args.new_tokens)]
            command += ["--cprofile"] if args.cprofile else []
            subprocess.run(command, env=env, check=False)


if __name__ == "__main__":
    main()
