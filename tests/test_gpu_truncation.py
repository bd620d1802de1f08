"""Top-k / top-p through the fused kernel at real size on a GPU: V = 151936, bf16.

Run with ``pytest -m gpu tests/test_gpu_truncation.py`` on a CUDA machine (skipped
elsewhere); ``benchmarks/gpu_check.py`` runs it with the other gpu tests. The statistical
test draws 2**24 (16.8M) tokens.
"""

from __future__ import annotations

import pytest
import torch
from scipy import stats
from torch._subclasses.fake_tensor import FakeTensor

from flashsampling_inductor import (
    dispatch,
    fused_sample,
    hopper_kernel,
    sample_logits,
    sampling_kernel,
    truncation_kernel,
)

from .sampling_oracle import (
    ALPHA,
    assert_pathwise_equal,
    chi_square_power,
    make_exact_problem,
    warped_probabilities,
)

pytestmark = pytest.mark.gpu

VOCAB = 151936
CUDA = torch.device("cuda")


def row_knobs(batch: int):
    """Per-row k in {0, 1, 20, 50, 200, 1024}, p in {1, 0.9, 0.5}, T in {0.7, 1.2, 0}."""
    top_k = torch.tensor([0, 1, 20, 50, 200, 1024], device=CUDA).repeat(batch)[:batch]
    top_p = torch.tensor([1.0, 0.9, 0.5], device=CUDA).repeat(batch)[:batch]
    temperature = torch.tensor([0.7, 1.2, 0.7, 0.0], device=CUDA).repeat(batch)[:batch]
    return top_k, top_p, temperature


@pytest.mark.parametrize("batch, hidden_size", [(1, 2048), (37, 4096), (256, 2048)])
@pytest.mark.parametrize("logits_dtype", [None, torch.bfloat16], ids=["fp32", "bf16-logits"])
def test_gpu_truncated_kernel_matches_reference_pathwise(batch, hidden_size, logits_dtype):
    """Exact logits (multiples of 1/32: heavy ties at every k-th value), per-row k / p / T
    with greedy rows, per-row seeds, 2 samples: the fused kernel draws the reference's
    tokens up to documented noise near-ties, and sample_logits on the same logits draws the
    reference's."""
    hidden, weight = make_exact_problem(batch, VOCAB, hidden_size, device=CUDA)
    top_k, top_p, temperature = row_knobs(batch)
    seed = torch.arange(batch, device=CUDA) * 104729 + 7
    arguments = dict(
        temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, num_samples=2,
        logits_dtype=logits_dtype,
    )  # fmt: skip
    tokens = fused_sample(hidden, weight, impl="triton", **arguments)
    expected = fused_sample(hidden, weight, impl="torch", **arguments)
    assert_pathwise_equal(
        tokens, expected, hidden, weight, temperature=temperature, seed=seed,
        logits_dtype=logits_dtype,
    )  # fmt: skip
    logits = (hidden.float() @ weight.float().T).to(logits_dtype or torch.float32)
    arguments.pop("logits_dtype")
    assert torch.equal(sample_logits(logits, impl="torch", **arguments), expected)


@pytest.mark.parametrize("batch", [1, 16, 100, 256])
def test_gpu_off_valued_knobs_draw_the_plain_tokens_and_truncate_only_their_rows(batch):
    """Knob tensors at their "off" values (k 0, p 1, min-p 0) draw exactly the plain call's
    tokens, greedy rows too: stage 1 skips the top-m epilogue of tiles with no truncated
    row (at B = 100 the Gluon kernel's two 64-row tiles) and stage 2 reads their plain
    candidates. With every third row truncated from row 64 on (from row 0 below 64 rows),
    the other rows still draw those tokens and the truncated ones the reference's."""
    hidden, weight = make_exact_problem(batch, VOCAB, 2048, device=CUDA)
    temperature = torch.tensor([0.7, 1.2, 0.0], device=CUDA).repeat(batch)[:batch]
    seed = torch.arange(batch, device=CUDA) * 7919 + 11
    common = dict(temperature=temperature, seed=seed, num_samples=2, logits_dtype=torch.bfloat16)
    plain = fused_sample(hidden, weight, impl="triton", **common)
    off = dict(
        top_k=torch.zeros(batch, dtype=torch.int64, device=CUDA),
        top_p=torch.ones(batch, device=CUDA),
        min_p=torch.zeros(batch, device=CUDA),
    )
    assert torch.equal(fused_sample(hidden, weight, impl="triton", **common, **off), plain)
    rows = torch.arange(batch, device=CUDA)
    truncated = (rows % 3 == 0) & (rows >= (64 if batch > 64 else 0))
    off["top_k"][truncated & (rows % 2 == 0)] = 50
    off["top_p"][truncated] = 0.9
    off["min_p"][truncated & (rows % 2 == 1)] = 0.05
    tokens = fused_sample(hidden, weight, impl="triton", **common, **off)
    expected = fused_sample(hidden, weight, impl="torch", **common, **off)
    untruncated = ~truncated | (temperature == 0)
    assert torch.equal(tokens[untruncated], plain[untruncated])
    assert_pathwise_equal(
        tokens, expected, hidden, weight, temperature=temperature, seed=seed,
        logits_dtype=torch.bfloat16,
    )  # fmt: skip


@pytest.mark.parametrize(
    "batch, levers",
    [(64, "gluonpdl"), (100, "gluonpdl"), (1, "default"), (16, "default"), (64, "default"),
     (100, "default")],
)  # fmt: skip
def test_gpu_split_stage1_follows_the_knobs_set_between_graph_replays(batch, levers,
                                                                      monkeypatch):  # fmt: skip
    """Stage 1 of a call with per-row knobs that may be off is two launches, one of which
    runs its tiles, chosen on the device from the batch's knobs (``dispatch._split_stage1``).
    One CUDA graph, its knob tensors set in place between replays: all off (plain tokens),
    knobs on for greedy rows only (plain tokens), one row truncated, every row truncated
    (the reference's tokens each time); [B] and 0-d knobs. ``gluonpdl``: the Gluon kernel's
    halves as programmatic dependents (``dispatch.GLUON_SPLIT_PDL``)."""
    monkeypatch.setattr(dispatch, "GLUON_SPLIT_PDL", levers == "gluonpdl")
    hidden, weight = make_exact_problem(batch, VOCAB, 2048, device=CUDA)
    temperature = torch.tensor([0.7, 1.2, 0.0], device=CUDA).repeat(batch)[:batch]
    seed = torch.arange(batch, device=CUDA) * 7919 + 11
    common = dict(temperature=temperature, seed=seed, num_samples=2, logits_dtype=torch.bfloat16)
    plain = fused_sample(hidden, weight, impl="triton", **common)
    for zero_d in (False, True):
        shape = () if zero_d else (batch,)
        knobs = dict(
            top_k=torch.zeros(shape, dtype=torch.int64, device=CUDA),
            top_p=torch.ones(shape, device=CUDA),
            min_p=torch.zeros(shape, device=CUDA),
        )

        def step(knobs=knobs):
            return fused_sample(hidden, weight, impl="triton", **common, **knobs)

        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            step()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step()
        settings = [("off", {})]
        if not zero_d:
            greedy = temperature == 0
            settings += [
                ("greedy rows only", dict(top_k=torch.where(greedy, 5, 0))),
                ("row 0", dict(top_p=torch.where(torch.arange(batch, device=CUDA) == 0, 0.9, 1.0))),
            ]
        settings += [("all", dict(top_k=torch.full(shape, 50, device=CUDA)))]
        for name, values in settings:
            knobs["top_k"].zero_()
            knobs["top_p"].fill_(1.0)
            knobs["min_p"].zero_()
            for knob, value in values.items():
                knobs[knob].copy_(value)
            graph.replay()
            tokens = out.clone()
            if name in ("off", "greedy rows only"):
                assert torch.equal(tokens, plain), (name, zero_d)
            expected = fused_sample(hidden, weight, impl="torch", **common, **knobs)
            assert_pathwise_equal(
                tokens, expected, hidden, weight, temperature=temperature, seed=seed,
                logits_dtype=torch.bfloat16,
            )  # fmt: skip


@pytest.mark.parametrize("batch", [1, 64, 200])
@pytest.mark.parametrize(
    "knobs",
    [dict(top_k=20), dict(top_k=50), dict(top_k=256), dict(top_k=50, top_p=0.9),
     dict(top_k=2000)],
    ids=["k20", "k50", "k256", "k50-p09", "k2000"],
)  # fmt: skip
def test_gpu_scalar_top_k_matches_reference_pathwise(batch, knobs):
    """Scalar knobs, as generate passes them, with bf16 logits: each tile keeps its m = 3 to
    6 or 16 largest keys by one int32 max over keys packed with their column, stage 2 merges
    them per group of tiles (not for k = 2000), and the k-th key and nucleus searches skip
    the 16 low key bits that bf16 fixes. Exact logits (multiples of 1/32): heavy ties at
    every k-th value. The fused kernel draws the reference's tokens up to documented noise
    near-ties."""
    _assert_scalar_knobs_pathwise(batch, knobs, seed_offset=11)


@pytest.mark.parametrize("batch", [1, 16, 24, 64, 128])
@pytest.mark.parametrize(
    "knobs", [dict(top_p=0.9), dict(min_p=0.1), dict(top_k=50, top_p=0.9)],
    ids=["p09", "minp01", "k50-p09"],
)  # fmt: skip
@pytest.mark.parametrize(
    "levers", ["default", "one-bit-reduced-max", "topp9-before", "topp9-opt-ins"]
)
def test_gpu_scalar_top_p_min_p_match_reference_pathwise(batch, knobs, levers, monkeypatch):
    """Top-p alone (the whole row's mass from stage 1's partials), min-p and top-k + top-p
    as Python scalars with bf16 logits, at the batch sizes of both stage-1 kernels (Triton
    up to 16 rows, Gluon above; at 24 most of a Gluon tile lies past the batch): the
    reference's tokens up to documented noise near-ties, with the defaults and with the
    choices they replaced or that remain opt-ins: topp8's (the nucleus search one bit a
    pass, the Triton partials' own maximum), topp9's replaced (swap-AB tiles to 32 rows, the
    Gluon partials' own maximum, narrow MMAs and 64-row tiles at 65-128 rows, eight stage-2
    warps) and its opt-ins (256 slots for the heaviest merged candidates with the narrowed
    search, 128-row tiles for top-p alone). Exact logits
    (multiples of 1/32): ties everywhere."""
    if levers == "one-bit-reduced-max":
        monkeypatch.setattr(truncation_kernel, "NUCLEUS_NARROW", False)
        monkeypatch.setattr(sampling_kernel, "MASS_MAX_FROM_TOP_KEY", False)
    if levers == "topp9-before":
        monkeypatch.setattr(dispatch, "TRUNCATING_SWAP_ROWS_MAX", 32)
        monkeypatch.setattr(hopper_kernel, "MASS_MAX_FROM_TOP_KEY", False)
        monkeypatch.setattr(dispatch, "TRUNCATING_WIDE_MMA_65_128", False)
        monkeypatch.setattr(truncation_kernel, "STAGE2_WARPS_WITHOUT_TOP_K", 8)
        monkeypatch.setattr(dispatch, "TRUNCATING_TILE_ROWS_65_128", 64)
    if levers == "topp9-opt-ins":
        monkeypatch.setattr(truncation_kernel, "MERGED_COMPACT_SLOTS", 256)
        monkeypatch.setattr(truncation_kernel, "NUCLEUS_NARROW", True)
        monkeypatch.setattr(dispatch, "MASS_TILE_ROWS_65_128", 128)
    _assert_scalar_knobs_pathwise(batch, knobs, seed_offset=13)


@pytest.mark.parametrize("batch", [160, 224])
@pytest.mark.parametrize("knobs", [dict(top_p=0.9), dict(min_p=0.1)], ids=["p09", "minp01"])
def test_gpu_scalar_top_p_min_p_above_128_rows_match_reference_pathwise(batch, knobs):
    """Top-p and min-p alone as Python scalars at 129-256 rows: eight stage-2 warps above 128
    rows (STAGE2_WARPS_WITHOUT_TOP_K_ROWS_MAX) and, for top-p's mass partials, the Gluon
    kernel's 64-row wide tiles at 193-256 rows too (dispatch.MASS_TILE_ROWS_193_256): the
    reference's tokens up to documented noise near-ties."""
    _assert_scalar_knobs_pathwise(batch, knobs, seed_offset=17)


@pytest.mark.parametrize(
    "batch, vocab_size, knobs, with_bias",
    [
        (64, VOCAB, dict(top_k=50), False),
        (48, 50_001, dict(top_k=256, top_p=0.9), True),
        (100, VOCAB, dict(top_p=0.9), False),
        (64, 50_001, dict(min_p=0.1), True),
        (40, VOCAB, "per-row", False),
    ],
    ids=["k50", "k256-p09-odd-V-bias", "p09-B100", "min-p-odd-V-bias", "per-row"],
)
@pytest.mark.parametrize("logits_dtype", [None, torch.bfloat16], ids=["fp32", "bf16-logits"])
def test_gpu_hopper_kernel_truncating_epilogue(
    batch, vocab_size, knobs, with_bias, logits_dtype, monkeypatch
):
    """From 33 to 128 rows on Hopper the Gluon kernel's top-m epilogue writes the candidates
    (on bf16 logits packed keys, or whole ones for 4 slots on 64-row tiles:
    hopper_kernel.PACKED_TOP_M_MIN_64_ROWS; fp32 keys; mass partials for top-p without
    top-k, plain candidates beside them for rows per-row knobs leave untruncated, V not a
    multiple of its tiles, a bias). On exact logits (multiples of 1/32, heavy ties at every
    k-th value) the tokens are the reference's up to documented noise near-ties."""
    probe = torch.empty(128, 64, device=CUDA, dtype=torch.bfloat16)
    if not hopper_kernel.supported(probe, probe):
        pytest.skip("not a Hopper GPU with Gluon")
    epilogues = []
    launch_stage1 = hopper_kernel.launch_stage1

    def spy(*args, **kwargs):
        epilogues.append(kwargs.get("top_m", 0))
        return launch_stage1(*args, **kwargs)

    monkeypatch.setattr(hopper_kernel, "launch_stage1", spy)
    hidden, weight = make_exact_problem(batch, vocab_size, 2048, device=CUDA)
    bias = None
    if with_bias:  # (multiples of 1/32: the logits stay exact)
        bias = torch.randint(-64, 64, (vocab_size,), device=CUDA) / 32
    temperature = 0.8
    if knobs == "per-row":
        top_k, top_p, temperature = row_knobs(batch)
        knobs = dict(top_k=top_k, top_p=top_p)
    seed = torch.arange(batch, device=CUDA) * 7919 + 11
    arguments = dict(
        bias=bias, temperature=temperature, seed=seed, num_samples=2,
        logits_dtype=logits_dtype, **knobs,
    )  # fmt: skip
    tokens = fused_sample(hidden, weight, impl="triton", **arguments)
    expected = fused_sample(hidden, weight, impl="torch", **arguments)
    assert epilogues and max(epilogues) > 0  # (per-row knobs: the plain half first)
    assert_pathwise_equal(
        tokens, expected, hidden, weight, bias=bias, temperature=temperature, seed=seed,
        logits_dtype=logits_dtype,
    )  # fmt: skip


@pytest.mark.parametrize(
    "batch, lever",
    [(48, (hopper_kernel, "MASS_MAX_FROM_TOP_KEY")),
     (16, (sampling_kernel, "MASS_MAX_FROM_TOP_KEY"))],
    ids=["gluon-max-from-key", "triton-max-from-key"],
)  # fmt: skip
@pytest.mark.parametrize("logits_dtype", [None, torch.bfloat16], ids=["fp32", "bf16-logits"])
def test_gpu_mass_partials_levers_give_the_same_bits(batch, lever, logits_dtype, monkeypatch):
    """Top-p's mass partials with the Gluon kernel's (48 rows) tile maximum taken from the
    top-m search's largest key (``hopper_kernel.MASS_MAX_FROM_TOP_KEY``), or the Triton
    kernel's (16 rows, ``sampling_kernel.MASS_MAX_FROM_TOP_KEY``), are the same bits as
    without, and so are
    the tokens: a bias with -inf and NaN tokens, +-0 logits, a vocabulary that the tiles do
    not divide, a tile at -inf."""
    probe = torch.empty(128, 64, device=CUDA, dtype=torch.bfloat16)
    if lever[0] is hopper_kernel and not hopper_kernel.supported(probe, probe):
        pytest.skip("not a Hopper GPU with Gluon")
    vocab_size = 50_001
    hidden, weight = make_exact_problem(batch, vocab_size, 2048, device=CUDA)
    weight[5:9] = 0.0  # (+0 logits, and -0 through the bias below)
    bias = torch.zeros(vocab_size, device=CUDA)
    bias[7::11] = float("-inf")
    bias[3::17] = float("nan")
    bias[5] = -0.0
    bias[256:384] = float("-inf")  # (one whole 128-wide tile)
    masses = []

    def keep_mass(hidden, weight, bias, params, stage1, *args, **kwargs):
        if not isinstance(stage1["mass"], FakeTensor):  # (not a compile-ahead dry run)
            masses.append(stage1["mass"].clone())
        return finish(hidden, weight, bias, params, stage1, *args, **kwargs)

    finish = dispatch._finish_truncation
    monkeypatch.setattr(dispatch, "_finish_truncation", keep_mass)
    knobs = dict(temperature=0.7, top_p=0.9, seed=5, num_samples=2, logits_dtype=logits_dtype)
    monkeypatch.setattr(*lever, False)
    tokens = fused_sample(hidden, weight, bias=bias, impl="triton", **knobs)
    monkeypatch.setattr(*lever, True)
    again = fused_sample(hidden, weight, bias=bias, impl="triton", **knobs)
    assert torch.equal(again, tokens)
    assert len(masses) == 2 and torch.equal(masses[0], masses[1])
    assert masses[0][:, :, 0].isneginf().any()  # (the -inf tile)


def test_gpu_all_survivors_in_one_tile_take_the_exact_fallback():
    """A bias lifts 300 neighbouring tokens far above the rest, so one tile holds far more
    than m survivors of top-k 200: the row overflows and the fallback draws exactly (the
    reference's tokens), while the other rows stay on the candidates."""
    batch = 8
    hidden, weight = make_exact_problem(batch, VOCAB, 2048, device=CUDA)
    bias = torch.zeros(VOCAB, device=CUDA)
    bias[1000:1300] = 40.0
    arguments = dict(bias=bias, top_k=200, top_p=0.95, temperature=3.0, seed=5, num_samples=3)
    tokens = fused_sample(hidden, weight, impl="triton", **arguments)
    expected = fused_sample(hidden, weight, impl="torch", **arguments)
    assert_pathwise_equal(tokens, expected, hidden, weight, bias=bias, temperature=3.0, seed=5)
    assert bool(((tokens >= 1000) & (tokens < 1300)).all())


@pytest.mark.parametrize("batch", [16, 64])
@pytest.mark.parametrize("knobs", ["scalar-k", "k-tensor"])
def test_gpu_greedy_rows_whose_maximum_ties_in_one_group_draw_the_first(batch, knobs):
    """Greedy rows beside sampled ones in a truncating call without plain candidates: 101
    tokens from 1000 on and token 100000 tie at every row's maximum (zero weights, a bias
    of 40), more than a merged group of tiles keeps. The greedy rows draw token 1000, as
    argmax does (the fallback, flagged because a group hides the maximum), the sampled
    ones the reference's."""
    hidden, weight = make_exact_problem(batch, VOCAB, 2048, device=CUDA)
    weight[1000:1101] = 0
    weight[100000] = 0
    bias = torch.zeros(VOCAB, device=CUDA)
    bias[1000:1101] = 40.0
    bias[100000] = 40.0
    temperature = torch.tensor([0.0, 0.8], device=CUDA).repeat(batch // 2)
    seed = torch.arange(batch, device=CUDA) * 7919 + 11
    top_k = 50 if knobs == "scalar-k" else torch.full((batch,), 50, device=CUDA)
    arguments = dict(
        bias=bias, temperature=temperature, seed=seed, top_k=top_k, top_p=0.95, num_samples=2
    )
    tokens = fused_sample(hidden, weight, impl="triton", **arguments)
    assert bool((tokens[temperature == 0] == 1000).all()), tokens[temperature == 0]
    expected = fused_sample(hidden, weight, impl="torch", **arguments)
    assert_pathwise_equal(
        tokens, expected, hidden, weight, bias=bias, temperature=temperature, seed=seed
    )


@pytest.mark.parametrize(
    "rows, logits_dtype, top_k, top_p",
    [(256, None, 50, 0.9), (64, torch.bfloat16, 256, 1.0)],
    ids=["B256-fp32-k50-p09", "B64-bf16-k256"],
)
def test_gpu_truncated_draws_follow_float64_warpers(rows, logits_dtype, top_k, top_p):
    """2**24 draws of one row (V = 151936 real-size logits, repeated over rows with their
    own seeds) with top-k and top-p at T = 0.8 against transformers' warpers in float64:
    chi-square at level ALPHA over the kept tokens, power 0.9 against a 0.6% relative bias;
    no removed token drawn. At B = 64 with bf16 logits and top-k 256: stage 1's packed-key
    top-6 per tile, the merge per group of tiles and the searches that skip the 16 low key
    bits; at B = 256 fp32 keys, unmerged."""
    samples = 2**24 // rows
    n = rows * samples
    generator = torch.Generator().manual_seed(3)
    hidden = torch.randn(1, 2048, generator=generator).to(CUDA, torch.bfloat16)
    weight = (torch.randn(VOCAB, 2048, generator=generator) * 0.05).to(CUDA, torch.bfloat16)
    logits = (hidden.double() @ weight.double().T)[0].float()  # what the kernel must see
    if logits_dtype is not None:
        logits = logits.to(logits_dtype).float()
    target = warped_probabilities(logits.double().cpu(), 0.8, top_k, top_p)
    kept = target > 0
    assert chi_square_power(n, 0.006, int(kept.sum())) >= 0.9
    tokens = fused_sample(
        hidden.expand(rows, -1), weight, temperature=0.8, top_k=top_k, top_p=top_p,
        seed=torch.arange(rows, device=CUDA) + 1, num_samples=samples, logits_dtype=logits_dtype,
    )  # fmt: skip
    counts = torch.bincount(tokens.flatten(), minlength=VOCAB).double().cpu()
    assert counts[~kept].sum() == 0, counts[~kept].nonzero().flatten()[:10]
    p_value = stats.chisquare(counts[kept].numpy(), (target[kept] * n).numpy()).pvalue
    assert p_value > ALPHA, p_value


def test_gpu_truncated_sampling_under_cuda_graph_replays_fresh_draws():
    """Unseeded top-k + top-p captured in a CUDA graph: every replay draws new valid tokens
    (no host sync inside: capture would fail)."""
    hidden, weight = make_exact_problem(16, VOCAB, 2048, device=CUDA)
    top_k = torch.full((16,), 50, device=CUDA)

    def step():
        return fused_sample(hidden, weight, top_k=top_k, top_p=0.9, num_samples=4)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    graph.replay()
    first = out.clone()
    graph.replay()
    assert not torch.equal(first, out)
    assert bool(((out >= 0) & (out < VOCAB)).all())


def _assert_scalar_knobs_pathwise(batch, knobs, seed_offset):
    """Python-scalar ``knobs`` at T = 0.8 on bf16 logits of an exact problem (multiples of
    1/32: ties everywhere), two samples a row: the fused kernel draws the pure-torch
    reference's tokens up to documented noise near-ties."""
    hidden, weight = make_exact_problem(batch, VOCAB, 2048, device=CUDA)
    seed = torch.arange(batch, device=CUDA) * 7919 + seed_offset
    arguments = dict(
        temperature=0.8, seed=seed, num_samples=2, logits_dtype=torch.bfloat16, **knobs
    )
    tokens = fused_sample(hidden, weight, impl="triton", **arguments)
    expected = fused_sample(hidden, weight, impl="torch", **arguments)
    assert_pathwise_equal(
        tokens, expected, hidden, weight, temperature=0.8, seed=seed,
        logits_dtype=torch.bfloat16,
    )  # fmt: skip
