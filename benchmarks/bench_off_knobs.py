"""What a batch pays for carrying its truncation knobs as per-row tensors, as one compiled
serving step does so that no setting is a graph of its own. Kernel level, CUDA graphs, one
GPU call (CUDA only; without CUDA it says so and exits 0).

Per shape and batch size B, ``fused_sample(hidden [B, D], weight [V, D])`` bf16 with a [B]
temperature tensor (0.7) and a device seed, and the knobs as

* ``plain``: None (the plain kernels);
* ``off``: [B] tensors at their "off" values, top_k 0, top_p 1.0, min_p 0.0 (the kernels
  read them on the device: stage 1 draws noise alone, stage 2 picks the plain candidates);
* ``mixed``: the same with every fourth row (0, 4, ...) at top_k 50, top_p 0.9;
* ``all``: every row at top_k 50, top_p 0.9, as [B] tensors.

With ``--zero-d`` the temperature and the knobs are 0-d tensors instead, as ``generate``
after ``hf.enable`` passes them (every knob a tensor, at its off value when off, so that no
setting recompiles): ``plain`` then has a 0-d temperature alone, ``off`` adds 0-d top_k 0,
top_p 1.0, min_p 0.0, ``all`` 0-d top_k 50, top_p 0.9 (no ``mixed``), and generate's
top-k settings as it passed them before (``k50``: top_k 50 alone; ``qwen3``: top_k 20,
top_p 0.95) and now (``k50off``, ``qwen3off``: the off knobs added at their off values), and
``k50int``: top_k=50 as a Python int (a graph of its own per setting; its tokens must equal
``k50off``'s).

``--variants split:_SPLIT_STAGE1=1,nopf:truncation_kernel.PREFETCH_PLAIN=False`` adds each
knob setting but ``plain`` again as ``off@split`` ... with those attributes of
``flashsampling_inductor.dispatch`` (or of another of its modules: ``truncation_kernel.NAME``)
set while the call is captured (A/B of such switches in one process, interleaved); its
tokens must equal the setting's own. ``--variant-plain`` adds ``plain@split`` ... too.

Each call is captured in a CUDA graph and timed by ``triton.testing.do_bench_cudagraph``
(median), the configurations interleaved over --rounds rounds. ``--label`` names the code
measured (run the script once per checkout to compare two on one card). ``--warmup-only``
compiles the kernels and times nothing (run several at once, one batch each, to fill
Triton's cache before a timed run). Goal of issue 35: ``off`` <= 1.01x ``plain`` at B <= 64.

    python benchmarks/bench_off_knobs.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import csv
import functools
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # a checkout
from profile_calls import kernel_us  # noqa: E402

SHAPES = {"d2048-v151936": (2048, 151936), "d4096-v151936": (4096, 151936)}
KNOBS = ("plain", "off", "mixed", "all")
# --zero-d: generate's settings, each knob that is off at its off value as generate passes it
# (since 20f68f9), and the top-k ones also as generate passed them before (off knobs absent).
ZERO_D_KNOBS = {
    "off": dict(top_k=0, top_p=1.0, min_p=0.0),
    "all": dict(top_k=50, top_p=0.9, min_p=0.0),
    "k50": dict(top_k=50),  # generate's default top-k, before
    "k50off": dict(top_k=50, top_p=1.0, min_p=0.0),  # now
    "qwen3": dict(top_k=20, top_p=0.95),  # Qwen3's generation_config, before
    "qwen3off": dict(top_k=20, top_p=0.95, min_p=0.0),  # now
    "k50int": dict(top_k=50),  # top_k=50 as a Python int (the path the tensors are held to)
}
# Passed as Python numbers, not tensors.
PYTHON_KNOBS = ("k50int",)


def knob_arguments(name: str, batch: int, zero_d: bool = False) -> dict:
    if name == "plain":
        return {}
    if name in PYTHON_KNOBS:
        return dict(ZERO_D_KNOBS[name])
    if zero_d:  # one value for every row, as generate passes them
        return {
            knob: torch.tensor(value, dtype=torch.int64 if knob == "top_k" else None, device="cuda")
            for knob, value in ZERO_D_KNOBS[name].items()
        }
    top_k = torch.zeros(batch, dtype=torch.int64, device="cuda")
    top_p = torch.ones(batch, device="cuda")
    on = torch.arange(batch, device="cuda") % 4 == 0 if name == "mixed" else slice(None)
    if name != "off":
        top_k[on] = 50
        top_p[on] = 0.9
    return dict(top_k=top_k, top_p=top_p, min_p=torch.zeros(batch, device="cuda"))


def parse_variants(text: str) -> dict[str, dict]:
    """The --variants text "label:ATTR=VALUE;ATTR=VALUE,label2:..." -> {label: {attr: value}}
    (values as Python literals where they parse, else strings)."""
    variants = {}
    for item in filter(None, text.split(",")):
        label, _, assignments = item.partition(":")
        settings = {}
        for assignment in filter(None, assignments.split(";")):
            attr, _, value = assignment.partition("=")
            try:
                settings[attr] = ast.literal_eval(value)
            except (ValueError, SyntaxError):
                settings[attr] = value
        variants[label] = settings
    return variants


def _owner(attr: str):
    """The module of a --variants attribute ("module.NAME" in flashsampling_inductor, else
    dispatch's) and the name."""
    import importlib

    module, _, name = attr.rpartition(".")
    return importlib.import_module(f"flashsampling_inductor.{module or 'dispatch'}"), name


@contextlib.contextmanager
def dispatch_set(settings: dict):
    saved = {attr: getattr(*_owner(attr)) for attr in settings}
    for attr, value in settings.items():
        setattr(*_owner(attr), value)
    try:
        yield
    finally:
        for attr, value in saved.items():
            setattr(*_owner(attr), value)


def with_settings(call, settings: dict):
    def run():
        with dispatch_set(settings):
            return call()

    return run


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--shapes", default=",".join(SHAPES), help="of " + str(SHAPES))
    parser.add_argument(
        "--batches", default="1,16,64,128,256", help="batch sizes (default 1,16,64,128,256)"
    )
    parser.add_argument(
        "--knobs", default=",".join(KNOBS), help=f"of {KNOBS}, with --zero-d {tuple(ZERO_D_KNOBS)}"
    )
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds")
    parser.add_argument("--rep", type=int, default=30, help="ms of replays per timing")
    parser.add_argument("--label", default="this", help="the code measured (CSV column)")
    parser.add_argument(
        "--zero-d", action="store_true", help="0-d temperature and knobs, as generate's"
    )
    parser.add_argument(
        "--warmup-only", action="store_true", help="compile the kernels, time nothing"
    )
    parser.add_argument(
        "--profile", action="store_true",
        help="also print each kernel's device time per call (eager, torch.profiler)",
    )  # fmt: skip
    parser.add_argument(
        "--variants", default="",
        help="label:ATTR=VALUE;... of flashsampling_inductor.dispatch, comma-separated",
    )  # fmt: skip
    parser.add_argument(
        "--variant-plain", action="store_true",
        help="--variants for plain too (a switch that changes plain calls as well)",
    )  # fmt: skip
    parser.add_argument("--out", default="benchmarks/results", help="folder of the CSV")
    args = parser.parse_args()
    variants = parse_variants(args.variants)
    if not torch.cuda.is_available():
        print("bench_off_knobs.py needs a CUDA GPU: nothing to run here")
        return
    import triton

    from flashsampling_inductor import fused_sample

    device_name = torch.cuda.get_device_name().lower().replace(" ", "-")
    stamp = time.strftime("%Y%m%d-%H%M", time.gmtime())
    writer = None
    if not args.warmup_only:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, f"bench_off_knobs_{device_name}_{args.label}_{stamp}.csv")
        print(f"{torch.cuda.get_device_name()}, torch {torch.__version__} -> {path}", flush=True)
        handle = open(path, "w", newline="")  # noqa: SIM115 (closed at exit)
        fields = ["gpu", "code", "shape", "batch", "knobs", "us", "ratio_to_plain"]
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
    for shape in args.shapes.split(","):
        hidden_size, vocab = SHAPES[shape]
        weight = torch.randn(vocab, hidden_size, device="cuda", dtype=torch.bfloat16)
        for batch in (int(b) for b in args.batches.split(",")):
            hidden = torch.randn(batch, hidden_size, device="cuda", dtype=torch.bfloat16)
            temperature = torch.full((batch,), 0.7, device="cuda")
            common = dict(
                temperature=temperature[0] if args.zero_d else temperature,
                seed=torch.tensor(7, device="cuda"),
            )
            names = [
                n
                for n in args.knobs.split(",")
                if not (n == "mixed" and (batch == 1 or args.zero_d))
            ]
            calls = {
                name: functools.partial(
                    fused_sample,
                    hidden,
                    weight,
                    **common,
                    **knob_arguments(name, batch, args.zero_d),
                )
                for name in names
            }
            pairs = [("plain", "off"), ("k50", "k50off"), ("qwen3", "qwen3off")]
            pairs.append(("k50int", "k50off"))
            for label, settings in variants.items():
                for name in names:
                    if (name != "plain" or args.variant_plain) and name not in PYTHON_KNOBS:
                        calls[f"{name}@{label}"] = with_settings(calls[name], settings)
                        pairs.append((name, f"{name}@{label}"))
            tokens = {name: call() for name, call in calls.items()}
            torch.cuda.synchronize()
            for same, other in pairs:
                if same in tokens and other in tokens:
                    if not torch.equal(tokens[same], tokens[other]):
                        print(f"{shape} B={batch}: {other} drew other tokens than {same}")
            if args.warmup_only:
                continue
            times = {name: [] for name in calls}
            for _ in range(args.rounds):
                for name, call in calls.items():
                    times[name].append(1e3 * triton.testing.do_bench_cudagraph(call, rep=args.rep))
            medians = {name: statistics.median(t) for name, t in times.items()}
            if args.profile:
                for name, call in calls.items():
                    kernels = " ".join(f"{k}={us:.1f}" for k, us in kernel_us(call).items())
                    print(f"{shape} B={batch} {name}: {kernels}", flush=True)
            for name, us in medians.items():
                row = dict(
                    gpu=torch.cuda.get_device_name(), code=args.label, shape=shape, batch=batch,
                    knobs=name, us=round(us, 1),
                    ratio_to_plain=round(us / medians["plain"], 4) if "plain" in medians else "",
                )  # fmt: skip
                writer.writerow(row)
                print(row, flush=True)
            handle.flush()


if __name__ == "__main__":
    main()
