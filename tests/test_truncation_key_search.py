"""Stage 2's key searches (truncation_kernel's ``_kth_key`` and ``_nucleus_bound``) in a
small Triton kernel under the interpreter: the k-th key and the nucleus bound against the
host's sort and the full 32-bit search."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from flashsampling_inductor import truncation_kernel


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
    narrow = truncation_kernel._nucleus_bound(
        keys, weights, total, tl.load(p_ptr + i), LOW_BITS, True
    )
    tl.store(nucleus_ptr + 2 * tl.num_programs(0) + i, narrow)
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
    largest keys, the nucleus bounds (one bit a pass, then narrowed: [2, len(ps)]) and the
    full 32-bit nucleus bounds of ``values`` (padded to ``block`` lanes); the nucleus over a
    mass of row_mass times the values'."""
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
    nucleus = torch.empty(3 * len(ks), dtype=torch.int32)
    _searches[(len(ks),)](
        keys, weights, ks, ps, kth, nucleus, float(weights.sum()) * row_mass,
        LOW_BITS=low_bits, BLOCK=block,
    )  # fmt: skip
    ordered = keys[: len(values)].sort(descending=True).values
    expected = torch.tensor(
        [int(ordered[k - 1]) if k <= len(values) else truncation_kernel.KEY_PAD.value for k in ks],
        dtype=torch.int32,
    )
    nucleus = nucleus.view(3, -1)
    return kth.view(2, -1), expected, nucleus[[0, 2]], nucleus[1]


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
        assert torch.equal(nucleus[0], full), low
        below_one = torch.tensor(ps) < 1.0
        assert torch.equal(nucleus[1][below_one], full[below_one]), low


@pytest.mark.parametrize(
    "case", ["positive", "negative", "mixed", "one_octave", "few_real", "row_mass", "all_tied"]
)
@pytest.mark.parametrize("low_bits", [0, 13, 16])
def test_key_searches_are_exact_wherever_the_keys_lie(case, low_bits):
    """The k-th key searched one bit a pass and narrowed (started from the bits the smallest
    and the largest real key share, ``_search_start``, two bits a pass) is the k-th largest
    key, and the nucleus bound stopped at the dtype's low bits, one bit a pass or narrowed
    the same way (``_nucleus_bound``'s NARROW), is the full 32-bit search's,
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
    assert torch.equal(nucleus[0], full)
    # (p = 1, which stage 2 never searches: the threshold is the whole mass, and whether a
    # sum reaches it is rounding's tie, decided by the order of the sums, which differs
    # between the interpreter's tl.sum and its tl.reduce; on a GPU both are one reduction)
    below_one = torch.tensor(ps) < 1.0
    assert torch.equal(nucleus[1][below_one], full[below_one])
