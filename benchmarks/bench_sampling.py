"""Time FlashSampling's fused LM-head sampler against its peers on one CUDA GPU.

One decode step: hidden [B, D] bf16, LM-head weight [V, D] bf16, one token per row drawn
from softmax(hidden @ weight.T / T) with T = 1.0. Providers (``--providers``):

    fused                    flashsampling_inductor.fused_sample (seed drawn on the device)
    fs_compiled              the step in plain torch (F.linear, softmax, torch.multinomial)
                             compiled with the FlashSampling backend
    inductor_multinomial     the same step, stock torch.compile (Inductor)
    fs_compiled_cg           fs_compiled with mode="reduce-overhead" (CUDA graphs)
    inductor_multinomial_cg  inductor_multinomial with mode="reduce-overhead"
    eager_race               eager argmax(probs / exponential noise), matmul included
    flashinfer_fi2           matmul + flashinfer.sampling.sampling_from_logits (Gumbel-max)
    flashinfer_fi1           matmul + top_k_top_p_sampling_from_logits(top_k=V, top_p=1.0)
    fused_topk50             fused_sample(..., top_k=50): exact top-k, logits never written
    fused_topk50_topp09      fused_sample(..., top_k=50, top_p=0.9)
    fused_topk256            fused_sample(..., top_k=256): the largest k issue 17's goal names
    flashinfer_topk50        matmul + top_k_top_p_sampling_from_logits(top_k=50, top_p=1.0)
    flashinfer_topk50_topp09 matmul + top_k_top_p_sampling_from_logits(top_k=50, top_p=0.9)
                             (FlashInfer >= 0.7 takes its radix top-k-first path for these)
    flashinfer_topk50_joint  the same with filter_apply_order="joint" (softmax, then top-k and
    flashinfer_topk50_topp09_joint  top-p in one rejection-sampling kernel: no top-k-first path)
    flashinfer_cake_topk50   matmul + fp32 softmax + flashinfer.cake_top_k_top_p_sampling_
                             from_probs(top_k=50, top_p=1.0) (FlashInfer >= 0.7.2, Hopper+)
    flashinfer_cake_topk50_topp09  the same with top_p=0.9
    hf_topk50                transformers' TopKLogitsWarper(50) (the installed version's
                             class; its version in the row's note) on the fp32 logits +
                             softmax + multinomial, stock torch.compile (Inductor),
                             mode="reduce-overhead" (CUDA graphs); plain sampling's
                             transformers peer is inductor_multinomial_cg (no warper at T = 1)
    hf_topk50_topp09         the same with TopPLogitsWarper(0.9) after the top-k warper
    fused_topp09             fused_sample(..., top_p=0.9): nucleus over the whole row
    fused_minp01             fused_sample(..., min_p=0.1)
    flashinfer_topp09        matmul + softmax + top_p_sampling_from_probs(top_p=0.9)
    flashinfer_minp01        matmul + softmax + min_p_sampling_from_probs(min_p=0.1)
    hf_topp09                transformers' TopPLogitsWarper(0.9) + softmax + multinomial,
                             stock torch.compile, mode="reduce-overhead" (CUDA graphs)
    hf_minp01                the same with MinPLogitsWarper(0.1)
    matmul                   cuBLAS hidden @ weight.T alone: what a perfect fused kernel costs
    floor                    bytes of W over the measured device-to-device copy bandwidth
                             (read + write bytes counted): the W-read time, not timed

Shapes are LM heads of real models: Qwen3-1.7B (2048, 151936), Qwen3-8B (4096, 151936),
Llama-3-70B (8192, 128256); B runs over 1..256. The logits are N(0, s^2) with s =
``--logit-std`` (default 1): a flat distribution, which plain sampling and top-k do not
notice but top-p and min-p do (their kept sets, and FlashInfer's rejection rounds, depend on
it): ``--logit-std 5`` gives rows of ~3.6 nats entropy with ~90 tokens in the 0.9 nucleus
and ~5 min-p 0.1 survivors at V = 151936, the regime of an LM's next-token distribution.
They are drawn after ``torch.manual_seed(--data-seed)`` (default 0), so runs time the same
rows: a truncating call in which some row takes the exact fallback is ~55-60 us slower at
D = 2048, and top-p alone on std-5 rows flags ~1.6e-3 of its rows (docs/performance.md).

``--fused-seed`` (default tensor): the fused providers' seed. ``tensor`` passes a fixed 0-d
device seed, as the FlashInfer providers get theirs: the op's own cost, the like-for-like
comparison. ``drawn`` leaves it to the op, which draws it on the device (``torch.randint`` in
the graph; a CUDA graph holding any torch RNG op also replays torch's generator prologue, two
small launches before each replay: ~7 us of an H200 call at D = 2048,
results/seed_cost_h200_*.log, which any sampler taking torch's randomness in a graph pays
once per replay, transformers' compiled ``multinomial`` step included).

How it times. ``triton.testing.do_bench`` medians (CUDA events around each call, warm-up
first). do_bench zeroes a 256 MB buffer before every timed call, so each call starts with a
cold L2 (50 MB on H100, 60 MB on H200); W itself (0.6 to 2.1 GB) would not fit in L2 anyway,
so rotating W copies would add nothing. Two timing modes (``--timing``):

    events  each provider called from Python as a user would (launch overhead hidden only
            as far as the GPU queue hides it)
    graph   the eager providers captured once in a torch.cuda.CUDAGraph and the replay timed,
            which removes launch gaps; the *_cg providers are CUDA graphs already, so they are
            timed once and reported under this mode

Compiled paths hold W as an nn.Parameter (a static address: under reduce-overhead a plain
input W would be copied on every replay). The batch dim is marked dynamic (``--static-batch``
compiles each B instead), so each compiled provider compiles twice per shape: B = 1 (always
specialised) and B >= 2. Every provider runs in try/except: a failure is recorded in the
CSV's note column and the sweep goes on; a provider that fails twice in one shape is skipped
for the rest of it. FlashInfer's one-time JIT (about a minute) runs once before the sweep.

Writes ``bench_sampling_<gpu>_<date>.csv`` (gpu, torch, triton, flashinfer (its
``__version__`` when a FlashInfer provider runs, so the CSVs of two versions' processes tell
apart; also in the file name), date, D, V, B, provider, timing, median_us, ratio_to_matmul,
note; rows appended as measured) and a PNG of the
speedup of fused over each peer (one panel per shape and timing mode) into ``--out-dir``,
then prints a markdown table of the speedups last. SIGTERM (e.g. from ``timeout``) and
``--budget-s`` end the sweep early but still write the plot and the table.

    python benchmarks/bench_sampling.py                 # full sweep, about 6-8 min
    python benchmarks/bench_sampling.py --quick         # one shape, three batch sizes
    python benchmarks/bench_sampling.py --dry-run       # print the plan; needs no GPU
"""

from __future__ import annotations

import argparse
import csv
import datetime
import gc
import re
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
# So the script runs from a plain checkout (the GPU machine does not install the package).
sys.path.insert(0, str(REPO))

SHAPES = ((2048, 151936), (4096, 151936), (8192, 128256))
# Servers batch whatever the scheduler makes, not powers of two: the sizes between 128 and 256
# are where stage 1 changes tiles (issue 38).
BATCHES = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 144, 160, 192, 224, 256)
QUICK_SHAPES = ((4096, 151936),)
QUICK_BATCHES = (1, 64, 256)
TEMPERATURE = 1.0
DTYPE = torch.bfloat16
DEVICE = "cuda"
TIMINGS = ("events", "graph")
CSV_COLUMNS = (
    "gpu", "torch", "triton", "flashinfer", "date", "D", "V", "B",
    "provider", "timing", "median_us", "ratio_to_matmul", "note",
)  # fmt: skip

Step = Callable[[torch.Tensor], torch.Tensor]  # hidden [B, D] -> token ids (or logits)


class DecodeStep(torch.nn.Module):
    """The sampling step as users write it; W is a parameter, so compiled graphs see a
    static address and reduce-overhead does not copy it on every replay."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.weight = torch.nn.Parameter(weight, requires_grad=False)  # shares storage

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = F.linear(hidden, self.weight)
        probs = torch.softmax(logits / TEMPERATURE, dim=-1)
        return torch.multinomial(probs, 1)


# --fused-logits: the dtype the fused truncating providers round the logits to (None: fp32).
# With bf16 the keys' 16 low bits are their sign's and the kernel uses it (truncation_kernel.
# key_low_bits); fp32 logits take the general path.
FUSED_LOGITS = {"bf16": torch.bfloat16, "fp32": None}
# --fused-seed tensor (the default): the fused providers take a fixed 0-d device seed (set in main).
FUSED_SEED_TENSOR = True


def fused_seed(device: torch.device) -> torch.Tensor | None:
    return torch.tensor(1234, dtype=torch.int64, device=device) if FUSED_SEED_TENSOR else None


TOP_K, TOP_P, MIN_P = 50, 0.9, 0.1


class WarpedDecodeStep(DecodeStep):
    """transformers' own warpers (the installed version's classes, in the order its
    ``_get_logits_processor`` stacks them) on the fp32 logits, then softmax and multinomial:
    what a generate() user's sampling step costs when it is compiled. At T = 1.0 transformers
    adds no TemperatureLogitsWarper."""

    def __init__(self, weight: torch.Tensor, **knobs: float):
        super().__init__(weight)
        from transformers.generation import logits_process as warpers

        self.warpers = []
        if TEMPERATURE != 1.0:
            self.warpers.append(warpers.TemperatureLogitsWarper(TEMPERATURE))
        if "top_k" in knobs:
            self.warpers.append(warpers.TopKLogitsWarper(knobs["top_k"]))
        if "top_p" in knobs:
            self.warpers.append(warpers.TopPLogitsWarper(knobs["top_p"]))
        if "min_p" in knobs:
            self.warpers.append(warpers.MinPLogitsWarper(knobs["min_p"]))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        scores = F.linear(hidden, self.weight).float()  # generate() samples fp32 logits
        for warper in self.warpers:
            scores = warper(None, scores)  # no warper here reads the input ids
        return torch.multinomial(torch.softmax(scores, dim=-1), 1)


def transformers_version() -> str:
    import transformers

    return transformers.__version__


def backport_split_scan_fix() -> bool:
    """pytorch#180221: Inductor's Triton codegen of a split scan (a cumsum over more than 128
    elements a row, as TopPLogitsWarper's) crashes with "TypeError: list indices must be
    integers or slices, not NoneType" when a broadcast value indexes the rows, which a batch
    of more than one row makes it do (torch 2.11: hf_topp09 / hf_topk50_topp09 compiled only
    at B = 1). The fix (pytorch#180369: a range tree without a tensor dimension counts as a
    scalar in TritonSymbols.get_block_shape), applied here where the installed torch lacks it,
    by handing the unpatched method the expression with those range symbols set to 0 (a
    scalar's shape). True when the patch went in."""
    import inspect

    from torch._inductor.codegen import triton as triton_codegen
    from torch._inductor.virtualized import V

    symbols = getattr(triton_codegen, "TritonSymbols", None)
    original = getattr(symbols, "get_block_shape", None)
    if original is None or "tensor_dim is None" in inspect.getsource(original):
        return False

    def get_block_shape(cls, expr):
        nodes = V.kernel.range_tree_nodes
        scalar = {
            var: 0
            for var in expr.free_symbols
            if var in nodes and nodes[var].root.tensor_dim is None
        }
        return original.__func__(cls, expr.subs(scalar) if scalar else expr)

    symbols.get_block_shape = classmethod(get_block_shape)
    return True


def warped_builder(**knobs: float) -> Callable[..., Step]:
    def build(weight: torch.Tensor, static_batch: bool) -> Step:
        dynamic = False if static_batch else None
        if "top_p" in knobs:
            backport_split_scan_fix()
        step = WarpedDecodeStep(weight, **knobs)
        return torch.compile(step, backend="inductor", mode=CG, dynamic=dynamic)

    return build


def fused_truncated_builder(**knobs) -> Callable[..., Step]:
    def build(weight: torch.Tensor, logits_dtype: torch.dtype | None) -> Step:
        from flashsampling_inductor import fused_sample

        seed = fused_seed(weight.device)
        return lambda hidden: fused_sample(
            hidden, weight, logits_dtype=logits_dtype, seed=seed, **knobs
        )

    return build


def build_matmul(weight: torch.Tensor) -> Step:
    return lambda hidden: hidden @ weight.T


def build_fused(weight: torch.Tensor) -> Step:
    from flashsampling_inductor import fused_sample

    seed = fused_seed(weight.device)
    return lambda hidden: fused_sample(hidden, weight, seed=seed)


def build_eager_race(weight: torch.Tensor) -> Step:
    def step(hidden):
        probs = torch.softmax((hidden @ weight.T) / TEMPERATURE, dim=-1)
        return torch.argmax(probs / torch.empty_like(probs).exponential_(1), dim=-1)

    return step


def compiled_builder(backend_name: str, mode: str | None) -> Callable[..., Step]:
    def build(weight: torch.Tensor, static_batch: bool) -> Step:
        if backend_name == "flashsampling":
            # The callable, not the string: the entry point exists only once the package
            # is installed, and the GPU machine runs a plain checkout.
            from flashsampling_inductor import flashsampling_backend as backend
        else:
            backend = backend_name
        dynamic = False if static_batch else None
        return torch.compile(DecodeStep(weight), backend=backend, mode=mode, dynamic=dynamic)

    return build


def flashinfer_builder(
    top_k_top_p: bool, top_k: int | None = None, top_p: float = 1.0, order: str | None = None
) -> Callable[[torch.Tensor], Step]:
    """order: top_k_top_p_sampling_from_logits' filter_apply_order (None: its default,
    "top_k_first")."""

    def build(weight: torch.Tensor) -> Step:
        import flashinfer.sampling as fi

        # Seed and offset as device tensors keep the call capturable in a CUDA graph; the
        # kernel is the same one that a scalar seed runs.
        seed = torch.tensor([1234], dtype=torch.int64, device=weight.device)
        offset = torch.zeros(1, dtype=torch.int64, device=weight.device)
        if top_k_top_p:
            # top_k >= V takes FlashInfer's "no top-k" path
            k = top_k or weight.shape[0]
            ordered = {"filter_apply_order": order} if order else {}
            return lambda hidden: fi.top_k_top_p_sampling_from_logits(
                hidden @ weight.T, top_k=k, top_p=top_p, seed=seed, offset=offset, **ordered
            )
        return lambda hidden: fi.sampling_from_logits(hidden @ weight.T, seed=seed, offset=offset)

    return build


def flashinfer_cake_builder(top_p: float = 1.0) -> Callable[..., Step]:
    """FlashInfer 0.7.2's fused radix top-k -> sparse top-p -> sampling kernel, which takes
    fp32 probabilities: cuBLAS logits, their softmax (counted), then the two cake kernels."""

    def build(weight: torch.Tensor) -> Step:
        import flashinfer

        sample = flashinfer.cake_top_k_top_p_sampling_from_probs  # AttributeError before 0.7.2

        def step(hidden):
            probs = torch.softmax((hidden @ weight.T).float() / TEMPERATURE, dim=-1)
            return sample(probs, TOP_K, top_p, philox_seed=1234, philox_offset=0)

        return step

    return build


def flashinfer_probs_builder(top_p: float = 1.0, min_p: float = 0.0) -> Callable[..., Step]:
    """FlashInfer's top-p or min-p sampler, which takes probabilities: cuBLAS logits, their
    fp32 softmax, then the sampler (rejection sampling over the row)."""

    def build(weight: torch.Tensor) -> Step:
        import flashinfer.sampling as fi

        seed = torch.tensor([1234], dtype=torch.int64, device=weight.device)
        offset = torch.zeros(1, dtype=torch.int64, device=weight.device)

        def step(hidden):
            probs = torch.softmax((hidden @ weight.T).float() / TEMPERATURE, dim=-1)
            if min_p > 0.0:
                return fi.min_p_sampling_from_probs(probs, min_p, seed=seed, offset=offset)
            return fi.top_p_sampling_from_probs(probs, top_p, seed=seed, offset=offset)

        return step

    return build


@dataclass(frozen=True)
class Provider:
    name: str
    build: Callable[..., Step]
    graph: str = "capture"  # "capture": we capture it; "own": it is a CUDA graph; "none"
    samples: bool = True  # returns token ids (checked to lie in [0, V))
    compiled: bool = False  # build takes static_batch; hidden gets a dynamic batch dim
    flashinfer: bool = False
    truncating: bool = False  # a fused top-k / top-p / min-p call: build takes logits_dtype


CG = "reduce-overhead"
COMPILED = {"graph": "none", "compiled": True}
COMPILED_CG = {"graph": "own", "compiled": True}
PROVIDERS = {
    p.name: p
    for p in (
        Provider("matmul", build_matmul, samples=False),
        Provider("fused", build_fused),
        Provider("fs_compiled", compiled_builder("flashsampling", None), **COMPILED),
        Provider("inductor_multinomial", compiled_builder("inductor", None), **COMPILED),
        Provider("fs_compiled_cg", compiled_builder("flashsampling", CG), **COMPILED_CG),
        Provider("inductor_multinomial_cg", compiled_builder("inductor", CG), **COMPILED_CG),
        Provider("eager_race", build_eager_race),
        Provider("flashinfer_fi2", flashinfer_builder(top_k_top_p=False), flashinfer=True),
        Provider("flashinfer_fi1", flashinfer_builder(top_k_top_p=True), flashinfer=True),
        Provider("fused_topk50", fused_truncated_builder(top_k=TOP_K), truncating=True),
        Provider(
            "fused_topk50_topp09",
            fused_truncated_builder(top_k=TOP_K, top_p=TOP_P),
            truncating=True,
        ),  # fmt: skip
        Provider("fused_topk256", fused_truncated_builder(top_k=256), truncating=True),
        Provider("flashinfer_topk50", flashinfer_builder(True, TOP_K), flashinfer=True),
        Provider(
            "flashinfer_topk50_topp09", flashinfer_builder(True, TOP_K, TOP_P), flashinfer=True
        ),
        Provider(
            "flashinfer_topk50_joint",
            flashinfer_builder(True, TOP_K, order="joint"),
            flashinfer=True,
        ),
        Provider(
            "flashinfer_topk50_topp09_joint",
            flashinfer_builder(True, TOP_K, TOP_P, "joint"),
            flashinfer=True,
        ),
        Provider("flashinfer_cake_topk50", flashinfer_cake_builder(), flashinfer=True),
        Provider("flashinfer_cake_topk50_topp09", flashinfer_cake_builder(TOP_P), flashinfer=True),
        Provider("hf_topk50", warped_builder(top_k=TOP_K), **COMPILED_CG),
        Provider("hf_topk50_topp09", warped_builder(top_k=TOP_K, top_p=TOP_P), **COMPILED_CG),
        Provider("fused_topp09", fused_truncated_builder(top_p=TOP_P), truncating=True),
        Provider("fused_minp01", fused_truncated_builder(min_p=MIN_P), truncating=True),
        Provider("flashinfer_topp09", flashinfer_probs_builder(top_p=TOP_P), flashinfer=True),
        Provider("flashinfer_minp01", flashinfer_probs_builder(min_p=MIN_P), flashinfer=True),
        Provider("hf_topp09", warped_builder(top_p=TOP_P), **COMPILED_CG),
        Provider("hf_minp01", warped_builder(min_p=MIN_P), **COMPILED_CG),
    )
}
ALL_PROVIDERS = (*PROVIDERS, "floor")
ALWAYS = ("matmul", "fused")  # every ratio and speedup is taken against these two


def timings_of(provider: Provider, timings: tuple[str, ...]) -> list[str]:
    """The timing modes this provider is measured in (see the module docstring)."""
    if provider.graph == "own":
        return ["graph"] if "graph" in timings else []
    if provider.graph == "none":
        return [t for t in timings if t == "events"]
    return list(timings)


# ---------------------------------------------------------------- command line


def parse_shapes(text: str) -> tuple[tuple[int, int], ...]:
    shapes = []
    for token in text.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", token)
        if not match:
            raise argparse.ArgumentTypeError(f"shape {token!r} is not DxV, e.g. 4096x151936")
        shapes.append((int(match[1]), int(match[2])))
    return tuple(shapes)


def parse_ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of ints like 1,2,4") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"batch sizes must be >= 1, got {text!r}")
    return values


def parse_names(choices: tuple[str, ...]) -> Callable[[str], tuple[str, ...]]:
    def parse(text: str) -> tuple[str, ...]:
        names = tuple(n.strip() for n in text.split(",") if n.strip())
        unknown = [n for n in names if n not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {unknown}; choose from {list(choices)}")
        return names

    return parse


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--shapes", type=parse_shapes, help="DxV list, default: the three models")
    parser.add_argument(
        "--batches", type=parse_ints, help="B list, default 1,2,...,32,48,64,96,128,144,...,256"
    )
    parser.add_argument(
        "--providers", type=parse_names(ALL_PROVIDERS), default=ALL_PROVIDERS,
        help=f"comma list from {','.join(ALL_PROVIDERS)} (matmul and fused always run)",
    )  # fmt: skip
    parser.add_argument(
        "--timing", choices=("events", "graph", "both"), default="both",
        help="events: calls from Python; graph: CUDA-graph replays (default both)",
    )  # fmt: skip
    parser.add_argument(
        "--quick", action="store_true",
        help=f"shape {QUICK_SHAPES[0]}, B {QUICK_BATCHES}, shorter timing (about 2 min)",
    )  # fmt: skip
    parser.add_argument(
        "--logit-std", type=float, default=1.0,
        help="standard deviation of the logits (default 1: flat rows; 5: ~3.6 nats)",
    )  # fmt: skip
    parser.add_argument("--warmup-ms", type=int, help="do_bench warm-up (default 25, quick 10)")
    parser.add_argument("--rep-ms", type=int, help="do_bench timed span (default 100, quick 40)")
    parser.add_argument(
        "--static-batch", action="store_true",
        help="compile each B separately instead of marking the batch dim dynamic",
    )  # fmt: skip
    parser.add_argument(
        "--budget-s", type=float,
        help="stop starting new points after this many seconds (results so far are kept)",
    )  # fmt: skip
    parser.add_argument(
        "--out-dir", type=Path, default=REPO / "benchmarks" / "results",
        help="where the CSV and PNG go (default benchmarks/results)",
    )  # fmt: skip
    parser.add_argument(
        "--fused-logits", choices=tuple(FUSED_LOGITS), default="bf16",
        help="logits the fused top-k / top-p / min-p providers sample: bf16 (default: what\n"
        "the rewrite of a bf16 LM head passes, and the cuBLAS logits the peers read) or fp32",
    )  # fmt: skip
    parser.add_argument(
        "--fused-seed", choices=("drawn", "tensor"), default="tensor",
        help="the fused providers' seed: a fixed 0-d device tensor, as the FlashInfer\n"
        "providers get (default), or drawn on the device by the op (see above)",
    )  # fmt: skip
    parser.add_argument(
        "--data-seed", type=int, default=0,
        help="torch.manual_seed before anything is drawn: every run times the same weights\n"
        "and hidden states (before 2026-11-28 17:40 UTC each process drew its own, and a\n"
        "truncating cell's time varied with whether some row took the exact fallback)",
    )  # fmt: skip
    parser.add_argument("--dry-run", action="store_true", help="print the plan; needs no GPU")
    args = parser.parse_args(argv)
    args.shapes = args.shapes or (QUICK_SHAPES if args.quick else SHAPES)
    args.batches = tuple(sorted(set(args.batches or (QUICK_BATCHES if args.quick else BATCHES))))
    args.warmup_ms = args.warmup_ms or (10 if args.quick else 25)
    args.rep_ms = args.rep_ms or (40 if args.quick else 100)
    args.timings = TIMINGS if args.timing == "both" else (args.timing,)
    args.providers = tuple(p for p in ALL_PROVIDERS if p in args.providers or p in ALWAYS)
    return args


def describe_plan(args: argparse.Namespace) -> str:
    timed = [PROVIDERS[p] for p in args.providers if p in PROVIDERS]
    per_point = sum(len(timings_of(p, args.timings)) for p in timed)
    compiles_per_shape = len(args.batches) if args.static_batch else min(2, len(args.batches))
    compiled = sum(p.compiled for p in timed)
    lines = [
        f"shapes (D, V): {list(args.shapes)}  W bf16: "
        + ", ".join(f"{d * v * 2 / 1e6:.0f} MB" for d, v in args.shapes),
        f"batches: {list(args.batches)}",
        f"providers: {list(args.providers)}",
        f"timing modes: {list(args.timings)}; do_bench warm-up {args.warmup_ms} ms, "
        f"timed span {args.rep_ms} ms, median, L2 flushed before each call",
        f"measurements: {per_point} per point x {len(args.shapes) * len(args.batches)} points"
        f" = {per_point * len(args.shapes) * len(args.batches)}",
        f"compiles: {compiled} compiled providers x {compiles_per_shape} per shape x "
        f"{len(args.shapes)} shapes = {compiled * compiles_per_shape * len(args.shapes)}"
        + (" (static batch)" if args.static_batch else " (batch dim dynamic)"),
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------- measuring


class ContextLost(RuntimeError):
    """The CUDA context is broken (a sticky error): nothing after this can run."""


def median_us(fn: Callable[[], object], args: argparse.Namespace) -> float:
    import triton.testing

    ms = triton.testing.do_bench(fn, warmup=args.warmup_ms, rep=args.rep_ms, return_mode="median")
    return ms * 1e3


def capture_graph(fn: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """Capture one call of fn after warm-up on a side stream (as torch.cuda.graphs asks)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        fn()
    return graph


def copy_bandwidth(args: argparse.Namespace) -> float:
    """Device-to-device copy rate in bytes/s, bytes read plus bytes written."""
    src = torch.randn(2**28, device=DEVICE)  # 1 GiB
    dst = torch.empty_like(src)
    seconds = median_us(lambda: dst.copy_(src), args) * 1e-6
    return 2 * src.nbytes / seconds


def check_tokens(tokens: torch.Tensor, batch: int, vocab: int) -> str:
    """'' if tokens hold one id in [0, V) per row, else what is wrong."""
    flat = tokens.reshape(-1)
    if flat.numel() != batch:
        return f"invalid output: shape {tuple(tokens.shape)} for B={batch}"
    low, high = int(flat.min()), int(flat.max())
    if low < 0 or high >= vocab:
        return f"invalid output: token ids in [{low}, {high}], not in [0, {vocab})"
    return ""


def rewrite_note(fn: Callable[[], object]) -> str:
    """Whether the FlashSampling pass replaced the multinomial (Inductor runs it as an aten
    fallback, so the profiler sees it by name when it is still there)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
        torch.cuda.synchronize()
    names = {event.name for event in prof.events()}
    if "aten::multinomial" in names:
        return "NOT rewritten: aten::multinomial still runs"
    fused = any("fused_sample" in name or "flashsampling" in name for name in names)
    return "rewritten" if fused else "rewritten (no fused_sample op seen by the profiler)"


def cudagraph_skips() -> int:
    from torch._dynamo.utils import counters

    return counters["inductor"]["cudagraph_skips"]


def one_line(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".split("Set TORCHDYNAMO_VERBOSE")[0]
    return " ".join(text.split())[:300]


def ensure_context_alive() -> None:
    try:
        torch.cuda.synchronize()
    except Exception as error:
        raise ContextLost(one_line(error)) from error


def warm_up_flashinfer(providers: tuple[str, ...]) -> str:
    """Run FlashInfer's one-time JIT builds (or AOT loads) of the modules the providers
    use; '' or the error."""
    start = time.perf_counter()
    try:
        import flashinfer
        import flashinfer.sampling as fi

        logits = torch.randn(4, 151936, device=DEVICE, dtype=DTYPE)
        fi.sampling_from_logits(logits)
        fi.top_k_top_p_sampling_from_logits(logits, top_k=logits.shape[1], top_p=1.0)
        if any(p.startswith("flashinfer_topk") for p in providers):
            # 0.7.2's top-k-first path builds its own radix top-k module (minutes, cold): only
            # when a provider times it, or a call without it ran out its time here
            fi.top_k_top_p_sampling_from_logits(logits, top_k=TOP_K, top_p=TOP_P)
        if any("cake" in p for p in providers):
            probs = torch.softmax(logits.float(), dim=-1)
            flashinfer.cake_top_k_top_p_sampling_from_probs(probs, TOP_K, TOP_P)
        torch.cuda.synchronize()
    except Exception as error:
        ensure_context_alive()
        print(f"FlashInfer unavailable: {one_line(error)}", flush=True)
        return one_line(error)
    print(
        f"FlashInfer {flashinfer.__version__} JIT warm-up: {time.perf_counter() - start:.1f} s",
        flush=True,
    )
    return ""


def flashinfer_version() -> str:
    try:
        import flashinfer
    except Exception:
        return ""
    return flashinfer.__version__


@dataclass
class Row:
    dim: int
    vocab: int
    batch: int
    provider: str
    timing: str
    median_us: float | None
    note: str = ""


class Results:
    """Rows as measured, appended to the CSV at once so a killed run keeps them."""

    def __init__(self, path: Path, meta: dict[str, str]):
        self.path, self.meta, self.rows = path, meta, []
        self.matmul_us: dict[tuple[int, int, int, str], float | None] = {}
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as file:
            csv.writer(file).writerow(CSV_COLUMNS)

    def add(self, row: Row) -> None:
        """Keep, append to the CSV and print one row; matmul comes first at every point."""
        self.rows.append(row)
        point = (row.dim, row.vocab, row.batch, row.timing)
        if row.provider == "matmul":
            self.matmul_us[point] = row.median_us
        matmul = self.matmul_us.get(point)
        ratio = row.median_us / matmul if row.median_us and matmul else None
        with self.path.open("a", newline="") as file:
            csv.writer(file).writerow([
                self.meta["gpu"], self.meta["torch"], self.meta["triton"],
                self.meta.get("flashinfer", ""), self.meta["date"],
                row.dim, row.vocab, row.batch, row.provider, row.timing,
                "" if row.median_us is None else f"{row.median_us:.2f}",
                "" if ratio is None else f"{ratio:.4f}", row.note,
            ])  # fmt: skip
        shown = "-" if row.median_us is None else f"{row.median_us:9.1f} us"
        ratio_text = "" if ratio is None else f"  {ratio:5.2f}x matmul"
        print(
            f"  D={row.dim} V={row.vocab} B={row.batch:<4d} {row.provider:<24s} "
            f"{row.timing:<6s} {shown}{ratio_text}  {row.note}",
            flush=True,
        )


def measure_point(
    provider: Provider,
    step: Step,
    hidden: torch.Tensor,
    vocab: int,
    args: argparse.Namespace,
) -> list[tuple[str, float, str]]:
    """(timing, median_us, note) for each timing mode of one provider at one B."""
    if provider.graph == "own":

        def call():
            torch.compiler.cudagraph_mark_step_begin()
            return step(hidden)
    else:

        def call():
            return step(hidden)

    skips = cudagraph_skips() if provider.graph == "own" else 0
    for _ in range(3):  # compile; for reduce-overhead also the warm-up run and the recording
        out = call()
    torch.cuda.synchronize()
    notes = [check_tokens(out, hidden.shape[0], vocab) if provider.samples else ""]
    del out
    if provider.graph == "own" and cudagraph_skips() > skips:
        notes.append("cudagraphs skipped when compiled at this B: no CUDA graphs (see log)")
    if provider.name == "fs_compiled":
        notes.append(rewrite_note(call))
    note = "; ".join(n for n in notes if n)

    results = []
    for timing in timings_of(provider, args.timings):
        if timing == "graph" and provider.graph == "capture":
            graph = capture_graph(call)
            results.append((timing, median_us(graph.replay, args), note))
            del graph
        else:
            results.append((timing, median_us(call, args), note))
    return results


def run_shape(
    dim: int,
    vocab: int,
    args: argparse.Namespace,
    results: Results,
    bandwidth: float,
    flashinfer_error: str,
    deadline: float,
) -> bool:
    """Sweep B for one shape; False once the time budget is spent."""
    print(f"== D={dim} V={vocab}: W {dim * vocab * 2 / 1e6:.0f} MB", flush=True)
    weight = torch.randn(vocab, dim, device=DEVICE, dtype=DTYPE).mul_(args.logit_std * dim**-0.5)
    floor_us = weight.nbytes / bandwidth * 1e6
    steps: dict[str, Step] = {}
    failures: dict[str, list[str]] = {}
    for batch in args.batches:
        if time.monotonic() > deadline:
            print(f"time budget spent: skipping D={dim} V={vocab} from B={batch}", flush=True)
            return False
        hidden = torch.randn(batch, dim, device=DEVICE, dtype=DTYPE)
        if batch > 1 and not args.static_batch:
            torch._dynamo.maybe_mark_dynamic(hidden, 0)  # one compile serves every B >= 2
        for name in args.providers:
            if name == "floor":
                for timing in args.timings:
                    results.add(Row(dim, vocab, batch, "floor", timing, floor_us))
                continue
            provider = PROVIDERS[name]
            modes = timings_of(provider, args.timings)
            if not modes:
                continue
            if provider.flashinfer and flashinfer_error:
                skip = f"flashinfer unavailable: {flashinfer_error}"
            elif len(failures.get(name, ())) >= 2:
                skip = f"skipped after 2 failures in this shape: {failures[name][-1]}"
            else:
                skip = ""
            if skip:
                for timing in modes:
                    results.add(Row(dim, vocab, batch, name, timing, None, skip))
                continue
            start = time.perf_counter()
            try:
                if name not in steps:
                    build_args = (args.static_batch,) if provider.compiled else ()
                    if provider.truncating:
                        build_args = (FUSED_LOGITS[args.fused_logits],)
                    steps[name] = provider.build(weight, *build_args)
                measured = measure_point(provider, steps[name], hidden, vocab, args)
            except Exception as error:
                ensure_context_alive()
                torch.cuda.empty_cache()
                failures.setdefault(name, []).append(one_line(error))
                for timing in modes:
                    results.add(Row(dim, vocab, batch, name, timing, None, one_line(error)))
                continue
            for timing, value, note in measured:
                if provider.truncating:
                    note = "; ".join(filter(None, (f"{args.fused_logits} logits", note)))
                if FUSED_SEED_TENSOR and name.startswith("fused"):
                    note = "; ".join(filter(None, ("seed tensor", note)))
                if provider.flashinfer:
                    note = "; ".join(filter(None, (f"flashinfer {args.flashinfer}", note)))
                if name.startswith("hf_"):
                    note = "; ".join(filter(None, (f"transformers {transformers_version()}", note)))
                results.add(Row(dim, vocab, batch, name, timing, value, note))
            print(f"  ({name}: {time.perf_counter() - start:.1f} s)", flush=True)
    return True


def configure_dynamo() -> None:
    """A sweep compiles the same forward for many providers and shapes: raise the limits,
    past which Dynamo silently falls back to eager."""
    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name):
            setattr(config, name, 1024)
    for name in ("accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(config, name):
            setattr(config, name, 4096)


def settle_triton_cache_keys() -> None:
    """Triton 3.6 keys a kernel by the keys its process computed before it; settled first
    (as ahead.py's children do), they are the keys a compile-only warm-up
    (benchmarks/compile_fused.py) wrote its cache under, whatever runs first here."""
    from flashsampling_inductor import ahead

    ahead._settle_cache_keys()


def release_shape() -> None:
    torch._dynamo.reset()  # also drops the CUDA-graph trees and their memory pools
    gc.collect()
    torch.cuda.empty_cache()


# ---------------------------------------------------------------- reporting

PEER_LABELS = {
    "matmul": "matmul alone (the bound)",
    "fs_compiled": "compiled (flashsampling)",
    "inductor_multinomial": "compiled multinomial",
    "fs_compiled_cg": "compiled (flashsampling), CUDA graphs",
    "inductor_multinomial_cg": "compiled multinomial, CUDA graphs",
    "eager_race": "exponential race (eager)",
    "flashinfer_fi2": "FlashInfer FI2",
    "flashinfer_fi1": "FlashInfer FI1",
    "fused_topk50": "fused top-k 50",
    "fused_topk50_topp09": "fused top-k 50 + top-p 0.9",
    "fused_topk256": "fused top-k 256",
    "flashinfer_topk50": "FlashInfer top-k 50",
    "flashinfer_topk50_topp09": "FlashInfer top-k 50 + top-p 0.9",
    "flashinfer_topk50_joint": "FlashInfer top-k 50, joint",
    "flashinfer_topk50_topp09_joint": "FlashInfer top-k 50 + top-p 0.9, joint",
    "flashinfer_cake_topk50": "FlashInfer cake top-k 50",
    "flashinfer_cake_topk50_topp09": "FlashInfer cake top-k 50 + top-p 0.9",
    "hf_topk50": "transformers top-k 50, compiled",
    "hf_topk50_topp09": "transformers top-k 50 + top-p 0.9, compiled",
    "fused_topp09": "fused top-p 0.9",
    "fused_minp01": "fused min-p 0.1",
    "flashinfer_topp09": "FlashInfer top-p 0.9",
    "flashinfer_minp01": "FlashInfer min-p 0.1",
    "hf_topp09": "transformers top-p 0.9, compiled",
    "hf_minp01": "transformers min-p 0.1, compiled",
}
# The fused provider each peer is compared with (plain sampling's peers: "fused").
FUSED_OF = {
    "fused_topk50": "matmul",
    "fused_topk50_topp09": "matmul",
    "fused_topk256": "matmul",
    "flashinfer_topk50": "fused_topk50",
    "hf_topk50": "fused_topk50",
    "flashinfer_topk50_topp09": "fused_topk50_topp09",
    "flashinfer_topk50_joint": "fused_topk50",
    "flashinfer_topk50_topp09_joint": "fused_topk50_topp09",
    "flashinfer_cake_topk50": "fused_topk50",
    "flashinfer_cake_topk50_topp09": "fused_topk50_topp09",
    "hf_topk50_topp09": "fused_topk50_topp09",
    "fused_topp09": "matmul",
    "fused_minp01": "matmul",
    "flashinfer_topp09": "fused_topp09",
    "hf_topp09": "fused_topp09",
    "flashinfer_minp01": "fused_minp01",
    "hf_minp01": "fused_minp01",
}


class Timings:
    """Median times by (D, V, B, timing, provider), for the table and the plot."""

    def __init__(self, rows: list[Row]):
        self.rows = rows
        self.times = {(r.dim, r.vocab, r.batch, r.timing, r.provider): r.median_us for r in rows}

    def timings(self) -> list[str]:
        return [t for t in TIMINGS if any(r.timing == t for r in self.rows)]

    def peers(self, timing: str) -> list[str]:
        present = {r.provider for r in self.rows if r.timing == timing}
        return [p for p in PEER_LABELS if p in present and p != "matmul"]

    def get(self, point: tuple[int, int, int], timing: str, provider: str) -> float | None:
        return self.times.get((*point, timing, provider))

    def speedup(self, point: tuple[int, int, int], timing: str, peer: str) -> float | None:
        """Peer time over the time of the fused provider it is compared with (FUSED_OF; a
        fused top-k provider against the matmul, so below 1 there): > 1 means fused is
        faster."""
        reference = FUSED_OF.get(peer, "fused")
        fused, other = self.get(point, timing, reference), self.get(point, timing, peer)
        return other / fused if fused and other else None


def markdown_tables(rows: list[Row], meta: dict[str, str]) -> str:
    """Per timing mode: fused/matmul and the speedup of fused over each peer."""
    timings = Timings(rows)
    points = sorted({(r.dim, r.vocab, r.batch) for r in rows})
    out = []
    for timing in timings.timings():
        peers = timings.peers(timing)
        out += [
            f"\n### {meta['gpu']}, torch {meta['torch']}, triton {meta['triton']}, {meta['date']}:"
            f" {timing} timing; matmul and fused in us; peer columns = peer time / fused time;"
            f" fused top-k / top-p / min-p on {meta.get('fused_logits', 'fp32')} logits;"
            f" fused seed {meta.get('fused_seed', 'drawn')}"
            + (f"; FlashInfer {meta['flashinfer']}" if meta.get("flashinfer") else ""),
            "",
            "| D, V | B | matmul | fused | fused/matmul | " + " | ".join(peers) + " |",
            "|---|---|---|---|---|" + "---|" * len(peers),
        ]
        for point in points:
            matmul = timings.get(point, timing, "matmul")
            fused = timings.get(point, timing, "fused")
            ratio = 1 / timings.speedup(point, timing, "matmul") if fused and matmul else None
            cells = [f"{point[0]}, {point[1]}", str(point[2])]
            cells += [f"{t:.0f}" if t else "-" for t in (matmul, fused)]
            cells.append(f"{ratio:.2f}" if ratio else "-")
            for peer in peers:
                speedup = timings.speedup(point, timing, peer)
                cells.append(f"{speedup:.2f}x" if speedup else "-")
            out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) if out else "no results"


def plot_speedups(rows: list[Row], path: Path, meta: dict[str, str]) -> None:
    """One panel per (timing, shape): speedup of fused over each peer against B."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timings = Timings(rows)
    shapes = sorted({(r.dim, r.vocab) for r in rows})
    modes = timings.timings()
    if not shapes or not modes:
        return
    fig, axes = plt.subplots(
        len(modes), len(shapes), figsize=(5.5 * len(shapes), 4.5 * len(modes)), squeeze=False
    )
    for ax_row, timing in zip(axes, modes, strict=True):
        for ax, (dim, vocab) in zip(ax_row, shapes, strict=True):
            batches = sorted({r.batch for r in rows if (r.dim, r.vocab) == (dim, vocab)})
            for peer in ["matmul", *timings.peers(timing)]:
                speedups = [timings.speedup((dim, vocab, b), timing, peer) for b in batches]
                drawn = [(b, s) for b, s in zip(batches, speedups, strict=True) if s]
                if drawn:
                    color = f"C{list(PEER_LABELS).index(peer)}"  # one color per peer
                    style = "--" if peer == "matmul" else "o-"
                    ax.plot(*zip(*drawn, strict=True), style, color=color, label=PEER_LABELS[peer])
            ax.axhline(1.0, color="grey", linewidth=0.8)
            ax.set_xscale("log", base=2)
            ax.set_xticks(batches, [str(b) for b in batches])
            ax.set_title(f"D={dim}, V={vocab} ({timing} timing)")
            ax.set_xlabel("batch size B")
            ax.set_ylabel("speedup of fused (peer time / fused time)")
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
    fig.suptitle(
        f"FlashSampling fused_sample vs peers\n{meta['gpu']}, torch {meta['torch']}, "
        f"triton {meta['triton']}, {meta['date']}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _stop_on_sigterm(signum, frame):
    raise SystemExit(f"stopped by signal {signum}")


def main(argv: list[str] | None = None) -> int:
    global FUSED_SEED_TENSOR
    args = parse_args(argv)
    FUSED_SEED_TENSOR = args.fused_seed == "tensor"
    print(describe_plan(args), flush=True)
    if args.dry_run:
        return 0
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to time (--dry-run prints the plan)", flush=True)
        return 0
    import triton

    now = datetime.datetime.now(datetime.timezone.utc)
    meta = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": now.strftime("%Y-%m-%d %H:%M UTC"),
        "fused_logits": args.fused_logits,
        "fused_seed": args.fused_seed,
    }
    if any(PROVIDERS[p].flashinfer for p in args.providers if p in PROVIDERS):
        meta["flashinfer"] = args.flashinfer = flashinfer_version()
    stem = f"bench_sampling_{slug(meta['gpu'])}_{now.strftime('%Y%m%d-%H%M')}"
    if meta.get("flashinfer"):  # sweeps of two FlashInfer versions in one minute keep both
        stem += f"_flashinfer-{slug(meta['flashinfer'])}"
    results = Results(args.out_dir / f"{stem}.csv", meta)
    print(f"{meta}\nwriting {results.path}", flush=True)
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    configure_dynamo()
    settle_triton_cache_keys()
    started = time.monotonic()
    deadline = started + args.budget_s if args.budget_s else float("inf")
    torch.manual_seed(args.data_seed)  # (torch seeds each process at random otherwise)
    try:
        bandwidth = copy_bandwidth(args)
        print(f"device-to-device copy: {bandwidth / 1e12:.2f} TB/s (read + write)", flush=True)
        use_flashinfer = any(PROVIDERS[p].flashinfer for p in args.providers if p in PROVIDERS)
        flashinfer_error = warm_up_flashinfer(args.providers) if use_flashinfer else ""
        for dim, vocab in args.shapes:
            finished = run_shape(dim, vocab, args, results, bandwidth, flashinfer_error, deadline)
            release_shape()
            if not finished:
                break
    except ContextLost as error:
        print(f"CUDA context lost, sweep ended: {error}", flush=True)
    finally:
        print(f"sweep: {time.monotonic() - started:.0f} s", flush=True)
        try:
            plot_speedups(results.rows, results.path.with_suffix(".png"), meta)
            print(f"wrote {results.path.with_suffix('.png')}", flush=True)
        except Exception as error:
            print(f"plot failed: {one_line(error)}", flush=True)
        print(markdown_tables(results.rows, meta), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
