"""Time one tensor-parallel sampling step on the GPUs of one host (2 by default).

Each rank holds a V/P shard of the LM-head weight (bf16) and the same hidden [B, D]; one
token per row is drawn from softmax(hidden @ W.T) over the whole vocabulary. Providers:

    fused_tp              flashsampling_inductor.tp_fused_sample: the fused kernel on the
                          shard, candidates to every peer through symmetric memory
    fused_tp_collective   the same, candidates through an NCCL all-gather
    shard_matmul          cuBLAS hidden @ W_shard.T alone (what the TP step cannot beat)
    shard_allgather       + NCCL all-gather of the [B, V/P] logits and the re-layout to [B, V]
    allgather_fi2         + FlashInfer sampling_from_logits (Gumbel-max) on the [B, V] logits
    allgather_multinomial + eager softmax and torch.multinomial
    allgather_compiled    + softmax and torch.multinomial compiled by stock Inductor
    step_flashsampling    a whole TP step as users write it (F.linear on the shard, functional
                          all_gather_tensor, slice, softmax, multinomial) compiled with
                          backend="flashsampling": the pass rewrites it into the TP op
    step_inductor         the same step compiled by stock Inductor
    tp1_fused             fused_sample over the whole V on one GPU (the TP = 1 line)
    tp1_matmul            cuBLAS over the whole V on one GPU

Not in the default list (A/B runs of the TP step): ``fused_tp_pdl`` / ``fused_tp_auto`` /
``fused_tp_nopdl`` (the exchange's kernel launched as a programmatic dependent of stage 1
after every stage 1 / where stage 1 runs on a persistent grid (the default) / never,
FLASHSAMPLING_TP_EXCHANGE_PDL=1 / auto / 0; the Triton and Gluon stage 1 signal it),
``fused_tp_stage1pdl`` (stage 1 a programmatic dependent of the seed's draw,
FLASHSAMPLING_TP_STAGE1_PDL=1: opt-in), ``fused_tp_bothpdl`` (both: stage 1 after the draw
and the exchange after stage 1 programmatic dependents),
``fused_tp_seed`` / ``fused_tp_seed_scalar`` (an explicit int seed, made a 0-d tensor per
call / passed to the kernels as it is (the default), FLASHSAMPLING_TP_SCALAR_SEED=0 / 1),
``fused_tp_assert`` (the exchange's verdict read by an assert kernel after it,
FLASHSAMPLING_TP_EXCHANGE_CHECK=assert: the path before the exchange failed a bad call in
its own kernel) and ``fused_tp_best`` (stage 1 on the configuration that
``short_shard_stage1.py`` timed fastest at the shard's shape and batch; ``--best-of`` its
JSON).

Top-k 50 (not in the default list; ``--providers`` names them, and a second table shows
them): ``fused_tp_topk50`` (tp_fused_sample(top_k=50): each rank's 50 largest scores
exchanged, the shard's logits materialized), ``allgather_fi1_topk50`` (the logits gathered,
then FlashInfer's top_k_top_p_sampling_from_logits), ``allgather_compiled_topk50`` (the
logits gathered, then gpt-fast's top-k, softmax and multinomial compiled by stock Inductor),
each also ``_topp90`` (then top-p 0.9; the compiled one as a sort, cumsum and threshold), and
``step_topk50_flashsampling`` / ``step_topk50_inductor`` (gpt-fast's top-k after the gather,
the whole step compiled).

How it times: every rank runs the same fixed number of calls (a collective must be called
the same number of times everywhere, so no adaptive do_bench), CUDA events around
``--iters`` calls after a barrier, five repeats, median per step. Every provider of a (shape,
B) is built first (its graph captured), then timed over ``--rounds`` rounds in an order
rotated a round, and a cell is the median of its rounds (the spread printed beside): drift
between runs falls on every provider alike. Two modes: "events" (calls from Python) and
"graph" (``--iters`` calls captured in one CUDA graph, the replay timed).

    python -m torch.distributed.run --nproc_per_node=2 benchmarks/bench_tp.py --out-dir DIR

Needs two or more CUDA GPUs of one host, launched by ``torch.distributed.run`` (without
CUDA it says so and exits 0); FlashInfer for the ``allgather_fi*`` providers (left out when
it does not import). Writes ``bench_tp_<gpu>_tp<P>_<date>.csv`` and a PNG into ``--out-dir``,
prints a markdown table last (rank 0). Always exports NCCL_NVLS_ENABLE=0
TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime
import functools
import json
import os
import statistics
import sys
from pathlib import Path

for _name, _value in (
    ("NCCL_NVLS_ENABLE", "0"),
    ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
    ("NVSHMEM_DISABLE_NVLS", "1"),
):
    os.environ[_name] = _value  # never multicast (../shared/gpu/README.md)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a plain checkout
import flashsampling_inductor as fs  # noqa: E402

PROVIDERS = (
    "tp1_matmul",
    "tp1_fused",
    "shard_matmul",
    "shard_allgather",
    "allgather_fi2",
    "allgather_multinomial",
    "fused_tp_collective",
    "fused_tp",
    "allgather_compiled",
    "step_flashsampling",
    "step_inductor",
)
TOP_K_PROVIDERS = (
    "fused_tp_topk50",
    "fused_tp_topk50_topp90",
    "allgather_fi1_topk50",
    "allgather_fi1_topk50_topp90",
    "allgather_compiled_topk50",
    "allgather_compiled_topk50_topp90",
    "step_topk50_flashsampling",
    "step_topk50_inductor",
)
PEERS = (
    "shard_allgather",
    "allgather_fi2",
    "allgather_multinomial",
    "allgather_compiled",
    "fused_tp_collective",
    "step_inductor",
)


BEST_OF: list[dict] = []  # --best-of: short_shard_stage1.py's rows


def best_stage1(hidden, weight_shard):
    """The fastest stage-1 configuration that short_shard_stage1.py timed at this shard's
    shape and batch (``--best-of``), or an error (the provider's row then says so)."""
    from short_shard_stage1 import candidates  # benchmarks/ is this script's folder

    (batch, dim), rows = hidden.shape, weight_shard.shape[0]
    timed = [r for r in BEST_OF if (r["D"], r["V"], r["B"]) == (dim, rows, batch)]
    if not timed:
        raise LookupError(f"no stage-1 sweep at D={dim} V_shard={rows} B={batch}")
    fastest = min(timed, key=lambda r: statistics.median(r["us"]))
    if fastest["name"] == "default":
        return None
    print(f"fused_tp_best D={dim} B={batch}: {fastest['name']}", flush=True)
    return candidates(batch)[fastest["name"]]


def _raise(error: Exception):
    raise error


@contextlib.contextmanager
def stage1_config(config):
    """Stage 1 of the calls inside takes ``config`` (None: the call's own choice)."""
    if config is None:
        yield
        return
    from flashsampling_inductor import dispatch

    chosen = dispatch.default_config
    dispatch.default_config = lambda *args, **kwargs: config
    try:
        yield
    finally:
        dispatch.default_config = chosen


def build(provider, hidden, weight_shard, weight_full, vocab_start, vocab_size, world):
    """-> a step() callable for the provider."""
    if provider == "tp1_matmul":
        return lambda: hidden @ weight_full.T
    if provider == "tp1_fused":
        return lambda: fs.fused_sample(hidden, weight_full)
    if provider == "shard_matmul":
        return lambda: hidden @ weight_shard.T
    if provider.startswith("fused_tp"):
        exchange = "collective" if provider == "fused_tp_collective" else "auto"
        # (top-k: bf16 logits, what a bf16 head computes and the pass asks for)
        top_k = {"top_k": 50, "logits_dtype": torch.bfloat16} if "topk" in provider else {}
        if "topp90" in provider:
            top_k["top_p"] = 0.9

        # FLASHSAMPLING_TP_EXCHANGE_PDL: fused_tp_pdl / _bothpdl after every stage 1, _auto where
        # stage 1 runs on a persistent grid, fused_tp_nopdl never, else the default (auto)
        pdl_exchange = {
            "fused_tp_pdl": "1", "fused_tp_bothpdl": "1", "fused_tp_auto": "auto",
            "fused_tp_nopdl": "0",
        }  # fmt: skip
        pdl_exchange = pdl_exchange.get(provider)
        # fused_tp_seed: an explicit int seed made a 0-d tensor per call
        # (FLASHSAMPLING_TP_SCALAR_SEED=0); fused_tp_seed_scalar: passed to the kernels as it
        # is (=1, the default)
        seeded = provider in ("fused_tp_seed", "fused_tp_seed_scalar")
        scalar_seed = {"fused_tp_seed": "0", "fused_tp_seed_scalar": "1"}.get(provider)
        # fused_tp_stage1pdl: the Triton stage 1 a programmatic dependent of the seed's draw;
        # fused_tp_bothpdl: that and the exchange after every stage 1
        stage1_pdl = "1" if provider in ("fused_tp_stage1pdl", "fused_tp_bothpdl") else None
        # fused_tp_assert: the exchange's verdict read by an assert kernel after it (the
        # path before the exchange trapped in its own kernel), for an A/B in one process
        check = "assert" if provider == "fused_tp_assert" else "kernel"
        stage1 = None
        if provider == "fused_tp_best":
            try:
                stage1 = best_stage1(hidden, weight_shard)
            except LookupError as error:  # every rank alike: the row records it
                return functools.partial(_raise, error)

        def fused_step():
            os.environ["FLASHSAMPLING_TP_EXCHANGE"] = exchange
            os.environ["FLASHSAMPLING_TP_EXCHANGE_CHECK"] = check
            for name, value in (
                ("FLASHSAMPLING_TP_EXCHANGE_PDL", pdl_exchange),
                ("FLASHSAMPLING_TP_SCALAR_SEED", scalar_seed),
                ("FLASHSAMPLING_TP_STAGE1_PDL", stage1_pdl),
            ):
                if value is None:
                    os.environ.pop(name, None)  # the default
                else:
                    os.environ[name] = value
            if seeded:
                top_k["seed"] = 1234
            with stage1_config(stage1):
                return fs.tp_fused_sample(
                    hidden, weight_shard, vocab_start=vocab_start, vocab_size=vocab_size, **top_k
                )

        return fused_step
    if provider.startswith("step_"):
        import torch.distributed._functional_collectives as funcol

        group = dist.group.WORLD

        def tp_step(h):
            # gather_dim=1, not -1: torch (2.11, 2.13) mis-shapes the B = 1 view of a negative
            # gather_dim ("shape '[1, V, P, V/P]' is invalid"), in eager too.
            local = torch.nn.functional.linear(h, weight_shard)
            full = funcol.all_gather_tensor(local, gather_dim=1, group=group)[:, :vocab_size]
            if "topk50" in provider:  # gpt-fast's logits_to_probs with top_k
                pivot = torch.topk(full, 50)[0].select(-1, -1).unsqueeze(-1)
                full = torch.where(full < pivot, -float("Inf"), full)
            return torch.multinomial(torch.softmax(full.float(), dim=-1), 1)

        backend = "flashsampling" if provider.endswith("_flashsampling") else "inductor"
        if provider == "step_topk50_flashsampling":
            from flashsampling_inductor.patterns import tp_gather

            tp_gather.TRUNCATION_ON_CUDA = True  # (the pass leaves it alone on GPUs by default)
        compiled = torch.compile(tp_step, backend=backend, fullgraph=True, dynamic=False)
        return lambda: compiled(hidden)
    batch, shard = hidden.shape[0], weight_shard.shape[0]
    gathered = torch.empty((world * batch, shard), dtype=hidden.dtype, device=hidden.device)

    def logits():
        # vLLM's / Megatron's gather: [P * B, V/P] -> [B, P * V/P], then the real V.
        dist.all_gather_into_tensor(gathered, hidden @ weight_shard.T)
        full = gathered.view(world, batch, shard).movedim(0, 1).reshape(batch, world * shard)
        return full[:, :vocab_size]

    if provider == "shard_allgather":
        return logits
    if provider == "allgather_fi2":
        import flashinfer.sampling as fi

        seed = torch.tensor([1234], dtype=torch.int64, device=hidden.device)
        offset = torch.zeros(1, dtype=torch.int64, device=hidden.device)
        return lambda: fi.sampling_from_logits(logits(), seed=seed, offset=offset)
    if provider.startswith("allgather_fi1_topk50"):
        import flashinfer.sampling as fi

        top_p = 0.9 if "topp90" in provider else 1.0
        return lambda: fi.top_k_top_p_sampling_from_logits(logits(), 50, top_p)
    if provider.startswith("allgather_compiled_topk50"):
        top_p = 0.9 if "topp90" in provider else 1.0

        def sample_top(full):
            # gpt-fast's top-k, then top-p, softmax and multinomial
            pivot = torch.topk(full, 50)[0][..., -1:]
            full = torch.where(full < pivot, -float("inf"), full.float())
            if top_p < 1.0:
                # (the nucleus as a threshold: torch 2.11's Inductor failed on HF's scatter
                # form, "list indices must be integers or slices, not NoneType")
                ordered = full.sort(dim=-1, descending=True).values
                probs = ordered.softmax(dim=-1)
                inside = (probs.cumsum(dim=-1) - probs < top_p).sum(dim=-1, keepdim=True)
                full = torch.where(full < ordered.gather(-1, inside - 1), -float("inf"), full)
            return torch.multinomial(torch.softmax(full, dim=-1), 1)

        sample = torch.compile(sample_top, dynamic=False)
        return lambda: sample(logits())
    if provider == "allgather_multinomial":
        return lambda: torch.multinomial(torch.softmax(logits().float(), dim=-1), 1)
    if provider == "allgather_compiled":
        sample = torch.compile(
            lambda full: torch.multinomial(torch.softmax(full.float(), dim=-1), 1), dynamic=False
        )
        return lambda: sample(logits())
    raise ValueError(provider)


def prepare(step, mode: str, iters: int):
    """Warm ``step`` up and return what one timed repeat runs: ``iters`` calls, from Python
    ("events") or captured in one CUDA graph ("graph"), replayed once before it is timed."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    if mode == "graph":
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            step()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(iters):
                step()
        run = graph.replay
    else:

        def run():
            for _ in range(iters):
                step()

    run()
    return run


def time_run(run, iters: int, repeats: int = 5) -> float:
    """Median us per step over ``repeats`` runs of ``run`` (same count on all ranks)."""
    samples = []
    for _ in range(repeats):
        dist.barrier()
        torch.cuda.synchronize()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) * 1e3 / iters)
    return statistics.median(samples)


def round_orders(names: list, rounds: int) -> list[list]:
    """The order ``names`` are timed in at each round: rotated by one a round, so that no
    provider always runs first (after the warm-ups) or always right after the same one.
    Every rank computes the same orders (a collective runs the same calls everywhere)."""
    return [names[r % len(names) :] + names[: r % len(names)] for r in range(rounds)]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--shapes",
        default="4096x151936,8192x128256",
        help="DxV of the whole LM head, comma-separated (default 4096x151936,8192x128256);"
        " DxV:B1/B2 times that shape at those batches only, instead of --batches",
    )
    parser.add_argument(
        "--batches", default="1,16,64,256", help="batch sizes (default 1,16,64,256)"
    )
    parser.add_argument(
        "--providers",
        default=",".join(PROVIDERS),
        help="comma-separated, of the list above (default: all but the top-k 50 ones)",
    )
    parser.add_argument(
        "--modes", default="events,graph", help="timing modes: events, graph or both"
    )
    parser.add_argument("--iters", type=int, default=20, help="calls per timed repeat")
    parser.add_argument(
        "--rounds", type=int, default=5,
        help="rounds per (shape, B): each times every provider once (five repeats of --iters"
        " calls), in an order rotated a round; a cell is the median of its rounds (default 5)",
    )  # fmt: skip
    parser.add_argument(
        "--best-of", action="append", default=[],
        help="short_shard_stage1.py's JSON (repeatable): fused_tp_best's configurations",
    )  # fmt: skip
    parser.add_argument("--out-dir", default="benchmarks/results", help="folder of the CSV and PNG")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_tp.py times tensor-parallel sampling on CUDA GPUs; there is none here")
        return 0

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    device = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group("nccl", device_id=device)
    providers = args.providers.split(",")
    for path in args.best_of:
        BEST_OF.extend(json.loads(Path(path).read_text())["rows"])
    # Each (shape, B) compiles the step anew (static shapes, like CUDA graphs want): more
    # graphs per code object than Dynamo's default limit of 8.
    torch._dynamo.config.recompile_limit = 64
    if any(p in providers for p in ("allgather_fi2", "allgather_fi1_topk50")):
        try:
            import flashinfer.sampling as fi

            fi.sampling_from_logits(torch.randn(4, 4096, device=device, dtype=torch.bfloat16))
        except Exception as error:  # noqa: BLE001 - a missing peer is a note, not a failure
            print(f"rank {rank}: FlashInfer unavailable: {error}", flush=True)
            providers = [p for p in providers if not p.startswith("allgather_fi")]
    meta = {
        "gpu": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M"),
    }
    rows = []
    for shape in args.shapes.split(","):
        shape, _, own_batches = shape.partition(":")
        dim, vocab = map(int, shape.split("x"))
        batches = own_batches.replace("/", ",") or args.batches
        generator = torch.Generator(device=device).manual_seed(0)
        weight_full = torch.randn(
            vocab, dim, device=device, dtype=torch.bfloat16, generator=generator
        )
        weight_full *= dim**-0.5
        shard = -(-vocab // world)
        vocab_start = rank * shard
        weight_shard = weight_full[vocab_start : vocab_start + shard].contiguous()
        for batch in map(int, batches.split(",")):
            hidden = torch.randn(
                batch, dim, device=device, dtype=torch.bfloat16, generator=generator
            )
            # Every provider's step built (and its graph captured) first, then timed over
            # rounds in rotated orders: run-to-run drift (clocks, power, the other ranks)
            # falls on every provider alike instead of on whichever ran last.
            runs, notes, samples = {}, {}, {}
            for provider in providers:
                step = build(provider, hidden, weight_shard, weight_full, vocab_start, vocab, world)
                for mode in args.modes.split(","):
                    try:
                        runs[provider, mode] = prepare(step, mode, args.iters)
                    except Exception as error:  # noqa: BLE001 - recorded in the CSV
                        notes[provider, mode] = f"{type(error).__name__}: {error}"[:200]
            for order in round_orders(list(runs), args.rounds):
                for key in order:
                    if key not in runs:  # (failed in an earlier round)
                        continue
                    try:
                        samples.setdefault(key, []).append(time_run(runs[key], args.iters))
                    except Exception as error:  # noqa: BLE001 - recorded in the CSV
                        notes[key] = f"{type(error).__name__}: {error}"[:200]
                        del runs[key]
            for provider in providers:
                for mode in args.modes.split(","):
                    key = (provider, mode)
                    times = samples.get(key, [])
                    us = statistics.median(times) if times and key not in notes else float("nan")
                    note = notes.get(key, "")
                    rows.append((dim, vocab, batch, provider, mode, us, note))
                    if rank == 0:
                        spread = f"(rounds {min(times):.1f}-{max(times):.1f})" if times else ""
                        print(f"D={dim} V={vocab} B={batch:<4d} {provider:<22s} {mode:<6s}"
                              f" {us:8.1f} us {spread} {note}", flush=True)  # fmt: skip
            del runs
            del hidden
        del weight_full, weight_shard
        torch.cuda.empty_cache()
    if rank == 0:
        write_results(rows, meta, world, Path(args.out_dir))
    dist.barrier()
    dist.destroy_process_group()
    return 0


def write_results(rows, meta, world: int, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"bench_tp_{meta['gpu'].lower().replace(' ', '-')}_tp{world}_{meta['date']}"
    with (out_dir / f"{stem}.csv").open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["gpu", "torch", "triton", "date", "tp", "D", "V", "B", "provider",
                         "timing", "median_us", "note"])  # fmt: skip
        for dim, vocab, batch, provider, mode, us, note in rows:
            writer.writerow([meta["gpu"], meta["torch"], meta["triton"], meta["date"], world,
                             dim, vocab, batch, provider, mode, f"{us:.2f}", note])  # fmt: skip
    table = {(d, v, b, p, m): us for d, v, b, p, m, us, _ in rows}
    points = sorted({(d, v, b) for d, v, b, *_ in rows})
    modes = sorted({m for *_, m, _, _ in rows})
    lines = []
    for mode in modes:
        lines += [
            f"\n{mode}: us per step, TP = {world}; peers as their time over fused_tp's",
            "| D, V | B | shard matmul | fused_tp | fused_tp / (matmul + 10 us) | "
            + " | ".join(PEERS)
            + " | step_flashsampling / step_inductor | TP1 fused | scaling TP1 -> TP"
            + str(world)
            + " |",
            "|---" * (7 + len(PEERS)) + "|",
        ]
        for d, v, b in points:
            time_of = {p: table.get((d, v, b, p, mode), float("nan")) for p in PROVIDERS}
            fused, matmul = time_of["fused_tp"], time_of["shard_matmul"]
            tp1 = time_of["tp1_fused"]
            peers = " | ".join(f"{time_of[p] / fused:.2f}x" for p in PEERS)
            lines.append(
                f"| {d}, {v} | {b} | {matmul:.0f} | {fused:.0f} | {fused / (matmul + 10):.2f} | "
                f"{peers} | {time_of['step_flashsampling'] / time_of['step_inductor']:.2f} | "
                f"{tp1:.0f} | {tp1 / (world * fused):.2f} |"
            )
    if any(p in TOP_K_PROVIDERS for *_, p, _, _, _ in rows):
        for mode in modes:
            lines += [
                f"\n{mode}, top-k 50 (and top-p 0.9): us per step, TP = {world}; peers as "
                "their time over the fused step's with the same knobs",
                "| D, V | B | shard matmul | shard + gather | fused top-k | FI1 | compiled |"
                " fused top-k + top-p | FI1 | compiled | step_topk50 flashsampling / inductor |",
                "|---|---|---|---|---|---|---|---|---|---|---|",
            ]
            for d, v, b in points:
                t = {p: table.get((d, v, b, p, mode), float("nan")) for p in PROVIDERS}
                t.update({p: table.get((d, v, b, p, mode), float("nan")) for p in TOP_K_PROVIDERS})
                k, kp = t["fused_tp_topk50"], t["fused_tp_topk50_topp90"]
                lines.append(
                    f"| {d}, {v} | {b} | {t['shard_matmul']:.0f} | {t['shard_allgather']:.0f} | "
                    f"{k:.0f} | {t['allgather_fi1_topk50'] / k:.2f}x | "
                    f"{t['allgather_compiled_topk50'] / k:.2f}x | {kp:.0f} | "
                    f"{t['allgather_fi1_topk50_topp90'] / kp:.2f}x | "
                    f"{t['allgather_compiled_topk50_topp90'] / kp:.2f}x | "
                    f"{t['step_topk50_flashsampling'] / t['step_topk50_inductor']:.2f} |"
                )
    text = "\n".join(lines)
    (out_dir / f"{stem}.md").write_text(text + "\n")
    print(text, flush=True)
    try:
        plot(rows, points, modes, world, out_dir / f"{stem}.png", meta)
    except Exception as error:  # noqa: BLE001 - the CSV and table are what matter
        print(f"no plot: {error}", flush=True)


def plot(rows, points, modes, world, path, meta) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = sorted({(d, v) for d, v, _ in points})
    figure, axes = plt.subplots(len(modes), len(shapes), figsize=(6 * len(shapes), 4 * len(modes)),
                                squeeze=False)  # fmt: skip
    for i, mode in enumerate(modes):
        for j, (d, v) in enumerate(shapes):
            ax = axes[i][j]
            batches = sorted({b for dd, vv, b in points if (dd, vv) == (d, v)})
            for provider in sorted({r[3] for r in rows}):
                us = [next((r[5] for r in rows if r[:5] == (d, v, b, provider, mode)), None)
                      for b in batches]  # fmt: skip
                ax.plot(batches, us, marker="o", label=provider)
            tp1 = [next((r[5] for r in rows if r[:5] == (d, v, b, "tp1_fused", mode)), None)
                   for b in batches]  # fmt: skip
            ideal = [None if t is None else t / world for t in tp1]
            ax.plot(
                batches, ideal, linestyle=":", color="black", label=f"ideal (TP1 fused / {world})"
            )
            ax.set_xscale("log", base=2)
            ax.set_xlabel("B")
            ax.set_ylabel("us per step")
            ax.set_title(f"D={d}, V={v}, TP={world}, {mode}")
            ax.legend(fontsize=7)
    figure.suptitle(
        f"{meta['gpu']}, torch {meta['torch']}, triton {meta['triton']}, {meta['date']}"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
