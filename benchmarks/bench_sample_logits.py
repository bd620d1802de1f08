"""``sample_logits`` on written logits: the kernels (``impl="auto"`` on CUDA) against the
PyTorch reference it ran before (``impl="torch"``), transformers' warpers with softmax and
``torch.multinomial`` (eager, in a CUDA graph) and FlashInfer's samplers from logits.

    python benchmarks/bench_sample_logits.py [--batches 1,16,64,256] [--vocab 151936]
        [--dtype bf16] [--rounds 2] [--flashinfer] [--out FILE.csv]

Forms: plain (T = 0.7), top-k 50, top-k 50 + top-p 0.9, top-p 0.9, min-p 0.1 (each at T =
0.7), logits of std 5 in the given dtype, a 0-d device seed. Each provider's call captured
in a CUDA graph after warm-up; the median of replays (``profile_calls.graph_us``), the best of
``--rounds`` rounds in a shuffled order, us. FlashInfer (``--flashinfer``, from
``../shared/gpu/fetch-wheels.sh``): ``sampling_from_logits`` for plain sampling,
``top_k_top_p_sampling_from_logits`` for top-k 50 with or without top-p 0.9 (its JIT build
runs in the warm-up). Tokens are not compared across providers (each draws its own stream);
the kernels' tokens are checked equal to the reference's per cell. Needs a GPU.
"""

from __future__ import annotations

import argparse
import csv
import random
import sys
import time
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain checkout

from profile_calls import graph_us  # noqa: E402  (this folder)

from flashsampling_inductor import sample_logits  # noqa: E402

FORMS = {
    "plain": {},
    "k50": dict(top_k=50),
    "k50p09": dict(top_k=50, top_p=0.9),
    "p09": dict(top_p=0.9),
    "minp": dict(min_p=0.1),
}
TEMPERATURE = 0.7


def warpers(knobs):
    """transformers' warpers for ``knobs`` (its generate order), then softmax and
    ``torch.multinomial``: the stock program."""
    from transformers import (
        LogitsProcessorList,
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    chain = [TemperatureLogitsWarper(TEMPERATURE)]
    if "top_k" in knobs:
        chain.append(TopKLogitsWarper(knobs["top_k"]))
    if "top_p" in knobs:
        chain.append(TopPLogitsWarper(knobs["top_p"]))
    if "min_p" in knobs:
        chain.append(MinPLogitsWarper(knobs["min_p"]))
    processors = LogitsProcessorList(chain)

    def sample(logits):
        scores = processors(None, logits.float())
        return torch.multinomial(torch.softmax(scores, dim=-1), 1)

    return sample


def providers(logits, form, knobs, use_flashinfer):
    seed = torch.tensor(7, device=logits.device)
    args = dict(temperature=TEMPERATURE, seed=seed, **knobs)
    stock = warpers(knobs)
    timed = {
        "kernels": lambda: sample_logits(logits, impl="auto", **args),
        "reference": lambda: sample_logits(logits, impl="torch", **args),
        "warpers": lambda: stock(logits),
    }
    if use_flashinfer and form in ("plain", "k50", "k50p09"):
        import flashinfer.sampling as fi

        fi_seed = torch.tensor([1234], dtype=torch.int64, device=logits.device)
        offset = torch.zeros(1, dtype=torch.int64, device=logits.device)
        scaled = lambda: logits.float() / TEMPERATURE  # noqa: E731  (counted: FlashInfer has no T)
        if form == "plain":
            timed["flashinfer"] = lambda: fi.sampling_from_logits(
                scaled(), seed=fi_seed, offset=offset
            )
        else:
            top_p = knobs.get("top_p", 1.0)
            timed["flashinfer"] = lambda: fi.top_k_top_p_sampling_from_logits(
                scaled(), top_k=knobs["top_k"], top_p=top_p, seed=fi_seed, offset=offset
            )
    return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="1,16,64,256")
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--flashinfer", action="store_true")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs a GPU; nothing timed")
        return
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    if args.flashinfer:
        import flashinfer.sampling as fi

        started = time.time()
        warm = torch.randn(4, args.vocab, device="cuda")
        fi.sampling_from_logits(warm)
        fi.top_k_top_p_sampling_from_logits(warm, top_k=50, top_p=0.9)
        torch.cuda.synchronize()
        print(f"FlashInfer warmed up in {time.time() - started:.0f} s")
    generator = torch.Generator(device="cuda").manual_seed(0)
    order = random.Random(0)
    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        logits = (torch.randn(batch, args.vocab, generator=generator, device="cuda") * 5).to(dtype)
        for form, knobs in FORMS.items():
            timed = providers(logits, form, knobs, args.flashinfer)
            same = torch.equal(timed["kernels"](), timed["reference"]())
            best = {name: float("inf") for name in timed}
            for _ in range(args.rounds):
                names = list(timed)
                order.shuffle(names)
                for name in names:
                    best[name] = min(best[name], graph_us(timed[name]))
            line = " ".join(f"{name} {us:.1f}" for name, us in best.items())
            ratios = " ".join(
                f"{name}/kernels {best[name] / best['kernels']:.2f}"
                for name in best
                if name != "kernels"
            )
            print(f"B={batch} {form}: {line} us | {ratios} | tokens equal: {same}", flush=True)
            for name, us in best.items():
                rows.append([args.vocab, args.dtype, batch, form, name, f"{us:.2f}", same])
    if args.out:
        with open(args.out, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["V", "dtype", "B", "form", "provider", "us", "tokens_equal"])
            writer.writerows(rows)


if __name__ == "__main__":
    main()
