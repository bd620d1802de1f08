"""Top-k and top-p: the op against the contract, pathwise and in distribution.

Pathwise: on logits that are exact in fp32, ``fused_sample(..., top_k, top_p)`` draws
exactly the tokens that plain Gumbel-max sampling draws on the same seed from logits whose
removed tokens were set to -inf by the contract written in float64 (``contract_keep``): the
noise is the same, so only the kept set can differ. Statistical: chi-square against
transformers' warpers computed in float64 (``warped_probabilities``).
"""

from __future__ import annotations

import pytest
import torch
from scipy import stats
from torch.fx.experimental.proxy_tensor import make_fx

from flashsampling_inductor import (
    dispatch,
    fused_sample,
    sample_logits,
    sampling_kernel,
    truncation_kernel,
)

from .sampling_oracle import (
    ALPHA,
    DEVICE,
    chi_square_power,
    contract_keep,
    make_exact_problem,
    top_p_margin,
    warped_probabilities,
)

IMPLS = ["torch", "triton"]
# Every k of the issue with every p, one (k, p) per row; V = 1000, so k = 1000 is off.
TOP_KS = [1, 2, 20, 50, 200, 1000]
TOP_PS = [0.5, 0.9, 0.95, 1.0]
# fp32 masses of ~1000 terms err by < 1e-6: a row whose top-p decision is farther than
# this from p in float64 cannot flip.
TOP_P_MARGIN = 1e-5


def exact_logits(hidden, weight, bias=None):
    logits = (hidden.double() @ weight.double().T).float()
    return logits if bias is None else logits + bias.float()


def contract_sample(logits, temperature, top_k, top_p, seed, num_samples, min_p=None):
    """Plain sampling (reference) from logits whose removed tokens the float64 contract set
    to -inf: what the op must draw on the same seed. ``min_p`` [B] or None (off)."""
    min_p = torch.zeros(len(logits)) if min_p is None else min_p
    masked = torch.stack(
        [
            row.masked_fill(~contract_keep(row.cpu(), t, k, p, m).to(row.device), float("-inf"))
            for row, t, k, p, m in zip(
                logits,
                temperature.tolist(),
                top_k.tolist(),
                top_p.tolist(),
                min_p.tolist(),
                strict=True,
            )  # fmt: skip
        ]
    )
    return sample_logits(
        masked, temperature=temperature, seed=seed, num_samples=num_samples, impl="torch"
    )


def per_row_grid(batch_repeats: int = 1):
    """[B] top_k, top_p, temperature: every (k, p) of the grid, temperatures cycling through
    0.7, 1.3 and 0 (greedy rows)."""
    grid = [(k, p) for k in TOP_KS for p in TOP_PS] * batch_repeats
    top_k = torch.tensor([k for k, _ in grid], device=DEVICE)
    top_p = torch.tensor([p for _, p in grid], device=DEVICE)
    temperature = torch.tensor([0.7, 1.3, 0.0], device=DEVICE).repeat(len(grid))[: len(grid)]
    return top_k, top_p, temperature


@pytest.mark.parametrize("impl", IMPLS)
def test_per_row_top_k_top_p_temperature_match_the_contract_pathwise(impl):
    """24 rows, one per (k, p) of k in {1, 2, 20, 50, 200, V} x p in {0.5, 0.9, 0.95, 1.0},
    per-row temperatures with greedy rows, per-row seeds, two samples, bf16 exact logits
    (multiples of 1/32: many ties, at the k-th value too), a bias with masked tokens."""
    top_k, top_p, temperature = per_row_grid()
    batch = len(top_k)
    hidden, weight = make_exact_problem(batch, 1000, 64)
    bias = torch.zeros(1000, device=DEVICE)
    bias[7::11] = float("-inf")
    logits = exact_logits(hidden, weight, bias)
    for row in range(batch):
        knobs = float(temperature[row]), int(top_k[row]), float(top_p[row])
        assert top_p_margin(logits[row].cpu(), *knobs) > TOP_P_MARGIN, (row, knobs)
    seed = torch.arange(batch, device=DEVICE) * 7 + 3
    tokens = fused_sample(
        hidden, weight, bias=bias, temperature=temperature, top_k=top_k, top_p=top_p,
        seed=seed, num_samples=2, impl=impl,
    )  # fmt: skip
    expected = contract_sample(logits, temperature, top_k, top_p, seed, 2)
    assert torch.equal(tokens, expected)
    greedy = temperature == 0
    assert torch.equal(tokens[greedy, 0], logits[greedy].argmax(-1))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("split, prefetch", [("1", True), ("0", False)])
def test_off_valued_knob_tensors_draw_the_plain_tokens_and_rows_stay_independent(
    impl, split, prefetch, monkeypatch
):
    """Per-row (and 0-d) knob tensors at their "off" values (k 0, p 1, min-p 0; greedy rows
    too) draw exactly the tokens of the call without them; in a batch where some rows turn
    knobs on, every other row still draws those tokens, and the truncated rows draw the
    contract's. (Stage 1 as two launches, ``dispatch._split_stage1``, or as one; stage 2
    with the plain candidates loaded before the knobs, ``truncation_kernel.PREFETCH_PLAIN``,
    or after.)"""
    monkeypatch.setattr(dispatch, "_SPLIT_STAGE1", split)
    monkeypatch.setattr(truncation_kernel, "PREFETCH_PLAIN", prefetch)
    batch = 6
    hidden, weight = make_exact_problem(batch, 1000, 64, seed=5)
    logits = exact_logits(hidden, weight)
    temperature = torch.tensor([0.7, 1.3, 0.0], device=DEVICE).repeat(2)
    seed = torch.arange(batch, device=DEVICE) * 5 + 1
    common = dict(temperature=temperature, seed=seed, num_samples=2, impl=impl)
    plain = fused_sample(hidden, weight, **common)
    top_k = torch.zeros(batch, dtype=torch.int64, device=DEVICE)
    top_p = torch.ones(batch, device=DEVICE)
    min_p = torch.zeros(batch, device=DEVICE)
    off = fused_sample(hidden, weight, top_k=top_k, top_p=top_p, min_p=min_p, **common)
    assert torch.equal(off, plain)
    # 0-d, as hf's generate passes them
    off_0d = dict(top_k=top_k[0], top_p=top_p[0], min_p=min_p[0])
    assert torch.equal(fused_sample(hidden, weight, **off_0d, **common), plain)
    top_k[1], top_p[3], min_p[4], top_k[2] = 20, 0.9, 0.2, 5  # (row 2 is greedy)
    mixed = fused_sample(hidden, weight, top_k=top_k, top_p=top_p, min_p=min_p, **common)
    untruncated = torch.tensor([True, False, True, False, False, True], device=DEVICE)
    assert torch.equal(mixed[untruncated], plain[untruncated])
    expected = contract_sample(logits, temperature, top_k, top_p, seed, 2, min_p=min_p)
    assert torch.equal(mixed, expected)


@pytest.mark.parametrize("split", ["1", "0"])
def test_knobs_on_greedy_rows_alone_draw_the_plain_tokens(split, monkeypatch):
    """Stage 1 with knobs that may be off as two launches, each reading the batch's knobs
    first (``dispatch._split_stage1``, on the GPU the Gluon kernel's; here the Triton
    kernel's, which the split also serves), and as one: top-k on greedy rows alone
    truncates no row, so the tokens are the plain call's. (Batches with truncated rows:
    the test above; generate's top-k with top-p at 1 as tensors, which writes no mass
    partials: tests/test_gpu_truncation.py.)"""
    monkeypatch.setattr(dispatch, "_SPLIT_STAGE1", split)
    hidden, weight = make_exact_problem(4, 300, 32, seed=3)
    temperature = torch.tensor([0.7, 1.3, 0.0, 0.9], device=DEVICE)
    common = dict(temperature=temperature, seed=torch.tensor(5, device=DEVICE), impl="triton")
    top_k = torch.tensor([0, 0, 5, 0], device=DEVICE)
    knobs = dict(top_k=top_k, top_p=torch.ones(4, device=DEVICE))
    assert torch.equal(
        fused_sample(hidden, weight, **knobs, **common), fused_sample(hidden, weight, **common)
    )


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("top_k, top_p", [(50, None), (None, 0.9), (20, 0.95), (1000, None)])
def test_scalar_knobs_match_the_contract_pathwise(impl, top_k, top_p):
    """Python k / p for every row (odd B); k >= V is off: plain sampling's tokens."""
    hidden, weight = make_exact_problem(5, 1000, 64, seed=1)
    logits = exact_logits(hidden, weight)
    tokens = fused_sample(
        hidden, weight, temperature=0.8, top_k=top_k, top_p=top_p, seed=9, num_samples=3,
        impl=impl,
    )  # fmt: skip
    ks = torch.full((5,), top_k or 0)
    ps = torch.full((5,), top_p or 1.0)
    expected = contract_sample(logits, torch.full((5,), 0.8, device=DEVICE), ks, ps, 9, 3)
    assert torch.equal(tokens, expected)
    if top_k == 1000:
        plain = fused_sample(hidden, weight, temperature=0.8, seed=9, num_samples=3, impl=impl)
        assert torch.equal(tokens, plain)


@pytest.mark.parametrize("logits_dtype", [None, torch.bfloat16], ids=["fp32", "bf16-logits"])
def test_narrow_nucleus_search_draws_the_contract_tokens(logits_dtype, monkeypatch):
    """Stage 2's nucleus bound searched from the candidates' key range, two bits a pass
    (``truncation_kernel.NUCLEUS_NARROW``): the per-row (k, p) grid with greedy rows, and a
    Python p alone (the whole row's mass from stage 1's partials), draw the contract's
    tokens, as the one-bit search does (narrowed on every path here, as by default:
    ``NUCLEUS_NARROW``)."""
    monkeypatch.setattr(truncation_kernel, "NUCLEUS_NARROW", True)
    top_k, top_p, temperature = per_row_grid()
    batch = len(top_k)
    hidden, weight = make_exact_problem(batch, 1000, 64)
    logits = exact_logits(hidden, weight)
    if logits_dtype is not None:
        logits = logits.to(logits_dtype).float()
    seed = torch.arange(batch, device=DEVICE) * 7 + 3
    tokens = fused_sample(
        hidden, weight, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
        num_samples=2, logits_dtype=logits_dtype, impl="triton",
    )  # fmt: skip
    assert torch.equal(tokens, contract_sample(logits, temperature, top_k, top_p, seed, 2))
    # (p alone on 6 of the rows: every one takes the whole-row fallback, whose stage 2 the
    # interpreter runs at ~3.5 s a row; the rows share their knobs)
    rows = 6
    temperature = torch.full((rows,), 0.8, device=DEVICE)
    tokens = fused_sample(
        hidden[:rows], weight, temperature=0.8, top_p=0.9, seed=seed[:rows], num_samples=2,
        logits_dtype=logits_dtype, impl="triton",
    )  # fmt: skip
    ps = torch.full((rows,), 0.9)
    expected = contract_sample(logits[:rows], temperature, torch.zeros(rows), ps, seed[:rows], 2)
    assert torch.equal(tokens, expected)


@pytest.mark.parametrize("logits_dtype", [None, torch.bfloat16], ids=["fp32", "bf16-logits"])
def test_mass_partials_take_the_tile_maximum_from_the_largest_key(logits_dtype, monkeypatch):
    """Stage 1's top-p mass partials with each tile's maximum taken from the top-m
    epilogue's largest key (``sampling_kernel.MASS_MAX_FROM_TOP_KEY``) are the same bits as
    with a reduction of its own, and so are the tokens: a bias
    with -inf and NaN tokens, +-0 logits, a vocabulary that the tiles do not divide, a whole
    tile at -inf."""
    hidden, weight = make_exact_problem(3, 997, 64, seed=2)
    weight[5:9] = 0.0  # (+0 logits, and -0 through the bias below)
    bias = torch.zeros(997, device=DEVICE)
    bias[7::11] = float("-inf")
    bias[3::17] = float("nan")
    bias[5] = -0.0
    bias[256:512] = float("-inf")  # (the interpreter's tiles are 256 wide)
    masses = []

    def keep_mass(hidden, weight, bias, params, stage1, *args, **kwargs):
        if type(stage1["mass"]) is torch.Tensor:  # (on a GPU, ahead.py's dry run: fakes)
            masses.append(stage1["mass"].clone())
        return finish(hidden, weight, bias, params, stage1, *args, **kwargs)

    finish = dispatch._finish_truncation
    monkeypatch.setattr(dispatch, "_finish_truncation", keep_mass)
    # (T = 0.2: the candidates hold each nucleus, so no row takes the whole-row fallback,
    # ~10 s a call under the interpreter, which reads no mass partial)
    knobs = dict(temperature=0.2, top_p=0.9, seed=5, num_samples=2, logits_dtype=logits_dtype)
    monkeypatch.setattr(sampling_kernel, "MASS_MAX_FROM_TOP_KEY", False)
    tokens = fused_sample(hidden, weight, bias=bias, impl="triton", **knobs)
    monkeypatch.setattr(sampling_kernel, "MASS_MAX_FROM_TOP_KEY", True)
    assert torch.equal(fused_sample(hidden, weight, bias=bias, impl="triton", **knobs), tokens)
    assert len(masses) == 2 and torch.equal(masses[0], masses[1])
    assert masses[0][:, :, 0].isneginf().any()  # (the -inf tile)


@pytest.mark.parametrize("impl", IMPLS)
def test_sample_logits_draws_what_fused_sample_draws(impl):
    """sample_logits on hidden @ weight.T (exact) draws fused_sample's tokens, with and
    without truncation, and with a bf16 logits tensor as a model would hand it over."""
    hidden, weight = make_exact_problem(3, 300, 64, seed=2)
    logits = exact_logits(hidden, weight)
    for knobs in ({}, {"top_k": 20, "top_p": 0.9}):
        fused = fused_sample(hidden, weight, seed=4, num_samples=2, impl=impl, **knobs)
        alone = sample_logits(logits, seed=4, num_samples=2, impl=impl, **knobs)
        assert torch.equal(fused, alone)
        rounded = fused_sample(
            hidden, weight, seed=4, num_samples=2, impl=impl, logits_dtype=torch.bfloat16,
            **knobs,
        )  # fmt: skip
        assert torch.equal(
            rounded,
            sample_logits(logits.bfloat16(), seed=4, num_samples=2, impl=impl, **knobs),
        )


def test_ties_at_the_kth_value_are_all_kept():
    """bf16 logits with a large tie group at the k-th value: every tied token stays, so with
    k = 3 and 40 tokens tied at the 3rd value all 42 are drawn (2**14 draws: each has
    probability >= 1/42 at T = 1e4, so a missing one has chance < 1e-100), never another."""
    logits = torch.full((1, 200), -1.0, dtype=torch.bfloat16)
    logits[0, 150:190] = 2.0
    logits[0, 10] = logits[0, 20] = 3.0
    tokens = sample_logits(
        logits.expand(64, 200).to(DEVICE), temperature=1e4, top_k=3, num_samples=256, seed=1
    )
    drawn = set(tokens.unique().tolist())
    assert drawn == {10, 20, *range(150, 190)}


def test_a_row_with_fewer_than_k_finite_tokens_keeps_them_all():
    """k = 50 on a row with 10 finite tokens: those 10 are drawn as without top-k
    (pathwise), and no -inf token ever."""
    logits = torch.full((4, 300), float("-inf"), device=DEVICE)
    logits[:, ::30] = torch.linspace(-1, 1, 10, device=DEVICE)
    tokens = sample_logits(logits, top_k=50, num_samples=64, seed=3)
    assert torch.equal(tokens, sample_logits(logits, num_samples=64, seed=3))
    assert bool((tokens % 30 == 0).all())


# (k, p, T) warper settings and the float64 targets they give on the 40-token row below.
WARPER_SETTINGS = [
    pytest.param(5, 1.0, 1.0, id="k5"),
    pytest.param(0, 0.9, 0.8, id="p0.9"),
    pytest.param(20, 0.7, 1.5, id="k20-p0.7"),
]


@pytest.mark.parametrize("top_k, top_p, temperature", WARPER_SETTINGS)
def test_draws_follow_float64_transformers_warpers(top_k, top_p, temperature):
    """Chi-square (level ALPHA) of 2**16 reference draws against transformers' top-k / top-p
    warpers in float64 on 40 distinct logits; cells are the kept tokens plus one cell for
    all removed ones (expected 0: a single removed draw fails). Power 0.9 against a 3.5%
    relative bias over 21 cells (chi_square_power)."""
    n = 2**16
    assert chi_square_power(n, 0.035, 21) >= 0.9
    order = torch.randperm(40, generator=torch.Generator().manual_seed(0))
    logits = torch.linspace(-3.0, 3.0, 40, dtype=torch.float64)[order].float()
    target = warped_probabilities(logits, temperature, top_k, top_p)
    assert top_p_margin(logits, temperature, top_k, top_p) > TOP_P_MARGIN
    tokens = sample_logits(
        logits.to(DEVICE).expand(256, 40), temperature=temperature, top_k=top_k or None,
        top_p=top_p, num_samples=n // 256, seed=11,
    )  # fmt: skip
    counts = torch.bincount(tokens.flatten().cpu(), minlength=40).double()
    kept = target > 0
    assert counts[~kept].sum() == 0
    p_value = stats.chisquare(counts[kept].numpy(), (target[kept] * n).numpy()).pvalue
    assert p_value > ALPHA, (p_value, counts.tolist())


BAD_KNOBS = [
    pytest.param({"top_k": -1}, ValueError, "top_k", id="k-negative"),
    pytest.param({"top_k": 2.0}, TypeError, "top_k", id="k-float"),
    pytest.param({"top_k": True}, TypeError, "top_k", id="k-bool"),
    pytest.param({"top_k": torch.ones(3)}, TypeError, "top_k", id="k-float-tensor"),
    pytest.param({"top_k": torch.tensor([1, -2, 3])}, ValueError, "top_k", id="k-row-negative"),
    pytest.param({"top_k": torch.ones(4, dtype=torch.long)}, ValueError, "top_k", id="k-shape"),
    pytest.param({"top_p": 0.0}, ValueError, "top_p", id="p-zero"),
    pytest.param({"top_p": 1.5}, ValueError, "top_p", id="p-above-one"),
    pytest.param({"top_p": float("nan")}, ValueError, "top_p", id="p-nan"),
    pytest.param({"top_p": "0.9"}, TypeError, "top_p", id="p-str"),
    pytest.param({"top_p": torch.tensor([0.5, 0.0, 1.0])}, ValueError, "top_p", id="p-row-zero"),
    pytest.param(
        {"top_p": torch.tensor([0.5, float("nan"), 1.0])}, ValueError, "top_p", id="p-row-nan"
    ),
    pytest.param({"top_p": torch.ones(3, dtype=torch.long)}, TypeError, "top_p", id="p-int"),
]


@pytest.mark.parametrize("knobs, error, message", BAD_KNOBS)
@pytest.mark.parametrize("entry", ["fused_sample", "sample_logits"])
def test_bad_top_k_top_p_raise_naming_the_argument(knobs, error, message, entry):
    """CPU eager calls check k and p on the host: a ValueError / TypeError naming them."""
    assert_bad_knobs_raise(entry, knobs, error, message)


def assert_bad_knobs_raise(entry: str, knobs: dict, error: type, message: str) -> None:
    """``entry`` ("fused_sample" or "sample_logits") called eagerly on the CPU with ``knobs``
    raises ``error`` whose message names the argument."""
    hidden, weight = make_exact_problem(3, 50, 16, device=torch.device("cpu"))
    with pytest.raises(error, match=message):
        if entry == "fused_sample":
            fused_sample(hidden, weight, impl="torch", **knobs)
        else:
            sample_logits(exact_logits(hidden, weight), impl="torch", **knobs)


def test_traced_top_k_top_p_tensors_are_checked_when_the_graph_runs():
    """Traced per-row k / p go into the graph with an assert op each, as temperature tensors
    do: the graph draws the eager tokens and rejects a bad value when it runs."""
    hidden, weight = make_exact_problem(3, 200, 32, device=torch.device("cpu"))

    def step(h, w, k, p):
        return fused_sample(h, w, top_k=k, top_p=p, seed=5, impl="torch")

    top_k, top_p = torch.tensor([5, 0, 50]), torch.tensor([0.9, 1.0, 0.5])
    expected = step(hidden, weight, top_k, top_p)
    graph = make_fx(step)(hidden, weight, top_k, top_p)
    targets = [node.target for node in graph.graph.nodes if node.op == "call_function"]
    assert targets.count(torch.ops.aten._assert_async.msg) == 2
    assert torch.ops.flashsampling.fused_sample.default in targets
    assert torch.equal(graph(hidden, weight, top_k, top_p), expected)
    with pytest.raises(RuntimeError, match="top_k must be an integer >= 0"):
        graph(hidden, weight, -top_k, top_p)
    with pytest.raises(RuntimeError, match="top_p must be in"):
        graph(hidden, weight, top_k, top_p + 1)


def _op_arguments(per_row: bool):
    hidden, weight = make_exact_problem(3, 300, 32)
    logits = exact_logits(hidden, weight)
    temperature = torch.tensor([0.0, 0.5, 1.0], device=DEVICE) if per_row else None
    seed = torch.tensor([1, 2, 3], device=DEVICE) if per_row else None
    top_k = torch.tensor([5, 0, 50], device=DEVICE) if per_row else None
    top_p = torch.tensor([0.9, 1.0, 0.5], device=DEVICE) if per_row else None
    fused = (hidden, weight, None, temperature, 0.9, seed, 42, 2, None, "torch",
             top_k, 20, top_p, 0.8)  # fmt: skip
    alone = (logits, temperature, 0.9, seed, 42, 2, top_k, 20, top_p, 0.8, "torch")
    return fused, alone


@pytest.mark.parametrize("per_row", [False, True], ids=["scalars", "per-row"])
def test_custom_ops_pass_opcheck(per_row):
    """torch.library.opcheck of both custom ops with truncation arguments (schema, fake
    kernel, AOT dispatch); they agree on exact logits."""
    fused, alone = _op_arguments(per_row)
    torch.library.opcheck(torch.ops.flashsampling.fused_sample.default, fused)
    torch.library.opcheck(torch.ops.flashsampling.sample_logits.default, alone)
    assert torch.equal(
        torch.ops.flashsampling.fused_sample(*fused), torch.ops.flashsampling.sample_logits(*alone)
    )


def test_existing_positional_calls_keep_working():
    """The new schema arguments have defaults: a call with the ten original arguments is
    a call without truncation."""
    fused, _ = _op_arguments(per_row=False)
    plain = torch.ops.flashsampling.fused_sample(*fused[:10])
    assert torch.equal(plain, torch.ops.flashsampling.fused_sample(*fused[:10], None, 0))


def test_sample_logits_compiles_fullgraph():
    """sample_logits inside torch.compile(fullgraph=True) draws the eager tokens."""
    torch._dynamo.reset()

    def step(logits, k):
        return sample_logits(logits * 2, top_k=k, top_p=0.9, seed=7, num_samples=2)

    logits = torch.randn(3, 100, device=DEVICE)
    top_k = torch.tensor([3, 0, 30], device=DEVICE)
    compiled = torch.compile(step, backend="inductor", fullgraph=True)
    assert torch.equal(compiled(logits, top_k), step(logits, top_k))
