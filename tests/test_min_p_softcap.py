"""Min-p, top-p without top-k, and the soft-cap: the op against the contract, pathwise and in
distribution (issue 19).

Pathwise: on logits that are exact in fp32, ``fused_sample(..., min_p=...)`` draws exactly
the tokens plain Gumbel-max sampling draws on the same seed from logits whose removed tokens
the float64 contract (``contract_keep``) set to -inf; rows are built so that no score lies
within fp32 rounding of a boundary (``min_p_margin``, ``top_p_margin``). With a soft-cap the
op draws from ``tanh(l / c) * c``: what ``sample_logits`` draws from those scores. Statistical:
chi-square against transformers' warpers (``MinPLogitsWarper`` and the rest) in float64.
"""

from __future__ import annotations

import pytest
import torch
from scipy import stats
from torch.fx.experimental.proxy_tensor import make_fx

from flashsampling_inductor import fused_sample, sample_logits

from .sampling_oracle import (
    ALPHA,
    DEVICE,
    chi_square_power,
    make_exact_problem,
    min_p_margin,
    top_p_margin,
    warped_probabilities,
)
from .test_truncation import (
    IMPLS,
    TOP_P_MARGIN,
    assert_bad_knobs_raise,
    contract_sample,
    exact_logits,
)

MIN_PS = [0.0, 0.05, 0.1, 0.3, 1.0]
# (top_k, top_p) before min-p: none, top-p over the whole row, top-k, both.
TRUNCATIONS = [(0, 1.0), (0, 0.9), (50, 1.0), (20, 0.95)]
# Exact logits are multiples of 1/32; a min-p bound farther than this from every score
# cannot flip under the fp32 rounding of max + T log(min_p).
MIN_P_MARGIN = 1e-4


def min_p_grid():
    """[B] top_k, top_p, min_p, temperature: every min-p with every truncation before it, one
    per row, temperatures cycling through 0.7, 1.3 and 0 (greedy rows)."""
    grid = [(k, p, m) for m in MIN_PS for k, p in TRUNCATIONS]
    top_k = torch.tensor([k for k, _, _ in grid], device=DEVICE)
    top_p = torch.tensor([p for _, p, _ in grid], device=DEVICE)
    min_p = torch.tensor([m for _, _, m in grid], device=DEVICE)
    temperature = torch.tensor([0.7, 1.3, 0.0], device=DEVICE).repeat(len(grid))[: len(grid)]
    return top_k, top_p, min_p, temperature


def assert_margins(logits, temperature, top_k, top_p, min_p):
    for row in range(len(logits)):
        t, k, p, m = (float(temperature[row]), int(top_k[row]), float(top_p[row]),
                      float(min_p[row]))  # fmt: skip
        assert top_p_margin(logits[row].cpu(), t, k, p) > TOP_P_MARGIN, (row, t, k, p)
        assert min_p_margin(logits[row].cpu(), t, m) > MIN_P_MARGIN, (row, t, m)


@pytest.mark.parametrize("impl", IMPLS)
def test_per_row_min_p_after_top_k_top_p_matches_the_contract_pathwise(impl):
    """20 rows, min_p in {0, 0.05, 0.1, 0.3, 1} after no truncation, top-p 0.9 alone (over
    the whole row), top-k 50, top-k 20 + top-p 0.95; per-row temperatures with greedy rows,
    per-row seeds, two samples, bf16 exact logits, a bias with masked tokens."""
    top_k, top_p, min_p, temperature = min_p_grid()
    batch = len(top_k)
    hidden, weight = make_exact_problem(batch, 1000, 64, seed=5)
    bias = torch.zeros(1000, device=DEVICE)
    bias[7::11] = float("-inf")
    logits = exact_logits(hidden, weight, bias)
    assert_margins(logits, temperature, top_k, top_p, min_p)
    seed = torch.arange(batch, device=DEVICE) * 5 + 1
    tokens = fused_sample(
        hidden, weight, bias=bias, temperature=temperature, top_k=top_k, top_p=top_p,
        min_p=min_p, seed=seed, num_samples=2, impl=impl,
    )  # fmt: skip
    expected = contract_sample(logits, temperature, top_k, top_p, seed, 2, min_p.cpu())
    assert torch.equal(tokens, expected)
    greedy = temperature == 0
    assert torch.equal(tokens[greedy, 0], logits[greedy].argmax(-1))
    assert torch.equal(
        sample_logits(
            logits,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            seed=seed,
            num_samples=2,
            impl="torch",  # (its kernels: tests/test_sample_logits_kernels.py)
        ),  # fmt: skip
        tokens,
    )


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "top_p, min_p", [(0.9, None), (None, 0.1), (0.95, 0.05), (None, 1.0)], ids=str
)
def test_scalar_top_p_and_min_p_match_the_contract_pathwise(impl, top_p, min_p):
    """Python p / min_p for every row (odd B), top-p without top-k over the whole row."""
    hidden, weight = make_exact_problem(5, 1000, 64, seed=6)
    logits = exact_logits(hidden, weight)
    knob = torch.ones(5)
    temperature = torch.full((5,), 0.8, device=DEVICE)
    ps, ms = knob * (top_p or 1.0), knob * (min_p or 0.0)
    assert_margins(logits, temperature, knob * 0, ps, ms)
    tokens = fused_sample(
        hidden, weight, temperature=0.8, top_p=top_p, min_p=min_p, seed=9, num_samples=3,
        impl=impl,
    )  # fmt: skip
    assert torch.equal(tokens, contract_sample(logits, temperature, knob * 0, ps, 9, 3, ms))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "knobs", [{}, {"top_k": 20}, {"top_p": 0.9}, {"min_p": 0.1}], ids=["plain", "k", "p", "min-p"]
)
def test_softcap_samples_the_capped_scores(impl, knobs):
    """fused_sample(softcap=c) draws what sample_logits draws from tanh(l / c) * c (fp32),
    with each truncation; greedy rows take the capped scores' argmax. Logits span +-12, so
    c = 5 saturates some of them (a -inf bias entry becomes -c)."""
    hidden, weight = make_exact_problem(4, 300, 64, seed=7)
    hidden = hidden * 4
    bias = torch.zeros(300, device=DEVICE)
    bias[::13] = float("-inf")
    capped = torch.tanh(exact_logits(hidden, weight, bias) / 5.0) * 5.0
    temperature = torch.tensor([0.9, 0.0, 1.5, 0.6], device=DEVICE)
    tokens = fused_sample(
        hidden, weight, bias=bias, temperature=temperature, softcap=5.0, seed=3,
        num_samples=4, impl=impl, **knobs,
    )  # fmt: skip
    expected = sample_logits(
        capped, temperature=temperature, seed=3, num_samples=4, impl="torch", **knobs
    )
    assert torch.equal(tokens, expected)
    capped_alone = sample_logits(
        exact_logits(hidden, weight, bias), temperature=temperature, softcap=5.0, seed=3,
        num_samples=4, impl=impl, **knobs,
    )  # fmt: skip
    assert torch.equal(capped_alone, expected)


# (k, p, min_p, T, softcap) settings of the float64 warper comparison below.
WARPER_SETTINGS = [
    pytest.param(0, 0.9, 0.0, 0.6, 0.0, id="p0.9-alone"),
    pytest.param(0, 1.0, 0.1, 1.0, 0.0, id="min-p0.1"),
    pytest.param(0, 1.0, 0.05, 1.7, 0.0, id="min-p0.05-hot"),
    pytest.param(20, 0.9, 0.2, 1.2, 0.0, id="k20-p0.9-min-p0.2"),
    pytest.param(0, 1.0, 0.0, 1.0, 2.0, id="softcap2"),
    pytest.param(0, 0.8, 0.1, 0.7, 2.5, id="softcap2.5-p0.8-min-p0.1"),
]


@pytest.mark.parametrize("top_k, top_p, min_p, temperature, softcap", WARPER_SETTINGS)
def test_draws_follow_float64_transformers_warpers(top_k, top_p, min_p, temperature, softcap):
    """Chi-square (level ALPHA) of 2**16 reference draws against transformers' warpers
    (soft-cap, temperature, top-k, top-p, min-p) in float64 on 40 distinct logits in
    [-3, 3]; cells are the kept tokens plus one for all removed ones (expected 0: a single
    removed draw fails). Power 0.9 against a 3.5% relative bias over 21 cells."""
    n = 2**16
    assert chi_square_power(n, 0.035, 21) >= 0.9
    order = torch.randperm(40, generator=torch.Generator().manual_seed(1))
    logits = torch.linspace(-3.0, 3.0, 40, dtype=torch.float64)[order].float()
    target = warped_probabilities(logits, temperature, top_k, top_p, min_p, softcap)
    capped = logits.double() if not softcap else torch.tanh(logits.double() / softcap) * softcap
    assert top_p_margin(capped, temperature, top_k, top_p) > TOP_P_MARGIN
    assert min_p_margin(capped, temperature, min_p) > MIN_P_MARGIN
    tokens = sample_logits(
        logits.to(DEVICE).expand(256, 40), temperature=temperature, top_k=top_k or None,
        top_p=top_p, min_p=min_p, softcap=softcap or None, num_samples=n // 256, seed=13,
    )  # fmt: skip
    counts = torch.bincount(tokens.flatten().cpu(), minlength=40).double()
    kept = target > 0
    assert counts[~kept].sum() == 0
    assert int(kept.sum()) < 40 or not (top_p < 1 or min_p > 0)  # the filters do truncate
    p_value = stats.chisquare(counts[kept].numpy(), (target[kept] * n).numpy()).pvalue
    assert p_value > ALPHA, (p_value, counts.tolist())


BAD_KNOBS = [
    pytest.param({"min_p": -0.1}, ValueError, "min_p", id="min-p-negative"),
    pytest.param({"min_p": 1.5}, ValueError, "min_p", id="min-p-above-one"),
    pytest.param({"min_p": float("nan")}, ValueError, "min_p", id="min-p-nan"),
    pytest.param({"min_p": "0.1"}, TypeError, "min_p", id="min-p-str"),
    pytest.param({"min_p": torch.ones(3, dtype=torch.long)}, TypeError, "min_p", id="min-p-int"),
    pytest.param(
        {"min_p": torch.tensor([0.1, float("nan"), 0.0])}, ValueError, "min_p", id="min-p-row-nan"
    ),
    pytest.param({"min_p": torch.ones(4)}, ValueError, "min_p", id="min-p-shape"),
    pytest.param({"softcap": 0.0}, ValueError, "softcap", id="softcap-zero"),
    pytest.param({"softcap": -30.0}, ValueError, "softcap", id="softcap-negative"),
    pytest.param({"softcap": float("inf")}, ValueError, "softcap", id="softcap-inf"),
    pytest.param({"softcap": float("nan")}, ValueError, "softcap", id="softcap-nan"),
    pytest.param({"softcap": True}, TypeError, "softcap", id="softcap-bool"),
    pytest.param({"softcap": torch.tensor(30.0)}, TypeError, "softcap", id="softcap-tensor"),
]


@pytest.mark.parametrize("knobs, error, message", BAD_KNOBS)
@pytest.mark.parametrize("entry", ["fused_sample", "sample_logits"])
def test_bad_min_p_and_softcap_raise_naming_the_argument(knobs, error, message, entry):
    """CPU eager calls check min_p and softcap on the host: an error naming them."""
    assert_bad_knobs_raise(entry, knobs, error, message)


def test_a_bad_softcap_in_a_graph_fails_when_the_op_runs():
    """The custom ops check a softcap a graph hands them (0.0 is off, the schema default)."""
    hidden, weight = make_exact_problem(2, 50, 16, device=torch.device("cpu"))
    args = (hidden, weight, None, None, 1.0, None, 3, 1, None, "torch")
    plain = torch.ops.flashsampling.fused_sample(*args)
    assert torch.equal(
        plain, torch.ops.flashsampling.fused_sample(*args, None, 0, None, 1.0, None, 0.0, 0.0)
    )
    with pytest.raises(ValueError, match="softcap"):
        torch.ops.flashsampling.fused_sample(*args, softcap=-1.0)


def test_traced_min_p_tensor_is_checked_when_the_graph_runs():
    """A traced per-row min_p goes into the graph with an assert op: the graph draws the
    eager tokens and rejects a bad value when it runs."""
    hidden, weight = make_exact_problem(3, 200, 32, device=torch.device("cpu"))

    def step(h, w, m):
        return fused_sample(h, w, min_p=m, softcap=4.0, seed=5, impl="torch")

    min_p = torch.tensor([0.1, 0.0, 0.5])
    expected = step(hidden, weight, min_p)
    graph = make_fx(step)(hidden, weight, min_p)
    targets = [node.target for node in graph.graph.nodes if node.op == "call_function"]
    assert targets.count(torch.ops.aten._assert_async.msg) == 1
    assert torch.equal(graph(hidden, weight, min_p), expected)
    with pytest.raises(RuntimeError, match=r"min_p must be in \[0, 1\]"):
        graph(hidden, weight, min_p + 1)


@pytest.mark.parametrize("per_row", [False, True], ids=["scalars", "per-row"])
def test_custom_ops_pass_opcheck_with_min_p_and_softcap(per_row):
    """torch.library.opcheck of both custom ops with min_p and softcap; they agree on exact
    logits."""
    hidden, weight = make_exact_problem(3, 300, 32)
    logits = exact_logits(hidden, weight)
    temperature = torch.tensor([0.0, 0.5, 1.0], device=DEVICE) if per_row else None
    seed = torch.tensor([1, 2, 3], device=DEVICE) if per_row else None
    top_p = torch.tensor([0.9, 1.0, 0.5], device=DEVICE) if per_row else None
    min_p = torch.tensor([0.2, 0.05, 0.0], device=DEVICE) if per_row else None
    fused = (hidden, weight, None, temperature, 0.9, seed, 42, 2, None, "torch",
             None, 0, top_p, 0.8, min_p, 0.1, 3.0)  # fmt: skip
    alone = (logits, temperature, 0.9, seed, 42, 2, None, 0, top_p, 0.8, "torch",
             min_p, 0.1, 3.0)  # fmt: skip
    torch.library.opcheck(torch.ops.flashsampling.fused_sample.default, fused)
    torch.library.opcheck(torch.ops.flashsampling.sample_logits.default, alone)
    assert torch.equal(
        torch.ops.flashsampling.fused_sample(*fused), torch.ops.flashsampling.sample_logits(*alone)
    )


def test_sample_logits_with_min_p_and_softcap_compiles_fullgraph():
    """sample_logits(min_p=tensor, softcap=c) inside torch.compile(fullgraph=True) draws the
    eager tokens."""
    torch._dynamo.reset()

    def step(logits, min_p):
        return sample_logits(logits * 2, min_p=min_p, softcap=3.0, seed=7, num_samples=2)

    logits = torch.randn(3, 100, device=DEVICE)
    min_p = torch.tensor([0.1, 0.0, 0.5], device=DEVICE)
    compiled = torch.compile(step, backend="inductor", fullgraph=True)
    assert torch.equal(compiled(logits, min_p), step(logits, min_p))
