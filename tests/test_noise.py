"""The noise contract: Philox4x32-10, the bits -> Gumbel map, and the kernel drawing it.

The reference's noise is pinned by known-answer vectors and by an independent pure-Python
Philox; the kernel's noise is pinned to the reference's by running its own Triton helpers
on the same inputs and, through the public op, by sampling with zero logits, where the
drawn token is the argmax of the noise alone.
"""

from __future__ import annotations

import math

import pytest
import torch
import triton
import triton.language as tl
from scipy import stats

from flashsampling_inductor import fused_sample
from flashsampling_inductor.reference import (
    bits_to_gumbel,
    bits_to_log2_gumbel,
    gumbel_noise,
    philox4x32,
)
from flashsampling_inductor.sampling_device import bits_to_log2_gumbel as device_gumbel
from flashsampling_inductor.sampling_device import philox4x32 as device_philox4x32

from .sampling_oracle import DEVICE, assert_pathwise_equal, philox_bits, row_keys

# The kernel's noise takes PTX fast paths (wide multiply, approximate log2 and reciprocal)
# only on CUDA: benchmarks/gpu_check.py runs this module there too.
pytestmark = pytest.mark.device_math

_U32 = 0xFFFFFFFF

# Random123 kat_vectors for philox4x32_10: (counter, key, output).
PHILOX_KNOWN_ANSWERS = [
    pytest.param(
        (0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8), id="zeros"
    ),
    pytest.param(
        (_U32, _U32, _U32, _U32),
        (_U32, _U32),
        (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD),
        id="all-ones",
    ),
    pytest.param(
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
        id="pi-digits",
    ),
]

# The bits where a careless map breaks: both ends, both sides of the midpoint.
EXTREME_BITS = [0, 1, 2**31 - 1, 2**31, 2**32 - 2, 2**32 - 1]


def philox4x32_python(counter, key, rounds: int = 10) -> tuple[int, int, int, int]:
    """Philox4x32 on Python ints, written from Salmon et al. (SC'11), independent of the repo."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(rounds):
        product_a, product_b = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = (
            (product_b >> 32) ^ c1 ^ k0,
            product_b & _U32,
            (product_a >> 32) ^ c3 ^ k1,
            product_a & _U32,
        )
        k0, k1 = (k0 + 0x9E3779B9) & _U32, (k1 + 0xBB67AE85) & _U32
    return c0, c1, c2, c3


@triton.jit
def _philox_probe_kernel(
    counter_ptr, key_ptr, out_ptr, n, FAST_MATH: tl.constexpr, BLOCK: tl.constexpr
):
    """out[w, i] = word w of the kernel's Philox of counter[:, i], key[:, i] (uint32 in int64)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    c0 = tl.load(counter_ptr + offs, mask=mask).to(tl.uint32)
    c1 = tl.load(counter_ptr + n + offs, mask=mask).to(tl.uint32)
    c2 = tl.load(counter_ptr + 2 * n + offs, mask=mask).to(tl.uint32)
    c3 = tl.load(counter_ptr + 3 * n + offs, mask=mask).to(tl.uint32)
    k0 = tl.load(key_ptr + offs, mask=mask).to(tl.uint32)
    k1 = tl.load(key_ptr + n + offs, mask=mask).to(tl.uint32)
    r0, r1, r2, r3 = device_philox4x32(c0, c1, c2, c3, k0, k1, FAST_MATH)
    tl.store(out_ptr + offs, r0.to(tl.int64), mask=mask)
    tl.store(out_ptr + n + offs, r1.to(tl.int64), mask=mask)
    tl.store(out_ptr + 2 * n + offs, r2.to(tl.int64), mask=mask)
    tl.store(out_ptr + 3 * n + offs, r3.to(tl.int64), mask=mask)


@triton.jit
def _gumbel_probe_kernel(bits_ptr, out_ptr, n, FAST_MATH: tl.constexpr, BLOCK: tl.constexpr):
    """out[i] = the kernel's base-2 Gumbel noise of bits[i] (uint32 values held in int64)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    bits = tl.load(bits_ptr + offs, mask=mask).to(tl.uint32)
    tl.store(out_ptr + offs, device_gumbel(bits, FAST_MATH), mask=mask)


def kernel_philox(counter: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """The kernel's Philox words [4, N] for counters [4, N] and keys [2, N] (int64 tensors)."""
    n = counter.shape[1]
    out = torch.empty((4, n), dtype=torch.int64, device=DEVICE)
    block = 1024
    _philox_probe_kernel[(triton.cdiv(n, block),)](
        counter.to(DEVICE).contiguous(),
        key.to(DEVICE).contiguous(),
        out,
        n,
        FAST_MATH=DEVICE.type == "cuda",  # the wide multiply in PTX, as the sampling kernel
        BLOCK=block,
    )
    return out.cpu()


def kernel_bits_to_log2_gumbel(bits: torch.Tensor) -> torch.Tensor:
    """The kernel's bits -> base-2 Gumbel map, as the sampling kernel runs it on this device
    (on CUDA with its fast hardware log2 and division; the interpreter cannot run inline
    PTX)."""
    out = torch.empty(bits.shape, dtype=torch.float32, device=DEVICE)
    block = 4096
    _gumbel_probe_kernel[(triton.cdiv(bits.numel(), block),)](
        bits.to(DEVICE).contiguous(),
        out,
        bits.numel(),
        FAST_MATH=DEVICE.type == "cuda",
        BLOCK=block,
    )
    return out.cpu()


def float64_gumbel(bits: torch.Tensor, log) -> torch.Tensor:
    """-log(-log(u)), u = (bits + 0.5) / 2**32, in float64 (u is exact: 33 significant bits)."""
    u = (bits.double() + 0.5) * 2.0**-32
    return -log(-log(u))


# On CUDA the kernel's map runs PTX lg2.approx, whose error is absolute near 1 (2**-22.6 on
# [0.5, 2]), and a hardware reciprocal refined by one Newton step: together up to 2**-21 of
# absolute error in g wherever the outer log2's argument is near 1, the budget
# assert_pathwise_equal allows for it. Relative bounds alone cannot hold there (g near 0).
DEVICE_LOG2_ERROR = 2.0**-21 if DEVICE.type == "cuda" else 0.0


def absolute_error(name: str) -> float:
    """The absolute error in g (base-2 units) a map may add to its relative bound."""
    return DEVICE_LOG2_ERROR if name.startswith("kernel") else 0.0


# name -> (map under test, the logarithm it is defined with, nats per unit of its output)
GUMBEL_MAPS = {
    "reference-log2": (bits_to_log2_gumbel, torch.log2, math.log(2.0)),
    "kernel-log2": (kernel_bits_to_log2_gumbel, torch.log2, math.log(2.0)),
    "reference-natural": (bits_to_gumbel, torch.log, 1.0),
}


def probe_bits() -> torch.Tensor:
    """Both tails in full (2**16 values each), both sides of 2**31, and 2**20 random words."""
    generator = torch.Generator().manual_seed(1234)
    span = torch.arange(2**16)
    return torch.cat(
        [
            span,
            _U32 - span,
            2**31 + span - 2**15,
            torch.randint(0, 2**32, (2**20,), generator=generator),
            torch.tensor(EXTREME_BITS),
        ]
    )


@pytest.mark.parametrize("counter, key, expected", PHILOX_KNOWN_ANSWERS)
@pytest.mark.parametrize("implementation", ["python", "reference", "kernel"])
def test_philox_known_answers(implementation, counter, key, expected):
    """Each Philox4x32-10 (the test's own, the reference's, the kernel's) meets Random123's KATs."""
    if implementation == "python":
        words = philox4x32_python(counter, key)
    elif implementation == "reference":
        words = [w.item() for w in philox4x32(*map(torch.tensor, counter), *map(torch.tensor, key))]
    else:
        words = kernel_philox(torch.tensor(counter)[:, None], torch.tensor(key)[:, None])
        words = words.flatten().tolist()
    assert tuple(words) == expected, [hex(w) for w in words]


def test_reference_and_kernel_philox_agree_on_random_inputs():
    """Reference and kernel Philox equal the pure-Python one on random counters and keys.

    Random uint32 inputs exercise the carries of the 32x32 -> 64-bit products that the
    reference emulates with int64 arithmetic.
    """
    generator = torch.Generator().manual_seed(7)
    counter = torch.randint(0, 2**32, (4, 257), generator=generator)
    key = torch.randint(0, 2**32, (2, 257), generator=generator)
    expected = torch.tensor(
        [philox4x32_python(c, k) for c, k in zip(counter.T.tolist(), key.T.tolist(), strict=True)]
    ).T
    reference = torch.stack(philox4x32(*counter, *key))
    assert torch.equal(reference, expected)
    assert torch.equal(kernel_philox(counter, key), expected)


def test_gumbel_noise_follows_counter_layout():
    """Token v of a row draws word v % 4 of Philox at counter (v // 4, row_counter, sample, 0).

    Pins the documented layout of ``gumbel_noise`` (which the kernel must reproduce) with the
    independent Philox, on a vocabulary that is not a multiple of 4 and keys with both halves
    set.
    """
    seeds = torch.tensor([0, -1, 0x123456789ABCDEF0, 2**63 - 1 - 2**40])
    seed_lo, seed_hi, _ = row_keys(seeds, len(seeds))
    row_counter = torch.tensor([0, 1, 7, 2**31 + 3])
    vocab_size, sample_index = 13, 5
    noise = gumbel_noise(seed_lo, seed_hi, row_counter, sample_index, vocab_size)
    expected_bits = torch.tensor(
        [
            [
                philox4x32_python((v // 4, rc, sample_index, 0), (lo, hi))[v % 4]
                for v in range(vocab_size)
            ]
            for lo, hi, rc in zip(
                seed_lo.tolist(), seed_hi.tolist(), row_counter.tolist(), strict=True
            )
        ]
    )
    assert torch.equal(noise, bits_to_log2_gumbel(expected_bits))


@pytest.mark.parametrize("name", GUMBEL_MAPS)
def test_gumbel_map_is_finite_and_accurate_at_extreme_bits(name):
    """At both ends and both sides of the midpoint the map is finite and within
    2**-22 * (1 + |g|) of float64 -log(-log(u)) (the far tails: u = 2**-33 and 1 - 2**-33)."""
    to_gumbel, log, _ = GUMBEL_MAPS[name]
    bits = torch.tensor(EXTREME_BITS)
    gumbel = to_gumbel(bits)
    assert gumbel.dtype == torch.float32
    assert bool(gumbel.isfinite().all()), gumbel
    error = (gumbel.double() - float64_gumbel(bits, log)).abs()
    assert bool((error <= 2.0**-22 * (1 + gumbel.double().abs())).all()), (gumbel, error)


@pytest.mark.parametrize("name", GUMBEL_MAPS)
def test_gumbel_map_matches_float64_in_both_tails(name):
    """Over every one of the 2**16 top and bottom bit patterns, both sides of the midpoint and
    2**20 random words, the fp32 map stays within 2**-22 * (1 + |g|) of float64, g and the
    error measured in nats (a base-2 map's outputs are 1 / ln 2 times larger).

    A naive ``u = float32(bits) / 2**32`` fails this by orders of magnitude in the upper tail
    (u rounds to 1 - k * 2**-24, or to exactly 1.0 and g = +inf, for the top 128 values), and
    so does a log whose error near 1 is absolute rather than relative (the inner log of
    1 - small). Measured error of the reference: below 1.9e-7 * (1 + |g|).
    """
    to_gumbel, log, nats_per_unit = GUMBEL_MAPS[name]
    bits = probe_bits()
    gumbel = to_gumbel(bits)
    exact = float64_gumbel(bits, log)
    error = (gumbel.double() - exact).abs() * nats_per_unit / (1 + (exact * nats_per_unit).abs())
    worst = int(error.argmax())
    assert error[worst] <= 2.0**-22, (hex(bits[worst].item()), gumbel[worst].item(), exact[worst])


@pytest.mark.parametrize("name", GUMBEL_MAPS)
def test_gumbel_map_is_monotone_and_resolves_the_upper_tail(name):
    """g is non-decreasing in the bits up to one ulp of fp32 rounding (plus, on CUDA, the
    device log2's absolute error near 1: ``DEVICE_LOG2_ERROR``), and strictly increasing
    over the top 2**16 values.

    In the upper tail g = -log(E) with E ~ (m + 0.5) / 2**32 for m = 2**32 - 1 - bits; there
    adjacent bits differ by at least log(1 + 1/2**16) ~ 1.5e-5 nats (2.2e-5 bits), more than
    an ulp of g (<= 2**-18 ~ 3.8e-6), so a map that keeps 32 bits of resolution tells every
    one of them apart; one that rounds u to fp32 first collapses them into a handful of
    values (or +inf).
    """
    to_gumbel, _, _ = GUMBEL_MAPS[name]
    gumbel = to_gumbel(probe_bits().unique())  # sorted bits
    one_ulp = torch.finfo(torch.float32).eps * gumbel[1:].abs() + absolute_error(name)
    assert bool((gumbel.diff() >= -one_ulp).all())
    top = to_gumbel(torch.arange(2**32 - 2**16, 2**32))
    assert bool((top.diff() > 0).all())


def test_kernel_noise_equals_reference_noise_elementwise():
    """The kernel's bits -> base-2 Gumbel map equals the reference's within 2 ulp of
    max(|g|, 1), the same fp32 formula where only the logs and the division may differ (PTX
    approximations on the GPU, numpy under the interpreter, torch on the CPU), plus on CUDA
    the device's absolute error near 1 (``DEVICE_LOG2_ERROR``). That error in the outer
    log2 fits; the same error in the inner log2(1 - small) of the upper tail does not, since
    the tail amplifies it."""
    bits = probe_bits()
    kernel, reference = kernel_bits_to_log2_gumbel(bits), bits_to_log2_gumbel(bits)
    two_ulp = 2 * torch.finfo(torch.float32).eps * reference.abs().clamp_min(1)
    two_ulp += DEVICE_LOG2_ERROR
    excess = (kernel - reference).abs() - two_ulp
    worst = int(excess.argmax())
    assert excess[worst] <= 0, (hex(bits[worst].item()), kernel[worst].item(), reference[worst])


NOISE_STREAM_CASES = [
    pytest.param(5, 1000, 3, 0x0123456789ABCDEF, id="b5-v1000-ns3-seed64bit"),
    pytest.param(5, 1000, 2, -3, id="b5-v1000-ns2-negative-seed"),
    pytest.param(3, 1000, 2, "rows", id="b3-v1000-ns2-row-seeds"),
    pytest.param(2, 50257, 1, 2**64 - 1, id="b2-v50257-seed-all-ones"),
]


@pytest.mark.parametrize("batch, vocab_size, num_samples, seed", NOISE_STREAM_CASES)
def test_kernel_draws_reference_noise_stream(batch, vocab_size, num_samples, seed):
    """With zero logits the token is the argmax of the noise alone: the kernel's equals the
    reference's, which pins the kernel's Philox keys, counters and word order end to end."""
    if seed == "rows":
        seed = torch.tensor([2**62 + 11, -(2**40), 5], device=DEVICE)
    hidden = torch.randn(batch, 64, device=DEVICE)
    weight = torch.zeros(vocab_size, 64, device=DEVICE)
    kwargs = dict(seed=seed, num_samples=num_samples)
    tokens = fused_sample(hidden, weight, impl="triton", **kwargs)
    expected = fused_sample(hidden, weight, impl="torch", **kwargs)
    assert_pathwise_equal(tokens, expected, hidden, weight, seed=seed)


# (per-row seed, token, bits) found by search: Philox gives the token, in row 0 / sample 0 of
# that seed, one of the top 128 bit patterns, which a naive fp32 u rounds to 1.0 (g = +inf).
FORCED_WINNER_DRAWS = [
    (4696, 376, 2**32 - 116),
    (13045, 138, 2**32 - 41),
    (25665, 126, 2**32 - 104),
]


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_top_bit_patterns_do_not_force_a_winner(impl):
    """Regression for the forced-winner bug: a token whose noise bits round u to 1.0 under a
    naive map would win with infinite noise whatever its logit. Give each such token a logit
    of -40: with a correct map its noise term is at most ln 2 * 32.5 = 22.6 and every other
    token's at least ln 2 * -5.1 = -3.5, so it must not be drawn; and the kernel must agree
    with the reference."""
    seeds = torch.tensor([seed for seed, _, _ in FORCED_WINNER_DRAWS], device=DEVICE)
    flagged = torch.tensor([token for _, token, _ in FORCED_WINNER_DRAWS])
    seed_lo, seed_hi, row_counter = row_keys(seeds, len(seeds))
    bits = philox_bits(seed_lo, seed_hi, row_counter, 0, flagged)
    assert bits.tolist() == [b for _, _, b in FORCED_WINNER_DRAWS]  # the premise
    hidden = torch.randn(len(seeds), 64, device=DEVICE)
    weight = torch.zeros(1000, 64, device=DEVICE)
    bias = torch.zeros(1000, device=DEVICE)
    bias[flagged] = -40.0
    tokens = fused_sample(hidden, weight, bias=bias, seed=seeds, impl=impl)
    assert not bool(torch.isin(tokens.cpu(), flagged).any()), tokens
    expected = fused_sample(hidden, weight, bias=bias, seed=seeds, impl="torch")
    assert_pathwise_equal(tokens, expected, hidden, weight, bias=bias, seed=seeds)


# Uniform-logits winner test: n = 256 rows x 16 samples = 4096 draws over V = 1024 tokens,
# in 64 index bins of 16 tokens (expected 64 each) and in the 4 Philox word positions.
UNIFORM_BATCH, UNIFORM_SAMPLES, UNIFORM_VOCAB, UNIFORM_BINS = 256, 16, 1024, 64


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_winner_is_uniform_under_uniform_logits(impl):
    """With all logits equal every token wins with probability 1/V: no index, tile or Philox
    word position is favoured (a counter or word-order mix-up, or a map whose tails are not
    symmetric, favours some). Chi-square over 64 index bins (df = 63) and over index % 4
    (df = 3), alpha = 1e-3 each. Power: n = 4096 draws detect a +-25% bias on half the bins
    (noncentrality n * 0.25**2 = 256, power > 0.999) and a +-10% bias between word positions
    (noncentrality 41, power 0.99)."""
    hidden = torch.randn(UNIFORM_BATCH, 64, device=DEVICE)
    weight = torch.zeros(UNIFORM_VOCAB, 64, device=DEVICE)
    tokens = fused_sample(hidden, weight, seed=99, num_samples=UNIFORM_SAMPLES, impl=impl).cpu()
    for groups in (tokens // (UNIFORM_VOCAB // UNIFORM_BINS), tokens % 4):
        counts = torch.bincount(groups.flatten(), minlength=int(groups.max()) + 1)
        p_value = stats.chisquare(counts.numpy()).pvalue
        assert p_value > 1e-3, (p_value, counts.tolist())
