"""A/B of one module of flashsampling_inductor against another version of its file, in one
process (CUDA only): the other version is imported under a name of its own and swapped in
for the calls of its providers while they are captured in CUDA graphs; tokens checked equal
per call; CUDA-graph medians over interleaved rounds, us, and each form's new / old.

    python benchmarks/probes/module_ab.py --old /path/to/old/truncation_kernel.py \\
        --module truncation_kernel --shapes 2048x151936 --batches 1,16,64
    python benchmarks/probes/module_ab.py --old-patch "SWITCH = False=>SWITCH = True"

Forms: plain (T = 0.7), k50 (top_k=50), k50p09 (+ top_p=0.9), p09, minp (min_p=0.1), and
off / k50off (0-d tensors at their off values, top-k 50 as a 0-d tensor: generate's), each
as ``form`` (this checkout) and ``form@old``. Rows: std-5 logits (bench_sampling's
``--logit-std 5``), a fixed seed; fp32 logits unless ``--bf16-logits``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

FORMS = {
    "plain": {},
    "k50": dict(top_k=50),
    "k50p09": dict(top_k=50, top_p=0.9),
    "p09": dict(top_p=0.9),
    "minp": dict(min_p=0.1),
    "off": "off",
    "k50off": "k50off",
}


def load_as(path: str, name: str, patches: tuple[tuple[str, str], ...] = ()):
    """The module of flashsampling_inductor in ``path``, each (old, new) text of ``patches``
    replaced, imported as ``_ab_<name>`` (``import_source``)."""
    return import_source(patched(open(path).read(), patches), name)


def patched(source: str, patches: tuple[tuple[str, str], ...]) -> str:
    """``source`` with each (old, new) text of ``patches`` replaced (each old found once)."""
    for old, new in patches:
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    return source


def import_source(source: str, name: str):
    """A module of flashsampling_inductor's ``source`` (its relative imports made absolute)
    imported as ``_ab_<name>`` from a file beside this script (git ignores them)."""
    source = source.replace("from .", "from flashsampling_inductor.")
    target = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"_ab_{name}.py")
    with open(target, "w") as handle:  # (Triton reads a kernel's source from its file)
        handle.write(source)
    spec = importlib.util.spec_from_file_location(f"_ab_{name}", target)
    module = importlib.util.module_from_spec(spec)
    sys.modules[f"_ab_{name}"] = module
    spec.loader.exec_module(module)
    return module


def knobs(form: str) -> dict:
    value = FORMS[form]
    if value in ("off", "k50off"):
        return dict(
            top_k=torch.tensor(50 if value == "k50off" else 0, device="cuda"),
            top_p=torch.tensor(1.0, device="cuda"), min_p=torch.tensor(0.0, device="cuda"),
            temperature=torch.tensor(0.7, device="cuda"),
        )  # fmt: skip
    return dict(value, temperature=0.7)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", help="the other version's file (default: this one's own)")
    parser.add_argument(
        "--old-patch", action="append", default=[],
        help="OLD=>NEW: a text replaced in the other version (repeatable): a switch's A/B",
    )  # fmt: skip
    parser.add_argument("--module", default="truncation_kernel")
    parser.add_argument("--shapes", default="2048x151936")
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--forms", default=",".join(FORMS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rep", type=int, default=25, help="ms of replays per timing")
    parser.add_argument(
        "--bf16-logits", action="store_true",
        help="logits rounded to bf16 (logits_dtype=torch.bfloat16), as bench_sampling's calls",
    )  # fmt: skip
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("module_ab.py needs a CUDA GPU: nothing to run here")
        return
    import triton

    import flashsampling_inductor
    from flashsampling_inductor import dispatch, fused_sample, op

    new = getattr(flashsampling_inductor, args.module, None) or importlib.import_module(
        f"flashsampling_inductor.{args.module}"
    )
    patches = tuple(tuple(patch.split("=>", 1)) for patch in args.old_patch)
    old = load_as(args.old or new.__file__, args.module, patches)
    args.old = args.old or f"{args.module}.py with {patches}"
    owners = [m for m in (dispatch, op) if getattr(m, args.module, None) is new]
    logits = "bf16" if args.bf16_logits else "fp32"
    print(f"{torch.cuda.get_device_name()}: {args.module} new vs {args.old}; {logits} logits;"
          " graph us (median)")  # fmt: skip
    for shape in args.shapes.split(","):
        hidden_size, vocab = map(int, shape.split("x"))
        torch.manual_seed(0)
        weight = torch.randn(vocab, hidden_size, device="cuda", dtype=torch.bfloat16)
        for batch in map(int, args.batches.split(",")):
            hidden = torch.randn(batch, hidden_size, device="cuda", dtype=torch.bfloat16)
            hidden *= 5 / hidden_size**0.5
            calls = {}
            for form in args.forms.split(","):
                arguments = knobs(form)  # (made outside the graphs' capture)
                if args.bf16_logits:
                    arguments["logits_dtype"] = torch.bfloat16
                for label, module in (("", new), ("@old", old)):

                    def call(module=module, hidden=hidden, weight=weight, arguments=arguments):
                        for owner in owners:
                            setattr(owner, args.module, module)
                        try:
                            return fused_sample(hidden, weight, seed=7, **arguments)
                        finally:
                            for owner in owners:
                                setattr(owner, args.module, new)

                    calls[form + label] = call
            tokens = {name: call() for name, call in calls.items()}
            for form in args.forms.split(","):
                if not torch.equal(tokens[form], tokens[form + "@old"]):
                    print(f"  {shape} B={batch} {form}: old and new drew other tokens")
            times = {name: [] for name in calls}
            order = list(calls)
            for _ in range(args.rounds):
                random.shuffle(order)
                for name in order:
                    us = 1e3 * triton.testing.do_bench_cudagraph(calls[name], rep=args.rep)
                    times[name].append(us)
            line = []
            for form in args.forms.split(","):
                a = statistics.median(times[form])
                b = statistics.median(times[form + "@old"])
                line.append(f"{form} {a:.1f}/{b:.1f}={a / b:.3f}")
            print(f"D={hidden_size} B={batch}: " + "  ".join(line), flush=True)


if __name__ == "__main__":
    main()
