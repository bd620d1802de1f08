"""Time per output token of Hugging Face ``generate`` and of a gpt-fast-style decode loop, with
and without FlashSampling. One GPU call (CUDA only).

Models: Qwen3-1.7B and Llama-3.1-8B shapes with random bf16 weights (Qwen3ForCausalLM /
LlamaForCausalLM of the real configs). Per model and batch size B, a 32-token prompt and 128
new tokens, eos off, ``do_sample=True, temperature=0.7, top_k=0`` (``--top-k 50`` for
generate's default top-k, ``--top-p`` to add a nucleus: the HF configurations only; the
gpt-fast step samples without them):

  hf_eager     generate (dynamic cache, nothing compiled)
  hf_stock     generate(cache_implementation="static"): transformers' auto-compile (its
               CompileConfig: Inductor, mode="reduce-overhead"), sampling eager after it
  hf_fused     the same after flashsampling_inductor.hf.enable(model): the decode step
               (forward + sample_logits) compiled with backend="flashsampling"
  gf_stock     gpt_fast_decoder: decode step (forward + exponential-race sampling) compiled
               with stock Inductor, mode="reduce-overhead", fullgraph
  gf_fused     the same step with backend="flashsampling"
  gf_logits    the step returning the logits (no sampling), stock Inductor

The configurations are timed round-robin (repeat r of every configuration before repeat
r + 1 of any), --repeats times after a first call that is timed apart (compile included).
TPOT = wall time of a call / new tokens (the eager 32-token prefill included, the same in
every configuration); the CSV keeps every repeat. A deadline (--budget-s) stops starting
new (model, B) blocks, so what ran is written even when the sweep does not fit.

Needs a CUDA GPU (without one it says so and exits 0), transformers (``pip install -e
".[hf]"``) and about 20 GB of GPU memory for the Llama-3.1-8B shape. Writes
``bench_generate_<gpu>_<date>.csv`` into ``--out`` (shape, batch, config, top_k, top_p,
tpot_ms, first_call_s, repeats_ms) and prints a line per (model, B, configuration).

    python benchmarks/bench_generate.py --out benchmarks/results
    python benchmarks/bench_generate.py --shapes qwen3-1.7b --batches 1,8 --configs hf_fused
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # a checkout

import gpt_fast_decoder as gf  # noqa: E402

import flashsampling_inductor.hf as fs_hf  # noqa: E402
from flashsampling_inductor import ahead as fs_ahead  # noqa: E402

SHAPES = {
    "qwen3-1.7b": dict(
        kind="qwen3",
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=True,
    ),
    "llama-3.1-8b": dict(
        kind="llama",
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
    ),
}
PROMPT, TEMPERATURE = 32, 0.7
DEVICE = "cuda"


def build(shape: str):
    import transformers

    dims = dict(SHAPES[shape])
    kind = dims.pop("kind")
    if kind == "qwen3":
        config, cls = transformers.Qwen3Config(**dims), transformers.Qwen3ForCausalLM
    else:
        config, cls = transformers.LlamaConfig(**dims), transformers.LlamaForCausalLM
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(DEVICE):
            model = cls(config).eval()
    finally:
        torch.set_default_dtype(previous)
    model.generation_config.eos_token_id = None  # eos off: every call makes all its tokens
    model.generation_config.pad_token_id = 0
    return model


def hf_call(model, config: str, prompt, new_tokens: int, top_k: int = 0, top_p: float = 1.0):
    settings = dict(
        do_sample=True, temperature=TEMPERATURE, top_k=top_k, top_p=top_p,
        max_new_tokens=new_tokens,
    )  # fmt: skip
    if config == "hf_fused":
        fs_hf.enable(model)
    try:
        if config != "hf_eager":
            settings["cache_implementation"] = "static"
        out = model.generate(prompt, **settings)
    finally:
        fs_hf.disable(model)
    assert out.shape[1] == prompt.shape[1] + new_tokens
    return out


def timed(fn, *args) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn(*args)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--shapes",
        default="qwen3-1.7b,llama-3.1-8b",
        help=f"models, comma-separated, of {','.join(SHAPES)} (default: both)",
    )
    parser.add_argument(
        "--batches", default="1,8,32,64", help="batch sizes for qwen3-1.7b (default 1,8,32,64)"
    )
    parser.add_argument("--llama-batches", default="1,64", help="batch sizes for llama-3.1-8b")
    parser.add_argument(
        "--configs",
        default="hf_eager,hf_stock,hf_fused,gf_stock,gf_fused,gf_logits",
        help="configurations for qwen3-1.7b, comma-separated (the list above; default all)",
    )
    parser.add_argument(
        "--llama-configs",
        default="hf_stock,hf_fused,gf_stock,gf_fused,gf_logits",
        help="configurations for llama-3.1-8b (eager left out to fit one GPU call)",
    )
    parser.add_argument("--eager-batches", default="1,8,32,64", help="batch sizes for hf_eager")
    parser.add_argument(
        "--repeats", type=int, default=5, help="timed calls per configuration (default 5)"
    )
    parser.add_argument("--new-tokens", type=int, default=128, help="tokens per call (default 128)")
    parser.add_argument("--top-k", type=int, default=0, help="generate's top_k (0: off)")
    parser.add_argument("--top-p", type=float, default=1.0, help="generate's top_p (1: off)")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=540.0,
        help="seconds after which no new (model, B) block starts (default 540)",
    )
    parser.add_argument(
        "--out", default="benchmarks/results", help="folder of the CSV (default benchmarks/results)"
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_generate.py times generate on a CUDA GPU; there is none here: nothing run")
        return

    import transformers

    deadline = time.perf_counter() + args.budget_s
    device_name = torch.cuda.get_device_name().lower().replace(" ", "-")
    stamp = time.strftime("%Y%m%d-%H%M", time.gmtime())
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"bench_generate_{device_name}_{stamp}.csv")
    print(
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
        f"transformers {transformers.__version__} -> {path}",
        flush=True,
    )
    print(f"sampling: temperature {TEMPERATURE}, top_k {args.top_k}, top_p {args.top_p}")
    fields = ["shape", "batch", "config", "top_k", "top_p", "tpot_ms", "first_call_s",
              "repeats_ms"]  # fmt: skip
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        for shape in args.shapes.split(","):
            llama = shape.startswith("llama")
            batches = [int(b) for b in (args.llama_batches if llama else args.batches).split(",")]
            configs = (args.llama_configs if llama else args.configs).split(",")
            for row in run_shape(shape, batches, configs, args, deadline):
                writer.writerow(row)
                handle.flush()
                print(row, flush=True)
            torch.cuda.empty_cache()
    plot(path)


def run_shape(shape: str, batches, configs, args, deadline: float):
    """Yields one CSV row per (batch size, configuration) of ``shape``."""
    model = build(shape)
    decoder = gf.Decoder(model, max_batch=max(batches), max_len=PROMPT + args.new_tokens + 8)
    steps = {
        "gf_stock": gf.compile_step(gf.sample_step, "inductor"),
        "gf_fused": gf.compile_step(gf.sample_step, "flashsampling"),
        "gf_logits": gf.compile_step(gf.logits_step, "inductor"),
    }

    def call(config, prompt):
        if config.startswith("hf_"):
            return hf_call(model, config, prompt, args.new_tokens, args.top_k, args.top_p)
        return gf.generate(decoder, steps[config], prompt, args.new_tokens)

    for batch in batches:
        if time.perf_counter() > deadline:
            print(f"deadline: {shape} B={batch} and later skipped", flush=True)
            break
        prompt = torch.randint(0, model.config.vocab_size, (batch, PROMPT), device=DEVICE)
        first, timed_configs = {}, []
        eager = [int(b) for b in args.eager_batches.split(",")]
        for config in configs:
            if config == "hf_eager" and batch not in eager:
                continue
            try:
                first[config] = timed(call, config, prompt)
                timed_configs.append(config)
            except Exception as error:  # one failing configuration keeps the others
                print(f"{shape} B={batch} {config} failed: {error!r}", flush=True)
        times = {config: [] for config in timed_configs}
        # (the fused first call's children go on compiling other batch sizes' kernels once
        # its graph has compiled: not during the timed calls)
        fs_ahead.wait_for_background_compiles()
        for _ in range(args.repeats):
            for config in timed_configs:
                times[config].append(timed(call, config, prompt))
        for config in timed_configs:
            per_token = [1e3 * t / args.new_tokens for t in times[config]]
            yield dict(
                shape=shape,
                batch=batch,
                config=config,
                top_k=args.top_k if config.startswith("hf_") else 0,
                top_p=args.top_p if config.startswith("hf_") else 1.0,
                tpot_ms=round(statistics.median(per_token), 3),
                first_call_s=round(first[config], 2),
                repeats_ms=" ".join(f"{t:.3f}" for t in per_token),
            )
    torch._dynamo.reset()


def plot(path: str) -> None:
    """TPOT over stock compiled (HF) and over stock Inductor (gpt-fast), per batch size."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    with open(path) as handle:
        rows = list(csv.DictReader(handle))
    tpot = {(r["shape"], int(r["batch"]), r["config"]): float(r["tpot_ms"]) for r in rows}
    shapes = sorted({r["shape"] for r in rows})
    fig, axes = plt.subplots(1, len(shapes), figsize=(6 * len(shapes), 4), squeeze=False)
    for ax, shape in zip(axes[0], shapes, strict=True):
        for config, base in (
            ("hf_fused", "hf_stock"),
            ("gf_fused", "gf_stock"),
            ("gf_logits", "gf_stock"),
        ):
            points = sorted(
                (b, tpot[(s, b, config)] / tpot[(s, b, base)])
                for (s, b, c) in tpot
                if s == shape and c == config and (s, b, base) in tpot
            )
            if points:
                ax.plot(*zip(*points, strict=True), marker="o", label=f"{config} / {base}")
        ax.axhline(1.0, color="gray", lw=0.5)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size")
        ax.set_ylabel("TPOT ratio (lower is faster)")
        ax.set_title(shape)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path.replace(".csv", ".png"), dpi=120)


if __name__ == "__main__":
    main()
