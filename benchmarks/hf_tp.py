"""Hugging Face ``generate`` under tensor parallelism: a model loaded with
``from_pretrained(..., tp_plan="auto")`` (its LM head sharded by vocabulary, the logits
gathered: transformers' ``colwise_gather_output``) and ``flashsampling_inductor.hf.enable``.

Run under torchrun (GPUs: NCCL, one rank per GPU; CPU: gloo)::

    python -m torch.distributed.run --nproc_per_node=2 benchmarks/hf_tp.py --shape tiny
    python -m torch.distributed.run --nproc_per_node=2 benchmarks/hf_tp.py \\
        --shape llama-3.1-8b --batches 1,16 --configs stock,fused --out-dir DIR

Rank 0 writes a checkpoint of random bf16 weights of the shape (``--layers`` fewer than the
real model's to save time), every rank loads it with ``tp_plan="auto"``. Per configuration
and batch size, ``generate(do_sample=True, temperature=0.7, top_k=50, cache_implementation=
"static")`` from the same prompt and ``torch.manual_seed`` on every rank:

  stock   transformers' own generate (its static-cache decode step compiled by Inductor,
          mode="reduce-overhead")
  fused   the same after ``hf.enable(model)``: the decode step compiled with
          backend="flashsampling", whose pass turns the LM head's gather and the sampling
          into one ``tp_fused_sample`` call

It checks that every rank returns the same tokens, says whether the decode step was fused
(``hf.is_fused``, the pass's rewrites), and times the calls after the first (TPOT: wall time
per new token, the prefill included). Rank 0 prints a table and writes
``hf_tp_<gpu>_tp<P>_<date>.csv`` into ``--out-dir``.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import faulthandler
import os
import statistics
import sys
import time
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
import flashsampling_inductor.hf as fs_hf  # noqa: E402

SHAPES = {
    "tiny": dict(
        vocab_size=32000, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64,
    ),
    "llama-3.1-8b": dict(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128,
    ),
    # Qwen2.5-32B's dimensions and vocabulary in Llama layers (no attention bias): "a 32B shape"
    "32b": dict(
        vocab_size=152064, hidden_size=5120, intermediate_size=27648, num_hidden_layers=64,
        num_attention_heads=40, num_key_value_heads=8, head_dim=128,
    ),
}  # fmt: skip
PROMPT, TEMPERATURE, TOP_K = 16, 0.7, 50


def write_checkpoint(shape: str, layers: int | None, path: Path, device: torch.device) -> None:
    import transformers

    dims = dict(SHAPES[shape])
    if layers:
        dims["num_hidden_layers"] = layers
    config = transformers.LlamaConfig(**dims)
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = transformers.LlamaForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(previous)
    model.save_pretrained(path)


def generate(model, prompt, new_tokens: int, fused: bool):
    """-> the tokens and, when fused, ``hf.is_fused``'s word on the call."""
    if fused:
        fs_hf.enable(model)
    try:
        torch.manual_seed(1234)
        out = model.generate(
            prompt, do_sample=True, temperature=TEMPERATURE, top_k=TOP_K,
            max_new_tokens=new_tokens, cache_implementation="static",
        )  # fmt: skip
        return out, str(fs_hf.is_fused(model)) if fused else ""
    finally:
        fs_hf.disable(model)


def profile_call(model, prompt, new_tokens: int, fused: bool, rank: int, label: str) -> None:
    """One more call under torch.profiler; rank 0 prints its kernels by GPU time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        generate(model, prompt, new_tokens, fused)
        torch.cuda.synchronize()
    if rank == 0:
        table = prof.key_averages().table(
            sort_by="cuda_time_total", row_limit=15, max_name_column_width=60
        )
        print(f"profile {label}, {new_tokens} tokens:\n{table}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--shape", default="tiny", choices=sorted(SHAPES), help="model shape (default tiny)"
    )
    parser.add_argument("--layers", type=int, default=None, help="fewer layers than the shape's")
    parser.add_argument("--batches", default="1,4", help="batch sizes (default 1,4)")
    parser.add_argument("--configs", default="fused,stock", help="fused and/or stock")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens per call (default 32)")
    parser.add_argument("--repeats", type=int, default=2, help="timed calls after the first")
    parser.add_argument(
        "--checkpoint", default="/tmp/hf_tp_checkpoint", help="where rank 0 writes the weights"
    )
    parser.add_argument("--out-dir", default=None, help="folder of the CSV (none: no CSV)")
    parser.add_argument(
        "--profile", action="store_true",
        help="one more call per cell under torch.profiler: rank 0 prints the top GPU kernels",
    )  # fmt: skip
    parser.add_argument(
        "--pool-history", action="store_true",
        help="record cudagraph trees' allocation history (names the sites of tensors left in a"
        " graph's pool)",
    )  # fmt: skip
    args = parser.parse_args()
    if args.pool_history:
        from torch._inductor import config as inductor_config

        inductor_config.triton.cudagraph_trees_history_recording = True
    if "RANK" not in os.environ:
        print("hf_tp.py runs one process per rank: start it with torchrun (see --help)")
        return 0

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
        device = torch.device("cuda", torch.cuda.current_device())
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    import transformers
    from torch._dynamo.utils import counters

    torch._dynamo.config.recompile_limit = 64
    checkpoint = Path(f"{args.checkpoint}_{args.shape}_{args.layers or 'all'}")
    if rank == 0 and not (checkpoint / "config.json").exists():
        started = time.perf_counter()
        write_checkpoint(args.shape, args.layers, checkpoint, device)
        print(f"checkpoint written in {time.perf_counter() - started:.1f} s", flush=True)
    dist.barrier()
    started = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        checkpoint, tp_plan="auto", dtype=torch.bfloat16
    ).eval()
    model.generation_config.eos_token_id = None  # every call makes all its tokens
    model.generation_config.pad_token_id = 0
    head = model.get_output_embeddings().weight
    if rank == 0:
        print(
            f"loaded with tp_plan='auto' in {time.perf_counter() - started:.1f} s on {world} "
            f"ranks: lm_head weight {type(head).__name__} {getattr(head, 'placements', '')} "
            f"local {tuple(getattr(head, 'to_local', lambda: head)().shape)}; transformers "
            f"{transformers.__version__}, torch {torch.__version__}",
            flush=True,
        )
    rows = []
    vocab = model.config.vocab_size
    for batch in map(int, args.batches.split(",")):
        prompt = torch.randint(
            1, vocab, (batch, PROMPT), generator=torch.Generator().manual_seed(batch)
        ).to(device)
        for config in args.configs.split(","):
            fused = config == "fused"
            counters.clear()
            note, times, equal, fusion = "", [], None, ""
            try:
                started = time.perf_counter()
                out, fusion = generate(model, prompt, args.new_tokens, fused)
                first = time.perf_counter() - started
                mine = dict(counters["flashsampling"])
                every = [None] * world
                dist.all_gather_object(every, mine)
                # (what the pass rewrote, the same on every rank, or each rank's)
                rewrites = mine if all(r == mine for r in every) else every
                gathered = [torch.empty_like(out) for _ in range(world)]
                dist.all_gather(gathered, out)
                equal = all(torch.equal(g, gathered[0]) for g in gathered)
                for _ in range(args.repeats):
                    if cuda:
                        torch.cuda.synchronize()
                    started = time.perf_counter()
                    generate(model, prompt, args.new_tokens, fused)
                    if cuda:
                        torch.cuda.synchronize()
                    times.append(time.perf_counter() - started)
                if args.profile and cuda:
                    profile_call(model, prompt, args.new_tokens, fused, rank, f"B={batch} {config}")
            except Exception as error:  # noqa: BLE001 - recorded in the CSV
                first, rewrites = float("nan"), {}
                note = f"{type(error).__name__}: {error}"[:300]
            tpot = statistics.median(times) * 1e3 / args.new_tokens if times else float("nan")
            rows.append((args.shape, args.layers or "all", batch, config, tpot, first, equal,
                         rewrites, fusion, note))  # fmt: skip
            if rank == 0:
                print(f"B={batch:<3d} {config:<6s} TPOT {tpot:8.2f} ms  first call {first:6.1f} s"
                      f"  tokens equal on all ranks: {equal}  rewrites {rewrites}  {fusion}"
                      f"  {note}", flush=True)  # fmt: skip
    if rank == 0 and args.out_dir:
        gpu = torch.cuda.get_device_name(device) if cuda else "cpu"
        date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M")
        out_dir = Path(args.out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / f"hf_tp_{gpu.lower().replace(' ', '-')}_tp{world}_{date}.csv"
        with path.open("w", newline="") as file:
            writer = csv.writer(file)
            writer.writerow(["gpu", "torch", "transformers", "date", "tp", "shape", "layers",
                             "B", "config", "new_tokens", "tpot_ms", "first_call_s",
                             "tokens_equal_on_ranks", "rewrites", "fusion", "note"])  # fmt: skip
            for shape, layers, batch, config, tpot, first, equal, rewrites, fusion, note in rows:
                writer.writerow([gpu, torch.__version__, transformers.__version__, date, world,
                                 shape, layers, batch, config, args.new_tokens, f"{tpot:.3f}",
                                 f"{first:.1f}", equal, rewrites, fusion, note])  # fmt: skip
        print(f"wrote {path} at {time.strftime('%H:%M:%S')}", flush=True)
    # A teardown that hangs prints every thread's stack and ends the process with code 1 (two
    # runs on two H200s hung in destroy_process_group: NCCL waited for the decode step's CUDA
    # graphs, which hold its captured all-reduces; flashsampling_inductor.teardown frees them).
    faulthandler.dump_traceback_later(30, exit=True)
    dist.barrier()
    if rank == 0:
        print(f"barrier passed at {time.strftime('%H:%M:%S')}", flush=True)
    started = time.perf_counter()
    dist.destroy_process_group()
    faulthandler.cancel_dump_traceback_later()
    if rank == 0:
        print(f"process group destroyed at {time.strftime('%H:%M:%S')} in "
              f"{time.perf_counter() - started:.2f} s", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
