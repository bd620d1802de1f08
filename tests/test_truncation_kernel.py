"""The fused top-k / top-p / min-p path of the Triton kernel, under the interpreter on CPU.

Stage 1 keeps each tile's m largest scores, stage 2 selects among them and proves it saw
every kept token, and rows it cannot prove take the exact fallback. These tests draw on
small tiles so that both the candidate path and the fallback run, record which rows
overflowed, and require the contract's tokens (``test_truncation.contract_sample``) from
every row either way.
"""

from __future__ import annotations

import math

import pytest
import torch
import triton
import triton.language as tl

from flashsampling_inductor import fused_sample, truncation_kernel
from flashsampling_inductor.params import SamplingParams
from flashsampling_inductor.sampling_kernel import SampleConfig, triton_fused_sample

from .sampling_oracle import DEVICE, make_exact_problem
from .test_min_p_softcap import assert_margins, min_p_grid
from .test_truncation import contract_sample, exact_logits, per_row_grid

FULL = truncation_kernel.OVERFLOW_FULL.value
PATCH = truncation_kernel.OVERFLOW_PATCH.value


def masked_problem(batch: int):
    """Exact hidden / weight over V = 1000 with every 11th token masked by the bias, and
    per-row seeds."""
    hidden, weight = make_exact_problem(batch, 1000, 64)
    bias = torch.zeros(1000, device=DEVICE)
    bias[7::11] = float("-inf")
    seed = torch.arange(batch, device=DEVICE) * 7 + 3
    return hidden, weight, bias, seed


def tensor_knob(values, dtype):
    return torch.tensor(values, dtype=dtype, device=DEVICE)


@pytest.mark.parametrize(
    "config, codes",
    [
        pytest.param(SampleConfig(16, 16, 64), {0, FULL, PATCH}, id="16x16"),
        pytest.param(
            SampleConfig(32, 64, 32, swap_ab=False, epilogue_chunks=2), {0, PATCH}, id="32x64"
        ),
    ],
)
def test_candidates_and_fallback_match_the_contract(config, codes, overflowed):
    """The 24-row (k, p) grid of test_truncation (k in {1, 2, 20, 50, 200, V}, p in {0.5,
    0.9, 0.95, 1}, T in {0.7, 1.3, 0}), per-row seeds, two samples, a masked bias: every
    row draws the contract's tokens, through the candidates where they prove complete and
    through the fallback where not. On 16-wide tiles all three happen: a flagged row whose
    left-out keys reach its floor in at most 16 tiles has only those recomputed
    (OVERFLOW_PATCH), one with more its whole row (OVERFLOW_FULL)."""
    top_k, top_p, temperature = per_row_grid()
    batch = len(top_k)
    hidden, weight, bias, seed = masked_problem(batch)
    params = SamplingParams(temperature, 1.0, seed, 0, 2, None, top_k, 0, top_p, 1.0)
    tokens = triton_fused_sample(hidden, weight, bias, params, config)
    expected = contract_sample(
        exact_logits(hidden, weight, bias), temperature, top_k, top_p, seed, 2
    )
    assert torch.equal(tokens, expected)
    (flags,) = overflowed
    truncated = ((top_k < 1000) | (top_p < 1)).cpu() & (temperature > 0).cpu()
    assert bool(flags[truncated].any()) and not bool(flags[truncated].all()), flags
    assert not bool(flags[~truncated].any())
    assert set(flags.tolist()) == codes, flags


@pytest.mark.parametrize(
    "top_k, top_p",
    [(1, None), (2, None), (20, None), (50, 0.9), (200, 0.95), (None, 0.5), (999, None)],
)
def test_scalar_knobs_on_small_tiles(top_k, top_p, overflowed):
    """Python k / p (odd B, V = 1000, 16-wide tiles): the contract's tokens."""
    hidden, weight = make_exact_problem(5, 1000, 64, seed=3)
    params = SamplingParams(None, 0.9, None, 21, 3, None, None, top_k or 0, None, top_p or 1.0)
    tokens = triton_fused_sample(hidden, weight, None, params, SampleConfig(16, 16, 64))
    knob = torch.ones(5)
    expected = contract_sample(
        exact_logits(hidden, weight), knob.to(DEVICE) * 0.9, knob * (top_k or 0),
        knob * (top_p or 1.0), 21, 3,
    )  # fmt: skip
    assert torch.equal(tokens, expected)


ADVERSARIAL = {
    # every survivor in the first tile: it holds far more than m of them
    "top-k-in-one-tile": lambda logits: logits.index_fill_(1, torch.arange(40), 50.0),
    # a huge tie group at the k-th value, spread over every tile
    "ties-everywhere": lambda logits: logits.fill_(1.0).index_fill_(1, torch.arange(3), 2.0),
}


@pytest.mark.parametrize("layout", [*ADVERSARIAL, "few-finite"])
@pytest.mark.parametrize("logits_dtype", [None, torch.bfloat16], ids=["fp32", "bf16"])
def test_adversarial_layouts_take_the_fallback_exactly(layout, logits_dtype, overflowed):
    """Logits built so that a tile hides kept tokens (top-k 20 / top-p 0.9 on 16-wide
    tiles, m = 4): the flagged rows are resampled exactly; the others stay on the
    candidates. hidden = the logits, weight = I: the kernel's logits are exact. "few-finite":
    a bias leaves 5 finite tokens (fewer than k) in one tile, in every row."""
    batch, vocab = 3, 200
    logits = torch.linspace(-2, 2, batch * vocab).reshape(batch, vocab)
    bias = None
    if layout == "few-finite":
        bias = torch.full((vocab,), float("-inf"))
        bias[:5] = 0.0
    else:
        logits = ADVERSARIAL[layout](logits.clone())
        # An ordinary row in the batch: its 20 best tokens are every 10th, two a tile.
        logits[2] = -(torch.arange(vocab) % 10).float() + torch.arange(vocab) * 1e-3
    hidden, weight = logits.to(DEVICE), torch.eye(vocab, device=DEVICE)
    bias = None if bias is None else bias.to(DEVICE)
    params = SamplingParams(None, 1.0, None, 4, 2, logits_dtype, None, 20, None, 0.9)
    tokens = triton_fused_sample(hidden, weight, bias, params, SampleConfig(16, 16, 64))
    scores = logits if bias is None else logits + bias.cpu()
    scores = scores if logits_dtype is None else scores.to(logits_dtype).float()
    knob = torch.ones(batch)
    expected = contract_sample(scores.to(DEVICE), knob.to(DEVICE), knob * 20, knob * 0.9, 4, 2)
    assert torch.equal(tokens, expected)
    (flags,) = overflowed
    assert bool(flags[0]), flags
    # (a Python k up to 256 rarely overflows: a flagged row is recomputed whole, never
    # patched, so no call pays the patched pass's launch: truncation_kernel.patching_pays)
    assert PATCH not in set(flags.tolist()), flags
    if layout != "few-finite":
        assert not bool(flags[2]), flags


def test_k_beyond_the_candidates_is_exact():
    """k = 900 of V = 1000 (more than the candidates can prove on 256-wide tiles): exact."""
    hidden, weight = make_exact_problem(2, 1000, 64, seed=4)
    params = SamplingParams(None, 1.0, None, 8, 1, None, None, 900, None, 1.0)
    tokens = triton_fused_sample(hidden, weight, None, params)
    knob = torch.ones(2)
    expected = contract_sample(
        exact_logits(hidden, weight), knob.to(DEVICE), knob * 900, knob, 8, 1
    )
    assert torch.equal(tokens, expected)


@pytest.mark.parametrize("lanes", [None, 512], ids=["registers", "chunked"])
def test_min_p_and_top_p_alone_take_candidates_or_fallback_exactly(lanes, monkeypatch, overflowed):
    """The 20-row min-p grid of test_min_p_softcap (min_p in {0, 0.05, 0.1, 0.3, 1} after no
    truncation, top-p alone, top-k, top-k + top-p; T in {0.7, 1.3, 0}) on 16-wide tiles with
    m = 8 candidates each, per-row seeds, a masked bias, and a soft-cap of 2 (in stage 1 and
    in the fallback): the contract's tokens from every row, some through the candidates and
    some (many survivors: min_p 0.05 at T = 1.3 keeps most of the row) through the
    fallback. (One call: the interpreter takes ~15 s for it.) "chunked": stage 2 reads 512
    candidates (the fallback 512 tokens) at a time, as at V = 151936 on the GPU, and the
    fallback packs the tokens above a flagged row's floor where at most 512 are (two of the
    four flagged rows here, 352 and 415 tokens; the others search all 1000)."""
    if lanes:
        monkeypatch.setattr(truncation_kernel, "STAGE2_LANES", lanes)
    softcap = 2.0
    top_k, top_p, min_p, temperature = min_p_grid()
    batch = len(top_k)
    hidden, weight = make_exact_problem(batch, 1000, 64, seed=5)
    bias = torch.zeros(1000, device=DEVICE)
    bias[7::11] = float("-inf")
    scores = torch.tanh(exact_logits(hidden, weight, bias) / softcap) * softcap
    assert_margins(scores, temperature, top_k, top_p, min_p)
    seed = torch.arange(batch, device=DEVICE) * 5 + 1
    params = SamplingParams(
        temperature, 1.0, seed, 0, 2, None, top_k, 0, top_p, 1.0, min_p, 0.0, softcap
    )
    tokens = triton_fused_sample(hidden, weight, bias, params, SampleConfig(16, 16, 64))
    expected = contract_sample(scores, temperature, top_k, top_p, seed, 2, min_p.cpu())
    assert torch.equal(tokens, expected)
    (flags,) = overflowed
    min_p_rows = ((min_p > 0) & (top_k == 0) & (top_p == 1) & (temperature > 0)).cpu()
    assert bool(flags[min_p_rows].any()) and not bool(flags[min_p_rows].all()), flags
    assert not bool(flags[(temperature == 0).cpu()].any())


@pytest.mark.parametrize("knobs", [{"top_p": 0.9}, {"min_p": 0.1}], ids=["top-p", "min-p"])
def test_a_flat_row_takes_the_fallback_exactly(knobs, overflowed):
    """A flat row (every score equal up to 1e-3: top-p 0.9 and min-p 0.1 keep ~all of it)
    overflows every tile and is resampled exactly; a peaked row beside it stays on the
    candidates. hidden = the logits, weight = I."""
    vocab = 200
    flat = torch.arange(vocab).float() * 1e-3
    peaked = -(torch.arange(vocab) % 10).float() * 3 + torch.arange(vocab) * 1e-3
    logits = torch.stack([flat, peaked])
    params = SamplingParams(
        None, 1.0, None, 6, 2, None, None, 0, None, knobs.get("top_p", 1.0), None,
        knobs.get("min_p", 0.0),
    )  # fmt: skip
    tokens = triton_fused_sample(
        logits.to(DEVICE), torch.eye(vocab, device=DEVICE), None, params, SampleConfig(16, 16, 64)
    )
    knob = torch.ones(2)
    expected = contract_sample(
        logits.to(DEVICE), knob.to(DEVICE), knob * 0, knob * knobs.get("top_p", 1.0), 6, 2,
        knob * knobs.get("min_p", 0.0),
    )  # fmt: skip
    assert torch.equal(tokens, expected)
    (flags,) = overflowed
    assert (flags != 0).tolist() == [True, False]


@pytest.mark.parametrize(
    "knobs, wide",
    [
        ({"scalar_top_k": 50}, False),
        ({"scalar_top_k": 50, "scalar_top_p": 0.9}, False),
        ({"scalar_min_p": 0.1}, False),
        ({"scalar_top_p": 0.9}, False),
        ({"scalar_top_k": 1000, "top_p": torch.tensor([0.9, 1.0])}, False),
        ({"scalar_top_k": 2000}, True),
        ({"scalar_top_k": 2000, "scalar_top_p": 0.9}, True),
        ({"top_k": torch.tensor([50, 0])}, True),
        ({"top_k": torch.tensor([50, 0]), "scalar_top_p": 0.9}, False),
        ({}, False),
    ],
    ids=["top-k", "top-k+top-p", "min-p", "top-p", "k1000+p-tensor", "k2000", "k2000+top-p",
         "k-tensor", "k-tensor+top-p", "plain"],
)  # fmt: skip
def test_wide_tiles_only_where_stage2_does_not_merge(knobs, wide):
    """At B <= 32 on CUDA, a truncating call whose stage 2 merges its candidates per group of
    tiles keeps 64-wide tiles (the merge makes stage 2's size independent of the width);
    one that does not (k > 1024, per-row k) takes 128-wide tiles (half the candidates)
    unless top-p may run without top-k on some row: a nucleus of hundreds of tokens would
    overflow a 128-wide tile's 4 candidates far more often (sampling_kernel)."""
    from flashsampling_inductor.sampling_kernel import _wide_truncation_tiles

    params = SamplingParams(None, 1.0, None, 0, 1, **knobs)
    assert _wide_truncation_tiles(params, vocab_size=151936) is wide


@pytest.mark.parametrize("lanes", [64, 256])
def test_chunked_stage2_matches_the_contract(lanes, monkeypatch, overflowed):
    """Stage 2 reading its candidates (and the fallback its V tokens) in chunks, as the
    fallback does at V = 151936 on the GPU: forced here on a small vocabulary by lowering the
    register budget. Per-row k / p / T, two samples, a masked bias; rows on the candidates
    and rows through the fallback both draw the contract's tokens."""
    monkeypatch.setattr(truncation_kernel, "STAGE2_LANES", lanes)
    top_k = torch.tensor([1, 20, 50, 0, 20, 200], device=DEVICE)
    top_p = torch.tensor([1.0, 0.9, 1.0, 0.5, 0.95, 1.0], device=DEVICE)
    temperature = torch.tensor([0.7, 1.3, 0.0, 1.0, 0.7, 1.3], device=DEVICE)
    hidden, weight = make_exact_problem(6, 600, 64, seed=5)
    bias = torch.zeros(600, device=DEVICE)
    bias[5::13] = float("-inf")
    seed = torch.arange(6, device=DEVICE) * 5 + 1
    params = SamplingParams(temperature, 1.0, seed, 0, 2, None, top_k, 0, top_p, 1.0)
    tokens = triton_fused_sample(hidden, weight, bias, params, SampleConfig(16, 16, 64))
    expected = contract_sample(
        exact_logits(hidden, weight, bias), temperature, top_k, top_p, seed, 2
    )
    assert torch.equal(tokens, expected)
    (flags,) = overflowed
    assert bool(flags.any()), flags  # the chunked fallback ran too


@pytest.fixture
def merged(monkeypatch):
    """Stage 2 on small rows merging its candidates in groups of tiles (as at V = 151936,
    where 2374 tiles become 64 groups of 32): 4 groups of 8 here, each call recorded."""
    calls = []
    merge = truncation_kernel._merge

    def record(stage1, *rest):
        calls.append(stage1["hidden_key"].shape)
        return merge(stage1, *rest)

    monkeypatch.setattr(truncation_kernel, "_merge", record)
    monkeypatch.setattr(truncation_kernel, "MERGE_GROUPS", 4)
    monkeypatch.setattr(truncation_kernel, "MERGE_KEEP", 8)
    return calls


@pytest.mark.parametrize("logits_dtype", [None, torch.bfloat16], ids=["fp32", "bf16"])
def test_merged_groups_match_the_contract_for_top_k(logits_dtype, merged, overflowed):
    """Top-k 20 on every row with the per-row top-p and temperatures of the 24-row grid, per-row
    seeds, two samples, a masked bias: stage 2 sees each group's 3 largest candidates (k <= 64
    keeps half of MERGE_KEEP) and the group's hidden key, and draws the contract's tokens;
    rows with more than 3 survivors in a group take the fallback (both happen). With bf16
    logits the top-m, the merge's and stage 2's searches take the packed / 16-bit forms."""
    _, top_p, temperature = per_row_grid()
    batch = len(top_p)
    hidden, weight, bias, seed = masked_problem(batch)
    params = SamplingParams(temperature, 1.0, seed, 0, 2, logits_dtype, None, 20, top_p, 1.0)
    tokens = triton_fused_sample(hidden, weight, bias, params, SampleConfig(16, 16, 64))
    top_k = torch.full((batch,), 20, device=DEVICE)
    logits = exact_logits(hidden, weight, bias)
    if logits_dtype is not None:
        logits = logits.to(logits_dtype).float()
    expected = contract_sample(logits, temperature, top_k, top_p, seed, 2)
    assert torch.equal(tokens, expected)
    assert merged == [(batch, 63)]
    (flags,) = overflowed
    assert bool(flags.any()) and not bool(flags.all()), flags


def test_merged_groups_match_the_contract_for_top_p_and_min_p(merged, overflowed):
    """Top-p alone and min-p (per row, over the whole row: the groups' merged mass partials
    give top-p its total) with a soft-cap, per-row temperatures with greedy rows: the
    contract's tokens from every row, through the merged candidates or the fallback."""
    softcap = 2.0
    _, top_p, min_p, temperature = min_p_grid()
    batch = len(top_p)
    top_k = torch.zeros(batch, dtype=torch.int64, device=DEVICE)
    hidden, weight = make_exact_problem(batch, 1000, 64, seed=5)
    bias = torch.zeros(1000, device=DEVICE)
    bias[7::11] = float("-inf")
    scores = torch.tanh(exact_logits(hidden, weight, bias) / softcap) * softcap
    assert_margins(scores, temperature, top_k, top_p, min_p)
    seed = torch.arange(batch, device=DEVICE) * 5 + 1
    params = SamplingParams(
        temperature, 1.0, seed, 0, 2, None, None, 0, top_p, 1.0, min_p, 0.0, softcap
    )
    tokens = triton_fused_sample(hidden, weight, bias, params, SampleConfig(16, 16, 64))
    expected = contract_sample(scores, temperature, top_k, top_p, seed, 2, min_p.cpu())
    assert torch.equal(tokens, expected)
    assert merged == [(batch, 63)]
    (flags,) = overflowed
    assert not bool(flags.all()), flags


@pytest.mark.parametrize(
    "knobs, keep",
    [
        ({"scalar_top_k": 50}, 16),
        ({"scalar_top_k": 200}, 32),
        ({"scalar_top_k": 600, "scalar_top_p": 0.9}, 64),
        ({"scalar_top_k": 2000}, 0),
        ({"top_k": torch.tensor([50, 0])}, 0),
        ({"scalar_top_p": 0.9}, 32),
        ({"min_p": torch.tensor([0.1, 0.0])}, 32),
    ],
    ids=["k50", "k200", "k600", "k2000", "k-tensor", "top-p", "min-p"],
)
def test_merge_keeps_enough_candidates_per_group(knobs, keep):
    """Each of the 64 groups keeps 16 candidates up to k = 64, 32 up to k = 256 or without
    top-k, 64 from k = 257 (k / 64 survivors per group on average), and nothing merges past
    k = 1024 or with a per-row k of unknown size."""
    params = SamplingParams(None, 1.0, None, 0, 1, **knobs)
    assert truncation_kernel.merge_keep(params, vocab_size=151936) == keep


def test_more_flagged_rows_than_one_mma_holds_take_the_fallback_exactly(overflowed):
    """19 flat rows interleaved with 19 peaked ones, top-p 0.9: the fallback gathers the
    flagged rows 16 at a time (two MMA row groups, neither a block of adjacent rows) and
    every row draws the contract's tokens. hidden = the logits, weight = I."""
    vocab = 200
    ramp = torch.arange(vocab).float()
    rows = []
    for i in range(19):
        rows.append(ramp.roll(i) * 1e-3)  # flat
        rows.append(-((ramp + i) % 10) * 3 + ramp * 1e-3)  # peaked
    logits = torch.stack(rows).to(DEVICE)
    params = SamplingParams(None, 1.0, None, 6, 2, None, None, 0, None, 0.9)
    tokens = triton_fused_sample(
        logits, torch.eye(vocab, device=DEVICE), None, params, SampleConfig(16, 16, 64)
    )
    knob = torch.ones(len(rows))
    expected = contract_sample(logits, knob.to(DEVICE), knob * 0, knob * 0.9, 6, 2)
    assert torch.equal(tokens, expected)
    (flags,) = overflowed
    assert (flags != 0).tolist() == [True, False] * 19


@pytest.mark.parametrize(
    "num_tiles, top_m, block_v, patched",
    [(2374, 4, 64, True), (1187, 4, 128, True), (594, 4, 256, True), (2374, 8, 64, False)],
    ids=["64-wide", "128-wide", "256-wide", "m8-64-wide"],
)
def test_patching_only_where_a_patched_row_fits_the_registers(num_tiles, top_m, block_v, patched):
    """The tile-level fallback needs stage 1's candidates plus 16 recomputed tiles in one
    program's STAGE2_LANES lanes: CUDA's tiles at V = 151936 with m = 4 fit (10520, 6796,
    6472), m = 8 on 64-wide tiles (per-row k at B <= 32: 20016) does not, and such rows
    recompute the whole row instead."""
    keys = torch.empty((2, num_tiles * top_m), dtype=torch.int32)
    buffers = truncation_kernel.patch_buffers({"top_m_key": keys}, block_v)
    assert (buffers is not None) is patched
    if patched:
        assert buffers["keys"].shape == (2, truncation_kernel.PATCH_TILES * block_v)
        assert buffers["tiles"].is_contiguous() and buffers["index"].is_contiguous()


@triton.jit
def _searches(keys_ptr, weights_ptr, k_ptr, p_ptr, kth_ptr, nucleus_ptr, total,
              LOW_BITS: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    keys = tl.load(keys_ptr + tl.arange(0, BLOCK))
    weights = tl.load(weights_ptr + tl.arange(0, BLOCK))
    i = tl.program_id(0)
    k = tl.load(k_ptr + i)
    tl.store(kth_ptr + i, truncation_kernel._kth_key(keys, k, LOW_BITS, False))
    tl.store(kth_ptr + tl.num_programs(0) + i, truncation_kernel._kth_key(keys, k, LOW_BITS, True))
    nucleus = truncation_kernel._nucleus_bound(keys, weights, total, tl.load(p_ptr + i), LOW_BITS)
    tl.store(nucleus_ptr + i, nucleus)
    # The nucleus bound as the search over all 32 bits from KEY_PAD finds it.
    threshold = tl.load(p_ptr + i) * total
    one = tl.full((), 1, tl.int64)
    bound = tl.full((), truncation_kernel.KEY_PAD, tl.int32)
    for bit in range(32):
        trial = (bound.to(tl.int64) + (one << (31 - bit))).to(tl.int32)
        mass = tl.sum(tl.where(keys >= trial, weights, 0.0))
        bound = tl.where(mass >= threshold, trial, bound)
    tl.store(nucleus_ptr + tl.num_programs(0) + i, bound)


def _ordered_keys(values: torch.Tensor) -> torch.Tensor:
    """sampling_device.ordered_key on the host."""
    values = torch.where(values == values, values, float("-inf"))
    bits = torch.where(values == 0, 0.0, values).view(torch.int32)
    return torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


def _search(values: torch.Tensor, block: int, low_bits: int, ks, ps, row_mass: float = 1.0):
    """The k-th keys (searched one bit a pass, then narrowed: [2, len(ks)]) and the k-th
    largest keys, the nucleus bounds and the full 32-bit nucleus bounds of ``values``
    (padded to ``block`` lanes); the nucleus over a mass of row_mass times the values'."""
    keys = torch.full((block,), truncation_kernel.KEY_PAD.value, dtype=torch.int32)
    keys[: len(values)] = _ordered_keys(values)
    weights = torch.zeros(block)
    finite = values[values > float("-inf")]
    if len(finite):
        weights[: len(values)] = torch.where(
            values > float("-inf"), torch.exp(values - finite.max()), 0.0
        )
    ks = torch.tensor(ks, dtype=torch.int64)
    ps = torch.tensor(ps, dtype=torch.float32)
    kth = torch.empty(2 * len(ks), dtype=torch.int32)
    nucleus = torch.empty(2 * len(ks), dtype=torch.int32)
    _searches[(len(ks),)](
        keys, weights, ks, ps, kth, nucleus, float(weights.sum()) * row_mass,
        LOW_BITS=low_bits, BLOCK=block,
    )  # fmt: skip
    ordered = keys[: len(values)].sort(descending=True).values
    expected = torch.tensor(
        [int(ordered[k - 1]) if k <= len(values) else truncation_kernel.KEY_PAD.value for k in ks],
        dtype=torch.int32,
    )
    return kth.view(2, -1), expected, nucleus[: len(ks)], nucleus[len(ks) :]


@pytest.mark.parametrize("dtype, low_bits", [(torch.bfloat16, 16), (torch.float16, 13)])
def test_key_searches_skip_the_bits_the_logits_dtype_fixes(dtype, low_bits):
    """The k-th key and the nucleus bound over keys of bf16 / fp16 logits (ties, both signs,
    +-0, -inf, padding): stopped at key_low_bits, they equal the k-th largest key (KEY_PAD
    for k past the real ones) and the full 32-bit search."""
    gen = torch.Generator().manual_seed(0)
    values = (torch.randn(50, generator=gen) * 3).to(dtype).float()
    values[:6] = torch.tensor([0.0, -0.0, float("-inf"), float("-inf"), 1.5, 1.5])
    values[6:16] = values[16]  # a tie group
    ks = [1, 2, 7, 17, 48, 50, 51, 64]
    ps = [0.05, 0.3, 0.5, 0.9, 0.95, 0.999, 1.0, 0.7]
    for low in (0, low_bits):
        kth, expected, nucleus, full = _search(values, 64, low, ks, ps)
        assert torch.equal(kth[0], expected) and torch.equal(kth[1], expected), low
        assert torch.equal(nucleus, full), low


@pytest.mark.parametrize(
    "case", ["positive", "negative", "mixed", "one_octave", "few_real", "row_mass", "all_tied"]
)
@pytest.mark.parametrize("low_bits", [0, 13, 16])
def test_key_searches_are_exact_wherever_the_keys_lie(case, low_bits):
    """The k-th key searched one bit a pass and narrowed (started from the bits the smallest
    and the largest real key share, ``_search_start``, two bits a pass) is the k-th largest
    key, and the nucleus bound stopped at the dtype's low bits is the full 32-bit search's,
    on candidates within one octave, of one sign or both, few real ones among padding, a
    tie at every key, and a nucleus over a row mass the candidates hold only part of."""
    gen = torch.Generator().manual_seed(low_bits)
    dtype = {0: torch.float32, 13: torch.float16, 16: torch.bfloat16}[low_bits]
    draws = {
        "positive": torch.rand(200, generator=gen) * 20 + 0.5,
        "negative": -torch.rand(200, generator=gen) * 20 - 0.5,
        "mixed": torch.randn(200, generator=gen) * 6,
        "one_octave": torch.rand(200, generator=gen) + 8.0,
        "few_real": torch.rand(5, generator=gen) * 4 + 1.0,
        "row_mass": torch.randn(200, generator=gen) * 2 + 10.0,
        "all_tied": torch.full((200,), 3.25),
    }
    values = draws[case].to(dtype).float()
    ks = [1, 2, 3, 4, 5, 6, 50, 199, 200, 201]
    ps = [0.01, 0.1, 0.3, 0.5, 0.7, 0.9, 0.95, 0.99, 0.999, 1.0]
    row_mass = 1.7 if case == "row_mass" else 1.0
    kth, expected, nucleus, full = _search(values, 256, low_bits, ks, ps, row_mass)
    assert torch.equal(kth[0], expected) and torch.equal(kth[1], expected)
    assert torch.equal(nucleus, full)


@pytest.mark.parametrize(
    "top_k, block_v, batch, m",
    [(1, 64, 1, 1), (20, 64, 1, 2), (50, 64, 1, 3), (256, 64, 1, 4), (50, 64, 16, 3),
     (256, 64, 16, 5), (20, 128, 64, 3), (50, 128, 64, 4), (256, 128, 64, 6),
     (50, 256, 256, 5), (256, 256, 256, 8), (257, 64, 1, 8), (1024, 128, 64, 8)],
)  # fmt: skip
def test_candidates_per_tile_are_the_fewest_that_rarely_overflow(top_k, block_v, batch, m):
    """Up to k = 256 each tile keeps the fewest candidates with which at most one call in
    1000 has a row overflow at V = 151936 (one fewer slot exceeds that); larger k keep the
    table's."""
    vocab = 151936
    params = SamplingParams(None, 1.0, None, 0, 1, scalar_top_k=top_k)
    assert truncation_kernel.candidates_per_tile(params, block_v, vocab, batch) == m
    if top_k <= 256:
        assert batch * truncation_kernel.overflow_chance(top_k, block_v, vocab, m) <= 1e-3
        assert batch * truncation_kernel.overflow_chance(top_k, block_v, vocab, m - 1) > 1e-3


@pytest.mark.parametrize("top_k, m", [(1, 1), (2, 2), (20, 3)])
def test_fewest_candidates_draw_the_reference_tokens(top_k, m, monkeypatch):
    """At V = 151936 a one-row call keeps as few as 1-3 candidates a tile (the interpreter's
    256-wide tiles): still the reference's tokens, ties at the k-th value and all."""
    chosen = []
    choose = truncation_kernel.candidates_per_tile
    monkeypatch.setattr(
        truncation_kernel, "candidates_per_tile", lambda *a: chosen.append(choose(*a)) or chosen[-1]
    )
    gen = torch.Generator().manual_seed(0)
    weight = (torch.randn(151936, 16, generator=gen) * 0.5).to(torch.bfloat16).to(DEVICE)
    hidden = torch.randn(1, 16, generator=gen).to(torch.bfloat16).to(DEVICE)
    params = SamplingParams(
        None, 0.8, torch.tensor(123, device=DEVICE), 0, 8, torch.bfloat16, scalar_top_k=top_k
    )
    tokens = triton_fused_sample(hidden, weight, None, params, SampleConfig(16, 256, 64))
    assert chosen == [m]
    expected = fused_sample(
        hidden, weight, temperature=0.8, top_k=top_k, seed=params.seed, num_samples=8,
        logits_dtype=torch.bfloat16, impl="torch",
    )  # fmt: skip
    assert torch.equal(tokens, expected)


@pytest.mark.parametrize("vocab, block_v", [(16, 16), (200, 16), (1000, 64)])
def test_small_vocabularies_keep_the_tables_candidates(vocab, block_v):
    """Where most tiles hold several of the k survivors, no m below the table's rarely
    overflows: the table's stays (the chance is computed without underflowing to 0)."""
    params = SamplingParams(None, 1.0, None, 0, 1, scalar_top_k=50)
    assert truncation_kernel.overflow_chance(50, block_v, vocab, 3) > 0.5
    assert truncation_kernel.candidates_per_tile(params, block_v, vocab, 1) == 4


@pytest.mark.parametrize("top_k", [1, 20, 50, 64, 65, 128, 256, 257, 600, 1024])
def test_merge_groups_rarely_hold_their_keep_of_the_survivors(top_k):
    """A group overflows when it holds merge_keep of the row's k survivors (spread at random:
    binomial over the groups); with the groups and slots chosen per k that stays < 1e-8."""
    params = SamplingParams(None, 1.0, None, 0, 1, scalar_top_k=top_k)
    groups = truncation_kernel.merge_groups(params)
    keep = truncation_kernel.merge_keep(params, vocab_size=151936)
    assert groups == (32 if 64 < top_k <= 256 else 64)
    share = 1.0 / groups
    tail = sum(
        math.comb(top_k, i) * share**i * (1 - share) ** (top_k - i) for i in range(keep, top_k + 1)
    )
    assert tail * groups < 1e-8, (groups, keep, tail)


@pytest.mark.parametrize("batch", [1, 256])
@pytest.mark.parametrize("block_v", [64, 128, 256])
@pytest.mark.parametrize("top_k", [1, 50, 64, 65, 200, 256, 257, 1024])
def test_wider_tiles_keep_more_candidates_per_tile(block_v, top_k, batch):
    """m grows with the tile's width, so that a row's chance to overflow (some tile holding
    more than m of its k survivors, spread at random: Poisson) stays <= 1e-3 a call up to
    k = 256 (or, where the table caps m at B = 256, ~4e-6 a row) and ~5e-4 a row up to
    k = 1024 at V = 151936 on every tile width the kernels use."""
    vocab = 151936
    params = SamplingParams(None, 1.0, None, 0, 1, scalar_top_k=top_k)
    m = truncation_kernel.candidates_per_tile(params, block_v, vocab, batch)
    mean = top_k * block_v / vocab
    # P(X > m) for X ~ Poisson(mean), per tile, then over the row's tiles
    tail = 1.0 - sum(math.exp(-mean) * mean**i / math.factorial(i) for i in range(m + 1))
    per_row = tail * triton.cdiv(vocab, block_v)
    bound = max(1e-3 / batch, 5e-6) if top_k <= 256 else 5e-4
    assert per_row <= bound, (m, per_row)
