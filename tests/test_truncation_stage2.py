"""Stage 2 of the fused top-k / top-p / min-p path, under the interpreter on CPU: min-p and
top-p alone, stage 2 reading its candidates in chunks, merging them per group of tiles, and
patching a flagged row's tiles.

As in test_truncation_candidates.py: small tiles so that both the candidates and the
fallback run, the overflow flags recorded, and the contract's tokens
(``test_truncation.contract_sample``) required from every row.
"""

from __future__ import annotations

import pytest
import torch

from flashsampling_inductor import dispatch, truncation_kernel
from flashsampling_inductor.dispatch import SampleConfig, triton_fused_sample
from flashsampling_inductor.params import SamplingParams

from .sampling_oracle import DEVICE, make_exact_problem
from .test_min_p_softcap import assert_margins, min_p_grid
from .test_truncation import contract_sample, exact_logits, per_row_grid
from .test_truncation_candidates import masked_problem


@pytest.mark.parametrize("lanes", [None, 512], ids=["registers", "chunked"])
def test_min_p_and_top_p_alone_take_candidates_or_fallback_exactly(lanes, monkeypatch, overflowed):
    """The 20-row min-p grid of test_min_p_softcap (min_p in {0, 0.05, 0.1, 0.3, 1} after no
    truncation, top-p alone, top-k, top-k + top-p; T in {0.7, 1.3, 0}) on 16-wide tiles with
    m = 8 candidates each, per-row seeds, a masked bias, and a soft-cap of 2 (in stage 1 and
    in the fallback): the contract's tokens from every row, some through the candidates and
    some (many survivors: min_p 0.05 at T = 1.3 keeps most of the row) through the
    fallback. (One call on 32-row tiles, one program a vocabulary tile: the interpreter's
    cost is per program.) "chunked": stage 2 reads 512
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
    tokens = triton_fused_sample(hidden, weight, bias, params, SampleConfig(32, 16, 64))
    expected = contract_sample(scores, temperature, top_k, top_p, seed, 2, min_p.cpu())
    assert torch.equal(tokens, expected)
    (flags,) = overflowed
    min_p_rows = ((min_p > 0) & (top_k == 0) & (top_p == 1) & (temperature > 0)).cpu()
    assert bool(flags[min_p_rows].any()) and not bool(flags[min_p_rows].all()), flags
    assert not bool(flags[(temperature == 0).cpu()].any())


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
    monkeypatch.setattr(dispatch, "MERGE_GROUPS", 4)
    monkeypatch.setattr(dispatch, "MERGE_KEEP", 8)
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
    tokens = triton_fused_sample(hidden, weight, bias, params, SampleConfig(32, 16, 64))
    top_k = torch.full((batch,), 20, device=DEVICE)
    logits = exact_logits(hidden, weight, bias)
    if logits_dtype is not None:
        logits = logits.to(logits_dtype).float()
    expected = contract_sample(logits, temperature, top_k, top_p, seed, 2)
    assert torch.equal(tokens, expected)
    assert merged == [(batch, 63)]
    (flags,) = overflowed
    assert bool(flags.any()) and not bool(flags.all()), flags


@pytest.mark.parametrize(
    "compact_slots, narrow", [(None, True), (16, False), (16, True)],
    ids=["default", "compact16-one-bit", "compact16-narrow"],
)  # fmt: skip
def test_merged_groups_match_the_contract_for_top_p_and_min_p(
    compact_slots, narrow, merged, overflowed, monkeypatch
):
    """Top-p alone and min-p (per row, over the whole row: the groups' merged mass partials
    give top-p its total) with a soft-cap, per-row temperatures with greedy rows: the
    contract's tokens from every row, through the merged candidates or the fallback.
    "compact16-": 16 slots for the 32 merged candidates (``MERGED_COMPACT_SLOTS``), so top-p
    searches and draws on the heaviest ones where they hold p of the mass, min-p on its
    kept ones where they fit; "-narrow": the nucleus searched from the candidates' key
    range (``NUCLEUS_NARROW``, the default), else one bit a pass."""
    if compact_slots:
        monkeypatch.setattr(truncation_kernel, "MERGED_COMPACT_SLOTS", compact_slots)
    monkeypatch.setattr(truncation_kernel, "NUCLEUS_NARROW", narrow)
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


@pytest.mark.parametrize("narrow", [False, True], ids=["one-bit", "narrow"])
def test_merged_top_p_alone_on_the_heaviest_candidates(narrow, merged, overflowed, monkeypatch):
    """A Python p alone on peaked rows (T = 0.25) from 32 merged candidates with 16 slots
    (``MERGED_COMPACT_SLOTS``): where the heaviest 16 hold p of the mass, stage 2 searches
    the nucleus and draws on them alone (``_top_p_bound``'s pruning), with the narrowed
    search or one bit a pass; every row draws the contract's tokens."""
    monkeypatch.setattr(truncation_kernel, "MERGED_COMPACT_SLOTS", 16)
    monkeypatch.setattr(truncation_kernel, "NUCLEUS_NARROW", narrow)
    batch = 6
    hidden, weight, bias, seed = masked_problem(batch)
    params = SamplingParams(None, 0.25, seed, 0, 2, None, None, 0, None, 0.9)
    tokens = triton_fused_sample(hidden, weight, bias, params, SampleConfig(32, 16, 64))
    logits = exact_logits(hidden, weight, bias)
    temperature = torch.full((batch,), 0.25, device=DEVICE)
    expected = contract_sample(
        logits, temperature, torch.zeros(batch), torch.full((batch,), 0.9), seed, 2
    )
    assert torch.equal(tokens, expected)
    assert merged == [(batch, 63)]


@pytest.mark.parametrize("route_k_max", [0, 20, 1000], ids=["k-off", "k20", "every-k"])
def test_per_row_k_rows_take_the_merged_or_the_per_tile_candidates_exactly(
    route_k_max, merged, overflowed, monkeypatch
):
    """A per-row k tensor (the 24-row grid: k in {1, 2, 20, 50, 200, off} x p in {0.5, 0.9,
    0.95, 1}, greedy rows, untruncated rows drawn from the plain candidates) with its rows
    routed on the device: those whose k is at most MERGE_ROUTE_K_MAX, or off (top-p alone),
    from the merged groups (4 of 8 here), the others from stage 1's per-tile candidates. Every
    row draws the contract's tokens whichever route it takes; with every k merged, the rows
    of k = 200 (more survivors than 4 groups hold) all take the fallback."""
    monkeypatch.setattr(dispatch, "MERGE_ROUTE_K_MAX", route_k_max)
    top_k, top_p, temperature = per_row_grid()
    batch = len(top_k)
    hidden, weight, bias, seed = masked_problem(batch)
    params = SamplingParams(temperature, 1.0, seed, 0, 2, None, top_k, 0, top_p, 1.0)
    tokens = triton_fused_sample(hidden, weight, bias, params, SampleConfig(32, 16, 64))
    expected = contract_sample(
        exact_logits(hidden, weight, bias), temperature, top_k, top_p, seed, 2
    )
    assert torch.equal(tokens, expected)
    assert merged == [(batch, 63)]
    (flags,) = overflowed
    sampled = (temperature > 0).cpu()
    assert not bool(flags[~sampled | ((top_k == 1000) & (top_p == 1)).cpu()].any()), flags
    if route_k_max == 1000:
        assert bool(flags[sampled & (top_k == 200).cpu()].all()), flags


@pytest.mark.parametrize(
    "knobs",
    [dict(top_k=0, top_p=1.0, min_p=0.0), dict(top_k=5, top_p=1.0, min_p=0.0),
     dict(top_k=300, top_p=0.9, min_p=0.0), dict(top_k=0, top_p=0.9, min_p=0.1)],
    ids=["off", "k5", "k300-p", "p-min-p"],
)  # fmt: skip
def test_zero_d_knobs_take_one_route_for_the_batch_exactly(knobs, merged, monkeypatch):
    """0-d knobs as generate passes them (every knob a tensor, at its off value when off), a
    0-d temperature of 0.7: off-valued ones draw the plain call's tokens, the others the
    contract's, through the merged groups (k 5, top-p and min-p) or the per-tile candidates
    (k 300 > MERGE_ROUTE_K_MAX, lowered to 20 here)."""
    monkeypatch.setattr(dispatch, "MERGE_ROUTE_K_MAX", 20)
    batch = 4
    hidden, weight, bias, _ = masked_problem(batch)
    temperature = torch.tensor(0.7, device=DEVICE)
    seed = torch.tensor(11, device=DEVICE)
    tensors = {
        name: torch.tensor(value, dtype=torch.int64 if name == "top_k" else None, device=DEVICE)
        for name, value in knobs.items()
    }
    params = SamplingParams(
        temperature, 1.0, seed, 0, 2, None, tensors["top_k"], 0, tensors["top_p"], 1.0,
        tensors["min_p"], 0.0,
    )  # fmt: skip
    tokens = triton_fused_sample(hidden, weight, bias, params, SampleConfig(32, 16, 64))
    rows = torch.full((batch,), 1, device=DEVICE)
    expected = contract_sample(
        exact_logits(hidden, weight, bias), rows * 0.7, rows * knobs["top_k"],
        rows * knobs["top_p"], seed, 2, (rows * knobs["min_p"]).cpu(),
    )  # fmt: skip
    assert torch.equal(tokens, expected)
    assert merged == [(batch, 63)]


@pytest.mark.parametrize("knobs", ["scalar-k", "k-tensor"])
def test_greedy_rows_whose_maximum_a_group_hides_take_the_fallback(knobs, merged, overflowed):
    """A greedy row (T = 0 beside a sampled one) in a truncating call without plain
    candidates: its maximum ties 21 times in the first group (more than the group keeps)
    and once more at token 500, so the merged candidates hold only the later one. The row
    is flagged and the fallback draws the lowest index of the ties, as argmax does (before,
    stage 2 drew 500)."""
    hidden = torch.zeros(2, 64, device=DEVICE)
    hidden[:, 0] = 1.0
    generator = torch.Generator().manual_seed(0)
    weight = torch.randint(-8, 8, (1000, 64), generator=generator).float() / 32
    weight[:, 0] = torch.randint(-64, 0, (1000,), generator=generator).float() / 32
    weight[40:61, 0] = 1.0
    weight[500, 0] = 1.0
    weight = weight.to(DEVICE)
    temperature = torch.tensor([0.0, 0.7], device=DEVICE)
    seed = torch.tensor([1, 2], device=DEVICE)
    if knobs == "scalar-k":
        params = SamplingParams(temperature, 1.0, seed, 0, 1, None, None, 50, None, 1.0)
    else:  # (a scalar top-p: no row may be untruncated, so no plain candidates)
        top_k = torch.tensor([50, 50], device=DEVICE)
        params = SamplingParams(temperature, 1.0, seed, 0, 1, None, top_k, 0, None, 0.9)
    tokens = triton_fused_sample(hidden, weight, None, params, SampleConfig(16, 16, 64))
    assert int(tokens[0, 0]) == 40
    assert merged
    (flags,) = overflowed
    assert int(flags[0]) != 0, flags


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
