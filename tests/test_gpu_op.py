"""The kernel at real size on a GPU: V = 151936 (Qwen3), D = 2048 / 4096, bf16.

Run with ``pytest -m gpu tests/test_gpu_op.py`` on a CUDA machine (skipped elsewhere). The
chi-square test draws 2**27 tokens (about a minute or two on an H100/H200).
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import torch
from scipy import stats

from flashsampling_inductor import fused_sample

from .gpu_problems import CUDA, VOCAB, masked_bias, temperature_rows
from .sampling_oracle import (
    ALPHA,
    assert_pathwise_equal,
    chi_square_power,
    head_and_tail_cells,
    make_exact_problem,
    make_problem,
)

pytestmark = pytest.mark.gpu


@dataclasses.dataclass(frozen=True)
class GpuCase:
    batch: int
    hidden_size: int
    dtype: torch.dtype = torch.bfloat16
    temperature: str = "scalar"  # "scalar" (0.9) or "rows" (greedy rows among 0.5 .. 1.5)
    row_seeds: bool = False
    num_samples: int = 1
    bias: bool = False
    strided: bool = False
    logits_dtype: torch.dtype | None = None


GPU_PATHWISE_CASES = [
    pytest.param(GpuCase(1, 2048), id="b1-d2048"),
    pytest.param(GpuCase(1, 4096, temperature="rows", row_seeds=True), id="b1-d4096-row-seed"),
    pytest.param(
        GpuCase(64, 4096, temperature="rows", row_seeds=True, num_samples=4, bias=True),
        id="b64-d4096-rows-bias-ns4",
    ),
    pytest.param(GpuCase(64, 2048, torch.float16, strided=True), id="b64-d2048-fp16-strided"),
    pytest.param(GpuCase(256, 4096, temperature="rows"), id="b256-d4096-rows"),
    pytest.param(
        GpuCase(256, 2048, logits_dtype=torch.bfloat16, bias=True), id="b256-d2048-logits-bf16"
    ),
    pytest.param(GpuCase(256, 2048, torch.float32), id="b256-d2048-fp32"),
    # Batches that are not a multiple of the row tiles: the TMA rows are padded
    # (sampling_device.rows_for_tma); 144 and 176 take the Gluon kernel on Hopper.
    pytest.param(GpuCase(100, 2048, temperature="rows", bias=True), id="b100-d2048-rows"),
    pytest.param(GpuCase(144, 2048, logits_dtype=torch.bfloat16), id="b144-d2048-logits-bf16"),
    pytest.param(GpuCase(176, 4096, row_seeds=True), id="b176-d4096-row-seed"),
    pytest.param(GpuCase(200, 4096, temperature="rows"), id="b200-d4096-rows"),
]


def gpu_case_arguments(case: GpuCase) -> dict:
    hidden, weight = make_problem(
        case.batch, VOCAB, case.hidden_size, case.dtype, strided=case.strided, device=CUDA
    )
    temperature = temperature_rows(case.batch) if case.temperature == "rows" else 0.9
    seed = 1234
    if case.row_seeds:
        seed = torch.randint(-(2**63), 2**63 - 1, (case.batch,), device=CUDA)
    bias = None
    if case.bias:
        bias = masked_bias()
        bias[(hidden.float() @ weight.float().T).argmax(dim=-1)] = float("-inf")
    return dict(
        hidden=hidden,
        weight=weight,
        bias=bias,
        temperature=temperature,
        seed=seed,
        num_samples=case.num_samples,
        logits_dtype=case.logits_dtype,
    )


def assert_kernel_matches_reference(case: GpuCase) -> None:
    arguments = gpu_case_arguments(case)
    tokens = fused_sample(**arguments, impl="triton")
    expected = fused_sample(**arguments, impl="torch")
    checked = {k: v for k, v in arguments.items() if k != "num_samples"}
    near_ties = assert_pathwise_equal(tokens, expected, **checked)
    assert near_ties <= max(1, tokens.numel() // 100), near_ties


@pytest.mark.parametrize("case", GPU_PATHWISE_CASES)
def test_gpu_kernel_matches_reference_pathwise(case):
    """Real-size kernel draws equal the reference's on the same seed, up to the documented
    near-ties of ``assert_pathwise_equal`` (which reports how many)."""
    assert_kernel_matches_reference(case)


# The chi-square target: 300 head tokens spread over the vocabulary (every 506th from 7)
# with logits 0..2 carry 96.6% of the mass; the other 151636 tokens have logits uniform in
# [-11, -7]. Logits are bf16 values, placed exactly: hidden = ones [B, D] and weight row v =
# logit_v at column v % D, so logit_v = hidden . weight_v is exact and the matmul runs at
# D = 2048.
HEAD = torch.arange(300) * (VOCAB // 300) + 7
TAIL_BINS = 32
CHI_SQUARE_BATCH, CHI_SQUARE_SAMPLES = 256, 64
CHI_SQUARE_DRAWS = 2**27


def head_heavy_problem(batch: int, hidden_size: int = 2048):
    """(hidden, weight) on the GPU whose logits are ``logits`` exactly, and the float64
    softmax of those logits."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.rand(VOCAB, generator=generator, dtype=torch.float64) * 4 - 11
    logits[HEAD] = torch.linspace(0.0, 2.0, len(HEAD), dtype=torch.float64)
    logits = logits.to(torch.bfloat16)
    weight = torch.zeros(VOCAB, hidden_size, dtype=torch.bfloat16)
    weight[torch.arange(VOCAB), torch.arange(VOCAB) % hidden_size] = logits
    hidden = torch.ones(batch, hidden_size, dtype=torch.bfloat16)
    probabilities = torch.softmax(logits.double(), dim=0)
    return hidden.to(CUDA), weight.to(CUDA), probabilities


def chi_square_p_values(counts: torch.Tensor, probabilities: torch.Tensor) -> list[float]:
    """p-values of two chi-square tests on the same counts [V]: head tokens + equal-mass tail
    bins against the softmax, and the head tokens alone against their share of the head's
    draws (conditional on the head, df = 299: sensitive to biases among head tokens only)."""
    n = counts.sum()
    observed = head_and_tail_cells(counts, probabilities, HEAD, TAIL_BINS)
    expected = head_and_tail_cells(probabilities * n, probabilities, HEAD, TAIL_BINS)
    head_counts = counts[HEAD]
    head_expected = probabilities[HEAD] / probabilities[HEAD].sum() * head_counts.sum()
    return [
        float(stats.chisquare(observed.numpy(), expected.numpy()).pvalue),
        float(stats.chisquare(head_counts.numpy(), head_expected.numpy()).pvalue),
    ]


def test_gpu_samples_follow_float64_softmax():
    """2**27 kernel draws follow the float64 softmax: chi-square over 332 cells (300 head
    tokens, 32 equal-mass tail bins; df = 331) at level ALPHA. Power 0.90 against a 0.1%
    relative bias on the head tokens (head cell probabilities p (1 +- 0.001), signs
    balanced: noncentrality 2**27 * 0.966 * 1e-6 = 130)."""
    hidden, weight, probabilities = head_heavy_problem(CHI_SQUARE_BATCH)
    head_mass = float(probabilities[HEAD].sum())
    assert chi_square_power(CHI_SQUARE_DRAWS, 1e-3, len(HEAD) + TAIL_BINS, head_mass) >= 0.9
    counts = torch.zeros(VOCAB, dtype=torch.int64, device=CUDA)
    per_call = CHI_SQUARE_BATCH * CHI_SQUARE_SAMPLES
    for call in range(CHI_SQUARE_DRAWS // per_call):
        tokens = fused_sample(hidden, weight, num_samples=CHI_SQUARE_SAMPLES, seed=call)
        counts += torch.bincount(tokens.flatten(), minlength=VOCAB)
    counts = counts.cpu().double()
    assert counts.sum() == CHI_SQUARE_DRAWS
    for p_value in chi_square_p_values(counts, probabilities):
        assert p_value > ALPHA, p_value


def test_gpu_masked_tokens_and_greedy_rows():
    """At real size: masked tokens (the 300 most likely among them) are never drawn in
    2**20 draws, and greedy rows return the argmax with ties to the lowest index."""
    hidden, weight, _ = head_heavy_problem(256)
    bias = torch.zeros(VOCAB, device=CUDA)
    bias[HEAD] = float("-inf")
    bias[:1000] = float("-inf")
    masked = bias.isinf()
    drawn = torch.zeros(VOCAB, dtype=torch.int64, device=CUDA)
    for call in range(64):
        tokens = fused_sample(hidden, weight, bias=bias, num_samples=64, seed=call)
        drawn += torch.bincount(tokens.flatten(), minlength=VOCAB)
    assert int(drawn[masked].sum()) == 0
    assert int(drawn.gt(0).sum()) > 50_000  # the unmasked tail is drawn
    weight[HEAD[-1] + 1] = weight[HEAD[-1]]  # a tie with the top token, one index higher
    temperature = torch.zeros(256, device=CUDA)
    temperature[1::2] = 1.0
    tokens = fused_sample(hidden, weight, temperature=temperature, num_samples=2, seed=6)
    assert bool((tokens[0::2] == HEAD[-1].item()).all())
    assert bool((tokens[1::2] != HEAD[-1].item()).any())


def test_gpu_row_seeds_are_batch_position_invariant():
    """Per-row seeds at real size: a row's tokens are the same in a batch of 256, of 64
    (another kernel configuration) and alone. Logits exact in fp32 (D = 2048), so
    different tile shapes cannot round differently."""
    hidden, weight = make_exact_problem(256, VOCAB, 2048, device=CUDA)
    seeds = torch.randint(-(2**63), 2**63 - 1, (256,), device=CUDA)
    arguments = dict(temperature=8.0, num_samples=2)
    tokens = fused_sample(hidden, weight, seed=seeds, **arguments)
    permutation = torch.randperm(256, device=CUDA)
    permuted = fused_sample(hidden[permutation], weight, seed=seeds[permutation], **arguments)
    assert torch.equal(permuted, tokens[permutation])
    subset = permutation[:64]
    assert torch.equal(
        fused_sample(hidden[subset], weight, seed=seeds[subset], **arguments), tokens[subset]
    )
    for row in permutation[:4].tolist():
        alone = fused_sample(hidden[row : row + 1], weight, seed=seeds[row : row + 1], **arguments)
        assert torch.equal(alone, tokens[row : row + 1])
    assert torch.equal(fused_sample(hidden, weight, seed=seeds, **arguments, impl="torch"), tokens)


def test_gpu_unseeded_sampling_under_cuda_graph_replays_fresh_draws():
    """fused_sample without a seed captures into a CUDA graph (no host sync), and every
    replay draws fresh tokens: 200 replays of 256 x 16 draws are not repeats and follow the
    float64 softmax (the chi-square above, 819200 draws: power 0.9 against a 1.3% relative
    bias on the head)."""
    hidden, weight, probabilities = head_heavy_problem(256)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: compile the kernels outside the capture
        fused_sample(hidden, weight, num_samples=16)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tokens = fused_sample(hidden, weight, num_samples=16)
    counts = torch.zeros(VOCAB, dtype=torch.int64, device=CUDA)
    previous = None
    for _ in range(200):
        graph.replay()
        assert previous is None or not torch.equal(tokens, previous)
        previous = tokens.clone()
        counts += torch.bincount(tokens.flatten(), minlength=VOCAB)
    assert chi_square_power(200 * 256 * 16, 0.013, len(HEAD) + TAIL_BINS, 0.966) >= 0.9
    for p_value in chi_square_p_values(counts.cpu().double(), probabilities):
        assert p_value > ALPHA, p_value


@pytest.mark.parametrize("batch", [64, 256])
@pytest.mark.parametrize("hidden_size", [2048, 4096])
def test_gpu_memory_is_far_below_materialized_logits(batch, hidden_size):
    """The call allocates under 5% of the B x V fp32 logits it never materializes."""
    hidden, weight = make_problem(batch, VOCAB, hidden_size, torch.bfloat16, device=CUDA)
    fused_sample(hidden, weight, seed=0)  # compile outside the measurement
    torch.cuda.synchronize()
    baseline = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fused_sample(hidden, weight, seed=1)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - baseline
    logits_bytes = batch * VOCAB * 4
    assert extra < 0.05 * logits_bytes, (extra, logits_bytes)


@pytest.mark.parametrize(
    "knob", ["temperature=torch.tensor([1.0, -1.0], device='cuda')",
             "top_k=torch.zeros(2, device='cuda', dtype=torch.int64), min_p=torch.zeros(2,"
             " device='cuda'), top_p=torch.tensor([1.0, 0.0], device='cuda')"],
    ids=["temperature", "top-p-beside-off-knobs"],
)  # fmt: skip
def test_gpu_bad_knob_tensor_fails_loudly(knob):
    """A bad CUDA temperature or top-p tensor (beside valid ones: all of a call's knob
    tensors are checked in one kernel, knob_check.py) trips a device-side assert, whose
    message names the knob, instead of sampling from a wrong distribution. It poisons the
    CUDA context, so it runs in a child process."""
    script = (
        "import torch; from flashsampling_inductor import fused_sample;"
        "h = torch.randn(2, 64, device='cuda'); w = torch.randn(1000, 64, device='cuda');"
        f"fused_sample(h, w, {knob});"
        "torch.cuda.synchronize()"
    )
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert child.returncode != 0
    assert "device-side assert" in child.stderr
    # (the checking kernel's own assert prints the call's message: knob_check.FUSED_ASSERT)
    bad = "temperature" if knob.startswith("temperature") else "top_p"
    assert f"{bad} must be" in child.stderr, child.stderr[-2000:]


@pytest.mark.parametrize("bad", [None, "temperature", "top_p"])
def test_gpu_knob_check_beside_a_captured_call(bad):
    """Under CUDA graph capture the knob tensors' check is a branch of the graph beside the
    call's kernels (knob_check.CHECK_BESIDE): a replay draws the eager call's tokens, and a
    bad value trips the check's assert with its message, before anything after the call
    (the graph's last kernel reads the tokens). In a child process (the assert poisons the
    CUDA context)."""
    top_p = {"top_p": "0.0", "temperature": "0.9"}.get(bad, "0.9")
    temperature = "-1.0" if bad == "temperature" else "0.7"
    script = f"""
import torch
from flashsampling_inductor import fused_sample, knob_check
assert knob_check.CHECK_BESIDE
h = torch.randn(16, 256, device='cuda', dtype=torch.bfloat16)
w = torch.randn(4000, 256, device='cuda', dtype=torch.bfloat16)
knobs = dict(temperature=torch.tensor(0.7, device='cuda'),
             top_k=torch.tensor([0, 50] * 8, device='cuda'),
             top_p=torch.full((16,), 0.9, device='cuda'), min_p=torch.zeros(16, device='cuda'))
def call():
    return fused_sample(h, w, seed=3, **knobs) + 0
eager = call()
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    tokens = call()
knobs['temperature'].fill_({temperature})
knobs['top_p'][1] = {top_p}
graph.replay()
torch.cuda.synchronize()
assert torch.equal(tokens, eager), (tokens, eager)
print('replayed')
"""
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    if bad is None:
        assert child.returncode == 0 and "replayed" in child.stdout, child.stderr[-3000:]
        return
    assert child.returncode != 0 and "replayed" not in child.stdout
    assert "device-side assert" in child.stderr, child.stderr[-3000:]
    assert f"{bad} must be" in child.stderr, child.stderr[-3000:]


def _warp_specialized_runs() -> bool:
    from flashsampling_inductor import hopper_kernel

    return hopper_kernel.AVAILABLE and torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.skipif(
    not torch.cuda.is_available() or not _warp_specialized_runs(),
    reason="the warp-specialized kernel needs Gluon and a Hopper GPU",
)
@pytest.mark.parametrize("wide_mma", [False, True], ids=["narrow", "wide"])  # WIDE_MMA
@pytest.mark.parametrize("block_b", [64, 128])  # rows per tile
@pytest.mark.parametrize("case", GPU_PATHWISE_CASES[2:])
def test_gpu_warp_specialized_kernel_matches_reference_pathwise(
    case, block_b, wide_mma, monkeypatch
):
    """The Gluon stage 1 (hopper_kernel.py, the default from 33 to 128 rows on Hopper) draws
    the reference's tokens too: the same noise stream, per-half-tile candidates, bias, row
    temperatures and seeds, several samples, rounded logits (fp32 and strided inputs fall
    back to the Triton kernel), with two m64n64 MMAs a step or one m64n128 (WIDE_MMA). It
    must also have compiled: a compile error
    would make it hand over to the Triton kernel, whose tokens are the same."""
    from flashsampling_inductor import dispatch, hopper_kernel

    config = dispatch.SampleConfig(64, 128, 64, warp_specialized_rows=block_b)
    monkeypatch.setattr(dispatch, "default_config", lambda *args, **kwargs: config)
    monkeypatch.setattr(hopper_kernel, "WIDE_MMA", wide_mma)
    assert_kernel_matches_reference(case)
    assert hopper_kernel._disabled_by is None


@pytest.mark.skipif(
    not torch.cuda.is_available() or not _warp_specialized_runs(),
    reason="the swapped warp-specialized kernel needs Gluon and a Hopper GPU",
)
@pytest.mark.parametrize("batch", [129, 150, 200, 256])  # second accumulator 8 / 32 / 128 rows
def test_gpu_swapped_kernel_draws_the_triton_kernels_tokens(batch, monkeypatch):
    """The swapped Gluon stage 1 (hopper_swap_kernel, 129-256 rows) draws the Triton
    kernel's tokens: a device seed, per-row temperatures (greedy rows among them) and seeds
    with a bias and bf16 logits over two samples, and greedy, on a ragged vocabulary whose
    last half tile lies past V; on each consumer schedule (ping-pong, cooperative, ping-pong
    on 128-entry tiles up to 192 rows). It must have run, not handed over to another kernel."""
    from flashsampling_inductor import dispatch, hopper_swap_kernel
    from flashsampling_inductor.params import SamplingParams

    launches = []
    launch = hopper_swap_kernel.launch_stage1
    monkeypatch.setattr(
        hopper_swap_kernel, "launch_stage1", lambda *a, **k: launches.append(1) or launch(*a, **k)
    )
    generator = torch.Generator(device=CUDA).manual_seed(batch)
    vocab, hidden_size = 5000, 512  # 5000 = 39 * 128 + 8
    hidden = torch.randn(batch, hidden_size, generator=generator, device=CUDA).bfloat16()
    weight = torch.randn(vocab, hidden_size, generator=generator, device=CUDA)
    weight = (weight * 4 / hidden_size**0.5).bfloat16()
    bias = torch.randn(vocab, generator=generator, device=CUDA).bfloat16()
    seeds = torch.randint(0, 2**62, (batch,), generator=generator, device=CUDA)
    cases = [
        (SamplingParams(None, 1.0, torch.tensor(11, device=CUDA), 0, 1), None),
        (SamplingParams(temperature_rows(batch), 1.0, seeds, 0, 2, torch.bfloat16), bias),
        (SamplingParams(None, 0.0, None, 5, 1), None),
    ]
    # (greedy above SWAP_GREEDY_ROWS_MAX rows keeps the Triton kernel by default: here the
    # swapped kernel's greedy runs at every batch)
    monkeypatch.setattr(dispatch, "SWAP_GREEDY_ROWS_MAX", 256)
    triton_tiles = dispatch.SampleConfig(
        128, 128, 64, swap_ab=False, num_warps=8, maxnreg=128, tma=True, programs_per_sm=2,
        epilogue_chunks=4,
    )  # fmt: skip
    schedules = ("ping-pong", "cooperative")
    if batch <= hopper_swap_kernel.WIDE_TILE_ROWS_MAX:  # (above, it refuses: it would spill)
        schedules += ("ping-pong-wide",)
    for schedule in schedules:
        swapped = dataclasses.replace(triton_tiles, warp_specialized_swap=schedule)
        for params, case_bias in cases:
            tokens = dispatch.triton_fused_sample(hidden, weight, case_bias, params, swapped)
            expected = dispatch.triton_fused_sample(hidden, weight, case_bias, params, triton_tiles)
            assert torch.equal(tokens, expected), (schedule, params)
    assert len(launches) == len(schedules) * len(cases)
    assert hopper_swap_kernel._disabled_by is None


@pytest.mark.skipif(
    not torch.cuda.is_available() or not _warp_specialized_runs(),
    reason="the swapped warp-specialized kernel needs Gluon and a Hopper GPU",
)
@pytest.mark.parametrize("batch", [150, 256])  # second accumulator 32 / 128 rows
def test_gpu_swapped_kernel_serves_truncation_knobs(batch, monkeypatch):
    """Truncation knobs in the swapped Gluon stage 1 (its top-m epilogue on 64-wide tiles,
    the sampling one beside it where knobs may be off, each per block of rows on the device)
    draw the tokens of the Triton kernel's 64-wide tiles: [B] knobs with per-row temperatures
    (greedy rows), seeds, a bias and bf16 logits over two samples, top-p alone (a 0-d
    tensor: the mass partials), and a scalar top-k that truncates every row
    (``SWAP_TRUNCATING``; also on 128-entry tiles: "ping-pong-wide"), on a ragged vocabulary
    whose last 64-wide tile lies past V; as a split stage 1 (SWAP_SPLIT) and, at 150 rows,
    unsplit. (0-d knobs at their off values and 0-d top-k 50, as ``generate`` passes them,
    take the swapped kernel on the default route:
    test_gpu_knobs_that_may_be_off_take_a_gluon_stage1_above_128_rows.)

    Each case compiles stage 1 per half, and stage 2 and the fallback per knob mode (3-9 s
    each on an H200 machine's CPUs, cold): the cases are those that reach different code,
    and the reference's 64-wide tiles share the swapped kernel's stage 2 and fallback."""
    from flashsampling_inductor import dispatch, hopper_swap_kernel
    from flashsampling_inductor.params import SamplingParams

    launches = []
    launch = hopper_swap_kernel.launch_stage1
    monkeypatch.setattr(
        hopper_swap_kernel, "launch_stage1", lambda *a, **k: launches.append(1) or launch(*a, **k)
    )
    monkeypatch.setattr(dispatch, "SWAP_KNOBS", True)
    monkeypatch.setattr(dispatch, "SWAP_TRUNCATING", True)
    generator = torch.Generator(device=CUDA).manual_seed(batch)
    vocab, hidden_size = 5000, 512  # 5000 = 39 * 128 + 8: 79 tiles of 64, 80 half tiles
    hidden = torch.randn(batch, hidden_size, generator=generator, device=CUDA).bfloat16()
    weight = torch.randn(vocab, hidden_size, generator=generator, device=CUDA)
    weight = (weight * 4 / hidden_size**0.5).bfloat16()
    bias = torch.randn(vocab, generator=generator, device=CUDA).bfloat16()
    seed = torch.tensor(11, device=CUDA)
    on = torch.arange(batch, device=CUDA) % 4 == 0
    row_seeds = torch.randint(0, 2**62, (batch,), generator=generator, device=CUDA)
    row_knobs = dict(
        logits_dtype=torch.bfloat16, top_k=torch.where(on, 50, 0),
        top_p=torch.where(on, 0.9, 1.0), min_p=torch.zeros(batch, device=CUDA),
    )  # fmt: skip
    row_case = (SamplingParams(temperature_rows(batch), 1.0, row_seeds, 0, 2, **row_knobs), bias)
    cases = [
        row_case,
        (SamplingParams(None, 0.8, seed, 0, 1, top_p=torch.tensor(0.9, device=CUDA)), None),
        (SamplingParams(None, 0.8, None, 5, 1, scalar_top_k=50), None),
    ]
    # SWAP_SPLIT: knobs that may be off in two launches; the scalar top-k on 128-entry tiles too
    runs = [(True, case, "ping-pong") for case in cases]
    if batch <= hopper_swap_kernel.WIDE_TILE_ROWS_MAX:
        runs.append((True, cases[-1], "ping-pong-wide"))
    if batch <= 160:
        runs.append((False, row_case, "ping-pong"))
    triton_tiles = dispatch.SampleConfig(64, 64, 128, num_warps=8, num_stages=3)
    for split, (params, case_bias), schedule in runs:
        swapped = dataclasses.replace(triton_tiles, warp_specialized_swap=schedule)
        monkeypatch.setattr(dispatch, "SWAP_SPLIT", split)
        launches.clear()
        tokens = dispatch.triton_fused_sample(hidden, weight, case_bias, params, swapped)
        expected = dispatch.triton_fused_sample(hidden, weight, case_bias, params, triton_tiles)
        assert torch.equal(tokens, expected), (split, params)
        assert len(launches) == 1 + (split and dispatch.knobs_may_be_off(params, vocab))
    assert hopper_swap_kernel._disabled_by is None


@pytest.mark.skipif(
    not torch.cuda.is_available() or not _warp_specialized_runs(),
    reason="the warp-specialized kernels need Gluon and a Hopper GPU",
)
@pytest.mark.parametrize("batch", [144, 192, 256])
def test_gpu_knobs_that_may_be_off_take_a_gluon_stage1_above_128_rows(batch, monkeypatch):
    """Knob tensors that may be off at 129-256 rows, as dispatch routes them (the swapped
    kernel or the Gluon kernel's 64-row tiles: ``_swap_takes_knobs``; never the persistent
    Triton tiles, which spill with both epilogues; SWAP_SPLIT, SWAP_PLAIN_HALF), draw the
    tokens of the Triton kernel's 64 x 64 tiles: 0-d knobs at their off values, 0-d top-k 50,
    and [B] knobs with per-row temperatures (greedy rows) and seeds."""
    from flashsampling_inductor import dispatch, hopper_kernel, hopper_swap_kernel
    from flashsampling_inductor.params import SamplingParams

    launches = []
    for module, name in ((hopper_swap_kernel, "swap"), (hopper_kernel, "gluon")):
        launch = module.launch_stage1
        monkeypatch.setattr(
            module, "launch_stage1",
            lambda *a, _launch=launch, _name=name, **k: launches.append(_name) or _launch(*a, **k),
        )  # fmt: skip
    generator = torch.Generator(device=CUDA).manual_seed(batch)
    vocab, hidden_size = 5000, 512
    hidden = torch.randn(batch, hidden_size, generator=generator, device=CUDA).bfloat16()
    weight = torch.randn(vocab, hidden_size, generator=generator, device=CUDA)
    weight = (weight * 4 / hidden_size**0.5).bfloat16()

    def zero_d(value, dtype=torch.float32):
        return torch.tensor(value, dtype=dtype, device=CUDA)

    seed = zero_d(11, torch.int64)
    on = torch.arange(batch, device=CUDA) % 4 == 0
    off_knobs = dict(top_k=zero_d(0, torch.int64), top_p=zero_d(1.0), min_p=zero_d(0.0))
    k50 = {**off_knobs, "top_k": zero_d(50, torch.int64)}
    row_seeds = torch.randint(0, 2**62, (batch,), generator=generator, device=CUDA)
    cases = [
        SamplingParams(zero_d(0.7), 1.0, seed, 0, 1, **off_knobs),
        SamplingParams(zero_d(0.7), 1.0, seed, 0, 1, **k50),
        SamplingParams(
            temperature_rows(batch), 1.0, row_seeds, 0, 1, top_k=torch.where(on, 50, 0),
            top_p=torch.where(on, 0.9, 1.0), min_p=torch.zeros(batch, device=CUDA),
        ),
    ]  # fmt: skip
    triton_tiles = dispatch.SampleConfig(64, 64, 128, num_warps=8, num_stages=3)
    # (the Gluon kernel's split stage 1 with the swapped kernel as its plain half)
    expected_kernels = ["swap", "swap"]
    if not dispatch._swap_takes_knobs(batch, hidden_size):
        expected_kernels = ["swap", "gluon"]
    for params in cases:
        launches.clear()
        tokens = dispatch.triton_fused_sample(hidden, weight, None, params)
        assert launches == expected_kernels, (launches, params)
        expected = dispatch.triton_fused_sample(hidden, weight, None, params, triton_tiles)
        assert torch.equal(tokens, expected), params


@pytest.mark.parametrize("batch", [1, 48, 100, 200])
def test_gpu_warm_calls_launch_every_kernel_on_the_fast_path(batch, monkeypatch):
    """After a call of its kind, no launch of the op (Triton stage 1, Gluon stage 1 at 33-128
    rows, the swapped kernel above, the truncating tail, written logits) takes Triton's own
    launch path (tests/test_launch.py checks the arguments on a CPU; here the Gluon kernels
    too): its host time is what an eager caller pays a call."""
    from flashsampling_inductor import launch, sample_logits

    torch.manual_seed(0)
    hidden = torch.randn(batch, 2048, device=CUDA, dtype=torch.bfloat16)
    weight = torch.randn(VOCAB, 2048, device=CUDA, dtype=torch.bfloat16) * 0.05
    logits = hidden @ weight.T
    by_triton = []
    original = launch._launch_by_triton

    def counted(kernel, *args):
        by_triton.append(kernel)
        return original(kernel, *args)

    monkeypatch.setattr(launch, "_launch_by_triton", counted)
    for knobs in ({}, {"top_k": 50}, {"top_k": 20, "top_p": 0.9}, {"min_p": 0.1}):
        for _ in range(2):
            by_triton.clear()
            fused_sample(hidden, weight, temperature=0.7, seed=1, **knobs)
            sample_logits(logits, temperature=0.7, seed=1, **knobs)
        assert not by_triton, (knobs, [kernel.__name__ for kernel in by_triton])
