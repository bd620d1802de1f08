# ruff: noqa: E501  (the expected graphs are printed verbatim)
"""The pass end to end: graphs before/after (expecttest), compiled-vs-eager distributions,
dynamic batch sizes, the FX graph cache, and on a GPU CUDA-graph replays."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import stats
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters
from torch._inductor.utils import fresh_cache, run_and_get_code

import flashsampling_inductor  # noqa: F401

from .graph_capture import TestCase, graph_after_pass
from .test_patterns import gpt_fast, gumbel_eps, hidden, logits_returned, nanogpt


@pytest.fixture(autouse=True)
def _no_fx_graph_cache():
    """A cache hit skips the pass, and with it the rewrite counters the tests read."""
    with torch._inductor.config.patch(fx_graph_cache=False):
        yield


torch.manual_seed(0)
WEIGHT = torch.randn(12, 8)  # V = 12 keeps the chi-square cells full
BIAS = torch.randn(12)


def multinomial_step(h, temperature):
    probs = F.softmax((h @ WEIGHT.T + BIAS) / temperature, dim=-1)
    return torch.multinomial(probs, num_samples=1).squeeze(-1)


def race_step(h, temperature):
    probs = torch.softmax(F.linear(h, WEIGHT, BIAS) / temperature, dim=-1)
    return torch.argmax(probs / torch.empty_like(probs).exponential_(1), dim=-1)


def gumbel_step(h, temperature):
    logits = F.linear(h, WEIGHT, BIAS) / temperature
    return (logits - torch.log(-torch.log(torch.rand_like(logits)))).argmax(-1)


def multi_sample_step(h, temperature):
    probs = F.softmax(F.linear(h, WEIGHT, BIAS) / temperature, dim=-1)
    return torch.multinomial(probs, 3, replacement=True).flatten()


class TestGraphs(TestCase):
    def test_nanogpt_before_and_after(self):
        x = hidden(3, 5, 24)
        before, _ = graph_after_pass(nanogpt, x, backend="inductor")
        self.assertExpectedInline(
            before,
            """\
graph():
    %arg0_1 : [num_users=1] = placeholder[target=arg0_1]
    %arg1_1 : [num_users=1] = placeholder[target=arg1_1]
    %permute : [num_users=1] = call_function[target=torch.ops.aten.permute.default](args = (%arg0_1, [1, 0]), kwargs = {})
    %view : [num_users=1] = call_function[target=torch.ops.aten.view.default](args = (%arg1_1, [15, 24]), kwargs = {})
    %mm : [num_users=1] = call_function[target=torch.ops.aten.mm.default](args = (%view, %permute), kwargs = {})
    %view_1 : [num_users=1] = call_function[target=torch.ops.aten.view.default](args = (%mm, [3, 5, 1000]), kwargs = {})
    %select : [num_users=1] = call_function[target=torch.ops.aten.select.int](args = (%view_1, 1, -1), kwargs = {})
    %div : [num_users=2] = call_function[target=torch.ops.aten.div.Tensor](args = (%select, 0.8), kwargs = {})
    %amax : [num_users=1] = call_function[target=torch.ops.aten.amax.default](args = (%div, [-1], True), kwargs = {})
    %sub : [num_users=1] = call_function[target=torch.ops.aten.sub.Tensor](args = (%div, %amax), kwargs = {})
    %exp : [num_users=2] = call_function[target=torch.ops.aten.exp.default](args = (%sub,), kwargs = {})
    %sum_1 : [num_users=1] = call_function[target=torch.ops.aten.sum.dim_IntList](args = (%exp, [-1], True), kwargs = {})
    %div_1 : [num_users=1] = call_function[target=torch.ops.aten.div.Tensor](args = (%exp, %sum_1), kwargs = {})
    %multinomial : [num_users=1] = call_function[target=torch.ops.aten.multinomial.default](args = (%div_1, 1), kwargs = {})
    return (multinomial,)""",
        )
        after, rewrites = graph_after_pass(nanogpt, x)
        self.assertEqual(rewrites, {"multinomial": 1})
        self.assertExpectedInline(
            after,
            """\
graph():
    %arg0_1 : [num_users=1] = placeholder[target=arg0_1]
    %arg1_1 : [num_users=1] = placeholder[target=arg1_1]
    %select_int : [num_users=1] = call_function[target=torch.ops.aten.select.int](args = (%arg1_1, 1, -1), kwargs = {})
    %randint_low : [num_users=1] = call_function[target=torch.ops.aten.randint.low](args = (0, 4611686018427387904, []), kwargs = {device: cpu, pin_memory: False})
    %fused_sample_default : [num_users=1] = call_function[target=torch.ops.flashsampling.fused_sample.default](args = (%select_int, %arg0_1, None, None, 0.8, %randint_low, 0, 1, None, auto), kwargs = {})
    return (fused_sample_default,)""",
        )

    def test_gpt_fast_after(self):
        after, _ = graph_after_pass(gpt_fast, hidden(1, 5, 24))
        self.assertExpectedInline(
            after,
            """\
graph():
    %arg0_1 : [num_users=1] = placeholder[target=arg0_1]
    %arg1_1 : [num_users=1] = placeholder[target=arg1_1]
    %select_int : [num_users=1] = call_function[target=torch.ops.aten.select.int](args = (%arg1_1, 0, 0), kwargs = {})
    %select_int_1 : [num_users=1] = call_function[target=torch.ops.aten.select.int](args = (%select_int, 0, -1), kwargs = {})
    %randint_low : [num_users=1] = call_function[target=torch.ops.aten.randint.low](args = (0, 4611686018427387904, []), kwargs = {device: cpu, pin_memory: False})
    %view_default : [num_users=1] = call_function[target=torch.ops.aten.view.default](args = (%select_int_1, [-1, 24]), kwargs = {})
    %fused_sample_default : [num_users=1] = call_function[target=torch.ops.flashsampling.fused_sample.default](args = (%view_default, %arg0_1, None, None, 0.9, %randint_low, 0, 1, None, auto), kwargs = {})
    %view_default_1 : [num_users=1] = call_function[target=torch.ops.aten.view.default](args = (%fused_sample_default, [1]), kwargs = {})
    %convert_element_type : [num_users=1] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%view_default_1, torch.int32), kwargs = {})
    return (convert_element_type,)""",
        )

    def test_gumbel_bias_after(self):
        after, _ = graph_after_pass(gumbel_eps, hidden(3, 24))
        self.assertExpectedInline(
            after,
            """\
graph():
    %arg0_1 : [num_users=1] = placeholder[target=arg0_1]
    %arg1_1 : [num_users=1] = placeholder[target=arg1_1]
    %arg2_1 : [num_users=1] = placeholder[target=arg2_1]
    %randint_low : [num_users=1] = call_function[target=torch.ops.aten.randint.low](args = (0, 4611686018427387904, []), kwargs = {device: cpu, pin_memory: False})
    %view_default : [num_users=1] = call_function[target=torch.ops.aten.view.default](args = (%arg2_1, [-1, 24]), kwargs = {})
    %fused_sample_default : [num_users=1] = call_function[target=torch.ops.flashsampling.fused_sample.default](args = (%view_default, %arg0_1, %arg1_1, None, 1.0, %randint_low, 0, 1, None, auto), kwargs = {})
    return (fused_sample_default,)""",
        )

    def test_dynamic_batch_after(self):
        after, _ = graph_after_pass(nanogpt, hidden(3, 5, 24), dynamic=True)
        self.assertExpectedInline(
            after,
            """\
graph():
    %arg0_1 : [num_users=1] = placeholder[target=arg0_1]
    %arg1_1 : [num_users=1] = placeholder[target=arg1_1]
    %arg2_1 : [num_users=1] = placeholder[target=arg2_1]
    %arg3_1 : [num_users=1] = placeholder[target=arg3_1]
    %arg4_1 : [num_users=1] = placeholder[target=arg4_1]
    %mul : [num_users=0] = call_function[target=operator.mul](args = (%arg1_1, %arg2_1), kwargs = {})
    %convert_element_type_default_1 : [num_users=5] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%arg4_1, torch.float32), kwargs = {})
    %select_int : [num_users=1] = call_function[target=torch.ops.aten.select.int](args = (%arg3_1, 1, -1), kwargs = {})
    %lt_scalar : [num_users=1] = call_function[target=torch.ops.aten.lt.Scalar](args = (%convert_element_type_default_1, 0), kwargs = {})
    %abs_default : [num_users=1] = call_function[target=torch.ops.aten.abs.default](args = (%convert_element_type_default_1,), kwargs = {})
    %ne_scalar : [num_users=1] = call_function[target=torch.ops.aten.ne.Scalar](args = (%abs_default, inf), kwargs = {})
    %eq_tensor : [num_users=1] = call_function[target=torch.ops.aten.eq.Tensor](args = (%convert_element_type_default_1, %convert_element_type_default_1), kwargs = {})
    %mul_tensor : [num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%eq_tensor, %ne_scalar), kwargs = {})
    %ne_scalar_1 : [num_users=1] = call_function[target=torch.ops.aten.ne.Scalar](args = (%convert_element_type_default_1, 0), kwargs = {})
    %bitwise_and_tensor : [num_users=1] = call_function[target=torch.ops.aten.bitwise_and.Tensor](args = (%mul_tensor, %ne_scalar_1), kwargs = {})
    %logical_not_default : [num_users=1] = call_function[target=torch.ops.aten.logical_not.default](args = (%bitwise_and_tensor,), kwargs = {})
    %any_dims : [num_users=1] = call_function[target=torch.ops.aten.any.dims](args = (%logical_not_default,), kwargs = {})
    %logical_not_default_1 : [num_users=1] = call_function[target=torch.ops.aten.logical_not.default](args = (%any_dims,), kwargs = {})
    %_assert_async_msg : [num_users=0] = call_function[target=torch.ops.aten._assert_async.msg](args = (%logical_not_default_1, flashsampling: a rewritten sampling step divides its logits by a temperature of 0, inf or NaN, or by a negative temperature it cannot fold (per row with a bias, after a top-k / top-p mask, or of logits the graph is given); the fused sampler cannot draw from what those make of softmax (compile without backend='flashsampling' for them)), kwargs = {})
    %scalar_tensor_default : [num_users=1] = call_function[target=torch.ops.aten.scalar_tensor.default](args = (1.0,), kwargs = {dtype: torch.float32, layout: torch.strided, device: cpu})
    %scalar_tensor_default_1 : [num_users=1] = call_function[target=torch.ops.aten.scalar_tensor.default](args = (-1.0,), kwargs = {dtype: torch.float32, layout: torch.strided, device: cpu})
    %where_self : [num_users=1] = call_function[target=torch.ops.aten.where.self](args = (%lt_scalar, %scalar_tensor_default_1, %scalar_tensor_default), kwargs = {})
    %mul_tensor_1 : [num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%select_int, %where_self), kwargs = {})
    %abs_default_1 : [num_users=1] = call_function[target=torch.ops.aten.abs.default](args = (%convert_element_type_default_1,), kwargs = {})
    %mul_tensor_2 : [num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%abs_default_1, 1.0), kwargs = {})
    %randint_low : [num_users=1] = call_function[target=torch.ops.aten.randint.low](args = (0, 4611686018427387904, []), kwargs = {device: cpu, pin_memory: False})
    %view_default : [num_users=1] = call_function[target=torch.ops.aten.view.default](args = (%mul_tensor_1, [-1, 24]), kwargs = {})
    %fused_sample_default : [num_users=1] = call_function[target=torch.ops.flashsampling.fused_sample.default](args = (%view_default, %arg0_1, None, %mul_tensor_2, 1.0, %randint_low, 0, 1, None, auto), kwargs = {})
    return (fused_sample_default,)""",
        )

    def test_logits_returned_are_sampled_where_they_are(self):
        # The program reads the matmul's logits: it stays, and the draw reads them once.
        after, rewrites = graph_after_pass(logits_returned, hidden(3, 24))
        self.assertEqual(rewrites, {"multinomial": 1})
        self.assertExpectedInline(
            after,
            """\
graph():
    %arg0_1 : [num_users=1] = placeholder[target=arg0_1]
    %arg1_1 : [num_users=1] = placeholder[target=arg1_1]
    %permute : [num_users=1] = call_function[target=torch.ops.aten.permute.default](args = (%arg0_1, [1, 0]), kwargs = {})
    %mm : [num_users=2] = call_function[target=torch.ops.aten.mm.default](args = (%arg1_1, %permute), kwargs = {})
    %randint_low : [num_users=1] = call_function[target=torch.ops.aten.randint.low](args = (0, 4611686018427387904, []), kwargs = {device: cpu, pin_memory: False})
    %view_default : [num_users=1] = call_function[target=torch.ops.aten.view.default](args = (%mm, [-1, 1000]), kwargs = {})
    %sample_logits_default : [num_users=1] = call_function[target=torch.ops.flashsampling.sample_logits.default](args = (%view_default, None, 1.0, %randint_low, 0, 1), kwargs = {})
    return (sample_logits_default, mm)""",
        )


def _chi_square_p(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    observed = np.bincount(tokens.numpy(), minlength=probs.numel())
    return stats.chisquare(observed, probs.double().numpy() * tokens.numel()).pvalue


# 40_000 draws over V = 12 give the test power against a 1% shift in any one token's
# probability; p > 1e-4 keeps the fixed-seed test from flaking when the sampler is right.
@pytest.mark.parametrize("step", [multinomial_step, race_step, gumbel_step, multi_sample_step])
@pytest.mark.parametrize(
    "temperature",
    [0.7, torch.tensor(1.3), torch.tensor(-1.3)],
    ids=["float-T", "tensor-T", "negative-tensor-T"],
)
def test_compiled_step_keeps_the_distribution(step, temperature):
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(1)
    row = torch.randn(8)
    h = row.expand(40_000 // (3 if step is multi_sample_step else 1), 8).contiguous()
    with torch.no_grad():
        tokens = torch.compile(step, backend="flashsampling")(h, temperature)
    assert sum(counters["flashsampling"].values()) == 1
    probs = torch.softmax((F.linear(row, WEIGHT, BIAS) / temperature).double(), -1)
    assert _chi_square_p(tokens, probs) > 1e-4


def unbiased_multinomial_step(h, temperature):
    probs = F.softmax(F.linear(h, WEIGHT) / temperature, dim=-1)
    return torch.multinomial(probs, 20_000, replacement=True)


def test_per_row_negative_temperature_keeps_the_distribution():
    """softmax(l / T) with T < 0 favours the low logits; the rewrite folds the sign into the
    row's hidden state (there is no bias to flip), so each row keeps its own distribution."""
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(2)
    rows = torch.randn(2, 8)
    temperature = torch.tensor([[-0.8], [1.1]])
    with torch.no_grad():
        tokens = torch.compile(unbiased_multinomial_step, backend="flashsampling")(
            rows, temperature
        )
    assert counters["flashsampling"]["multinomial"] == 1
    for row, t, drawn in zip(rows, temperature, tokens, strict=True):
        probs = torch.softmax((F.linear(row, WEIGHT) / t).double(), -1)
        assert _chi_square_p(drawn, probs) > 1e-4


@pytest.mark.parametrize("step", [multinomial_step, gumbel_step])
@pytest.mark.parametrize("temperatures", [(0.7, 1.3, -0.9), (2, 3, -2)], ids=["float-T", "int-T"])
def test_dynamic_temperature_keeps_the_distribution(step, temperatures):
    """A Python temperature that changes between calls (a decode loop serving each
    request's temperature) becomes an input of the recompiled graph: a 0-d CPU tensor
    (floats) or a symbolic int. That graph is rewritten too, and the temperature's value
    and sign are taken when it runs."""
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(3)
    row = torch.randn(8)
    h = row.expand(40_000, 8).contiguous()
    compiled = torch.compile(step, backend="flashsampling")
    with torch.no_grad():
        compiled(h, temperatures[0])  # specializes on the first value; the next is dynamic
        for temperature in temperatures[1:]:
            tokens = compiled(h, temperature)
            probs = torch.softmax((F.linear(row, WEIGHT, BIAS) / temperature).double(), -1)
            assert _chi_square_p(tokens, probs) > 1e-4
        assert sum(counters["flashsampling"].values()) == 2
        with pytest.raises(RuntimeError, match="flashsampling: a rewritten"):
            compiled(h, type(temperatures[0])(0))


@pytest.mark.parametrize(
    "step, temperature",
    [
        (unbiased_multinomial_step, [0.0, 1.0]),
        (unbiased_multinomial_step, [float("nan"), 1.0]),
        (unbiased_multinomial_step, [float("inf"), 1.0]),
        (multinomial_step, [-1.0, 1.0]),
    ],
    ids=["zero", "nan", "inf", "negative-row-with-bias"],
)
def test_temperature_the_op_cannot_draw_from_fails_loudly(step, temperature):
    """0 and NaN make the program's probabilities NaN (torch.multinomial raises), inf makes
    them uniform, and one shared bias cannot take a per-row sign: the rewritten step raises
    rather than draw from another distribution. (CPU: on CUDA it is a device-side assert.)"""
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(step, backend="flashsampling")
    with torch.no_grad(), pytest.raises(RuntimeError, match="flashsampling: a rewritten"):
        compiled(torch.randn(2, 8), torch.tensor(temperature)[:, None])
    assert counters["flashsampling"]["multinomial"] == 1


def test_greedy_matches_eager_bf16():
    """bf16 logits: the fused argmax breaks ties as torch.argmax on the bf16 logits does."""
    weight = torch.randn(1000, 64, dtype=torch.bfloat16)
    h = torch.randn(17, 64, dtype=torch.bfloat16)

    def greedy(h):
        return F.linear(h, weight).argmax(-1)

    torch._dynamo.reset()
    counters.clear()
    with torch.no_grad():
        compiled = torch.compile(greedy, backend="flashsampling")(h)
    assert counters["flashsampling"]["greedy"] == 1
    torch.testing.assert_close(compiled, greedy(h))


def test_dynamic_batch_compiles_once():
    counter = CompileCounterWithBackend("flashsampling")
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(multinomial_step, backend=counter)
    for batch in (3, 5, 17):  # batch 1 is specialized, as with stock Inductor
        h = torch.randn(batch, 8)
        if batch == 3:
            torch._dynamo.mark_dynamic(h, 0)
        with torch.no_grad():
            assert compiled(h, 0.9).shape == (batch,)
    assert counter.frame_count == 1
    assert counters["flashsampling"]["multinomial"] == 1


def test_fx_graph_cache_hit_is_still_rewritten():
    h = torch.randn(3, 8)
    with fresh_cache(), torch._inductor.config.patch(fx_graph_cache=True), torch.no_grad():
        for expected_hits in (0, 1):
            torch._dynamo.reset()
            counters.clear()
            compiled = torch.compile(multinomial_step, backend="flashsampling")
            _, (code, *_) = run_and_get_code(compiled, h, 0.9)
            assert counters["inductor"]["fxgraph_cache_hit"] == expected_hits
            assert "flashsampling.fused_sample" in code


@pytest.mark.gpu
def test_cuda_graph_replays_draw_fresh_tokens():
    """mode="reduce-overhead": every replay draws new tokens, with the right distribution,
    and no [B, V] buffer is allocated."""
    vocab, dim, batch = 32_000, 256, 64
    weight = torch.randn(vocab, dim, device="cuda", dtype=torch.bfloat16) * 0.05
    h = torch.randn(1, dim, device="cuda", dtype=torch.bfloat16).expand(batch, dim).contiguous()

    def step(h):
        probs = torch.softmax(F.linear(h, weight).float() / 0.8, dim=-1)
        return torch.multinomial(probs, 1).squeeze(-1)

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(step, backend="flashsampling", mode="reduce-overhead")
    with torch.no_grad():
        _, (code, *_) = run_and_get_code(compiled, h)
        assert counters["flashsampling"]["multinomial"] == 1
        assert f"{batch}, {vocab}" not in code  # no [B, V] buffer in the compiled step
        draws = torch.stack([compiled(h).clone() for _ in range(200)])
    assert (draws[1:] != draws[:1]).any(dim=1).all(), "a replay repeated the previous tokens"
    probs = torch.softmax(F.linear(h[0], weight).double() / 0.8, -1)
    assert _top_tokens_chi_square_p(draws, probs) > 1e-4


def _top_tokens_chi_square_p(draws: torch.Tensor, probs: torch.Tensor, top: int = 20) -> float:
    """Chi-square p-value of the draws over the `top` likeliest tokens and one cell for the
    rest (a large V leaves most tokens' cells nearly empty)."""
    probs = probs.cpu()
    likeliest = probs.argsort(descending=True)[:top]
    observed = torch.stack([(draws == t).sum() for t in likeliest]).cpu().double()
    expected = probs[likeliest] * draws.numel()
    return stats.chisquare(
        np.append(observed.numpy(), draws.numel() - observed.sum().item()),
        np.append(expected.numpy(), draws.numel() - expected.sum().item()),
    ).pvalue


@pytest.mark.gpu
def test_cuda_graph_replays_with_row_temperatures():
    """Per-row temperature tensors on the GPU, a negative one among them: under
    mode="reduce-overhead" the temperature check and the sign folding replay with the
    graph, and each row keeps its own distribution."""
    vocab, dim = 4096, 128
    weight = torch.randn(vocab, dim, device="cuda") * 0.15
    h = torch.randn(2, dim, device="cuda")
    temperature = torch.tensor([[-0.9], [1.2]], device="cuda")

    def step(h, t):
        probs = torch.softmax(F.linear(h, weight) / t, dim=-1)
        return torch.multinomial(probs, 4096, replacement=True)

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(step, backend="flashsampling", mode="reduce-overhead")
    with torch.no_grad():
        draws = torch.cat([compiled(h, temperature).clone() for _ in range(16)], dim=1)
    assert counters["flashsampling"]["multinomial"] == 1
    for row in range(2):
        probs = torch.softmax(F.linear(h[row], weight).double() / temperature[row].double(), -1)
        assert _top_tokens_chi_square_p(draws[row], probs) > 1e-4


@pytest.mark.gpu
def test_dynamic_float_temperature_on_cuda():
    """The symbolic temperature comes from a 0-d CPU input while the LM head runs on the
    GPU: the rewrite makes it a device tensor in the graph, and the step samples right."""
    vocab, dim, batch = 4096, 128, 8192
    weight = torch.randn(vocab, dim, device="cuda") * 0.15
    row = torch.randn(dim, device="cuda")
    h = row.expand(batch, dim).contiguous()

    def step(h, t):
        return torch.multinomial(torch.softmax(F.linear(h, weight) / t, dim=-1), 1)

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(step, backend="flashsampling", mode="reduce-overhead")
    with torch.no_grad():
        compiled(h, 0.8)
        for temperature in (1.1, -0.9):
            draws = torch.cat([compiled(h, temperature).clone() for _ in range(8)])
            probs = torch.softmax(F.linear(row, weight).double() / temperature, -1)
            assert _top_tokens_chi_square_p(draws, probs) > 1e-4
    assert counters["flashsampling"]["multinomial"] == 2
