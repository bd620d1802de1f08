"""Statistical correctness: the draws follow softmax(logits / T), masked tokens never appear,
draws are independent, seeding behaves as documented and tiling changes nothing.

Every test uses fixed seeds, so it is repeatable; the significance level of each test and
the sample size that gives it power are written next to it. The reference (impl="torch")
runs with many samples; the kernel, under the Triton interpreter on CPU, with fewer:
pathwise equality (test_fused_sample.py) plus the reference's statistics prove the kernel,
and the kernel's own smaller runs catch gross errors directly.
"""

from __future__ import annotations

import pytest
import torch
from scipy import stats

from flashsampling_inductor import fused_sample
from flashsampling_inductor.dispatch import SampleConfig, triton_fused_sample
from flashsampling_inductor.params import SamplingParams

from .sampling_oracle import (
    ALPHA,
    DEVICE,
    chi_square_power,
    head_and_tail_cells,
    make_exact_problem,
)


def one_hot_problem(logits: torch.Tensor, batch: int):
    """hidden [B, V] = logits in every row and weight = I [V, V]: exact logits in fp32."""
    vocab_size = logits.shape[0]
    hidden = logits.float().to(DEVICE).expand(batch, vocab_size).contiguous()
    return hidden, torch.eye(vocab_size, device=DEVICE)


def sample_counts(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    return torch.bincount(tokens.flatten().cpu(), minlength=vocab_size).double()


# The target: V = 300 tokens, 25 "head" tokens spread over the vocabulary (every 12th from
# 5) with logits 4..6, the 275 others with logits -2..2 in shuffled order; T = 1.25. The
# head then carries 79% of the mass, and the rarest token 1.0e-4 (>= 54 expected draws in
# 2**19).
SOFTMAX_VOCAB, SOFTMAX_TEMPERATURE, TAIL_BINS = 300, 1.25, 8
HEAD_TOKENS = torch.arange(5, SOFTMAX_VOCAB, 12)


def softmax_target() -> tuple[torch.Tensor, torch.Tensor]:
    """(fp32-exact logits [V], their float64 softmax at SOFTMAX_TEMPERATURE)."""
    generator = torch.Generator().manual_seed(0)
    tail = torch.ones(SOFTMAX_VOCAB, dtype=torch.bool)
    tail[HEAD_TOKENS] = False
    logits = torch.empty(SOFTMAX_VOCAB, dtype=torch.float64)
    logits[HEAD_TOKENS] = torch.linspace(4.0, 6.0, len(HEAD_TOKENS), dtype=torch.float64)
    tail_logits = torch.linspace(-2.0, 2.0, int(tail.sum()), dtype=torch.float64)
    logits[tail] = tail_logits[torch.randperm(int(tail.sum()), generator=generator)]
    logits = logits.float().double()  # what the op sees
    return logits, torch.softmax(logits / SOFTMAX_TEMPERATURE, dim=0)


# (impl, rows, samples per row, calls): 2**19 reference draws (calls of 256 rows keep the
# reference's [B, V] int64 temporaries in cache), 2**13 kernel draws.
SOFTMAX_RUNS = [
    pytest.param("torch", 256, 128, 16, id="torch-n524288"),
    pytest.param("triton", 128, 64, 1, id="triton-n8192"),
]


@pytest.mark.parametrize("impl, batch, num_samples, calls", SOFTMAX_RUNS)
def test_samples_follow_float64_softmax(impl, batch, num_samples, calls):
    """Draws follow softmax(logits / T) computed in float64, by two chi-square tests at
    level ALPHA on the same draws:

    * 33 cells (25 head tokens, 8 equal-mass tail bins; df = 32): with n = 2**19 reference
      draws, power 0.92 against a 1% relative bias (cell probabilities p (1 +- 0.01),
      noncentrality n * 0.01**2 = 52.4) and 0.9 at 0.98%; with the kernel's n = 2**13,
      power 0.9 at a 7.9% bias;
    * every token its own cell (df = 299): power 0.9 against a 1.5% bias at n = 2**19
      -- catches anomalies confined to a few tokens, such as one Philox word position or
      one vocabulary tile.
    """
    n = batch * num_samples * calls
    cells = len(HEAD_TOKENS) + TAIL_BINS
    if impl == "torch":
        assert chi_square_power(n, 0.01, cells) >= 0.9
    logits, probabilities = softmax_target()
    hidden, weight = one_hot_problem(logits, batch)
    counts = sum(
        sample_counts(
            fused_sample(
                hidden,
                weight,
                temperature=SOFTMAX_TEMPERATURE,
                num_samples=num_samples,
                seed=2718 + call,
                impl=impl,
            ),
            SOFTMAX_VOCAB,
        )
        for call in range(calls)
    )
    binned = (
        head_and_tail_cells(counts, probabilities, HEAD_TOKENS, TAIL_BINS),
        head_and_tail_cells(probabilities * n, probabilities, HEAD_TOKENS, TAIL_BINS),
    )
    for observed, expected in (binned, (counts, probabilities * n)):
        p_value = stats.chisquare(observed.numpy(), expected.numpy()).pvalue
        assert p_value > ALPHA, (p_value, observed.tolist())


# (impl, rows, samples per row): 16 rows of each temperature.
@pytest.mark.parametrize("impl, samples_per_row", [("torch", 2048), ("triton", 256)])
def test_per_row_temperatures_follow_their_own_softmax(impl, samples_per_row):
    """In one batch, rows at T = 0.5 and rows at T = 2 each follow softmax(logits / T) of
    their own temperature (chi-square over 20 tokens, df = 19, level ALPHA; the reference's
    n = 32768 per temperature gives power 0.9 against a 3.6% relative bias, the kernel's
    n = 4096 against 10%). Swapped or shared temperatures miss by far more: the two targets
    differ by factors from 1/133 to 3 on single tokens."""
    logits = torch.linspace(-2.0, 2.0, 20, dtype=torch.float64).float().double()
    temperature = torch.tensor([0.5, 2.0], device=DEVICE).repeat(16)
    hidden, weight = one_hot_problem(logits, len(temperature))
    tokens = fused_sample(
        hidden, weight, temperature=temperature, num_samples=samples_per_row, seed=31, impl=impl
    ).cpu()
    for row_temperature in (0.5, 2.0):
        rows = (temperature.cpu() == row_temperature).nonzero().flatten()
        counts = sample_counts(tokens[rows], 20)
        expected = torch.softmax(logits / row_temperature, dim=0) * counts.sum()
        p_value = stats.chisquare(counts.numpy(), expected.numpy()).pvalue
        assert p_value > ALPHA, (row_temperature, p_value, counts.tolist())


@pytest.mark.parametrize("impl, batch, num_samples", [("torch", 512, 64), ("triton", 64, 16)])
def test_masked_tokens_are_never_drawn(impl, batch, num_samples):
    """Tokens with bias -inf never appear, even when they are the most likely ones, at any
    temperature (rows from 0.3 to 50, where the rest is nearly uniform and a leak of mass
    1e-4 would show in the reference's 32768 draws with probability 0.96), and a row
    with a single unmasked token always draws it."""
    logits, _ = softmax_target()
    masked = torch.zeros(SOFTMAX_VOCAB, dtype=torch.bool)
    masked[HEAD_TOKENS] = True  # the 25 most likely tokens
    masked[[0, 1, 2, 3, SOFTMAX_VOCAB - 1]] = True
    bias = torch.zeros(SOFTMAX_VOCAB, device=DEVICE).masked_fill(masked.to(DEVICE), float("-inf"))
    hidden, weight = one_hot_problem(logits, batch)
    temperature = torch.tensor([0.3, 1.0, 5.0, 50.0], device=DEVICE).repeat(batch // 4)
    arguments = dict(bias=bias, num_samples=num_samples, seed=77, impl=impl)
    tokens = fused_sample(hidden, weight, temperature=temperature, **arguments).cpu()
    assert not bool(masked[tokens].any()), tokens[masked[tokens]].unique()
    assert sample_counts(tokens, SOFTMAX_VOCAB)[~masked].gt(0).sum() > 200  # the rest is drawn
    lone = torch.full((SOFTMAX_VOCAB,), float("-inf"), device=DEVICE)
    lone[SOFTMAX_VOCAB // 2] = 0.0
    arguments["bias"] = lone
    tokens = fused_sample(hidden, weight, temperature=50.0, **arguments)
    assert bool((tokens == SOFTMAX_VOCAB // 2).all())


# Pair tests: V = 8 tokens with probabilities 0.026 .. 0.32.
PAIR_LOGITS = torch.linspace(-1.5, 1.0, 8, dtype=torch.float64).float().double()
PAIR_KINDS = ["two-rows", "two-samples", "consecutive-row-seeds"]


def draw_pairs(kind: str, impl: str, pairs_per_sample: int, num_samples: int):
    """Two draws from the same distribution that must be independent, as two [N] tensors.

    two-rows: rows 2i and 2i + 1 of one batch (identical hidden states, scalar seed);
    two-samples: samples 2j and 2j + 1 of one row; consecutive-row-seeds: rows 2i and 2i + 1
    with per-row seeds 1000 + 2i and 1001 + 2i (keys that differ in one bit).
    """
    batch = 2 * pairs_per_sample
    hidden, weight = one_hot_problem(PAIR_LOGITS, batch)
    seed = 4242
    if kind == "consecutive-row-seeds":
        seed = torch.arange(1000, 1000 + batch, device=DEVICE)
    tokens = fused_sample(hidden, weight, num_samples=num_samples, seed=seed, impl=impl).cpu()
    if kind == "two-samples":
        return tokens[:, 0::2].flatten(), tokens[:, 1::2].flatten()
    return tokens[0::2].flatten(), tokens[1::2].flatten()


# (impl, pairs per sample index, samples): 32768 reference pairs, 4096 kernel pairs.
@pytest.mark.parametrize("impl, pairs, num_samples", [("torch", 2048, 16), ("triton", 256, 16)])
@pytest.mark.parametrize("kind", PAIR_KINDS)
def test_paired_draws_are_independent(kind, impl, pairs, num_samples):
    """Draws that share everything but their Philox counter or key are independent:

    * their 8 x 8 contingency table passes the chi-square independence test (df = 49);
    * they agree with probability sum p_i**2 = 0.198 (exact binomial test). With 32768
      reference pairs (sd 0.0022) an excess agreement of 0.012 is caught with power 0.99,
      with the kernel's 4096 pairs (sd 0.0062) one of 0.035. A counter that ignores the
      row, the sample or the key's low bit makes the two draws equal: agreement 1.
    Both at level ALPHA, and each marginal follows softmax (chi-square, df = 7).
    """
    first, second = draw_pairs(kind, impl, pairs, num_samples)
    probabilities = torch.softmax(PAIR_LOGITS, dim=0)
    table = torch.zeros(8, 8, dtype=torch.float64).index_put_(
        (first, second), torch.ones(len(first), dtype=torch.float64), accumulate=True
    )
    assert stats.chi2_contingency(table.numpy()).pvalue > ALPHA, table
    agreement = stats.binomtest(
        int((first == second).sum()), len(first), float((probabilities**2).sum())
    )
    assert agreement.pvalue > ALPHA, agreement
    for draws in (first, second):
        counts = sample_counts(draws, 8)
        p_value = stats.chisquare(counts.numpy(), (probabilities * len(draws)).numpy()).pvalue
        assert p_value > ALPHA, (p_value, counts.tolist())


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_unseeded_calls_draw_from_the_generator(impl):
    """Without a seed two calls differ (equal with probability 1e-96 here), and the draw
    is a function of the generator state: re-seeding the default generator, or passing a
    generator seeded alike, repeats it."""
    hidden = torch.zeros(8, 64, device=DEVICE)
    weight = torch.zeros(1000, 64, device=DEVICE)  # uniform over 1000 tokens
    first = fused_sample(hidden, weight, num_samples=4, impl=impl)
    second = fused_sample(hidden, weight, num_samples=4, impl=impl)
    assert not torch.equal(first, second)
    torch.manual_seed(123)
    default_first = fused_sample(hidden, weight, num_samples=4, impl=impl)
    torch.manual_seed(123)
    assert torch.equal(fused_sample(hidden, weight, num_samples=4, impl=impl), default_first)
    generated = [
        fused_sample(
            hidden,
            weight,
            num_samples=4,
            impl=impl,
            generator=torch.Generator(DEVICE).manual_seed(seed),
        )
        for seed in (5, 5, 6)
    ]
    assert torch.equal(generated[0], generated[1])
    assert not torch.equal(generated[0], generated[2])


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_row_seeds_make_rows_batch_position_invariant(impl):
    """With per-row seeds a row's tokens depend on its own hidden state and seed only:
    permuting the batch permutes the tokens, and any sub-batch gives the same rows."""
    hidden, weight = make_exact_problem(9, 1000, 64)
    seeds = torch.tensor([3, -3, 2**62, 7, 7, 0, -(2**63), 2**32, 11], device=DEVICE)
    temperature = torch.linspace(0.0, 2.0, 9, device=DEVICE)
    arguments = dict(num_samples=3, impl=impl)
    tokens = fused_sample(hidden, weight, seed=seeds, temperature=temperature, **arguments)
    permutation = torch.tensor([8, 2, 5, 0, 7, 1, 4, 3, 6], device=DEVICE)
    permuted = fused_sample(
        hidden[permutation],
        weight,
        seed=seeds[permutation],
        temperature=temperature[permutation],
        **arguments,
    )
    assert torch.equal(permuted, tokens[permutation])
    subset = permutation[:4]
    alone = fused_sample(
        hidden[subset], weight, seed=seeds[subset], temperature=temperature[subset], **arguments
    )
    assert torch.equal(alone, tokens[subset])


# Tile shapes for the kernel: tiles smaller than, equal to and larger than the problem, one
# vocabulary tile for all of V, both MMA orientations; D = 96 is not a multiple of any. Also
# the large-batch machinery: TMA descriptors (zero-filled past D), persistent grids whose
# programs loop over several tiles, and the noise drawn in vocabulary chunks.
TILE_CONFIGS = [
    pytest.param(SampleConfig(block_b=16, block_v=16, block_d=16), id="b16-v16-d16"),
    pytest.param(SampleConfig(16, 64, 32, swap_ab=False), id="b16-v64-d32-no-swap"),
    pytest.param(SampleConfig(32, 128, 64), id="b32-v128-d64"),
    pytest.param(SampleConfig(64, 256, 128, swap_ab=False), id="b64-v256-d128-no-swap"),
    pytest.param(SampleConfig(16, 1024, 32), id="b16-v1024-d32-one-tile"),
    pytest.param(
        SampleConfig(16, 64, 64, swap_ab=False, tma=True, epilogue_chunks=4), id="tma-chunks4"
    ),
    pytest.param(
        SampleConfig(32, 128, 64, tma=True, programs_per_sm=3, epilogue_chunks=2),
        id="tma-persistent-chunks2",
    ),
    pytest.param(SampleConfig(16, 32, 32, programs_per_sm=2), id="persistent"),
]


@pytest.mark.parametrize("per_row_seed", [False, True], ids=["scalar-seed", "row-seeds"])
@pytest.mark.parametrize("config", TILE_CONFIGS)
def test_tokens_do_not_depend_on_tile_sizes(config, per_row_seed):
    """Every tiling draws exactly the reference's tokens on logits that are exact in fp32
    (so summation order cannot matter): the noise of a token depends on its index only,
    and the tile maxima reduce to the global argmax with ties to the lowest index."""
    batch, vocab_size = 17, 1000
    hidden, weight = make_exact_problem(batch, vocab_size, 96)
    bias = torch.zeros(vocab_size, device=DEVICE)
    bias[::5] = float("-inf")
    temperature = torch.tensor([0.0, 0.7, 1.3], device=DEVICE).repeat(6)[:batch]
    seed = torch.arange(batch, device=DEVICE) * 7919 - 5 if per_row_seed else None
    params = SamplingParams(temperature, 1.0, seed, 99, 2)
    tokens = triton_fused_sample(hidden, weight, bias, params, config=config)
    expected = fused_sample(
        hidden,
        weight,
        bias=bias,
        temperature=temperature,
        seed=seed if per_row_seed else 99,
        num_samples=2,
        impl="torch",
    )
    assert torch.equal(tokens, expected)


@pytest.mark.parametrize(
    "layout",
    ["transposed-weight", "fp32", "sliced-hidden"],
)
def test_tma_config_falls_back_to_pointers_where_the_layout_does_not_allow_it(layout):
    """TMA wants 16-bit, unit-stride, 16-byte aligned rows; other layouts take the pointer
    path under the same configuration and draw the same tokens."""
    hidden, weight = make_exact_problem(9, 300, 64)
    if layout == "transposed-weight":
        weight = weight.t().contiguous().t()
    elif layout == "fp32":
        hidden, weight = hidden.float(), weight.float()
    else:
        hidden = torch.cat([hidden, hidden], dim=1)[:, 1:65]  # 2-byte offset: misaligned
        weight = torch.cat([weight, weight], dim=1)[:, 1:65]
    config = SampleConfig(16, 64, 32, swap_ab=False, tma=True, programs_per_sm=2)
    params = SamplingParams(None, 1.0, None, 5, 3)
    tokens = triton_fused_sample(hidden, weight, None, params, config=config)
    expected = fused_sample(hidden, weight, seed=5, num_samples=3, impl="torch")
    assert torch.equal(tokens, expected)


def test_bad_epilogue_chunks_is_a_clear_error():
    hidden, weight = make_exact_problem(2, 100, 32)
    with pytest.raises(ValueError, match="epilogue_chunks"):
        triton_fused_sample(
            hidden,
            weight,
            None,
            SamplingParams(None, 1.0, None, 5, 1),
            SampleConfig(16, 32, 32, epilogue_chunks=4),
        )


def test_gluon_compile_error_hands_over_to_the_triton_kernel_once(monkeypatch):
    """A Triton whose Gluon cannot compile the warp-specialized kernel (its API moves between
    releases) gets the Triton kernel's tokens and one warning, and no second attempt."""
    from triton.compiler.errors import CompilationError

    from flashsampling_inductor import dispatch, hopper_kernel

    attempts = []

    def no_such_builtin(*args):
        attempts.append(1)
        raise CompilationError(None, None, "gl has no attribute 'some_builtin'")

    monkeypatch.setattr(hopper_kernel, "_disabled_by", None)
    # As on a Hopper GPU: supported() until the kernel is disabled.
    monkeypatch.setattr(
        hopper_kernel, "supported", lambda *args: hopper_kernel._disabled_by is None
    )
    monkeypatch.setattr(dispatch, "_hopper_fused_sample", no_such_builtin)
    hidden, weight = make_exact_problem(5, 300, 64)
    config = SampleConfig(64, 128, 64, swap_ab=False, warp_specialized_rows=64)
    expected = fused_sample(hidden, weight, seed=11, num_samples=2, impl="torch")
    params = SamplingParams(None, 1.0, None, 11, 2)
    with pytest.warns(RuntimeWarning, match="warp-specialized Hopper kernel does not compile"):
        first = triton_fused_sample(hidden, weight, None, params, config)
    second = triton_fused_sample(hidden, weight, None, params, config)
    assert torch.equal(first, expected) and torch.equal(second, expected)
    assert len(attempts) == 1
    assert "some_builtin" in hopper_kernel._disabled_by
