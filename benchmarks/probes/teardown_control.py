"""Control for the TP teardown hang (issue 39; two CUDA GPUs):

    python benchmarks/probes/teardown_control.py [--release] [--exit-s 25]

A step with a captured NCCL all-reduce compiled with mode="reduce-overhead" and NO
flashsampling call. Expected (pytorch#115388, NCCL's commDestroySync waits for graphs
holding captured work): a rank does not exit within the bound. With --release the worker
installs flashsampling's release first: expected clean."""

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a plain checkout
from tests.tp_ranks import last_exit_s, run_ranks  # noqa: E402


def _worker(rank, world, release):
    import torch.distributed._functional_collectives as funcol

    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    if release:
        from flashsampling_inductor import teardown

        teardown.release_before_destroy()
    x = torch.ones(4, 64, device=device)

    def step(h):
        return funcol.all_reduce(h, "sum", torch.distributed.group.WORLD) * 2

    from torch._dynamo.utils import counters

    compiled = torch.compile(step, mode="reduce-overhead")
    total = torch.stack([compiled(x).clone() for _ in range(4)]).sum().item()
    return total, dict(counters["inductor"])  # cudagraph_skips: 0 if the graph was captured


if __name__ == "__main__":
    release = "--release" in sys.argv
    exit_s = float(sys.argv[sys.argv.index("--exit-s") + 1]) if "--exit-s" in sys.argv else 8.0
    started = time.perf_counter()
    try:
        out = run_ranks(2, _worker, release, backend="nccl", timeout_s=60, exit_s=exit_s)
        print(f"control release={release}: clean exit, results {out}, exits {last_exit_s}")
    except AssertionError as error:
        print(f"control release={release}: {error}")
    print(f"control release={release}: {time.perf_counter() - started:.1f} s in all")
