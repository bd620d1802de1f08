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

# The main thread's stack, sampled: a phase is the first of these (file's tail, function)
# found in a sample's stack, innermost first among equals, in this order.
PHASES = [
    ("Triton compile (op's kernels)", "triton/compiler/compiler.py", "compile"),
    ("launcher build (first launch)", "triton/compiler/compiler.py", "_init_handles"),
    ("wait for compiles ahead", "flashsampling_inductor/launch.py", "wait_for_compiles"),
    ("our op (first launch)", "flashsampling_inductor/launch.py", "_launch_by_triton"),
    ("Inductor autotune", "triton_heuristics.py", "benchmark_all_configs"),
    ("Inductor codegen+compile", "torch/_inductor/compile_fx.py", "fx_codegen_and_compile"),
    ("Inductor joint passes", "torch/_inductor/compile_fx.py", "_recursive_joint_graph_passes"),
    ("AOT (trace, metadata)", "torch/_functorch/aot_autograd.py", "create_aot_dispatcher_function"),
    ("Inductor (other)", "torch/_inductor/compile_fx.py", "compile_fx"),
    ("guards", "torch/_dynamo/guards.py", "__init__"),
    ("Dynamo (trace, other)", "torch/_dynamo/convert_frame.py", "_compile"),
    ("CUDA graph record", "torch/_inductor/cudagraph_trees.py", "_record"),
    ("CUDA graph trees (warm-up, other)", "torch/_inductor/cudagraph_trees.py", ""),
    ("prefill", "transformers/generation/utils.py", "_prefill"),
    ("compiled step (other)", "flashsampling_inductor/hf.py", "step"),
    ("our op (other)", "flashsampling_inductor/", ""),
    ("generate (other)", "transformers/", ""),
]


class StackSampler(threading.Thread):
    """Samples the main thread's stack every ``period`` seconds: (time, stack id), stacks
    interned as lists of "file:line function" frames, outermost first."""

    def __init__(self, origin: list, period: float = 0.02) -> None:
        super().__init__(name="stack-sampler", daemon=True)
        self.origin, self.period = origin, period
        self.main = threading.main_thread().ident
        self.samples: list[tuple[float, int]] = []
        self.stacks: dict[tuple, int] = {}
        self.running = True

    def run(self) -> None:
        while self.running:
            frame = sys._current_frames().get(self.main)
            stack = []
            while frame is not None:
                code = frame.f_code
                stack.append((code.co_filename, frame.f_lineno, code.co_name))
                frame = frame.f_back
            key = tuple(reversed(stack))
            stack_id = self.stacks.setdefault(key, len(self.stacks))
            self.samples.append((time.perf_counter() - self.origin[0], stack_id))
            time.sleep(self.period)

    def phase(self, stack: tuple) -> str:
        for name, file_tail, function in PHASES:
            for filename, _, code_name in reversed(stack):
                if filename.endswith(file_tail) or (
                    file_tail.endswith("/") and file_tail in filename
                ):
                    if not function or code_name == function:
                        return name
        return "other: " + (f"{stack[-1][0].rsplit('/', 2)[-1]}:{stack[-1][2]}" if stack else "?")

    def report(self, path: str | None, until: float) -> None:
        by_id = {stack_id: stack for stack, stack_id in self.stacks.items()}
        phases = [(at, self.phase(by_id[stack_id])) for at, stack_id in self.samples if at <= until]
        totals: dict[str, float] = {}  # (a sample stands for the time until the next)
        for (at, phase), (next_at, _) in zip(phases, [*phases[1:], (until, None)], strict=True):
            totals[phase] = totals.get(phase, 0.0) + next_at - at
        print(f"main thread, sampled every {self.period * 1e3:.0f} ms (first call, {until:.1f} s):")
        for phase, seconds in sorted(totals.items(), key=lambda item: -item[1])[:25]:
            print(f"  {seconds:7.2f} s  {phase}")
        print("main thread's timeline (spans of one phase >= 0.3 s):")
        spans: list[list] = []
        for at, phase in phases:
            if spans and spans[-1][2] == phase:
                spans[-1][1] = at
            else:
                spans.append([at, at, phase])
        for start, end, phase in spans:
            if end - start >= 0.3:
                print(f"  {start:7.2f} -> {end:7.2f} s  {phase}")
        if path:
            import gzip
            import json

            with gzip.open(path, "wt") as file:
                json.dump(
                    {
                        "period": self.period,
                        "samples": self.samples,
                        "stacks": [[list(frame) for frame in by_id[i]] for i in range(len(by_id))],
                    },
                    file,
                )


def child(
    config: str, batches: list[int], top_k: int, new_tokens: int, profile: bool,
    timeline: str | None,
) -> None:  # fmt: skip
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
    first_launches: list[tuple[float, float, str]] = []
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

        def timed_dry_run(run, kinds, *rest):
            start = time.perf_counter()
            ran = dry_run(run, kinds, *rest)
            thread = threading.current_thread().name
            dry_runs.append((start - origin[0], time.perf_counter() - start, thread))
            return ran

        fs_ahead._dry_run = timed_dry_run
        in_processes = getattr(fs_ahead, "_dry_run_in_processes", None)
        if in_processes is not None:

            def timed_in_processes(run, kinds, *rest, **options):
                start = time.perf_counter()
                in_processes(run, kinds, *rest, **options)
                thread = threading.current_thread().name + ", in child processes"
                dry_runs.append((start - origin[0], time.perf_counter() - start, thread))

            fs_ahead._dry_run_in_processes = timed_in_processes
        in_children = getattr(fs_ahead, "_compile_in_children", None)
        reap = getattr(fs_ahead, "_reap", None)
        if in_children is not None and reap is not None:

            def timed_in_children(run, calls, later=()):
                start = time.perf_counter()
                running = in_children(run, calls, later)
                thread = f"{threading.current_thread().name}, {len(calls)} call(s) in children"
                dry_runs.append((start - origin[0], time.perf_counter() - start, thread))
                return running

            def timed_reap(children):
                start = time.perf_counter()
                reap(children)
                thread = f"{threading.current_thread().name}: other batch sizes in children"
                dry_runs.append((start - origin[0], time.perf_counter() - start, thread))

            fs_ahead._compile_in_children = timed_in_children
            fs_ahead._reap = timed_reap
        by_triton = fs_launch._launch_by_triton

        def timed_first_launch(kernel, grid, args, kwargs):
            start = time.perf_counter()
            compiled = by_triton(kernel, grid, args, kwargs)
            name = getattr(getattr(kernel, "fn", None), "__name__", "?")
            first_launches.append((start - origin[0], time.perf_counter() - start, name))
            return compiled

        fs_launch._launch_by_triton = timed_first_launch
        failed = logging.getLogger("flashsampling_inductor")
        failed.setLevel(logging.DEBUG)
        handler = logging.StreamHandler(sys.stdout)
        handler.addFilter(lambda record: "compiled ahead" in record.getMessage())
        failed.addHandler(handler)
    except (ImportError, AttributeError):
        pass

    events: list[tuple[float, float, str]] = []

    def timed_method(owner, name: str, label: str) -> None:
        method = getattr(owner, name, None)
        if method is None:
            return

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                events.append((start - origin[0], time.perf_counter() - start, label))

        setattr(owner, name, timed)

    from torch._dynamo import convert_frame
    from torch._inductor import cudagraph_trees

    timed_method(convert_frame, "_compile", "Dynamo _compile (trace + AOT + Inductor)")
    timed_method(cudagraph_trees.CUDAGraphNode, "_record", "CUDA graph record")
    timed_method(cudagraph_trees.CUDAWarmupNode, "run", "CUDA graph warm-up run")
    from flashsampling_inductor import hf as fs_hf

    mark_steps = fs_hf._mark_steps

    def timed_mark_steps(compiled, mode):
        step = mark_steps(compiled, mode)

        def timed_step(*args, **kwargs):
            start = time.perf_counter()
            try:
                return step(*args, **kwargs)
            finally:
                events.append((start - origin[0], time.perf_counter() - start, "decode step"))

        return timed_step

    fs_hf._mark_steps = timed_mark_steps
    batch, *batches = batches
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
    sampler = StackSampler(origin) if timeline is not None else None
    if sampler is not None:
        sampler.start()
    if profiler is not None:
        profiler.enable()
    torch.manual_seed(1)
    outputs = []
    first = bg.timed(
        lambda *a: outputs.append(bg.hf_call(*a)), model, config, prompt, new_tokens, top_k
    )
    if profiler is not None:
        profiler.disable()
    first_end = time.perf_counter() - origin[0]
    in_first = list(compiles)
    if sampler is not None:
        sampler.running = False
    second = bg.timed(bg.hf_call, model, config, prompt, new_tokens, top_k)
    ahead = os.environ.get("FLASHSAMPLING_COMPILE_AHEAD", "1")
    # (the hand-off is named only where it is not the default, so older summaries still match)
    handoff = os.environ.get("FLASHSAMPLING_COMPILE_AHEAD_HANDOFF", "late")
    handoff = "" if handoff == "late" else f" FLASHSAMPLING_COMPILE_AHEAD_HANDOFF={handoff}"
    print(f"== {config} B={batch} top_k={top_k} FLASHSAMPLING_COMPILE_AHEAD={ahead}{handoff}: "
          f"first call {first:.2f} s, second {second:.3f} s")  # fmt: skip
    tokens = outputs[0][:, prompt.shape[1] :]
    print(f"first call's new tokens (torch.manual_seed(1)): sum {int(tokens.sum())}, "
          f"row 0 {tokens[0].tolist()}")  # fmt: skip
    report_compiles(dry_runs, waits, in_first)
    for at, seconds in prefills[:1]:
        print(f"prefill (eager, transformers' own): at {at:.2f} s, {seconds:.2f} s")
    print(
        "first launches of the op's kernels (Triton's own path: a compile or a cache hit, "
        "the launcher's build or load):"
    )
    for at, seconds, name in first_launches:
        if at <= first_end:
            print(f"  at {at:7.2f} s  {seconds:6.2f} s  {name}")
    decode_steps = [
        event for event in events if event[2] == "decode step" and event[0] <= first_end
    ]
    print(f"timed events of the first call (ends at {first_end:.2f} s):")
    for at, seconds, label in events:
        if at <= first_end and (label != "decode step" or seconds > 0.05):
            print(f"  at {at:7.2f} s  {seconds:6.2f} s  {label}")
    if decode_steps:
        rest = sum(seconds for _, seconds, _ in decode_steps[1:])
        print(f"  decode steps 2..{len(decode_steps)}: {rest:.3f} s of host time in all")
    if sampler is not None:
        sampler.report(timeline, first_end)
    if profiler is not None:  # (cProfile slows Python-heavy phases: read it as shares)
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(45)
    for later in batches:
        # A new batch size in the same process, as a server meets them: Dynamo compiles the
        # step again with a dynamic batch at the second size (both configurations), and the
        # op's kernels may need variants of their own.
        for record in (compiles, waits, first_launches, dry_runs, events):
            record.clear()
        prompt = torch.randint(0, 1000, (later, bg.PROMPT), device="cuda")
        torch.cuda.synchronize()
        origin[0] = time.perf_counter()
        sampler = StackSampler(origin) if timeline is not None else None
        if sampler is not None:
            sampler.start()
        first = bg.timed(bg.hf_call, model, config, prompt, new_tokens, top_k)
        first_end = time.perf_counter() - origin[0]
        if sampler is not None:
            sampler.running = False
        second = bg.timed(bg.hf_call, model, config, prompt, new_tokens, top_k)
        print(f"== {config} B={later} (after B={batch} in this process): first call "
              f"{first:.2f} s, second {second:.3f} s")  # fmt: skip
        report_compiles(dry_runs, waits, [entry for entry in compiles if entry[0] <= first_end])
        for at, seconds, label in events:
            if at <= first_end and (label != "decode step" or seconds > 0.05):
                print(f"  at {at:7.2f} s  {seconds:6.2f} s  {label}")
        if sampler is not None:
            sampler.report(timeline.replace(".json.gz", "") + f"_b{later}.json.gz", first_end)
        batch = later
    print(torch._dynamo.utils.compile_times(repr="str", aggregate=True))


def report_compiles(dry_runs: list, waits: list, in_first: list) -> None:
    for at, seconds, thread in dry_runs:
        print(f"compile ahead (dry run and its compiles) at {at:.2f} s, {seconds:.2f} s [{thread}]")
    for at, seconds in waits:
        print(f"first launch waited for the compiles ahead: at {at:.2f} s, {seconds:.2f} s")
    triton_s = sum(seconds for _, seconds, _ in in_first)
    print(f"Triton compiles in the main process during the first call: {len(in_first)}, "
          f"{triton_s:.2f} s")  # fmt: skip
    for at, seconds, name in in_first:
        print(f"  at {at:7.2f} s  {seconds:6.2f} s  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--configs", default="hf_stock,hf_fused", help="hf_stock and/or hf_fused")
    parser.add_argument(
        "--batch",
        default="1",
        help="rows per call (default 1); several, comma-separated (16,64): the first call of "
        "each in turn in one process (the first one's report in full)",
    )
    parser.add_argument("--top-k", type=int, default=50, help="generate's top_k (default 50)")
    parser.add_argument("--new-tokens", type=int, default=16, help="tokens per call (default 16)")
    parser.add_argument(
        "--cprofile",
        action="store_true",
        help="also print cProfile's top functions of the first call",
    )
    parser.add_argument(
        "--timeline",
        default=None,
        metavar="PREFIX",
        help="also sample the main thread's stack every 20 ms during the first call: print its "
        "phases and spans, and write the samples to PREFIX<config>.json.gz",
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        batches = [int(batch) for batch in args.batch.split(",")]
        child(args.child, batches, args.top_k, args.new_tokens, args.cprofile, args.timeline)
        # (the compile workers' shutdown and the CUDA teardown are no part of the report:
        # seconds a run saves on a GPU machine's time)
        sys.stdout.flush()
        os._exit(0)
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
            command += ["--timeline", f"{args.timeline}{config}.json.gz"] if args.timeline else []
            subprocess.run(command, env=env, check=False)
            if args.timeline:
                cache_report(os.path.join(caches, "triton"), f"{args.timeline}{config}")


def cache_report(cache: str, prefix: str) -> None:
    """The op's kernels in the Triton cache after the run: per kernel, each compiled variant
    (its hash directory) with its options from the metadata, the size of its TTIR and its
    first line (the signature's specialization); their metadata and TTIR go to
    PREFIX_triton_cache.tar.gz (a kernel compiled twice with different keys shows there)."""
    import glob
    import hashlib
    import json
    import tarfile

    variants: dict[str, list] = {}
    kept = []
    for path in sorted(glob.glob(os.path.join(cache, "*", "*.json"))):
        name = os.path.basename(path)[: -len(".json")]
        if name.startswith(("__grp__", "triton_", "cuda_utils")) or name == "__triton_launcher":
            continue
        ttir = path[: -len(".json")] + ".ttir"
        with open(path) as file:
            metadata = json.load(file)
        first = ""
        if os.path.exists(ttir):
            with open(ttir) as file:
                first = next((line for line in file if "tt.func" in line), "")
            kept.append(ttir)
        kept.append(path)
        variants.setdefault(name, []).append(
            (
                os.path.basename(os.path.dirname(path)),
                metadata,
                first,
                os.path.getsize(ttir) if os.path.exists(ttir) else 0,
            )
        )
    print("the op's kernels in the Triton cache (variants: hash, ttir bytes, options that differ):")
    for name, found in variants.items():
        keys = set().union(*(metadata.keys() for _, metadata, _, _ in found))
        differ = sorted(
            k
            for k in keys
            if k != "hash"
            and len({json.dumps(m.get(k), sort_keys=True) for _, m, _, _ in found}) > 1
        )
        print(f"  {name}: {len(found)} variant(s); options that differ: {differ}")
        for directory, metadata, first, size in found:
            signature = hashlib.sha256(first.encode()).hexdigest()[:8]
            differing = {k: metadata.get(k) for k in differ}
            print(f"    {directory[:16]} ttir {size} B, signature {signature}; {differing}")
    with tarfile.open(f"{prefix}_triton_cache.tar.gz", "w:gz") as tar:
        for path in kept:
            tar.add(path, arcname=os.path.relpath(path, cache))


if __name__ == "__main__":
    main()
