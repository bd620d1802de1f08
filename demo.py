"""FlashSampling in one argument: compile a decoder's decode step with backend="flashsampling".

A small decoder-only transformer (written here, randomly initialised) samples a few tokens
with three sampling idioms as public code writes them. Each step is compiled with
``backend="flashsampling"``: the LM-head matmul and the sampling after it become one fused
call that never writes the [batch, vocab] logits. The script prints which idioms were
rewritten, the tokens drawn and, on a GPU, the time per step against stock Inductor. With
transformers installed, a random Llama then samples through plain Hugging Face ``generate``
after ``flashsampling_inductor.hf.enable(model)``.

    python demo.py
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import nn
from torch._dynamo.utils import counters
from torch._inductor.custom_graph_pass import CustomGraphPass

import flashsampling_inductor  # noqa: F401  (registers backend="flashsampling")

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
DTYPE = torch.bfloat16 if ON_GPU else torch.float32
# Qwen3-like vocabulary on a GPU; small enough on a CPU to compile and run in seconds.
VOCAB, DIM, LAYERS, HEADS = (151936, 1024, 2, 8) if ON_GPU else (1000, 64, 1, 4)
BATCH, CONTEXT, NEW_TOKENS = 4, 16, 6


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.out = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, length, 3, HEADS, -1).unbind(2)
        attention = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.out(attention.transpose(1, 2).reshape(batch, length, DIM))
        return x + self.mlp(self.norm2(x))


class TinyDecoder(nn.Module):
    """GPT-2 shaped: token + position embeddings, pre-norm blocks, LM head tied to the
    token embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, DIM), nn.Embedding(CONTEXT, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(DIM)
        # GPT-2's init: with unit-variance embeddings a tied head just repeats the last token.
        nn.init.normal_(self.wte.weight, std=0.02)

    def hidden(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.wte(tokens) + self.wpe.weight[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.norm(x)

    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        return F.linear(self.hidden(tokens), self.wte.weight)


def multinomial_step(model: TinyDecoder, tokens: torch.Tensor, temperature: float):
    """HF / nanoGPT: temperature, softmax, torch.multinomial."""
    logits = model.logits(tokens)[:, -1, :].float() / temperature
    probs = F.softmax(logits, dim=-1)
    return torch.multinomial(probs, num_samples=1)


def exponential_race_step(model: TinyDecoder, tokens: torch.Tensor, temperature: float):
    """gpt-fast / torchtune: argmax(probs / Exp(1) noise), no host sync."""
    probs = torch.softmax(model.logits(tokens)[:, -1] / temperature, dim=-1)
    q = torch.empty_like(probs).exponential_(1)
    return torch.argmax(probs / q, dim=-1, keepdim=True)


def greedy_step(model: TinyDecoder, tokens: torch.Tensor, temperature: float):
    """Greedy decoding: a fused argmax that writes no logits."""
    return model.logits(tokens)[:, -1, :].argmax(dim=-1, keepdim=True)


STEPS = (multinomial_step, exponential_race_step, greedy_step)


class GraphTail(CustomGraphPass):
    """Records the aten ops at the end of the graph Inductor is about to lower, from the last
    matmul on (or the last few ops when no matmul is left). On ``joint_custom_pre_pass`` it
    runs after the FlashSampling pass, so it shows the rewrite."""

    def __init__(self) -> None:
        self.ops: list[str] = []

    def __call__(self, graph: torch.fx.Graph) -> None:
        names = [_op_name(node.target) for node in graph.nodes if node.op == "call_function"]
        matmuls = [i for i, name in enumerate(names) if name in ("mm", "addmm")]
        self.ops = names[matmuls[-1] if matmuls else -4 :]

    def uuid(self) -> None:
        return None  # never cache: the recording must run


def _op_name(target) -> str:
    return getattr(target, "__name__", str(target)).split(".")[0]


def generate(step, tokens: torch.Tensor) -> torch.Tensor:
    """Draw NEW_TOKENS tokens, sliding the context window so every step has one shape."""
    drawn = []
    for _ in range(NEW_TOKENS):
        # Under CUDA graphs (reduce-overhead) the next replay overwrites the output buffer.
        next_token = step(tokens).clone()
        drawn.append(next_token)
        tokens = torch.cat([tokens[:, 1:], next_token], dim=1)
    return torch.cat(drawn, dim=1)


def time_per_step(step, tokens: torch.Tensor, repeats: int = 50) -> float:
    """Median milliseconds per call, with CUDA events after warm-up."""
    for _ in range(3):
        step(tokens)
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step(tokens)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


@torch.no_grad()
def main() -> None:
    torch.manual_seed(0)
    model = TinyDecoder().to(DEVICE, DTYPE).eval()
    prompt = torch.randint(0, VOCAB, (BATCH, CONTEXT), device=DEVICE)
    print(f"decoder: V={VOCAB} D={DIM} layers={LAYERS} batch={BATCH} on {DEVICE} ({DTYPE})")
    mode = "reduce-overhead" if ON_GPU else None  # CUDA graphs on a GPU, as in serving
    # A cached graph is the rewritten one, but the pass (and its counters) would not run.
    torch._inductor.config.fx_graph_cache = False
    for step_fn in STEPS:
        torch._dynamo.reset()
        counters.clear()

        def step(tokens, step_fn=step_fn):
            return step_fn(model, tokens, 0.8)

        start = time.perf_counter()
        after = GraphTail()
        # torch.compile takes a mode or options, not both: spell the mode out as options.
        mode_options = torch._inductor.list_mode_options(mode) if mode else {}
        options = {**mode_options, "joint_custom_pre_pass": after}
        fused = torch.compile(step, backend="flashsampling", options=options)
        tokens = generate(fused, prompt)
        seconds = time.perf_counter() - start
        before = GraphTail()
        stock = torch.compile(step, backend="inductor", options={"joint_custom_pre_pass": before})
        stock(prompt)
        rewrites = dict(counters["flashsampling"]) or "none"
        print(f"\n{step_fn.__name__}: rewritten idioms {rewrites} (compile + run {seconds:.1f}s)")
        print(f"  stock Inductor:  {' -> '.join(before.ops)}")
        print(f"  flashsampling:   {' -> '.join(after.ops)}")
        print(f"  sampled tokens: {tokens.tolist()}")
        if ON_GPU:
            stock = torch.compile(step, backend="inductor", mode=mode)
            fused_ms, stock_ms = time_per_step(fused, prompt), time_per_step(stock, prompt)
            print(
                f"  time per step: flashsampling {fused_ms:.3f} ms, stock Inductor "
                f"{stock_ms:.3f} ms ({stock_ms / fused_ms:.2f}x)"
            )


@torch.no_grad()
def hf_generate() -> None:
    """The same through Hugging Face ``generate``, when transformers 5.x is installed: one
    setup call, then plain ``generate`` calls run fused (transformers' static cache, the decode
    step compiled with ``backend="flashsampling"``, CUDA graphs on a GPU)."""
    try:
        import transformers

        import flashsampling_inductor.hf
    except ImportError:
        print("\nHugging Face generate: transformers is not installed, skipped")
        return
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=DIM,
        intermediate_size=4 * DIM,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(DEVICE, DTYPE).eval()
    prompt = torch.randint(0, VOCAB, (BATCH, CONTEXT), device=DEVICE)
    flashsampling_inductor.hf.enable(model)
    torch._dynamo.reset()
    counters.clear()
    start = time.perf_counter()
    out = model.generate(prompt, do_sample=True, max_new_tokens=NEW_TOKENS, pad_token_id=0)
    seconds = time.perf_counter() - start
    print(
        "\nHugging Face generate (random Llama, flashsampling_inductor.hf.enable(model), then"
        f" generate(do_sample=True)): rewritten idioms {dict(counters['flashsampling']) or 'none'}"
        f" (compile + run {seconds:.1f}s)"
    )
    print(f"  sampled tokens: {out[:, CONTEXT:].tolist()}")


if __name__ == "__main__":
    main()
    hf_generate()
