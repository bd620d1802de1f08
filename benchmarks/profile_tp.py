"""Where a tensor-parallel sampling step spends its time: the kernels of one step (CUDA-graph
replay under the torch profiler) and the host's Python time per call (cProfile), rank 0.

    python -m torch.distributed.run --nproc_per_node=2 benchmarks/profile_tp.py \
        [--shape 4096x151936] [--batches 1,64,256] [--top-k 0]

Prints, per batch size: the GPU kernels of one step with their durations, the host time per
eager call (no synchronization inside the loop), and the top of cProfile's table. Needs two
or more CUDA GPUs of one host (without CUDA it says so and exits 0); writes nothing.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
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
import flashsampling_inductor as fs  # noqa: E402


def kernels_of_one_step(step, rank: int) -> None:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    dist.barrier()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            graph.replay()
        torch.cuda.synchronize()
    if rank == 0:
        events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        by_name: dict[str, list[float]] = {}
        for event in events:
            by_name.setdefault(event.name, []).append(event.device_time)
        print("  kernels of one step (graph replay, mean of 10, us):")
        total = 0.0
        for name, times in by_name.items():
            mean = sum(times) / 10
            total += mean
            print(f"    {mean:8.2f}  x{len(times) // 10}  {name[:110]}")
        print(f"    {total:8.2f}  sum of kernel times")
    dist.barrier()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        graph.replay()
    stop.record()
    stop.synchronize()
    if rank == 0:
        print(f"  graph replay: {start.elapsed_time(stop) * 1e3 / 20:.1f} us per step")


def host_time(step, rank: int, calls: int = 200) -> None:
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    dist.barrier()
    begin = time.perf_counter()
    for _ in range(calls):
        step()
    host = (time.perf_counter() - begin) / calls * 1e6
    torch.cuda.synchronize()
    wall = (time.perf_counter() - begin) / calls * 1e6
    dist.barrier()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        step()
    profiler.disable()
    torch.cuda.synchronize()
    dist.barrier()
    if rank == 0:
        print(f"  eager: host {host:.1f} us per call, wall {wall:.1f} us per call")
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        stats.sort_stats("tottime").print_stats(25)
        stats.sort_stats("cumulative").print_stats(45)
        lines = [line for line in text.getvalue().splitlines() if line.strip()]
        print("\n".join("    " + line for line in lines))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", default="4096x151936", help="DxV of the whole LM head")
    parser.add_argument("--batches", default="1,64,256", help="B list (default 1,64,256)")
    parser.add_argument("--top-k", type=int, default=0, help="top-k of the step (0: off)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("profile_tp.py profiles CUDA GPUs; there is none here: nothing run")
        return 0
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    device = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group("nccl", device_id=device)
    dim, vocab = map(int, args.shape.split("x"))
    shard = -(-vocab // world)
    generator = torch.Generator(device=device).manual_seed(0)
    weight = torch.randn(shard, dim, device=device, dtype=torch.bfloat16, generator=generator)
    weight *= dim**-0.5
    knobs = {"top_k": args.top_k, "logits_dtype": torch.bfloat16} if args.top_k else {}
    for batch in map(int, args.batches.split(",")):
        hidden = torch.randn(batch, dim, device=device, dtype=torch.bfloat16, generator=generator)

        def step(hidden=hidden):
            return fs.tp_fused_sample(
                hidden, weight, vocab_start=rank * shard, vocab_size=vocab, **knobs
            )

        if rank == 0:
            print(f"== TP = {world}, D = {dim}, V = {vocab}, B = {batch}, {knobs or 'plain'}")
        matmul = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(3):
            hidden @ weight.T
        matmul[0].record()
        for _ in range(20):
            hidden @ weight.T
        matmul[1].record()
        matmul[1].synchronize()
        if rank == 0:
            print(f"  shard matmul (eager): {matmul[0].elapsed_time(matmul[1]) * 50:.1f} us")
        kernels_of_one_step(step, rank)
        host_time(step, rank)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
