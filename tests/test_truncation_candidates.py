"""Top-k / top-p in the Triton kernel, under the interpreter on CPU: stage 1's candidates and
the exact fallback.

Stage 1 keeps each tile's m largest scores, stage 2 selects among them and proves it saw
every kept token, and rows it cannot prove take the exact fallback. These tests draw on
small tiles so that both the candidate path and the fallback run, record which rows
overflowed, and require the contract's tokens (``test_truncation.contract_sample``) from
every row either way. Stage 2's chunked and merged forms: test_truncation_stage2.py; its
key searches: test_truncation_key_search.py; the sizes of the candidate tables:
test_truncation_tables.py.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from flashsampling_inductor import dispatch, fused_sample, sampling_kernel, truncation_kernel
from flashsampling_inductor.dispatch import SampleConfig, triton_fused_sample
from flashsampling_inductor.params import SamplingParams

from .sampling_oracle import DEVICE, make_exact_problem
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


@pytest.mark.parametrize(
    "config, codes",
    [
        pytest.param(SampleConfig(32, 16, 64), {0, FULL, PATCH}, id="32x16"),
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
    (OVERFLOW_PATCH), one with more its whole row (OVERFLOW_FULL). (32-row tiles: one program
    a vocabulary tile, the interpreter's cost being per program; stage 1 over several row
    tiles: test_more_flagged_rows_than_one_mma_holds_take_the_fallback_exactly.)"""
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
    # patched, so no call pays the patched pass's launch: dispatch.patching_pays)
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


@pytest.mark.parametrize("top_k, m", [(1, 1), (2, 2), (20, 3)])
def test_fewest_candidates_draw_the_reference_tokens(top_k, m, monkeypatch):
    """At V = 151936 a one-row call keeps as few as 1-3 candidates a tile (the interpreter's
    256-wide tiles): still the reference's tokens, ties at the k-th value and all."""
    chosen = []
    choose = dispatch.candidates_per_tile
    monkeypatch.setattr(
        dispatch, "candidates_per_tile", lambda *a: chosen.append(choose(*a)) or chosen[-1]
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


def _ranked_tile_keys(logits: torch.Tensor, block_v: int, low_bits: int) -> torch.Tensor:
    """Each (row, ``block_v``-wide tile)'s ordered keys as stage 1 ranks them, largest first,
    [B, tiles, block_v] int64: the key (its low ``low_bits`` cleared) then the lowest column;
    the columns past V as KEY_PAD. Each entry is key * 2**16 + (block_v - 1 - column)."""
    batch, vocab = logits.shape
    tiles = -(-vocab // block_v)
    values = logits.masked_fill(logits.isnan(), float("-inf"))
    values = torch.where(values == 0, torch.zeros_like(values), values)
    bits = values.view(torch.int32).long()
    keys = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    keys = keys & -(1 << low_bits)
    padded = torch.full((batch, tiles * block_v), -(2**31), dtype=torch.int64)
    padded[:, :vocab] = keys.cpu()
    reversed_columns = block_v - 1 - torch.arange(block_v)
    ranked = padded.view(batch, tiles, block_v) * 2**16 + reversed_columns
    return ranked.sort(dim=-1, descending=True).values


@pytest.mark.parametrize(
    "m, logits_dtype, swap_ab",
    [pytest.param(m, torch.bfloat16, True, id=f"bf16-{m}") for m in (1, 3, 4, 5, 7, 8)]
    + [pytest.param(3, torch.float16, True, id="fp16-3"),
       pytest.param(3, None, True, id="fp32-3"),
       pytest.param(3, torch.bfloat16, False, id="bf16-3-batch-on-M")],
)  # fmt: skip
def test_stage1_keeps_each_tiles_largest_keys(m, logits_dtype, swap_ab, monkeypatch):
    """Stage 1's top-m buffers hold each tile's m largest keys, ties to the lowest column, and
    the largest it left out, whichever way the kernel ranks them (bf16 / fp16 logits up to 7
    slots on swap-AB tiles: one reduction of sorted lists; fp32 logits, 8 slots and the batch
    on the MMA's M: a reduction a slot): ties (the exact problem's integer logits), -inf and
    NaN bias entries, a tile past V."""
    monkeypatch.setattr(dispatch, "candidates_per_tile", lambda *a: m)
    stage1 = {}
    launch = dispatch.sampling_kernel.launch_stage1
    monkeypatch.setattr(
        dispatch.sampling_kernel, "launch_stage1",
        lambda *a, **k: launch(*a, **k) or stage1.update(a[5]),
    )  # fmt: skip
    hidden, weight = make_exact_problem(5, 1000, 64)
    bias = torch.zeros(1000, device=DEVICE)
    bias[5::17] = float("-inf")
    bias[9::23] = float("nan")
    params = SamplingParams(
        None, 0.8, torch.tensor(3, device=DEVICE), 0, 1, logits_dtype, scalar_top_k=50
    )
    triton_fused_sample(hidden, weight, bias, params, SampleConfig(16, 64, 32, swap_ab=swap_ab))
    low_bits = {torch.bfloat16: 16, torch.float16: 13}.get(logits_dtype, 0)
    logits = exact_logits(hidden, weight, bias)
    if logits_dtype is not None:
        logits = logits.to(logits_dtype).float()
    ranked = _ranked_tile_keys(logits, 64, low_bits)
    keys, columns = ranked >> 16, 63 - (ranked & 0xFFFF)
    if low_bits:  # (the stored keys' low bits are their sign's again)
        keys = keys | torch.where((keys < 0) & (keys != -(2**31)), (1 << low_bits) - 1, 0)
    tiles = ranked.shape[1]
    index = columns + 64 * torch.arange(tiles)[:, None]
    assert torch.equal(stage1["top_m_key"].cpu().view(5, tiles, m).long(), keys[..., :m])
    assert torch.equal(stage1["top_m_index"].cpu().view(5, tiles, m).long(), index[..., :m])
    assert torch.equal(stage1["hidden_key"].cpu().view(5, tiles).long(), keys[..., m])


@triton.jit
def _merge_lists_kernel(a_ptr, b_ptr, out_ptr, N: tl.constexpr, LENGTH: tl.constexpr):
    a = a_ptr + tl.arange(0, N) * LENGTH
    b = b_ptr + tl.arange(0, N) * LENGTH
    out = out_ptr + tl.arange(0, N) * LENGTH
    if LENGTH == 4:
        c0, c1, c2, c3 = sampling_kernel._merge4(
            tl.load(a), tl.load(a + 1), tl.load(a + 2), tl.load(a + 3),
            tl.load(b), tl.load(b + 1), tl.load(b + 2), tl.load(b + 3),
        )  # fmt: skip
        tl.store(out, c0)
        tl.store(out + 1, c1)
        tl.store(out + 2, c2)
        tl.store(out + 3, c3)
    else:
        c0, c1, c2, c3, c4, c5, c6, c7 = sampling_kernel._merge8(
            tl.load(a), tl.load(a + 1), tl.load(a + 2), tl.load(a + 3),
            tl.load(a + 4), tl.load(a + 5), tl.load(a + 6), tl.load(a + 7),
            tl.load(b), tl.load(b + 1), tl.load(b + 2), tl.load(b + 3),
            tl.load(b + 4), tl.load(b + 5), tl.load(b + 6), tl.load(b + 7),
        )  # fmt: skip
        tl.store(out, c0)
        tl.store(out + 1, c1)
        tl.store(out + 2, c2)
        tl.store(out + 3, c3)
        tl.store(out + 4, c4)
        tl.store(out + 5, c5)
        tl.store(out + 6, c6)
        tl.store(out + 7, c7)


@pytest.mark.parametrize("length", [4, 8])
def test_sorted_list_merges_keep_the_largest(length):
    """The merges of stage 1's top-m reduction on whole lists (the interpreter's reduction
    merges one key at a time into a list, a GPU's whole lists: lanes' and warps'): the
    ``length`` largest of two descending lists, descending, duplicates kept."""
    gen = torch.Generator().manual_seed(length)
    n = 64
    a = torch.randint(-50, 50, (n, length), generator=gen, dtype=torch.int32)
    b = torch.randint(-50, 50, (n, length), generator=gen, dtype=torch.int32)
    b[: n // 4] += 60  # (one list wholly above the other, and below)
    a[n // 4 : n // 2] += 60
    a, b = (x.sort(dim=1, descending=True).values.contiguous().to(DEVICE) for x in (a, b))
    out = torch.empty_like(a)
    _merge_lists_kernel[(1,)](a, b, out, n, length)
    expected = torch.cat([a, b], dim=1).sort(dim=1, descending=True).values[:, :length]
    assert torch.equal(out, expected)
