"""Serving benchmark: transformers' continuous batching (its ``ContinuousBatchingManager``), stock
against fused by ``flashsampling_inductor.hf.enable(model)``. One GPU call (CUDA only; without
CUDA it says so and exits 0).

As the FlashSampling paper's vLLM runs: a stream of requests with Poisson arrivals at B
requests/s and at most B in flight (a client-side cap, as ``--max-concurrency``), for each
concurrency B. Models: Qwen3-1.7B and Llama-3.1-8B shapes with random bf16 weights
(``bench_generate.build``). Each request has a prompt of --prompt-min..--prompt-max random
tokens and --new-min..--new-max new tokens (uniform, eos off), and one of three settings,
in turn: half generate-style (temperature 0.7, top-k 50), a third Qwen3's (0.6, top-k 20,
top-p 0.95), the rest greedy. The manager's generation config turns on transformers'
per-request warpers (``per_request_processors=True``) for temperature, top-k and top-p.
Greedy is ``temperature=0`` for the fused manager (the op's greedy rows); transformers'
warpers divide by the temperature, so the stock manager's greedy requests are ``top_k=1``
(the argmax, up to ties).

Both managers attend through transformers' flash path (--attention torch_flash, the default):
its varlen attention, no mask, its CUDA graphs and asynchronous batching on by default, with
torch's own FlashAttention-2 kernels standing in for the flash-attn package, which our GPU
machines lack (torch_flash.py). Without a flash implementation transformers runs paged|sdpa
(--attention sdpa), which attends every request to the whole batch's keys under a mask: at
B = 128 that attention took ~90% of an 8B model's step and hid the sampling.

  stock   the manager with its own compile config (level 1: Inductor "default", dynamic
          shapes) and its CUDA graphs, warmed up by its own warmup (--stock-compile default,
          the default; --stock-compile none: transformers' eager step in its CUDA graphs).
          Where this torch's Inductor cannot compile a split scan, scans are kept whole
          (keep_scans_whole, below)
  fused   the manager after ``hf.enable(model)``: the step compiled (Inductor, "default",
          dynamic) with backend "flashsampling", the warpers, softmax and
          ``torch.multinomial`` one ``sample_logits`` call with per-request knobs, fused with
          the LM head; in the same CUDA graphs

Both managers are made once per shape and kept running; the configurations are interleaved
(repeat r of every configuration before repeat r + 1 of any). The stock manager runs its own
warmup (CUDA graphs captured at the largest sizes); the fused one does not (--warmup): that
warmup compiles at the full buffers' sizes, whose contiguous attention mask Dynamo guards on,
and the first served step compiles every graph again. Each shape's first concurrency has a
first, untimed run of each configuration (the compiles, the captures of most sizes); with
--warm every, every concurrency has one. ``first_call_s`` is the wall time of a
configuration's first run at that concurrency (at the shape's first, plus making the
manager). Dynamo's settings are entered in the manager's generation thread, where the step
compiles (torch's config overrides are per thread): no duck sizing (two sizes equal at the
first compile would otherwise become one symbol, and the first step where they differ
compiles every graph again) and room for transformers' many wrapped functions. Per run: TPOT
of each request = (last token's time - first token's time) / (tokens - 1), from the
manager's own timestamps; ``tpot_ms`` is the median over the requests of the timed runs,
``tokens_per_s`` the median over them of output tokens / wall time of the run. Deadlines
(--budget-s, one per shape, from the start) stop starting new cells, so what ran is written
(a started cell still runs to its end: up to a minute at B = 256). Both shapes'
grid does not fit one 600 s call (each configuration's first call, its compile, took 71-77 s
on an H200): run a shape per call (--shapes, --budget-s; benchmarks/jobs/serve6_job.sh, one
shape's grid with three repeats in 334 s for Qwen3-1.7B and 430 s for Llama-3.1-8B). Where
a cell misses the issue's goal (fused TPOT <= 0.95x stock, tokens/s >= 1.05x) and the shape's
deadline has not passed, each
configuration serves the smallest such cell again under torch.profiler (--profile-s s of
steps): the top kernels by GPU time go to the log and ``profile_<shape>_B<B>.txt``. CSV
``bench_serving_<gpu>_<date>.csv`` (``_<date>_<shape>.csv`` for one shape: shape,
concurrency, config, tpot_ms, tokens_per_s, first_call_s) and a PNG next to it. ``--shapes
tiny`` is a dry run on the CPU (a 2-layer Llama; pass small --concurrency, prompt and
new-token counts; FLASHSAMPLING_CPU=1 makes the pass rewrite there).

    python benchmarks/bench_serving.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import os
import statistics
import sys
import time
import traceback

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # a checkout

CONFIGS = ("stock", "fused")
TPOT_GOAL, RATE_GOAL = 0.95, 1.05  # fused / stock, the goals
FIELDS = ["shape", "concurrency", "config", "tpot_ms", "tokens_per_s", "first_call_s"]
# The manager's generation config: the values of requests that set nothing, and the warpers
# (temperature, top-k, top-p) whose per-request versions every request reads.
DEFAULTS = dict(do_sample=True, temperature=0.7, top_k=50, top_p=0.95)
TOP_K_50 = dict(temperature=0.7, top_k=50, top_p=1.0)
QWEN3 = dict(temperature=0.6, top_k=20, top_p=0.95)
GREEDY = {"fused": dict(temperature=0.0), "stock": dict(top_k=1)}


def settings_of(index: int, config: str) -> dict:
    """Request ``index``'s settings: 3 of 6 top-k 50, 2 of 6 Qwen3's, 1 of 6 greedy."""
    turn = index % 6
    if turn < 3:
        return TOP_K_50
    return QWEN3 if turn < 5 else GREEDY[config]


def workload(count: int, concurrency: int, args, vocab: int, seed: int):
    """-> (arrival times s, prompts, new token counts): the same for every configuration."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / concurrency, count))
    lengths = rng.integers(args.prompt_min, args.prompt_max + 1, count)
    prompts = [rng.integers(0, vocab, n).tolist() for n in lengths]
    new_tokens = rng.integers(args.new_min, args.new_max + 1, count).tolist()
    return arrivals.tolist(), prompts, new_tokens


def serve(manager, config: str, load, concurrency: int, tag: str, profiler=None) -> dict:
    """Submit ``load``'s requests at their arrival times, at most ``concurrency`` in flight;
    -> per-request TPOTs (s), output tokens and the wall time. With ``(profiler, start s,
    stop s)`` the profiler records that window of the run (the steps run in the manager's
    thread; the profiler sees their kernels)."""
    arrivals, prompts, new_tokens = load
    start = time.perf_counter()
    submitted, in_flight, done = 0, 0, {}
    while len(done) < len(prompts):
        now = time.perf_counter() - start
        if profiler is not None:
            recorder, window_start, window_stop = profiler
            if window_start is not None and now >= window_start:
                recorder.start()
                profiler = (recorder, None, window_stop)
            elif window_start is None and now >= window_stop:
                recorder.stop()
                profiler = None
        while submitted < len(prompts) and arrivals[submitted] <= now and in_flight < concurrency:
            manager.add_request(
                prompts[submitted],
                request_id=f"{tag}-{submitted}",
                max_new_tokens=new_tokens[submitted],
                record_timestamps=True,
                **settings_of(submitted, config),
            )
            submitted, in_flight = submitted + 1, in_flight + 1
        due = arrivals[submitted] - now if submitted < len(prompts) else 1.0
        wait = 0.1 if in_flight >= concurrency else max(1e-4, min(due, 0.1))
        result = manager.get_result(timeout=wait)
        if result is not None and result.is_finished():
            if result.error is not None:
                raise RuntimeError(f"request {result.request_id} failed: {result.error}")
            done[result.request_id] = result
            in_flight -= 1
        if not manager.is_running():
            raise RuntimeError("the manager's generation thread stopped")
    wall = time.perf_counter() - start
    if profiler is not None and profiler[1] is None:
        profiler[0].stop()
    tpots = []
    for result in done.values():
        stamps = result.timestamps
        if stamps and len(stamps) > 1:
            tpots.append((stamps[-1] - stamps[0]) / (len(stamps) - 1))
    tokens = sum(len(result.generated_tokens) for result in done.values())
    return dict(tpots=tpots, tokens=tokens, wall=wall)


def compile_settings() -> contextlib.ExitStack:
    """Dynamo's settings for the managers' compiles, entered in the thread that compiles (the
    manager's generation thread: torch's config overrides are per thread)."""
    from torch.fx.experimental import _config as shapes_config

    stack = contextlib.ExitStack()
    # transformers' decorators (deprecation, output capturing) wrap many functions with one
    # code object each, whose graphs pass Dynamo's default limit of 8: room for them.
    # Floats as constants: with dynamic shapes Dynamo makes the modules' float attributes
    # (epsilons, scalings) symbols, fails to turn some into tensors and traces the whole step
    # again (on the CPU, transformers 5.17: "Restarting analysis due to _tensorify_python_scalars").
    stack.enter_context(torch._dynamo.config.patch(recompile_limit=64, specialize_float=True))
    # The manager pads a step's query tokens to multiples of 64 and its rows to min(query
    # tokens, max requests): with duck sizing, a first compile whose two sizes happen to be
    # equal makes them one symbol, and the first step where they differ compiles every graph
    # again (the fused step: minutes). Each size its own symbol: one compile serves all.
    stack.enter_context(shapes_config.patch(use_duck_shape=False))
    return stack


def split_scans_fail() -> bool:
    """Whether this torch's Inductor fails to compile the stock top-p warper's scan: the
    minimal form of its softmax and cumsum over [rows, 151936] fp32 with a dynamic row count,
    which Inductor splits across blocks (a split scan). On torch 2.11 (H200) its code generation
    raised ``TypeError: list indices must be integers or slices, not NoneType`` at 24 and 256
    rows, as stock's compiled step did. One small compile, on CUDA only (the split scan is
    Inductor's CUDA code)."""
    if not torch.cuda.is_available():
        return False
    probe = torch.compile(lambda scores: scores.softmax(-1).cumsum(-1), dynamic=True)
    try:
        probe(torch.rand(24, 151936, device="cuda"))
        return False
    except Exception as error:  # Dynamo wraps Inductor's error in its own
        print(f"Inductor's split scan fails here: {str(error)[-300:]}", flush=True)
        return True
    finally:
        torch._dynamo.reset()


def keep_scans_whole() -> None:
    """Make Inductor compile every scan as one (no split across blocks), for the whole process
    and so for both configurations alike. Without it stock's compile fails where
    ``split_scans_fail``; with it the minimal form compiled on an H200 (torch 2.11) and ran
    faster than eager: 160.9 against 252.3 us at 24 rows, 317.3 against 467.0 at 256, within
    1.7e-6 of it. The fused step has no scan left (the pass replaces the warpers, softmax and
    sampling with one op) and compiled without this in every earlier run."""
    from torch._inductor import ir

    split_of = ir.Scan.num_splits.__func__

    def one_split(cls, *args, **kwargs):
        hint, _ = split_of(cls, *args, **kwargs)
        return hint, 1

    ir.Scan.num_splits = classmethod(one_split)


def make_managers(model, args, configs):
    """One running manager per configuration, stock made before ``enable``."""
    from transformers import CompileConfig, ContinuousBatchingConfig, GenerationConfig

    import flashsampling_inductor.hf as fs_hf

    max_concurrency = max(int(b) for b in args.concurrency.split(","))
    page = 256
    # page_size in newer transformers (5.24), block_size in 5.17
    fields = {field.name for field in dataclasses.fields(ContinuousBatchingConfig)}
    page_field = "page_size" if "page_size" in fields else "block_size"
    longest = args.prompt_max + args.new_max
    generation = GenerationConfig(eos_token_id=-1, pad_token_id=0, **DEFAULTS)
    managers = {}
    for config in configs:
        compile_config = CompileConfig(mode="default", fullgraph=False, dynamic=True)
        if config == "stock" and args.stock_compile == "none":
            compile_config = None  # transformers' eager step, in its CUDA graphs
        batching = ContinuousBatchingConfig(
            **{page_field: page},
            num_blocks=max_concurrency * -(-longest // page) + 16,
            max_batch_tokens=args.max_batch_tokens,
            max_requests_per_batch=max_concurrency,
            per_request_processors=True,
            varlen_compile_config=compile_config,
            decode_compile_config=compile_config,
            use_cuda_graph=torch.cuda.is_available(),
            allow_block_sharing=False,
            seed=0,
        )
        if config == "fused":
            fs_hf.enable(model)
        start = time.perf_counter()
        try:
            manager = model.init_continuous_batching(
                generation_config=generation, continuous_batching_config=batching
            )
        finally:
            fs_hf.disable(model)
        try:
            if config in args.warmup.split(","):
                with compile_settings():
                    manager.warmup()
        except Exception:  # a failing configuration keeps the others
            print(f"{config}: warmup failed:", flush=True)
            traceback.print_exc()
            continue
        loop = manager._run_generation_loop

        def loop_with_our_settings(*args, loop=loop, **kwargs):
            with compile_settings():
                return loop(*args, **kwargs)

        manager._run_generation_loop = loop_with_our_settings
        manager.start()
        managers[config] = (manager, time.perf_counter() - start)
        print(f"{config}: manager made (and warmed up) in {managers[config][1]:.1f} s", flush=True)
    return managers


def build_model(shape: str):
    """``bench_generate.build``'s random bf16 model of ``shape``, or with ``tiny`` a 2-layer
    Llama of vocabulary 512 on the CPU (fp32): a dry run of the script's paths."""
    if shape != "tiny":
        from bench_generate import build

        return build(shape)
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def run_shape(shape: str, args, deadline: float):
    """Yields one CSV row per (concurrency, configuration) of ``shape``."""
    from torch._dynamo.utils import counters

    model = build_model(shape)
    if args.attention == "torch_flash":
        import torch_flash

        model.set_attn_implementation(torch_flash.install())
    configs = args.configs.split(",")
    counters.clear()
    managers = make_managers(model, args, configs)
    made = [manager for manager, _ in managers.values()]  # stopped at the end, failed or not
    missed = []  # (fused / stock TPOT, concurrency, load) of the cells that miss the goal
    loads = {}  # concurrency -> its load, for --profile-concurrency
    try:
        for index, concurrency in enumerate(int(b) for b in args.concurrency.split(",")):
            if time.perf_counter() > deadline:
                print(f"deadline: {shape} B={concurrency} and later skipped", flush=True)
                break
            count = max(args.min_requests, int(args.requests_per_slot * concurrency))
            load = workload(count, concurrency, args, model.config.vocab_size, concurrency)
            loads[concurrency] = load
            # An untimed first run compiles (and captures the new sizes' CUDA graphs); with
            # --warm first only at the shape's first concurrency, whose compiled step serves
            # every later one (dynamic shapes): the first timed run is then the first call.
            warm = args.warm == "every" or index == 0
            first, runs = {}, {config: [] for config in configs}
            for repeat in range(0 if warm else 1, args.repeats + 1):
                for config in [c for c in configs if c in managers]:
                    manager, setup = managers[config]
                    tag = f"{config}-{concurrency}-{repeat}"
                    sampler = None
                    if args.timeline and config not in first and repeat == 0:
                        sampler = generation_thread_sampler(manager)
                    try:
                        run = serve(manager, config, load, concurrency, tag)
                    except Exception:  # one failing configuration keeps the others
                        print(f"{shape} B={concurrency} {config} failed:", flush=True)
                        traceback.print_exc()
                        del managers[config]
                        first.pop(config, None)
                        continue
                    finally:
                        if sampler is not None:
                            sampler.running = False
                            sampler.join()
                    if sampler is not None:
                        print(f"== {shape} B={concurrency} {config}: the first run's", end=" ")
                        sampler.report(None, run["wall"])
                    if config not in first:
                        first[config] = run["wall"] + setup
                        managers[config] = (manager, 0.0)
                    if repeat > 0:
                        runs[config].append(run)
                    print(
                        f"{shape} B={concurrency} {config} run {repeat}: {run['wall']:.2f} s,"
                        f" {run['tokens']} tokens, median TPOT"
                        f" {1e3 * statistics.median(run['tpots']):.2f} ms",
                        flush=True,
                    )
            print(f"rewrites so far: {dict(counters['flashsampling'])}", flush=True)
            rows = {}
            for config in [c for c in configs if c in first and runs[c]]:
                tpots = [t for run in runs[config] for t in run["tpots"]]
                rates = [run["tokens"] / run["wall"] for run in runs[config]]
                rows[config] = dict(
                    shape=shape,
                    concurrency=concurrency,
                    config=config,
                    tpot_ms=round(1e3 * statistics.median(tpots), 3),
                    tokens_per_s=round(statistics.median(rates), 1),
                    first_call_s=round(first[config], 2),
                )
                yield rows[config]
            if "stock" in rows and "fused" in rows:
                tpot = rows["fused"]["tpot_ms"] / rows["stock"]["tpot_ms"]
                rate = rows["fused"]["tokens_per_s"] / rows["stock"]["tokens_per_s"]
                if tpot > TPOT_GOAL or rate < RATE_GOAL:
                    missed.append((tpot, concurrency, load))
        if args.profile_concurrency in loads:
            missed = [(None, args.profile_concurrency, loads[args.profile_concurrency])]
        if missed and args.profile_s > 0 and time.perf_counter() < deadline:
            _, concurrency, load = min(missed, key=lambda cell: cell[1])  # the cheapest
            profile(shape, concurrency, load, managers, args)
    except KeyboardInterrupt:
        # A time limit (SIGINT): no clean-up. Stopping a manager whose thread is capturing a
        # CUDA graph frees the graph's pool under the capture (as emptying the cache does),
        # and PyTorch's allocator aborts the process (seen twice at a call's limit).
        made = None
        raise
    finally:
        if made is not None:
            for manager in made:
                manager.stop(block=True, timeout=30)
                manager.destroy()
            del model, managers, made
            torch._dynamo.reset()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()


def generation_thread_sampler(manager):
    """profile_first_call's stack sampler on the manager's generation thread (where the steps
    compile, capture and run), started: its report names the phases of a first run."""
    from profile_first_call import StackSampler

    sampler = StackSampler([time.perf_counter()], period=0.05)
    sampler.main = manager._generation_thread.ident
    sampler.start()
    return sampler


def profile(shape: str, concurrency: int, load, managers, args) -> None:
    """A cell that missed the goal (or --profile-concurrency's): each configuration's run of
    the same load again, with torch.profiler over --profile-s seconds of its steps from
    --profile-at s on; the top kernels by GPU time to the log and to
    ``profile_<shape>_B<B>.txt``."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as recorder_of

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    try:  # the steps run in the manager's thread: its CPU ops too where torch can
        extra = dict(
            experimental_config=torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
        )
    except (AttributeError, TypeError):
        extra = {}
    lines = []
    for config, (manager, _) in managers.items():
        recorder = recorder_of(activities=activities, **extra)
        window = (recorder, args.profile_at, args.profile_at + args.profile_s)
        serve(manager, config, load, concurrency, f"profile-{config}", profiler=window)
        sort = "cuda_time_total" if torch.cuda.is_available() else "cpu_time_total"
        try:
            table = recorder.key_averages().table(sort_by=sort, row_limit=args.profile_rows)
        except AssertionError:  # the run ended before its window opened (a short cell)
            table = "(no profile: the run ended before the window opened; lower --profile-at)"
        head = f"== {shape} B={concurrency} {config}: {args.profile_s} s from {args.profile_at} s"
        lines.append(f"{head} into the run, top kernels and ops by {sort}\n{table}")
        print(lines[-1], flush=True)
    path = os.path.join(args.out, f"profile_{shape}_B{concurrency}.txt")
    with open(path, "w") as handle:
        handle.write("\n".join(lines))


def plot(path: str) -> None:
    """Fused over stock, TPOT and output throughput, per concurrency."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    with open(path) as handle:
        rows = list(csv.DictReader(handle))
    if not rows:
        return
    cell = {(r["shape"], int(r["concurrency"]), r["config"]): r for r in rows}
    shapes = sorted({r["shape"] for r in rows})
    fig, axes = plt.subplots(1, len(shapes), figsize=(6 * len(shapes), 4), squeeze=False)
    for ax, shape in zip(axes[0], shapes, strict=True):
        for column, label in (("tpot_ms", "TPOT"), ("tokens_per_s", "output tokens/s")):
            points = sorted(
                (b, float(cell[(s, b, "fused")][column]) / float(cell[(s, b, "stock")][column]))
                for (s, b, c) in cell
                if s == shape and c == "fused" and (s, b, "stock") in cell
            )
            if points:
                ax.plot(*zip(*points, strict=True), marker="o", label=f"{label}: fused / stock")
        ax.axhline(1.0, color="gray", lw=0.5)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency B (Poisson arrivals at B requests/s)")
        ax.set_ylabel("ratio")
        ax.set_title(f"{shape}, transformers continuous batching")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path.replace(".csv", ".png"), dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--shapes", default="qwen3-1.7b,llama-3.1-8b", help="model shapes")
    parser.add_argument("--concurrency", default="16,64,128,256", help="B values, in order")
    parser.add_argument("--configs", default="stock,fused", help="configurations to time")
    parser.add_argument("--repeats", type=int, default=1, help="timed runs per configuration")
    parser.add_argument(
        "--requests-per-slot", type=float, default=1.0,
        help="requests per cell = this x B (at least --min-requests)",
    )  # fmt: skip
    parser.add_argument("--min-requests", type=int, default=16, help="fewest requests a cell")
    parser.add_argument(
        "--stock-compile", choices=("default", "none"), default="default",
        help="the stock manager's step: compiled by its own compile config as the fused one"
        " (default; scans kept whole where Inductor's split scan fails, as on torch 2.11) or"
        " transformers' eager step in its CUDA graphs (none)",
    )  # fmt: skip
    parser.add_argument(
        "--attention", choices=("torch_flash", "sdpa"), default="torch_flash",
        help="both managers' attention: transformers' flash path with torch's FlashAttention-2"
        " kernels (torch_flash.py; the flash-attn package is not on our GPU machines) or its"
        " paged|sdpa, which attends every request to the whole batch's keys under a mask",
    )  # fmt: skip
    parser.add_argument("--prompt-min", type=int, default=32, help="shortest prompt, tokens")
    parser.add_argument("--prompt-max", type=int, default=512, help="longest prompt, tokens")
    parser.add_argument("--new-min", type=int, default=128, help="fewest new tokens a request")
    parser.add_argument("--new-max", type=int, default=256, help="most new tokens a request")
    parser.add_argument(
        "--max-batch-tokens", type=int, default=2048, help="the managers' tokens per step"
    )
    parser.add_argument(
        "--budget-s", default="190,420",
        help="no new cell of the i-th shape starts after the i-th of these many s (comma"
        " list, the last one for the rest): one GPU call's share for each shape",
    )  # fmt: skip
    parser.add_argument(
        "--warm", choices=("first", "every"), default="first",
        help="an untimed run at each shape's first concurrency only, or at every one",
    )  # fmt: skip
    parser.add_argument(
        "--warmup", default="stock",
        help="the configurations that run the manager's own warmup (CUDA graphs captured at"
        " the largest sizes). Not fused by default: the warmup compiles at the full buffers'"
        " sizes, whose contiguous attention mask Dynamo guards on, and the first run with a"
        " sliced mask compiles every graph again (126 s twice on an H200, Qwen3-1.7B)",
    )  # fmt: skip
    parser.add_argument(
        "--profile-s", type=float, default=2.0,
        help="where a cell misses the goal: seconds of each configuration's steps profiled"
        " (the shape's smallest such B; 0: none)",
    )  # fmt: skip
    parser.add_argument(
        "--timeline", action="store_true",
        help="sample the generation thread's stack during each configuration's first run and"
        " print where its time went (compiles, captures, steps)",
    )  # fmt: skip
    parser.add_argument(
        "--profile-concurrency", type=int, default=0,
        help="profile this B's cell whether it misses the goal or not (instead of the"
        " smallest B that misses)",
    )  # fmt: skip
    parser.add_argument("--profile-at", type=float, default=4.0, help="s into the run")
    parser.add_argument("--profile-rows", type=int, default=15, help="kernels listed per profile")
    parser.add_argument("--out", default="benchmarks/results", help="folder of the CSV and PNG")
    args = parser.parse_args()
    if not torch.cuda.is_available() and args.shapes != "tiny":
        print("bench_serving.py needs a CUDA GPU (or --shapes tiny, a CPU dry run)")
        return

    import transformers

    began = time.perf_counter()
    budgets = [float(b) for b in args.budget_s.split(",")]
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    device_name = device.lower().replace(" ", "-")
    stamp = time.strftime("%Y%m%d-%H%M", time.gmtime())
    os.makedirs(args.out, exist_ok=True)
    if "stock" in args.configs.split(",") and args.stock_compile == "default":
        if split_scans_fail():
            keep_scans_whole()
            print("scans kept whole (one split) for both configurations", flush=True)
    # One shape per run (one per GPU, several at once): its name in the file's, so that two
    # runs started in the same minute do not write one file.
    only = f"_{args.shapes}" if "," not in args.shapes else ""
    path = os.path.join(args.out, f"bench_serving_{device_name}_{stamp}{only}.csv")
    print(
        f"{device}, torch {torch.__version__}, transformers {transformers.__version__} -> {path}",
        flush=True,
    )
    try:
        with open(path, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=FIELDS)
            writer.writeheader()
            for index, shape in enumerate(args.shapes.split(",")):
                deadline = began + budgets[min(index, len(budgets) - 1)]
                if time.perf_counter() > deadline:
                    print(f"deadline: {shape} skipped", flush=True)
                    continue
                for row in run_shape(shape, args, deadline):
                    writer.writerow(row)
                    handle.flush()
                    print(row, flush=True)
    except KeyboardInterrupt:  # a time limit: what ran, then out (the managers' threads run on)
        print("interrupted: the rows above are written", flush=True)
        plot(path)
        sys.stdout.flush()
        os._exit(130)
    finally:  # what ran, also when a cell failed
        plot(path)


if __name__ == "__main__":
    main()
