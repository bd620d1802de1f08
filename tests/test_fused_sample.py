"""``fused_sample``: the kernel equals the reference draw for draw, bad inputs fail clearly,
and the op behaves as a ``torch.library`` custom op (opcheck, torch.compile).

On machines without CUDA the Triton kernel runs under ``TRITON_INTERPRET=1`` (set in
conftest.py), so shapes stay small; tests/test_gpu_op.py repeats the pathwise check at
real sizes on a GPU.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import TorchDispatchMode

from flashsampling_inductor import fused_sample
from flashsampling_inductor import op as op_module

from .sampling_oracle import DEVICE, assert_pathwise_equal, make_exact_problem, make_problem

IMPLS = ["torch", "triton"]


@dataclasses.dataclass(frozen=True)
class PathwiseCase:
    """One ``fused_sample`` call. temperature: a float, "0d:<value>" (0-d tensor) or "rows"
    (a [B] tensor cycling 0 (greedy), 0.6, 1.0, 1.7); seed: an int, "0d:<value>" or "rows"
    ([B] int64 per-row seeds spanning all 64 bits)."""

    batch: int
    vocab_size: int
    hidden_size: int
    dtype: torch.dtype
    temperature: float | str = 1.0
    seed: int | str = 0
    num_samples: int = 1
    bias: bool = False
    strided: bool = False
    logits_dtype: torch.dtype | None = None


PATHWISE_CASES = [
    pytest.param(PathwiseCase(1, 1000, 64, torch.float32), id="b1-v1000-d64-fp32"),
    pytest.param(
        PathwiseCase(3, 1000, 96, torch.bfloat16, temperature="rows", seed="0d:1099511627793"),
        id="b3-v1000-d96-bf16-row-temperatures-0d-seed",
    ),
    pytest.param(
        PathwiseCase(17, 1000, 64, torch.float16, 0.9, "rows", num_samples=4, bias=True),
        id="b17-v1000-d64-fp16-bias-ns4-row-seeds",
    ),
    pytest.param(
        PathwiseCase(3, 50257, 96, torch.bfloat16, seed=2**64 - 3, bias=True, strided=True),
        id="b3-v50257-d96-bf16-bias-strided-seed-high-bits",
    ),
    pytest.param(
        PathwiseCase(17, 1000, 96, torch.float32, "0d:0.5", -987654321, num_samples=4),
        id="b17-v1000-d96-fp32-0d-temperature-ns4-negative-seed",
    ),
    pytest.param(
        PathwiseCase(3, 1000, 96, torch.bfloat16, "rows", 11, logits_dtype=torch.bfloat16),
        id="b3-v1000-d96-bf16-logits-bf16-row-temperatures",
    ),
    pytest.param(
        PathwiseCase(3, 1000, 64, torch.float32, 0.05, 12, logits_dtype=torch.float16),
        id="b3-v1000-d64-fp32-logits-fp16-cold",
    ),
    pytest.param(
        PathwiseCase(17, 1000, 64, torch.bfloat16, 0.0, 13, num_samples=4, strided=True),
        id="b17-v1000-d64-bf16-greedy-ns4-strided",
    ),
]


def build_temperature(spec, batch: int):
    if spec == "rows":
        return torch.tensor([0.0, 0.6, 1.0, 1.7], device=DEVICE).repeat(batch)[:batch]
    if isinstance(spec, str):
        return torch.tensor(float(spec.removeprefix("0d:")), device=DEVICE)
    return spec


def build_seed(spec, batch: int):
    if spec == "rows":
        seeds = [(0x9E3779B97F4A7C15 * (row + 1)) % 2**64 for row in range(batch)]
        return torch.tensor([s - 2**64 if s >= 2**63 else s for s in seeds], device=DEVICE)
    if isinstance(spec, str):
        return torch.tensor(int(spec.removeprefix("0d:")), device=DEVICE)
    return spec


def build_bias(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Random bias with -inf on the first and last token, every 7th token, and every row's
    most likely token, so masking changes the result."""
    vocab_size = weight.shape[0]
    generator = torch.Generator().manual_seed(5)
    bias = torch.randn(vocab_size, generator=generator).to(DEVICE)
    favourites = (hidden.float() @ weight.float().T + bias).argmax(dim=-1)
    bias[torch.arange(0, vocab_size, 7, device=DEVICE)] = float("-inf")
    bias[[0, vocab_size - 1]] = float("-inf")
    bias[favourites] = float("-inf")
    return bias


def case_arguments(case: PathwiseCase) -> dict:
    hidden, weight = make_problem(
        case.batch, case.vocab_size, case.hidden_size, case.dtype, strided=case.strided
    )
    return dict(
        hidden=hidden,
        weight=weight,
        bias=build_bias(hidden, weight) if case.bias else None,
        temperature=build_temperature(case.temperature, case.batch),
        seed=build_seed(case.seed, case.batch),
        num_samples=case.num_samples,
        logits_dtype=case.logits_dtype,
    )


def check_pathwise(arguments: dict) -> torch.Tensor:
    """Run kernel and reference on the same arguments; assert equal up to near-ties."""
    tokens = fused_sample(**arguments, impl="triton")
    expected = fused_sample(**arguments, impl="torch")
    batch = arguments["hidden"].shape[0]
    assert tokens.shape == (batch, arguments.get("num_samples", 1))
    assert tokens.device == arguments["hidden"].device
    checked = {k: v for k, v in arguments.items() if k != "num_samples"}
    assert_pathwise_equal(tokens, expected, **checked)
    return tokens


@pytest.mark.parametrize("case", PATHWISE_CASES)
def test_kernel_matches_reference_pathwise(case):
    """Same seed, same noise: the kernel draws the reference's tokens (up to documented
    near-ties) across shapes, dtypes, temperature and seed forms, masking bias, several
    samples, non-contiguous operands and rounded logits."""
    check_pathwise(case_arguments(case))


def test_kernel_matches_reference_exactly_on_exact_logits():
    """With logits exact in fp32 (small integers times 1/32) both sides compute the same
    scores, so the tokens must match with no near-tie allowance at all."""
    hidden, weight = make_exact_problem(17, 1000, 96)
    arguments = dict(temperature=0.8, seed=2024, num_samples=3)
    tokens = fused_sample(hidden, weight, **arguments, impl="triton")
    assert torch.equal(tokens, fused_sample(hidden, weight, **arguments, impl="torch"))


@pytest.mark.parametrize("impl", IMPLS)
def test_greedy_rows_are_argmax_with_ties_to_lowest_index(impl):
    """Temperature 0 rows return argmax(logits + bias) exactly, ties to the lowest index as
    torch.argmax; the other rows of the same batch still sample."""
    hidden, weight = make_exact_problem(6, 300, 64)
    weight[150:] = weight[:150]  # every logit appears twice: each argmax is a tie
    bias = torch.zeros(300, device=DEVICE)
    bias[[100, 250]] = float("-inf")  # a masked pair of equal logits
    temperature = torch.tensor([0.0, 1.0, 0.0, 2.0, 0.0, 0.0], device=DEVICE)
    tokens = fused_sample(
        hidden, weight, bias=bias, temperature=temperature, seed=3, num_samples=3, impl=impl
    )
    logits = hidden.double() @ weight.double().T + bias.double()
    greedy = temperature == 0
    expected = logits.argmax(dim=-1, keepdim=True).expand(-1, 3)
    assert bool((expected[greedy] < 150).all())  # the tie is real and resolved low
    assert torch.equal(tokens[greedy], expected[greedy])
    assert bool((tokens[~greedy] != expected[~greedy]).any())


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("num_samples", [1, 3])
def test_empty_batch_returns_empty(impl, num_samples):
    """B = 0 returns an empty [0, num_samples] int64 tensor, with and without seeds."""
    hidden, weight = make_problem(0, 100, 64)
    for seed in (None, 7, torch.empty(0, dtype=torch.int64, device=DEVICE)):
        tokens = fused_sample(hidden, weight, num_samples=num_samples, seed=seed, impl=impl)
        assert tokens.shape == (0, num_samples) and tokens.dtype == torch.int64
        assert tokens.device == hidden.device


NON_FINITE_CASES = [
    pytest.param("hidden-row-nan", id="hidden-row-nan"),
    pytest.param("weight-rows-nan", id="weight-rows-nan"),
    pytest.param("bias-nan-on-favourites", id="bias-nan-on-favourites"),
    pytest.param("all-masked", id="all-masked"),
    pytest.param("hidden-inf", id="hidden-inf"),
]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("temperature", [1.0, 0.0], ids=["sampled", "greedy"])
@pytest.mark.parametrize("kind", NON_FINITE_CASES)
def test_non_finite_scores_count_as_minus_inf(kind, temperature, impl):
    """A NaN score counts as -inf: NaN tokens are never drawn, a row with no finite score
    returns token 0, and no index ever falls outside [0, V)."""
    hidden, weight = make_problem(4, 257, 64)
    bias = torch.zeros(257, device=DEVICE)
    if kind == "hidden-row-nan":
        hidden[1] = float("nan")
    elif kind == "weight-rows-nan":
        weight[::2] = float("nan")
    elif kind == "bias-nan-on-favourites":
        bias[(hidden @ weight.T).argmax(dim=-1)] = float("nan")
    elif kind == "all-masked":
        bias[:] = float("-inf")
    else:
        hidden[2, 0] = float("inf")  # +-inf logits, and NaN where the weight is 0
        weight[5, 0] = 0.0
    arguments = dict(hidden=hidden, weight=weight, bias=bias, temperature=temperature, seed=8)
    tokens = fused_sample(**arguments, num_samples=2, impl=impl)
    logits = hidden.double() @ weight.double().T + bias.double()
    picked = logits.gather(1, tokens)
    no_finite_score = (logits.isnan() | (logits == float("-inf"))).all(dim=-1)
    assert bool((tokens[no_finite_score] == 0).all())
    assert not bool(picked[~no_finite_score].isnan().any())
    assert bool((picked[~no_finite_score] > float("-inf")).all())
    assert_pathwise_equal(
        tokens, fused_sample(**arguments, num_samples=2, impl="torch"), **arguments
    )


def _valid_arguments() -> dict:
    hidden, weight = make_problem(3, 50, 16)
    return dict(hidden=hidden, weight=weight)


def _replace(**changes):
    """A bad-input case: the valid arguments with ``changes`` applied (callables get them)."""

    def build():
        arguments = _valid_arguments()
        for name, value in changes.items():
            arguments[name] = value(arguments) if callable(value) else value
        return arguments

    return build


META = torch.device("meta")
BAD_INPUTS = [
    pytest.param(_replace(hidden=[[1.0]]), TypeError, "hidden", id="hidden-not-tensor"),
    pytest.param(_replace(hidden=lambda a: a["hidden"][0]), ValueError, "hidden", id="hidden-1d"),
    pytest.param(
        _replace(weight=lambda a: a["weight"][None]), ValueError, "weight", id="weight-3d"
    ),
    pytest.param(
        _replace(hidden=lambda a: a["hidden"].long()), TypeError, "hidden", id="hidden-int"
    ),
    pytest.param(
        _replace(weight=lambda a: a["weight"].double()), TypeError, "weight", id="weight-fp64"
    ),
    pytest.param(
        _replace(weight=lambda a: a["weight"].half()),
        TypeError,
        "hidden and weight",
        id="dtype-mismatch",
    ),
    pytest.param(
        _replace(weight=lambda a: a["weight"][:, :8]), ValueError, "D differs", id="d-mismatch"
    ),
    pytest.param(
        _replace(weight=lambda a: a["weight"].to(META)),
        ValueError,
        "hidden and weight",
        id="device-mismatch",
    ),
    pytest.param(
        _replace(weight=lambda a: a["weight"][:0]), ValueError, "weight has V = 0", id="v-zero"
    ),
    pytest.param(
        _replace(hidden=lambda a: a["hidden"][:, :0], weight=lambda a: a["weight"][:, :0]),
        ValueError,
        "D = 0",
        id="d-zero",
    ),
    pytest.param(_replace(bias=[0.0]), TypeError, "bias", id="bias-not-tensor"),
    pytest.param(
        _replace(bias=lambda a: torch.zeros(49, device=DEVICE)),
        ValueError,
        "bias",
        id="bias-shape",
    ),
    pytest.param(
        _replace(bias=lambda a: torch.zeros(50, dtype=torch.long, device=DEVICE)),
        TypeError,
        "bias",
        id="bias-int",
    ),
    pytest.param(
        _replace(bias=lambda a: torch.zeros(50, device=META)),
        ValueError,
        "bias",
        id="bias-device",
    ),
    pytest.param(_replace(temperature=-0.5), ValueError, "temperature", id="temperature-negative"),
    pytest.param(
        _replace(temperature=float("nan")), ValueError, "temperature", id="temperature-nan"
    ),
    pytest.param(
        _replace(temperature=float("inf")), ValueError, "temperature", id="temperature-inf"
    ),
    pytest.param(_replace(temperature="1.0"), TypeError, "temperature", id="temperature-str"),
    pytest.param(
        _replace(temperature=lambda a: torch.tensor(-1.0)),
        ValueError,
        "temperature",
        id="temperature-0d-negative",
    ),
    pytest.param(
        _replace(temperature=lambda a: torch.tensor([1.0, -1.0, 1.0], device=DEVICE)),
        ValueError,
        "temperature",
        id="temperature-row-negative",
    ),
    pytest.param(
        _replace(temperature=lambda a: torch.ones(4, device=DEVICE)),
        ValueError,
        "temperature",
        id="temperature-shape",
    ),
    pytest.param(
        _replace(temperature=lambda a: torch.ones(3, dtype=torch.long, device=DEVICE)),
        TypeError,
        "temperature",
        id="temperature-int-tensor",
    ),
    pytest.param(
        _replace(temperature=lambda a: torch.ones(3, device=META)),
        ValueError,
        "temperature",
        id="temperature-device",
    ),
    pytest.param(_replace(num_samples=0), ValueError, "num_samples", id="num-samples-zero"),
    pytest.param(_replace(num_samples=-2), ValueError, "num_samples", id="num-samples-negative"),
    pytest.param(_replace(num_samples=2.0), ValueError, "num_samples", id="num-samples-float"),
    pytest.param(_replace(seed=1.5), TypeError, "seed", id="seed-float"),
    pytest.param(_replace(seed=2**64), ValueError, "seed", id="seed-too-large"),
    pytest.param(_replace(seed=-(2**63) - 1), ValueError, "seed", id="seed-too-small"),
    pytest.param(
        _replace(seed=lambda a: torch.ones(3, dtype=torch.int32, device=DEVICE)),
        TypeError,
        "seed",
        id="seed-int32",
    ),
    pytest.param(
        _replace(seed=lambda a: torch.ones(2, dtype=torch.int64, device=DEVICE)),
        ValueError,
        "seed",
        id="seed-shape",
    ),
    pytest.param(
        _replace(seed=lambda a: torch.ones(3, dtype=torch.int64, device=META)),
        ValueError,
        "seed",
        id="seed-device",
    ),
    pytest.param(_replace(impl="cuda"), ValueError, "impl", id="impl-unknown"),
    pytest.param(_replace(logits_dtype=torch.int8), TypeError, "logits_dtype", id="logits-dtype"),
]


@pytest.mark.parametrize("build, error, message", BAD_INPUTS)
def test_bad_input_raises_naming_the_argument(build, error, message):
    """Each invalid argument raises ValueError/TypeError whose message names it."""
    with pytest.raises(error, match=message):
        fused_sample(**build())


def test_triton_on_cpu_needs_the_interpreter(monkeypatch):
    """impl="triton" with CPU tensors and no interpreter fails up front, not inside Triton."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    hidden, weight = make_problem(2, 50, 16, device=torch.device("cpu"))
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        fused_sample(hidden, weight, impl="triton")


@pytest.mark.parametrize("impl", IMPLS)
def test_seed_forms_and_determinism(impl):
    """A seed fixes the result: an int, the same int as a 0-d tensor and the same 64 bits
    written unsigned all give the same tokens; a [B] tensor gives row i the tokens that a
    one-row call with seed[i] gives, so a row never depends on its batch position."""
    hidden, weight = make_problem(5, 1000, 64)
    tokens = fused_sample(hidden, weight, seed=-5, num_samples=2, impl=impl)
    for same in (-5, torch.tensor(-5, device=DEVICE), 2**64 - 5):
        assert torch.equal(
            fused_sample(hidden, weight, seed=same, num_samples=2, impl=impl), tokens
        )
    assert not torch.equal(fused_sample(hidden, weight, seed=6, num_samples=2, impl=impl), tokens)
    row_seeds = torch.tensor([17, -1, 2**40, 17, 3], device=DEVICE)
    per_row = fused_sample(hidden, weight, seed=row_seeds, num_samples=2, impl=impl)
    for row in range(5):
        alone = fused_sample(
            hidden[row : row + 1], weight, seed=int(row_seeds[row]), num_samples=2, impl=impl
        )
        assert torch.equal(per_row[row : row + 1], alone)


@pytest.mark.parametrize("impl", IMPLS)
def test_temperature_forms_agree(impl):
    """A float, a 0-d tensor and a [B] tensor of the same temperature draw the same tokens."""
    hidden, weight = make_problem(4, 1000, 64)
    expected = fused_sample(hidden, weight, temperature=0.7, seed=1, impl=impl)
    for same in (torch.tensor(0.7, device=DEVICE), torch.full((4,), 0.7, device=DEVICE)):
        assert torch.equal(
            fused_sample(hidden, weight, temperature=same, seed=1, impl=impl), expected
        )


def test_auto_picks_the_device_implementation():
    """impl="auto" is the kernel on CUDA and the reference elsewhere: same tokens as that one."""
    hidden, weight = make_problem(3, 1000, 64)
    expected_impl = "triton" if DEVICE.type == "cuda" else "torch"
    tokens = fused_sample(hidden, weight, seed=4, impl="auto")
    assert torch.equal(tokens, fused_sample(hidden, weight, seed=4, impl=expected_impl))


def _op_arguments(impl: str, per_row: bool):
    """Positional arguments of torch.ops.flashsampling.fused_sample for one call."""
    hidden, weight = make_problem(3, 300, 32)
    bias = torch.randn(300, device=DEVICE)
    temperature = torch.tensor([0.0, 0.5, 1.0], device=DEVICE) if per_row else None
    seed = torch.tensor([1, 2, 3], device=DEVICE) if per_row else None
    return (hidden, weight, bias, temperature, 0.9, seed, 42, 2, None, impl)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("per_row", [False, True], ids=["scalars", "per-row"])
def test_custom_op_passes_opcheck(impl, per_row):
    """torch.library.opcheck: schema, fake tensor (meta) kernel, autograd registration and
    AOT dispatch of the custom op, with scalar and with per-row temperature and seed."""
    torch.library.opcheck(
        torch.ops.flashsampling.fused_sample.default, _op_arguments(impl, per_row)
    )


class _RecordOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("impl", IMPLS)
def test_eager_calls_skip_the_dispatcher_but_tracers_see_the_op(impl, monkeypatch):
    """Plain eager calls run the op's implementation directly (host time), with exactly the
    custom op's tokens; under a dispatch mode (what fake tensors and make_fx use) and in a
    make_fx graph the call is still the one custom op."""
    arguments = _op_arguments(impl, per_row=True)
    expected = torch.ops.flashsampling.fused_sample(*arguments)
    hidden, weight, bias, temperature, _, seed, _, num_samples, _, _ = arguments

    def call():
        return fused_sample(
            hidden, weight, bias=bias, temperature=temperature, seed=seed,
            num_samples=num_samples, impl=impl,
        )  # fmt: skip

    direct_calls = []
    implementation = op_module._fused_sample_impl
    monkeypatch.setattr(
        op_module,
        "_fused_sample_impl",
        lambda *args: direct_calls.append(args) or implementation(*args),
    )
    assert torch.equal(call(), expected)
    assert len(direct_calls) == 1
    with _RecordOps() as recorder:
        assert torch.equal(call(), expected)
    assert len(direct_calls) == 1
    assert recorder.ops.count(torch.ops.flashsampling.fused_sample.default) == 1
    # (scalars here: a temperature tensor adds its check to the graph, as the next test shows)
    graph = make_fx(lambda h, w: fused_sample(h, w, temperature=0.9, seed=42, impl=impl))(
        hidden, weight
    ).graph
    targets = [node.target for node in graph.nodes if node.op == "call_function"]
    assert targets == [torch.ops.flashsampling.fused_sample.default]


@pytest.mark.parametrize("tracing_mode", ["real", "fake", "symbolic"])
def test_traced_temperature_tensor_is_checked_when_the_graph_runs(tracing_mode):
    """A tracer has no values to check a temperature tensor with, so the check goes into the
    graph as an assert op: make_fx traces a CPU temperature tensor, and the graph draws the
    eager tokens and rejects a negative temperature when it runs; so does torch.compile.
    (CPU only: on CUDA the same assert is a device-side one, which ends the CUDA context.)"""
    hidden, weight = make_problem(3, 200, 32, device=torch.device("cpu"))

    def step(h, w, t):
        return fused_sample(h, w, temperature=t, seed=5, impl="torch")

    temperature = torch.tensor([0.5, 1.0, 0.0])
    expected = step(hidden, weight, temperature)
    graph = make_fx(step, tracing_mode=tracing_mode)(hidden, weight, temperature)
    targets = [node.target for node in graph.graph.nodes if node.op == "call_function"]
    assert torch.ops.aten._assert_async.msg in targets
    assert torch.equal(graph(hidden, weight, temperature), expected)
    with pytest.raises(RuntimeError, match="temperature must be finite and >= 0"):
        graph(hidden, weight, -temperature)
    if tracing_mode == "real":
        torch._dynamo.reset()
        compiled = torch.compile(step, backend="inductor", fullgraph=True)
        assert torch.equal(compiled(hidden, weight, temperature), expected)
        with pytest.raises(RuntimeError, match="temperature must be finite and >= 0"):
            compiled(hidden, weight, torch.tensor([0.5, float("nan"), 1.0]))


def sample_next_token(hidden, weight, temperature, seed, impl):
    """What a decode step compiles: normalise the last hidden states, sample two tokens."""
    hidden = torch.nn.functional.layer_norm(hidden, hidden.shape[-1:])
    return fused_sample(
        hidden, weight, temperature=temperature, seed=seed, num_samples=2, impl=impl
    )


COMPILE_ARGUMENTS = [
    pytest.param(lambda: (0.8, 123), id="float-temperature-int-seed"),
    pytest.param(
        lambda: (
            torch.tensor([0.0, 0.8, 1.2], device=DEVICE),
            torch.tensor([5, 6, 7], device=DEVICE),
        ),
        id="row-temperatures-row-seeds",
    ),
    pytest.param(
        lambda: (torch.tensor(0.8, device=DEVICE), torch.tensor(9, device=DEVICE)),
        id="0d-temperature-0d-seed",
    ),
]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("backend", ["eager", "inductor"])
@pytest.mark.parametrize("arguments", COMPILE_ARGUMENTS)
def test_torch_compile_fullgraph_matches_eager(arguments, backend, impl):
    """A function calling fused_sample compiles with fullgraph=True (no graph break around
    the op) and draws the same tokens as eager on the same seed."""
    torch._dynamo.reset()
    compiled = torch.compile(sample_next_token, backend=backend, fullgraph=True)
    hidden, weight = make_problem(3, 1000, 64)
    temperature, seed = arguments()
    expected = sample_next_token(hidden, weight, temperature, seed, impl)
    assert torch.equal(compiled(hidden, weight, temperature, seed, impl), expected)


@pytest.mark.parametrize("impl", IMPLS)
def test_torch_compile_fullgraph_unseeded(impl):
    """Without a seed the compiled function still compiles whole (the seed is drawn inside
    the graph), returns valid tokens, and two calls draw different tokens."""
    torch._dynamo.reset()
    compiled = torch.compile(sample_next_token, backend="inductor", fullgraph=True)
    hidden, weight = make_problem(8, 1000, 64)
    first = compiled(hidden, weight, 1.0, None, impl)
    second = compiled(hidden, weight, 1.0, None, impl)
    assert first.shape == (8, 2) and bool(((first >= 0) & (first < 1000)).all())
    assert not torch.equal(first, second)
