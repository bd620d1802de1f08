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

  stock   the manager with its own compile config (Inductor, mode "default", dynamic, not
          fullgraph: transformers' default_compile_level 1) and its CUDA graphs; with
          --stock-compile none, its eager step in its CUDA graphs
  fused   the same config after ``hf.enable(model)``: the step's backend is "flashsampling",
          the warpers, softmax and ``torch.multinomial`` one ``sample_logits`` call with
          per-request knobs, fused with the LM head

Both managers are made once per shape and kept running; the configurations are interleaved
(repeat r of every configuration before repeat r + 1 of any), after a first, untimed run of
each configuration per concurrency (its wall time is ``first_call_s``; the first
concurrency's includes making the manager, its warmup and the compiles). Per run: TPOT of
each request = (last token's time - first token's time) / (tokens - 1), from the manager's
own timestamps; ``tpot_ms`` is the median over the requests of the repeats, ``tokens_per_s``
the median over repeats of output tokens / wall time of the run. A deadline (--budget-s)
stops starting new cells, so what ran is written. CSV ``bench_serving_<gpu>_<date>.csv``
(shape, concurrency, config, tpot_ms, tokens_per_s, first_call_s) and a PNG next to it.

    python benchmarks/bench_serving.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
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


def serve(manager, config: str, load, concurrency: int, tag: str) -> dict:
    """Submit ``load``'s requests at their arrival times, at most ``concurrency`` in flight;
    -> per-request TPOTs (s), output tokens and the wall time."""
    arrivals, prompts, new_tokens = load
    start = time.perf_counter()
    submitted, in_flight, done = 0, 0, {}
    while len(done) < len(prompts):
        now = time.perf_counter() - start
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
        wait = 1.0 if in_flight >= concurrency else max(1e-4, min(due, 1.0))
        result = manager.get_result(timeout=wait)
        if result is not None and result.is_finished():
            if result.error is not None:
                raise RuntimeError(f"request {result.request_id} failed: {result.error}")
            done[result.request_id] = result
            in_flight -= 1
        if not manager.is_running():
            raise RuntimeError("the manager's generation thread stopped")
    wall = time.perf_counter() - start
    tpots = []
    for result in done.values():
        stamps = result.timestamps
        if stamps and len(stamps) > 1:
            tpots.append((stamps[-1] - stamps[0]) / (len(stamps) - 1))
    tokens = sum(len(result.generated_tokens) for result in done.values())
    return dict(tpots=tpots, tokens=tokens, wall=wall)


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
            use_cuda_graph=True,
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
            manager.warmup()
        except Exception:  # a failing configuration keeps the others
            print(f"{config}: warmup failed:", flush=True)
            traceback.print_exc()
            continue
        manager.start()
        managers[config] = (manager, time.perf_counter() - start)
        print(f"{config}: manager made and warmed up in {managers[config][1]:.1f} s", flush=True)
    return managers


def run_shape(shape: str, args, deadline: float):
    """Yields one CSV row per (concurrency, configuration) of ``shape``."""
    from bench_generate import build
    from torch._dynamo.utils import counters

    model = build(shape)
    configs = args.configs.split(",")
    counters.clear()
    managers = make_managers(model, args, configs)
    made = [manager for manager, _ in managers.values()]  # stopped at the end, failed or not
    try:
        for concurrency in (int(b) for b in args.concurrency.split(",")):
            if time.perf_counter() > deadline:
                print(f"deadline: {shape} B={concurrency} and later skipped", flush=True)
                break
            count = max(args.min_requests, int(args.requests_per_slot * concurrency))
            load = workload(count, concurrency, args, model.config.vocab_size, concurrency)
            first, runs = {}, {config: [] for config in configs}
            for repeat in range(args.repeats + 1):
                for config in [c for c in configs if c in managers]:
                    manager, setup = managers[config]
                    tag = f"{config}-{concurrency}-{repeat}"
                    try:
                        run = serve(manager, config, load, concurrency, tag)
                    except Exception:  # one failing configuration keeps the others
                        print(f"{shape} B={concurrency} {config} failed:", flush=True)
                        traceback.print_exc()
                        del managers[config]
                        first.pop(config, None)
                        continue
                    if repeat == 0:
                        first[config] = run["wall"] + setup
                        managers[config] = (manager, 0.0)
                    else:
                        runs[config].append(run)
                    print(
                        f"{shape} B={concurrency} {config} run {repeat}: {run['wall']:.2f} s,"
                        f" {run['tokens']} tokens, median TPOT"
                        f" {1e3 * statistics.median(run['tpots']):.2f} ms",
                        flush=True,
                    )
            print(f"rewrites so far: {dict(counters['flashsampling'])}", flush=True)
            for config in [c for c in configs if c in first and runs[c]]:
                tpots = [t for run in runs[config] for t in run["tpots"]]
                rates = [run["tokens"] / run["wall"] for run in runs[config]]
                yield dict(
                    shape=shape,
                    concurrency=concurrency,
                    config=config,
                    tpot_ms=round(1e3 * statistics.median(tpots), 3),
                    tokens_per_s=round(statistics.median(rates), 1),
                    first_call_s=round(first[config], 2),
                )
    finally:
        for manager in made:
            manager.stop(block=True, timeout=30)
            manager.destroy()
        del model, managers, made
        torch._dynamo.reset()
        torch.cuda.empty_cache()


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
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per configuration")
    parser.add_argument(
        "--requests-per-slot", type=float, default=1.0,
        help="requests per cell = this x B (at least --min-requests)",
    )  # fmt: skip
    parser.add_argument("--min-requests", type=int, default=32)
    parser.add_argument(
        "--stock-compile", choices=("default", "none"), default="default",
        help="the stock manager's step: compiled as the fused one (default) or transformers'"
        " eager step in its CUDA graphs (none: on torch 2.11 Inductor failed to generate code"
        " for the per-request top-p warper's cumsum with dynamic shapes)",
    )  # fmt: skip
    parser.add_argument("--prompt-min", type=int, default=32)
    parser.add_argument("--prompt-max", type=int, default=512)
    parser.add_argument("--new-min", type=int, default=128)
    parser.add_argument("--new-max", type=int, default=256)
    parser.add_argument(
        "--max-batch-tokens", type=int, default=2048, help="the managers' tokens per step"
    )
    parser.add_argument(
        "--budget-s", type=float, default=480.0, help="no new cell starts after this many s"
    )
    parser.add_argument("--out", default="benchmarks/results", help="folder of the CSV and PNG")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_serving.py needs a CUDA GPU: nothing to run here")
        return

    import transformers

    # transformers' decorators (deprecation, output capturing) wrap many functions with one
    # code object each, whose graphs pass Dynamo's default limit of 8 in the stock manager
    # too (it then runs them eagerly): both managers get room for theirs.
    torch._dynamo.config.recompile_limit = 64
    deadline = time.perf_counter() + args.budget_s
    device_name = torch.cuda.get_device_name().lower().replace(" ", "-")
    stamp = time.strftime("%Y%m%d-%H%M", time.gmtime())
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"bench_serving_{device_name}_{stamp}.csv")
    print(
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
        f"transformers {transformers.__version__} -> {path}",
        flush=True,
    )
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        writer.writeheader()
        for shape in args.shapes.split(","):
            if time.perf_counter() > deadline:
                print(f"deadline: {shape} skipped", flush=True)
                continue
            for row in run_shape(shape, args, deadline):
                writer.writerow(row)
                handle.flush()
                print(row, flush=True)
    plot(path)


if __name__ == "__main__":
    main()
