"""The sizes the truncating kernel picks on the host: candidates per tile, merge groups and
their keep, tile widths; each against the overflow chance it must keep rare."""

from __future__ import annotations

import math

import pytest
import torch
import triton

from flashsampling_inductor import dispatch
from flashsampling_inductor.params import SamplingParams


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
        ({"top_k": torch.tensor([50, 0])}, False),
        ({"top_k": torch.tensor([50, 0]), "scalar_top_p": 0.9}, False),
        ({}, False),
    ],
    ids=["top-k", "top-k+top-p", "min-p", "top-p", "k1000+p-tensor", "k2000", "k2000+top-p",
         "k-tensor", "k-tensor+top-p", "plain"],
)  # fmt: skip
def test_wide_tiles_only_where_stage2_does_not_merge(knobs, wide):
    """At B <= 32 on CUDA, a truncating call whose stage 2 merges its candidates per group of
    tiles (a per-row k tensor too: its rows up to k = 256 take the merged candidates) keeps
    64-wide tiles (the merge makes stage 2's size independent of the width); one that does
    not (k > 1024) takes 128-wide tiles (half the candidates)
    unless top-p may run without top-k on some row: a nucleus of hundreds of tokens would
    overflow a 128-wide tile's 4 candidates far more often (dispatch)."""
    from flashsampling_inductor.dispatch import _wide_truncation_tiles

    params = SamplingParams(None, 1.0, None, 0, 1, **knobs)
    assert _wide_truncation_tiles(params, vocab_size=151936) is wide


@pytest.mark.parametrize(
    "knobs, keep",
    [
        ({"scalar_top_k": 50}, 16),
        ({"scalar_top_k": 200}, 32),
        ({"scalar_top_k": 600, "scalar_top_p": 0.9}, 64),
        ({"scalar_top_k": 2000}, 0),
        ({"top_k": torch.tensor([50, 0])}, 32),
        ({"scalar_top_p": 0.9}, 32),
        ({"min_p": torch.tensor([0.1, 0.0])}, 32),
    ],
    ids=["k50", "k200", "k600", "k2000", "k-tensor", "top-p", "min-p"],
)
def test_merge_keeps_enough_candidates_per_group(knobs, keep):
    """Each of the 64 groups keeps 16 candidates up to k = 64, 32 up to k = 256 or without
    top-k, 64 from k = 257 (k / 64 survivors per group on average), and nothing merges past
    k = 1024. A per-row k tensor keeps 32 for the rows up to k = 512 (the others take the
    per-tile candidates: no route without such a tensor)."""
    params = SamplingParams(None, 1.0, None, 0, 1, **knobs)
    assert dispatch.merge_keep(params, vocab_size=151936) == keep
    routed = params.top_k is not None
    assert dispatch.merge_route_k_max(params) == (512 if routed else None)


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
    assert dispatch.candidates_per_tile(params, block_v, vocab, batch) == m
    if top_k <= 256:
        assert batch * dispatch.overflow_chance(top_k, block_v, vocab, m) <= 1e-3
        assert batch * dispatch.overflow_chance(top_k, block_v, vocab, m - 1) > 1e-3


def test_a_per_row_k_tensor_keeps_the_fewest_candidates_its_merged_rows_rarely_overflow():
    """A per-row k tensor (any size) keeps 8 candidates per 128-wide tile and 5 per 64-wide
    one: on the narrow tiles the fewest with which a row up to k = MERGE_ROUTE_K_MAX (512,
    the rows stage 2 draws from the merged candidates) overflows with chance < 1e-3 at V =
    151936; on the wide ones a row of k = 1024 does."""
    vocab = 151936
    params = SamplingParams(None, 1.0, None, 0, 1, top_k=torch.zeros(4, dtype=torch.int64))
    wide = dispatch.candidates_per_tile(params, 128, vocab, 4)
    narrow = dispatch.candidates_per_tile(params, 64, vocab, 4)
    assert (wide, narrow) == (8, 5)
    route_k_max = dispatch.merge_route_k_max(params)
    assert dispatch.overflow_chance(route_k_max, 64, vocab, narrow) < 1e-3
    assert dispatch.overflow_chance(route_k_max, 64, vocab, narrow - 1) > 1e-3
    assert dispatch.overflow_chance(1024, 128, vocab, wide) < 1e-3


@pytest.mark.parametrize("vocab, block_v", [(16, 16), (200, 16), (1000, 64)])
def test_small_vocabularies_keep_the_tables_candidates(vocab, block_v):
    """Where most tiles hold several of the k survivors, no m below the table's rarely
    overflows: the table's stays (the chance is computed without underflowing to 0)."""
    params = SamplingParams(None, 1.0, None, 0, 1, scalar_top_k=50)
    assert dispatch.overflow_chance(50, block_v, vocab, 3) > 0.5
    assert dispatch.candidates_per_tile(params, block_v, vocab, 1) == 4


@pytest.mark.parametrize("top_k", [1, 20, 50, 64, 65, 128, 256, 257, 600, 1024])
def test_merge_groups_rarely_hold_their_keep_of_the_survivors(top_k):
    """A group overflows when it holds merge_keep of the row's k survivors (spread at random:
    binomial over the groups); with the groups and slots chosen per k that stays < 1e-8."""
    params = SamplingParams(None, 1.0, None, 0, 1, scalar_top_k=top_k)
    groups = dispatch.merge_groups(params)
    keep = dispatch.merge_keep(params, vocab_size=151936)
    assert groups == (32 if 64 < top_k <= 256 else 64)
    share = 1.0 / groups
    tail = sum(
        math.comb(top_k, i) * share**i * (1 - share) ** (top_k - i) for i in range(keep, top_k + 1)
    )
    assert tail * groups < 1e-8, (groups, keep, tail)


def test_a_per_row_k_tensor_merges_only_the_rows_whose_survivors_the_groups_hold():
    """A per-row k tensor's rows take the merged candidates up to k = MERGE_ROUTE_K_MAX
    (512): a group then holds merge_keep of the row's survivors (spread at random: binomial
    over the groups) with chance < 1e-8 a row, as for a Python k; at twice that k it would
    be > 1e-3, so larger k keep stage 1's per-tile candidates."""
    params = SamplingParams(None, 1.0, None, 0, 1, top_k=torch.zeros(4, dtype=torch.int64))
    groups = dispatch.merge_groups(params)
    keep = dispatch.merge_keep(params, vocab_size=151936)
    route_k_max = dispatch.merge_route_k_max(params)

    def row_overflow(top_k):
        share = 1.0 / groups
        tail = sum(
            math.comb(top_k, i) * share**i * (1 - share) ** (top_k - i)
            for i in range(keep, top_k + 1)
        )
        return tail * groups

    assert (groups, keep, route_k_max) == (64, 32, 512)
    assert row_overflow(route_k_max) < 1e-8
    assert row_overflow(2 * route_k_max) > 1e-3


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
    m = dispatch.candidates_per_tile(params, block_v, vocab, batch)
    mean = top_k * block_v / vocab
    # P(X > m) for X ~ Poisson(mean), per tile, then over the row's tiles
    tail = 1.0 - sum(math.exp(-mean) * mean**i / math.factorial(i) for i in range(m + 1))
    per_row = tail * triton.cdiv(vocab, block_v)
    bound = max(1e-3 / batch, 5e-6) if top_k <= 256 else 5e-4
    assert per_row <= bound, (m, per_row)


@pytest.mark.parametrize(
    "knobs, served",
    [
        ({"top_k": torch.tensor(0), "top_p": torch.tensor(1.0), "min_p": torch.tensor(0.0)}, True),
        ({"top_k": torch.tensor(50), "top_p": torch.tensor(1.0)}, True),
        ({"top_k": torch.tensor([50, 0]), "top_p": torch.tensor([0.9, 1.0])}, True),
        ({"scalar_top_k": 50}, False),
        ({"scalar_top_p": 0.9, "top_k": torch.tensor(0)}, False),
        ({"scalar_min_p": 0.1}, False),
        ({"scalar_top_k": 151936, "top_p": torch.tensor(0.9)}, True),
    ],
    ids=["generate-off", "generate-k50", "rows", "k50", "p0.9", "min-p", "k-off+p-tensor"],
)  # fmt: skip
def test_swapped_kernel_serves_knobs_that_may_be_off(knobs, served, monkeypatch):
    """At 129-256 rows the swapped Gluon stage 1 takes truncating calls whose knobs may leave
    every row untruncated (tensors, as generate and continuous batching pass them: it chooses
    its epilogues on the device), not those that truncate every row (a scalar k < V, p < 1
    or min-p > 0), unless SWAP_TRUNCATING asks for them too; none with SWAP_KNOBS off."""
    params = SamplingParams(None, 1.0, None, 0, 1, **knobs)
    assert dispatch.swap_serves_knobs(params, vocab_size=151936) is served
    monkeypatch.setattr(dispatch, "SWAP_KNOBS", False)
    assert not dispatch.swap_serves_knobs(params, vocab_size=151936)
    monkeypatch.setattr(dispatch, "SWAP_TRUNCATING", True)
    assert dispatch.swap_serves_knobs(params, vocab_size=151936)


@pytest.mark.parametrize("hidden_size", [2048, 4096, 8192])
@pytest.mark.parametrize("batch", [65, 129, 144, 160, 192, 224, 256])
def test_knobs_that_may_be_off_take_a_gluon_stage1_on_hopper(batch, hidden_size, monkeypatch):
    """On Hopper, above 64 rows, knob tensors that may be off (both epilogues) take the Gluon
    kernel's 64-row tiles or the swapped kernel (up to 160 rows at D <= 4096), never the
    persistent Triton tiles alone, which spill with both (3.7-6.6x of cuBLAS); off Hopper
    their tiles are the plain call's."""
    cuda = torch.device("cuda")
    monkeypatch.setattr(dispatch, "is_hopper", lambda device: True)
    hopper = dispatch.default_config(batch, hidden_size, cuda, True, 151936, True)
    assert hopper.warp_specialized_rows == 64
    swapped = batch > 128 and hidden_size <= 4096 and batch <= 160
    assert hopper.warp_specialized_swap == ("ping-pong" if swapped else "")
    plain = dispatch.default_config(batch, hidden_size, cuda, False, 151936)
    plain_swaps = batch > 128 and (hidden_size <= 4096 or batch <= 192)
    plain_swaps &= not (batch > 192 and hidden_size == 4096)  # (_large_batch_gluon_rows)
    wide_tiles = batch <= 192 and (hidden_size > 4096 or batch <= 144)  # (swap_wide_tiles)
    schedule = "ping-pong-wide" if wide_tiles else "ping-pong"
    assert plain.warp_specialized_swap == (schedule if plain_swaps else "")
    monkeypatch.setattr(dispatch, "is_hopper", lambda device: False)
    other = dispatch.default_config(batch, hidden_size, cuda, True, 151936, True)
    assert other == dispatch.default_config(batch, hidden_size, cuda, True, 151936)


@pytest.mark.parametrize("hidden_size", [2048, 4096, 8192])
@pytest.mark.parametrize("batch", [1, 16, 17, 32, 33, 64, 65, 96, 128])
def test_truncating_calls_up_to_128_rows_on_hopper(batch, hidden_size, monkeypatch):
    """On Hopper (elsewhere as before), calls whose knobs truncate every row take the swap-AB
    Triton tiles up to 16 rows (TRUNCATING_SWAP_ROWS_MAX), the Gluon kernel's 64-row tiles
    from 17 rows, with its wide MMA at 65-128 rows over a whole vocabulary
    (TRUNCATING_WIDE_MMA_65_128) on 128-row tiles there, 64-row ones where stage 1 writes
    top-p's mass partials (MASS_TILE_ROWS_65_128); knob tensors that may be off, and plain
    calls, keep swap-AB up to 32 rows and narrow MMAs."""
    cuda = torch.device("cuda")
    monkeypatch.setattr(dispatch, "is_hopper", lambda device: True)
    truncating = dispatch.default_config(batch, hidden_size, cuda, True, 151936)
    assert truncating.swap_ab == (batch <= 16)
    assert truncating.warp_specialized_rows == (0 if batch <= 16 else 64 if batch <= 64 else 128)
    assert truncating.wide_mma == (batch > 64)
    top_p = dispatch.default_config(batch, hidden_size, cuda, True, 151936, mass_partials=True)
    assert top_p.warp_specialized_rows == (0 if batch <= 16 else 64)
    assert top_p.wide_mma == (batch > 64)
    shard = dispatch.default_config(batch, hidden_size, cuda, True, 37984)
    assert not shard.wide_mma
    knobs = dispatch.default_config(batch, hidden_size, cuda, True, 151936, True)
    assert knobs.swap_ab == (batch <= 32) and not knobs.wide_mma
    plain = dispatch.default_config(batch, hidden_size, cuda, False, 151936)
    assert plain.swap_ab == (batch <= 32) and plain.wide_mma == (batch > 64)  # (test below)
    monkeypatch.setattr(dispatch, "is_hopper", lambda device: False)
    elsewhere = dispatch.default_config(batch, hidden_size, cuda, True, 151936)
    monkeypatch.setattr(dispatch, "TRUNCATING_SWAP_ROWS_MAX", 32)
    assert elsewhere == dispatch.default_config(batch, hidden_size, cuda, True, 151936)
    monkeypatch.setattr(dispatch, "is_hopper", lambda device: True)
    monkeypatch.setattr(dispatch, "TRUNCATING_WIDE_MMA_65_128", False)
    before = dispatch.default_config(batch, hidden_size, cuda, True, 151936)
    assert before.swap_ab == (batch <= 32) and not before.wide_mma


@pytest.mark.parametrize("hidden_size", [2048, 4096, 8192])
@pytest.mark.parametrize("batch", [64, 65, 96, 128, 129])
def test_plain_sampling_at_65_128_rows_takes_128_row_wide_tiles_on_hopper(
    batch, hidden_size, monkeypatch
):
    """On Hopper, plain sampling at 65-128 rows on a whole vocabulary with one seed for the
    batch takes the Gluon kernel's 128-row tiles with its wide MMA (PLAIN_WIDE_TILES_65_128);
    per-row seeds (128-row tiles spill with them), greedy, knob tensors, a tensor-parallel
    shard, another GPU and the switch off keep the 64-row tiles with two MMAs a step."""
    cuda = torch.device("cuda")
    monkeypatch.setattr(dispatch, "is_hopper", lambda device: True)
    in_range = 64 < batch <= 128
    plain = dispatch.default_config(batch, hidden_size, cuda, False, 151936)
    if in_range:
        assert (plain.warp_specialized_rows, plain.wide_mma) == (128, True)
        assert not plain.swap_ab and not plain.warp_specialized_swap
    narrow = (64, False)
    for config in (
        dispatch.default_config(batch, hidden_size, cuda, False, 151936, per_row_seed=True),
        dispatch.default_config(batch, hidden_size, cuda, False, 151936, greedy=True),
        dispatch.default_config(batch, hidden_size, cuda, True, 151936, True),
        dispatch.default_config(batch, hidden_size, cuda, False, 37984),
    ):
        if in_range:
            assert (config.warp_specialized_rows, config.wide_mma) == narrow
    monkeypatch.setattr(dispatch, "PLAIN_WIDE_TILES_65_128", False)
    before = dispatch.default_config(batch, hidden_size, cuda, False, 151936)
    if in_range:
        assert (before.warp_specialized_rows, before.wide_mma) == narrow
    monkeypatch.setattr(dispatch, "PLAIN_WIDE_TILES_65_128", True)
    monkeypatch.setattr(dispatch, "is_hopper", lambda device: False)
    assert not dispatch.default_config(batch, hidden_size, cuda, False, 151936).wide_mma


@pytest.mark.parametrize("hidden_size", [2048, 4096, 8192])
@pytest.mark.parametrize("batch", [128, 129, 144, 192, 193, 224, 256, 257])
def test_large_batches_take_the_wide_gluon_tiles_on_hopper(batch, hidden_size, monkeypatch):
    """On Hopper, at 129-256 rows, calls that truncate every row (scalar knobs) take the Gluon
    kernel with its wide MMA, on 64-row tiles up to 192 rows and 128-row ones above, except
    where stage 1 writes top-p's mass partials (MASS_TILE_ROWS_193_256: 64), and as the
    fallback of the swapped kernel's 128-entry tiles where ``swap_wide_tiles`` sends them
    there (129-192 rows at D = 8192, 129-160 at D = 4096); plain sampling takes its 128-row
    tiles at 193-256 rows and D = 4096 unless the seeds are per row. Not on a
    tensor-parallel shard's vocabulary, nor off Hopper, nor with LARGE_BATCH_GLUON off (the
    choice before)."""
    cuda = torch.device("cuda")
    monkeypatch.setattr(dispatch, "is_hopper", lambda device: True)
    in_range = 128 < batch <= 256
    truncating = dispatch.default_config(batch, hidden_size, cuda, True, 151936)
    assert truncating.wide_mma == (in_range or batch == 128)  # (65-128 rows: the test below)
    top_p = dispatch.default_config(batch, hidden_size, cuda, True, 151936, mass_partials=True)
    assert top_p.wide_mma == truncating.wide_mma
    if in_range:
        assert truncating.warp_specialized_rows == (64 if batch <= 192 else 128)
        swapped = batch <= (192 if hidden_size > 4096 else 160 if hidden_size > 2048 else 0)
        assert truncating.swap_truncating == swapped
        assert truncating.warp_specialized_swap == ("ping-pong-wide" if swapped else "")
        assert top_p.warp_specialized_rows == 64
        monkeypatch.setattr(dispatch, "MASS_TILE_ROWS_193_256", 128)
        before = dispatch.default_config(batch, hidden_size, cuda, True, 151936, mass_partials=True)
        assert before == truncating
        monkeypatch.setattr(dispatch, "MASS_TILE_ROWS_193_256", 64)
    plain = dispatch.default_config(batch, hidden_size, cuda, False, 151936)
    plain_wide = hidden_size == 4096 and 192 < batch <= 256 or batch == 128  # (65-128: below)
    assert plain.wide_mma == plain_wide
    assert plain.warp_specialized_rows == (128 if plain_wide else plain.warp_specialized_rows)
    seeded = dispatch.default_config(batch, hidden_size, cuda, False, 151936, per_row_seed=True)
    assert not seeded.wide_mma
    monkeypatch.setattr(dispatch, "PLAIN_WIDE_TILES_65_128", False)
    plain = dispatch.default_config(batch, hidden_size, cuda, False, 151936)
    assert plain.wide_mma == (hidden_size == 4096 and 192 < batch <= 256)
    for vocab_size in (75968, 37984):  # shards at TP = 2 and 4
        assert not dispatch.default_config(batch, hidden_size, cuda, True, vocab_size).wide_mma
    assert not dispatch.default_config(batch, hidden_size, cuda, True, 151936, True).wide_mma
    monkeypatch.setattr(dispatch, "LARGE_BATCH_GLUON", False)
    assert dispatch.default_config(batch, hidden_size, cuda, True, 151936).wide_mma == (
        batch == 128
    )
    monkeypatch.setattr(dispatch, "LARGE_BATCH_GLUON", True)
    monkeypatch.setattr(dispatch, "is_hopper", lambda device: False)
    assert not dispatch.default_config(batch, hidden_size, cuda, True, 151936).wide_mma


@pytest.mark.parametrize("batch", [128, 129, 144, 160, 161, 176, 192, 193, 224, 256, 257])
def test_tensor_parallel_shards_take_their_measured_stage1_at_129_256_rows(batch, monkeypatch):
    """Plain sampling on Hopper over a tensor-parallel shard at 129-256 rows: D = 4096's short
    shard (V / 4 = 37984 rows) takes the swapped kernel up to 160 rows
    (SHORT_SHARD_SWAP_ROWS_MAX), the Gluon kernel's 64-row tiles at 161-192 and with its wide
    MMA at 193-256 (per-row seeds too: no spill), never the persistent Triton tiles; V / 2 =
    75968 takes a whole vocabulary's choice (the swapped kernel, then 128-row wide tiles above
    192 rows, but on 64-entry tiles); D = 8192's shards are unchanged (the swapped kernel up to
    192, then the Triton tiles). Off Hopper all keep the Triton tiles."""
    cuda = torch.device("cuda")
    monkeypatch.setattr(dispatch, "is_hopper", lambda device: True)
    in_range = 128 < batch <= 256

    def route(hidden_size, vocab_size, per_row_seed=False):
        config = dispatch.default_config(
            batch, hidden_size, cuda, vocab_size=vocab_size, per_row_seed=per_row_seed
        )
        return config.warp_specialized_swap, config.warp_specialized_rows, config.wide_mma

    short = route(4096, 37984)
    if not in_range:
        assert short[0] == "" and not short[2]
    elif batch <= 160:
        assert short == ("ping-pong", 0, False)
    elif batch <= 192:
        assert short == ("", 64, False)
    else:
        assert short == ("", 64, True)
        assert route(4096, 37984, per_row_seed=True) == ("", 64, True)
    # (the swapped kernel's 128-entry tiles: whole vocabularies only, swap_wide_tiles)
    assert "wide" not in route(4096, 75968)[0] and "wide" not in route(8192, 32064)[0]
    monkeypatch.setattr(dispatch, "SWAP_WIDE_TILES", False)
    if batch > 128:  # (at 65-128 rows plain sampling's 128-row tiles: whole vocabularies only)
        assert route(4096, 75968) == route(4096, 151936)
        assert route(8192, 32064) == route(8192, 128256)
    assert route(8192, 32064)[0] == ("ping-pong" if 128 < batch <= 192 else "")
    monkeypatch.setattr(dispatch, "is_hopper", lambda device: False)
    assert route(4096, 37984) == ("", 0, False)


@pytest.mark.parametrize(
    "knobs, expected",
    [(dict(top_p=0.9), True), (dict(top_k=50, top_p=0.9), False), (dict(min_p=0.1), False),
     (dict(top_k=50), False), (dict(top_k=151936, top_p=0.9), True)],
)  # fmt: skip
def test_mass_partials_only_for_top_p_over_the_whole_row(knobs, expected):
    """Stage 1 writes top-p's mass partials where top-p is on and top-k may be off (k >= V is
    off): the calls that keep the Gluon kernel's 64-row tiles at 65-128 rows."""
    params = SamplingParams(
        None, 1.0, None, 1, 1, top_k=None, scalar_top_k=knobs.get("top_k", 0),
        scalar_top_p=knobs.get("top_p", 1.0), scalar_min_p=knobs.get("min_p", 0.0),
    )  # fmt: skip
    assert dispatch.writes_mass_partials(params, 151936) == expected


@pytest.mark.parametrize("batch", [1, 64, 128, 129, 160, 256])
@pytest.mark.parametrize(
    "knobs, without_top_k",
    [(dict(scalar_top_p=0.9), True), (dict(scalar_min_p=0.1), True),
     (dict(scalar_top_k=50, scalar_top_p=0.9), False), (dict(scalar_top_k=50), False),
     (dict(scalar_top_k=151936, scalar_top_p=0.9), True),
     (dict(top_p=torch.tensor([0.9, 1.0])), False)],
    ids=["p09", "minp", "k50-p09", "k50", "k-off-p09", "p-tensor"],
)  # fmt: skip
def test_stage2_takes_more_warps_without_top_k_up_to_128_rows(batch, knobs, without_top_k):
    """Stage 2 of Python knobs that truncate without top-k (top-p / min-p alone, whose merged
    candidates all weigh) takes STAGE2_WARPS_WITHOUT_TOP_K warps up to
    STAGE2_WARPS_WITHOUT_TOP_K_ROWS_MAX rows (a program a row); above, and with top-k or
    knob tensors, STAGE2_WARPS."""
    from flashsampling_inductor import truncation_kernel

    params = SamplingParams(None, 1.0, None, 1, 1, **knobs)
    many = without_top_k and batch <= truncation_kernel.STAGE2_WARPS_WITHOUT_TOP_K_ROWS_MAX
    expected = truncation_kernel.STAGE2_WARPS_WITHOUT_TOP_K if many else 8
    assert truncation_kernel._stage2_warps(params, 151936, batch) == expected
    assert truncation_kernel.STAGE2_WARPS == 8
    assert truncation_kernel.STAGE2_WARPS_WITHOUT_TOP_K_ROWS_MAX == 128


@pytest.mark.parametrize("hidden_size", [2048, 4096, 8192])
@pytest.mark.parametrize("batch", [128, 129, 144, 145, 160, 161, 192, 193])
def test_swapped_kernel_on_128_entry_tiles_at_129_192_rows(batch, hidden_size, monkeypatch):
    """On Hopper, over a whole vocabulary at 129-192 rows, the swapped kernel's consumers run
    on 128-entry tiles ("ping-pong-wide"): greedy at every D; plain sampling at D = 8192 and
    up to 144 rows elsewhere (a second accumulator of up to 16 rows); calls that truncate
    every row at D = 8192 and up to 160 rows at D = 4096, where they leave the Gluon tiles
    for its top-m epilogue. Knob tensors that may be off keep the 64-entry tiles (not
    measured), as do tensor-parallel shards and every call with SWAP_WIDE_TILES off."""
    cuda = torch.device("cuda")
    monkeypatch.setattr(dispatch, "is_hopper", lambda device: True)
    in_range = 128 < batch <= 192

    def schedule(*args, **kwargs):
        config = dispatch.default_config(batch, hidden_size, cuda, *args, **kwargs)
        return config.warp_specialized_swap, config.swap_truncating

    wide = "ping-pong-wide"
    plain_wide = in_range and (hidden_size > 4096 or batch <= 144)
    assert (schedule(False, 151936)[0] == wide) == plain_wide
    assert (schedule(False, 151936, greedy=True)[0] == wide) == in_range
    if in_range:
        assert schedule(False, 151936)[0] in (wide, "ping-pong")
    if in_range:  # (per-row seeds keep 128-row Gluon tiles off at 193-256 rows: above)
        assert schedule(False, 151936, per_row_seed=True) == schedule(False, 151936)
    truncating_wide = in_range and (hidden_size > 4096 or (hidden_size > 2048 and batch <= 160))
    expected = (wide, True) if truncating_wide else ("", False)
    assert schedule(True, 151936) == expected
    assert schedule(True, 151936, mass_partials=True) == expected
    knobs = schedule(True, 151936, True)
    assert knobs[0] in ("ping-pong", "") and not knobs[1]
    assert wide not in schedule(False, 64128)[0]  # (a shard: D = 8192 at TP = 2)
    monkeypatch.setattr(dispatch, "SWAP_WIDE_TILES", False)
    assert schedule(False, 151936, greedy=True)[0] != wide
    assert schedule(True, 151936) == ("", False)


def test_fp32_operands_take_fewer_stages_where_16_bit_tiles_would_overflow():
    """The configurations are sized for 16-bit operands; fp32 ones (an fp32 LM head) take
    twice the bytes, and the 128 x 256 x 64 tiles' three stages overflowed Hopper's shared
    memory (294912 of 232448 bytes): fp32 keeps what fits."""
    from flashsampling_inductor.dispatch import (
        OPERAND_SHARED_MEMORY,
        SampleConfig,
        _fit_operand_stages,
    )

    wide = SampleConfig(128, 256, 64, swap_ab=False, num_warps=8, num_stages=3)
    assert _fit_operand_stages(wide, 2) == wide
    fitted = _fit_operand_stages(wide, 4)
    assert fitted.num_stages == 2
    assert (128 + 256) * 64 * 4 * fitted.num_stages <= OPERAND_SHARED_MEMORY
    swap = SampleConfig(32, 64, 128, num_stages=4)
    assert _fit_operand_stages(swap, 4) == swap
