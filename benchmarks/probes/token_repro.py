"""Same seed -> same tokens, across fresh processes: where a fused run stops repeating itself.

Three parts, each run in its own process (``--tag`` names it; fresh Triton / Inductor caches
come from the caller's environment), each writing ``<out>/<part>_<tag>.pt``; ``compare``
then reads them all and prints where processes and repeated calls disagree:

  op        the fused op on fixed inputs (drawn from a CUDA generator with a fixed seed, so
            every process gets the same bits): B = 8, top-k 50 with every knob a 0-d tensor
            (what ``generate`` passes after ``hf.enable``), top-k 50 as a Python int, plain
            sampling, B = 1; each called 5 times, with the tokens of the pure-torch reference
            on the same seed and which stage 1 was chosen. With ``--garbage`` the caching
            allocator's free blocks are first filled with values of this process's own
            (``--tag``): a read past a tensor's end then differs between processes.
  generate  ``generate`` after ``hf.enable`` (benchmarks/bench_generate.py's Qwen3-1.7B
            shape, B = 8, top-k 50, 16 new tokens, ``torch.manual_seed(1)``) twice in one
            process, recording the op's inputs and tokens at every call made outside a CUDA
            graph capture (``--no-cudagraphs``: every step), then re-running those calls
            eagerly and through the reference.
  compare   the first row / step where processes (or the repeats of one) differ.

    python benchmarks/probes/token_repro.py op --tag a --out /tmp/r
    python benchmarks/probes/token_repro.py compare --out /tmp/r
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import os
import sys
import time

import torch

V, D = 151936, 2048


def _fill_free_memory(tag: str) -> None:
    """Leave this process's own values in the caching allocator's free blocks (small and
    large pools), so that a read past a tensor's end gives per-process values."""
    value = sum(map(ord, tag)) * 7919 % 100003 + 11
    junk = [torch.full((n,), value + i, dtype=torch.int64, device="cuda")
            for i, n in enumerate([16, 64, 64, 128, 500, 4000, 70000, 300000] * 8)]  # fmt: skip
    torch.cuda.synchronize()
    del junk


def _op_cases(batch_all: int):
    from flashsampling_inductor import fused_sample

    g = torch.Generator(device="cuda").manual_seed(1234)
    weight = (torch.randn((V, D), generator=g, device="cuda") * 0.02).to(torch.bfloat16)
    hidden_all = torch.randn((batch_all, D), generator=g, device="cuda").to(torch.bfloat16)
    cases = {}

    def knobs0d(top_k=50):
        return dict(
            temperature=torch.tensor(0.7, device="cuda"),
            top_k=torch.tensor(top_k, dtype=torch.int64, device="cuda"),
            top_p=torch.tensor(1.0, device="cuda"),
            min_p=torch.tensor(0.0, device="cuda"),
        )

    seed = torch.tensor(987654321, dtype=torch.int64, device="cuda")
    cases["b8_knobs0d_topk50"] = (hidden_all[:8], knobs0d())
    cases["b8_int_topk50"] = (hidden_all[:8], dict(temperature=0.7, top_k=50))
    cases["b8_plain"] = (hidden_all[:8], dict(temperature=0.7))
    cases["b8_knobs0d_off"] = (hidden_all[:8], knobs0d(top_k=0))
    cases["b1_knobs0d_topk50"] = (hidden_all[:1], knobs0d())
    return fused_sample, weight, seed, cases


def run_op(args) -> None:
    from flashsampling_inductor import dispatch

    if args.garbage:
        _fill_free_memory(args.tag)
    fused_sample, weight, seed, cases = _op_cases(8)
    if args.garbage:
        _fill_free_memory(args.tag + "x")
    result = {"tag": args.tag, "cases": {}}
    for name, (hidden, knobs) in cases.items():
        calls = []
        for _ in range(5):
            calls.append(fused_sample(hidden, weight, seed=seed, logits_dtype=torch.bfloat16,
                                      impl="triton", **knobs).cpu())  # fmt: skip
        reference = fused_sample(hidden, weight, seed=seed, logits_dtype=torch.bfloat16,
                                 impl="torch", **knobs).cpu()  # fmt: skip
        truncates = any(k in knobs for k in ("top_k", "top_p", "min_p"))
        config = dispatch.default_config(hidden.shape[0], D, hidden.device, truncates, V)
        result["cases"][name] = dict(calls=calls, reference=reference, config=repr(config))
        same = all(torch.equal(c, calls[0]) for c in calls)
        rows_off_ref = (calls[0] != reference).any(dim=1).nonzero().flatten().tolist()
        print(f"[{args.tag}] {name}: repeats equal {same}; rows != reference {rows_off_ref}; "
              f"tokens {calls[0].flatten().tolist()}")  # fmt: skip
    torch.save(result, os.path.join(args.out, f"op_{args.tag}.pt"))


def run_generate(args) -> None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
    import bench_generate as bg
    from torch._subclasses.fake_tensor import FakeTensor
    from transformers import CompileConfig

    from flashsampling_inductor import dispatch
    from flashsampling_inductor.reference import reference_fused_sample

    records = []
    original = dispatch.triton_fused_sample

    def recording(hidden, weight, bias, params, *rest, **kwargs):
        out = original(hidden, weight, bias, params, *rest, **kwargs)
        if isinstance(hidden, FakeTensor) or not hidden.is_cuda:
            return out
        capturing = torch.cuda.is_current_stream_capturing()
        entry = dict(capturing=capturing, shape=tuple(hidden.shape), stride=hidden.stride(),
                     offset=hidden.storage_offset(), ptr16=hidden.data_ptr() % 16,
                     stream=torch.cuda.current_stream().cuda_stream)  # fmt: skip
        if not capturing:
            tokens = out[0] if isinstance(out, tuple) else out

            def value(t):
                return None if t is None else t.detach().cpu().clone()

            entry.update(hidden=value(hidden), tokens=value(tokens), seed=value(params.seed),
                         temperature=value(params.temperature), top_k=value(params.top_k),
                         top_p=value(params.top_p), min_p=value(params.min_p),
                         params=repr(params.__class__.__name__))  # fmt: skip
            # (the knobs' values only: a tensor of the CUDA graph's pool kept alive past the
            # step fails cudagraph trees' check)
            entry["params_obj"] = dataclasses.replace(
                params, seed=None, temperature=None, top_k=None, top_p=None, min_p=None
            )
        records.append(entry)
        return out

    dispatch.triton_fused_sample = recording
    model = bg.build("qwen3-1.7b")
    prompt = torch.randint(0, 1000, (args.batch, bg.PROMPT), device="cuda")
    if args.garbage:
        _fill_free_memory(args.tag)
    settings = dict(do_sample=True, temperature=bg.TEMPERATURE, top_k=50, max_new_tokens=16)
    if args.no_cudagraphs:
        settings["compile_config"] = CompileConfig(mode="default")
    from torch._inductor import config as inductor_config

    from flashsampling_inductor import hf

    def save(outs, records, rechecks):  # (after each call: a run cut by its time keeps some)
        kept = [{k: v for k, v in entry.items() if k != "params_obj"} for entry in records]
        torch.save(dict(tag=args.tag, outs=outs, records=kept, rechecks=rechecks),
                   os.path.join(args.out, f"generate_{args.tag}.pt"))  # fmt: skip

    deterministic = getattr(inductor_config, "deterministic", None)
    print(f"[{args.tag}] torch._inductor.config.deterministic = {deterministic}")
    outs = []
    for call in range(2):
        torch.manual_seed(1)
        hf.enable(model)
        torch.cuda.synchronize()
        start = time.perf_counter()
        outs.append(model.generate(prompt, **settings)[:, prompt.shape[1] :].cpu())
        seconds = time.perf_counter() - start
        hf.disable(model)
        records.append(dict(marker=f"end of call {call}"))
        print(f"[{args.tag}] call {call} ({seconds:.2f} s): sum {int(outs[-1].sum())}; rows "
              f"{[int(r.sum()) for r in outs[-1]]}")  # fmt: skip
        save(outs, records, [])
    if args.time_calls:
        _time_calls(args, model, prompt, settings)
        return  # (no re-checks: their calls would run past the caller's limit)
    weight = model.get_output_embeddings().weight
    rechecks = []
    for i, entry in enumerate(records):
        if "hidden" not in entry:
            continue
        params = entry.pop("params_obj")
        fresh = {k: (None if entry[k] is None else entry[k].cuda()) for k in
                 ("seed", "temperature", "top_k", "top_p", "min_p")}  # fmt: skip
        params = dataclasses.replace(params, **fresh)
        hidden = entry["hidden"].cuda()
        again = original(hidden, weight, None, params).cpu()
        reference = reference_fused_sample(hidden, weight, None, params).cpu()
        rechecks.append((i, again, reference))
        print(f"[{args.tag}] op call {i}: graph tokens {entry['tokens'].flatten().tolist()}, "
              f"eager again equal {torch.equal(again, entry['tokens'])}, rows != reference "
              f"{_rows(entry['tokens'] != reference)}")  # fmt: skip
    save(outs, records, rechecks)


def _time_calls(args, model, prompt, settings) -> None:
    """Time ``args.time_calls`` more calls in turns: touch ``ready_<tag>`` in ``--out``, then
    per turn wait for ``go_<tag>_<turn>``, time, touch ``done_<tag>_<turn>`` (the caller
    starts one process's turn at a time, on an otherwise idle GPU)."""
    from flashsampling_inductor import hf

    def touch(name):
        open(os.path.join(args.out, name), "w").close()

    touch(f"ready_{args.tag}")
    for turn in range(args.turns):
        while not os.path.exists(os.path.join(args.out, f"go_{args.tag}_{turn}")):
            time.sleep(0.05)
        hf.enable(model)
        seconds = []
        for _ in range(args.time_calls):
            torch.cuda.synchronize()
            start = time.perf_counter()
            model.generate(prompt, **settings)
            torch.cuda.synchronize()
            seconds.append(time.perf_counter() - start)
        hf.disable(model)
        seconds.sort()
        tokens = settings["max_new_tokens"]
        median = seconds[len(seconds) // 2]
        print(f"[{args.tag}] turn {turn}: {args.time_calls} calls of {tokens} tokens, median "
              f"{median * 1e3:.2f} ms ({median / tokens * 1e3:.3f} ms a token), min "
              f"{seconds[0] * 1e3:.2f} ms")  # fmt: skip
        touch(f"done_{args.tag}_{turn}")


def _rows(differs: torch.Tensor) -> list[int]:
    return differs.reshape(differs.shape[0], -1).any(dim=1).nonzero().flatten().tolist()


def compare(args) -> None:
    for part in ("op", "generate"):
        files = sorted(glob.glob(os.path.join(args.out, f"{part}_*.pt")))
        runs = {os.path.basename(f)[len(part) + 1 : -3]: torch.load(f, weights_only=False)
                for f in files}  # fmt: skip
        if not runs:
            continue
        print(f"== {part}: {sorted(runs)}")
        if part == "op":
            names = next(iter(runs.values()))["cases"].keys()
            for name in names:
                first = {tag: run["cases"][name]["calls"][0] for tag, run in runs.items()}
                base_tag, base = next(iter(first.items()))
                differ = {tag: (t != base).any(dim=1).nonzero().flatten().tolist()
                          for tag, t in first.items()}  # fmt: skip
                ref = {tag: _rows(run["cases"][name]["calls"][0] != run["cases"][name]["reference"])
                       for tag, run in runs.items()}  # fmt: skip
                print(f"  {name}: rows differing from {base_tag}: {differ}; rows != reference "
                      f"{ref}; config {runs[base_tag]['cases'][name]['config']}")  # fmt: skip
            continue
        for tag in runs:
            outs = runs[tag]["outs"]
            same = torch.equal(outs[0], outs[1]) if len(outs) == 2 else "(one call)"
            print(f"  {tag}: sums {[int(o.sum()) for o in outs]}; call 0 == call 1: {same}")
        tags = sorted(runs)
        for i, a in enumerate(tags):
            for b in tags[i + 1 :]:
                for call in range(min(len(runs[a]["outs"]), len(runs[b]["outs"]))):
                    x, y = runs[a]["outs"][call], runs[b]["outs"][call]
                    if x.shape != y.shape:
                        continue
                    diff = (x != y).nonzero().tolist()
                    first = min(diff, key=lambda rc: (rc[1], rc[0])) if diff else None
                    print(f"  {a} vs {b} call {call}: rows differing "
                          f"{sorted({r for r, _ in diff})}, first (row, step) {first}")  # fmt: skip
        for a, b in zip(tags, tags[1:], strict=False):
            ra = [e for e in runs[a]["records"] if "hidden" in e]
            rb = [e for e in runs[b]["records"] if "hidden" in e]
            for i, (ea, eb) in enumerate(zip(ra, rb, strict=False)):
                if ea["hidden"].shape != eb["hidden"].shape:
                    break
                hidden_rows = (ea["hidden"] != eb["hidden"]).any(dim=1).nonzero().flatten()
                token_rows = (ea["tokens"] != eb["tokens"]).any(dim=1).nonzero().flatten()
                elements = int((ea["hidden"] != eb["hidden"]).sum())
                print(f"  {a} vs {b} op call {i}: hidden rows differ {hidden_rows.tolist()} "
                      f"({elements} elements), "
                      f"token rows differ {token_rows.tolist()}, seeds {ea['seed']} "
                      f"{eb['seed']}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("part", choices=("op", "generate", "compare"))
    parser.add_argument("--tag", default="a")
    parser.add_argument("--out", default=".")
    parser.add_argument("--garbage", action="store_true")
    parser.add_argument("--no-cudagraphs", action="store_true")
    parser.add_argument("--batch", type=int, default=8, help="generate's rows (default 8)")
    parser.add_argument("--time-calls", type=int, default=0, help="generate: calls to time")
    parser.add_argument("--turns", type=int, default=2, help="generate: timing turns")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.part == "compare":
        compare(args)
        return
    if not torch.cuda.is_available():
        print("token_repro.py needs a CUDA GPU; there is none here")
        return
    (run_op if args.part == "op" else run_generate)(args)


if __name__ == "__main__":
    main()
