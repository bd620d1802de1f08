"""The A/B loop of the stage-choice scripts (large_batch_ab.py, truncation_ab.py), in one
process: per shape a weight (std-5 logits), per batch size the providers, every one compiled
ahead, each provider's tokens checked against its mode's first provider's (they must not
depend on the choice), then CUDA-graph medians round-robin over ``rounds`` in a shuffled
order (clock drift and neighbours hit every provider). A CSV row per timing
(``<stem>.csv``), a summary line per point (each provider's fastest round over cuBLAS's
fastest: ``<stem>_summary.txt``); points are skipped once ``budget`` seconds from ``start``
are near."""

from __future__ import annotations

import collections
import contextlib
import csv
import random
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import triton
from sweep_configs import graph_median_us  # (this folder)

from flashsampling_inductor.launch import compile_ahead

Timed = dict[str, Callable[[], torch.Tensor]]
# (hidden_size, vocab, batches) -> the weight and one hidden per batch size
Inputs = Callable[[int, int, Sequence[int]], tuple[torch.Tensor, list[torch.Tensor]]]


@contextlib.contextmanager
def flags(settings):
    """Each (module, name, value) of ``settings`` set for the block, the old values back after
    it: the module-level levers an A/B variant toggles."""
    before = [(module, name, getattr(module, name)) for module, name, _ in settings]
    for module, name, value in settings:
        setattr(module, name, value)
    try:
        yield
    finally:
        for module, name, value in before:
            setattr(module, name, value)


def kernel_times(fn, calls: int = 5) -> list[tuple[str, float]]:
    """(kernel name, mean us per call over ``calls`` calls of ``fn``, profiled), largest first."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    totals = collections.Counter()
    for event in profile.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name[:90]] += event.device_time_total / calls
    return totals.most_common()


def check_tokens(timed: Timed, mode_of: Callable[[str], str]) -> list[str]:
    """Names whose tokens differ from their mode's first provider's (one call each)."""
    differ, expected = [], {}
    for name, fn in timed.items():
        if name == "matmul":
            continue
        mode = mode_of(name)
        tokens = fn()
        if mode not in expected:
            expected[mode] = tokens
        elif not torch.equal(tokens, expected[mode]):
            differ.append(name)
    return differ


def time_rounds(
    shapes: str,
    batches: str,
    make_timed: Callable[[int, torch.Tensor, torch.Tensor], Timed],
    mode_of: Callable[[str], str],
    *,
    rounds: int,
    out_dir: str,
    stem: str,
    budget: float,
    start: float,
    inputs: Inputs | None = None,
) -> int:
    """Time ``make_timed(batch, hidden, weight)``'s providers (one named "matmul", the
    reference of every ratio) at every shape of ``shapes`` ("DxV,...") and batch size of
    ``batches`` ("B,..."), files in ``out_dir``; the number of token mismatches. The weight
    and hidden states are ``inputs``' (default: std-5 logits from a generator seeded 0)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    batches = [int(b) for b in batches.split(",")]
    shapes = [tuple(int(x) for x in s.split("x")) for s in shapes.split(",")]
    order = random.Random(0)
    generator = torch.Generator(device="cuda").manual_seed(0)
    failures = 0
    with open(out / f"{stem}.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["D", "V", "B", "provider", "round", "us"])
        for hidden_size, vocab in shapes:
            if time.time() - start > budget - 15:
                print(f"D={hidden_size}: skipped (budget)", flush=True)
                continue
            if inputs is None:
                weight = torch.randn(vocab, hidden_size, generator=generator, device="cuda")
                weight = (weight * (5 / hidden_size**0.5)).bfloat16()
                hiddens = [
                    torch.randn(batch, hidden_size, generator=generator, device="cuda").bfloat16()
                    for batch in batches
                ]
            else:
                weight, hiddens = inputs(hidden_size, vocab, batches)
            points = [
                (batch, make_timed(batch, hidden, weight))
                for batch, hidden in zip(batches, hiddens, strict=True)
            ]
            started = time.time()
            try:
                with compile_ahead(threads=16):
                    for _, timed in points:
                        for name, fn in timed.items():
                            if name != "matmul":
                                fn()
            except Exception:  # noqa: BLE001 - they then compile at their first launch
                traceback.print_exc()
            torch.cuda.synchronize()
            print(f"D={hidden_size}: compiled ahead in {time.time() - started:.1f} s", flush=True)
            for batch, timed in points:
                if time.time() - start > budget - 8:
                    print(f"D={hidden_size} B={batch}: skipped (budget)", flush=True)
                    continue
                for name, fn in list(timed.items()):
                    try:
                        fn()
                    except Exception:  # noqa: BLE001 - logged, the others go on
                        traceback.print_exc()
                        del timed[name]
                differ = check_tokens(timed, mode_of)
                failures += len(differ)
                times = {name: [] for name in timed}
                for round_index in range(rounds):
                    names = list(timed)
                    order.shuffle(names)
                    for name in names:
                        us = graph_median_us(timed[name])
                        times[name].append(us)
                        writer.writerow([hidden_size, vocab, batch, name, round_index, f"{us:.2f}"])
                f.flush()
                best = {n: min(t) for n, t in times.items()}
                mm = best["matmul"]
                line = f"D={hidden_size} B={batch} matmul {mm:.1f}us | " + " ".join(
                    f"{n} {u / mm:.3f}" for n, u in best.items() if n != "matmul"
                )
                if differ:
                    line += f" | TOKENS DIFFER: {','.join(differ)}"
                print(line, flush=True)
                with open(out / f"{stem}_summary.txt", "a") as summary:
                    summary.write(line + "\n")
            del weight, points
            torch.cuda.empty_cache()
    return failures
