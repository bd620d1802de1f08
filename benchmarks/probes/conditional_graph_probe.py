"""What CUDA graph conditional nodes would cost issue 35's off-valued knobs (item 2): the
fused call with knob tensors at their "off" values, against the plain call, against both
behind IF nodes that a device flag chooses between (the truncating call's kernels skipped
when no row truncates, no host sync). Not a route of the op: a measurement for the team.

Graphs, each replayed in loops of ``--loops`` between CUDA events, rounds interleaved:

  plain     fused_sample(T = 0.7), Python knobs
  off       the same with top-k / top-p / min-p as 0-d CUDA tensors at their off values
  if_plain  IF(flag) { plain } with flag = True: one set-condition kernel and one
            conditional node around the plain call
  if_both   IF(truncates) { off } then IF(not truncates) { plain }, truncates = False: the
            form an op would take (two set kernels, two nodes); the flags are inputs here,
            so the kernel that would compute them from the knobs is not counted

    python benchmarks/probes/conditional_graph_probe.py --batches 1,16,64
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from flashsampling_inductor import fused_sample  # noqa: E402


@contextlib.contextmanager
def if_node(graph: torch.cuda.CUDAGraph, pred: torch.Tensor):
    # (the graph being captured, passed in: torch 2.11 has no
    # CUDAGraph.get_currently_capturing_graph, so an op inside a capture it does not own,
    # as under torch.compile's CUDA graph trees, could not reach it there)
    graph.begin_capture_to_if_node(pred)
    try:
        yield
    finally:
        graph.end_capture_to_conditional_node()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--loops", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(), flush=True)
    torch.manual_seed(0)
    weight = torch.randn(args.vocab, args.hidden, device="cuda", dtype=torch.bfloat16) * 0.05
    off = dict(
        top_k=torch.tensor(0, device="cuda"),
        top_p=torch.tensor(1.0, device="cuda"),
        min_p=torch.tensor(0.0, device="cuda"),
    )
    truncates = torch.tensor(False, device="cuda")
    plain_flag = torch.tensor(True, device="cuda")
    for batch in (int(b) for b in args.batches.split(",")):
        measure(batch, weight, off, truncates, plain_flag, args)


def measure(batch, weight, off, truncates, plain_flag, args) -> None:
    hidden = torch.randn(batch, args.hidden, device="cuda", dtype=torch.bfloat16)
    seed = torch.tensor(5, device="cuda")
    out = torch.empty(batch, 1, dtype=torch.int64, device="cuda")

    def plain():
        out.copy_(fused_sample(hidden, weight, temperature=0.7, seed=seed))

    def off_valued():
        out.copy_(fused_sample(hidden, weight, temperature=0.7, seed=seed, **off))

    def if_plain(graph):
        with if_node(graph, plain_flag):
            plain()

    def if_both(graph):
        with if_node(graph, truncates):
            off_valued()
        with if_node(graph, plain_flag):
            plain()

    bodies = dict(plain=plain, off=off_valued, if_plain=if_plain, if_both=if_both)
    graphs, tokens = {}, {}
    for name, body in bodies.items():
        try:
            if name in ("plain", "off"):
                for _ in range(2):
                    body()
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                body() if name in ("plain", "off") else body(graph)
            graph.replay()
            torch.cuda.synchronize()
            graphs[name] = graph
            tokens[name] = out.clone()
        except Exception as error:  # (a torch without conditional nodes, a capture error)
            print(f"B={batch} {name}: not captured ({type(error).__name__}: {error})")
    times = {name: [] for name in graphs}
    for _ in range(args.rounds):
        for name, graph in graphs.items():
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(args.loops):
                graph.replay()
            end.record()
            torch.cuda.synchronize()
            times[name].append(start.elapsed_time(end) * 1e3 / args.loops)
    base = statistics.median(times["plain"]) if "plain" in times else float("nan")
    cells = []
    for name, values in times.items():
        us = statistics.median(values)
        same = torch.equal(tokens[name], tokens.get("plain", tokens[name]))
        cells.append(f"{name} {us:.1f} us ({us / base:.3f}{'' if same else ', tokens differ'})")
    print(f"D={args.hidden} B={batch}: " + "; ".join(cells), flush=True)


if __name__ == "__main__":
    main()
