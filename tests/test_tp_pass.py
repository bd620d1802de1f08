# ruff: noqa: E501  (the expected graphs are printed verbatim)
"""The compiler pass on tensor-parallel programs: the gather of vocabulary-sharded logits,
then a sampling idiom, becomes one ``tp_fused_sample`` call (gloo ranks on the CPU)."""

from __future__ import annotations

import traceback

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from flashsampling_inductor import fused_sample
from flashsampling_inductor.patterns import tp_gather

from .graph_capture import TestCase, graph_after_pass
from .sampling_oracle import assert_pathwise_equal, make_problem
from .tp_ranks import run_ranks

BATCH, DIM, VOCAB = 3, 16, 37  # V % P != 0: shards padded to equal size, then sliced
BIAS = torch.linspace(-2.0, 2.0, VOCAB)


def _problem(world):
    """hidden [B, D] and this rank's padded [S, D] shard, S = ceil(V / P)."""
    hidden, weight = make_problem(BATCH, VOCAB, DIM, device=torch.device("cpu"))
    shard = -(-VOCAB // world)
    padded = torch.cat([weight, torch.zeros(world * shard - VOCAB, DIM)])
    return hidden, weight, padded, shard


def _functional(hidden, weight_shard):
    logits = tp_gather.search_functional(hidden, weight_shard, dist.group.WORLD, 0.7)
    return logits


def _sliced_functional(hidden, weight_shard):
    import torch.distributed._functional_collectives as funcol

    logits = funcol.all_gather_tensor(hidden @ weight_shard.T, -1, dist.group.WORLD)
    return torch.multinomial(torch.softmax(logits[:, :VOCAB] / 0.7, dim=-1), 1)


def _into_tensor(hidden, weight_shard):
    return tp_gather.search_into_tensor(hidden, weight_shard, dist.group.WORLD, VOCAB)


def _megatron_chunk_cat(hidden, weight_shard):
    """Megatron-core's _gather_along_last_dim: a [P * B, S] buffer, then chunk / cat."""
    world = dist.get_world_size()
    logits = hidden @ weight_shard.T
    output = torch.empty((logits.shape[0] * world, logits.shape[1]), dtype=logits.dtype)
    dist.all_gather_into_tensor(output, logits.contiguous())
    logits = torch.cat(output.chunk(world, dim=0), dim=-1).contiguous()[:, :VOCAB]
    return torch.multinomial(torch.softmax(logits / 0.7, dim=-1), 1)


def _all_gather_list(hidden, weight_shard):
    """``dist.all_gather`` into a list, then ``cat`` (fairscale, older Megatron)."""
    logits = hidden @ weight_shard.T
    parts = [torch.empty_like(logits) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, logits)
    logits = torch.cat(parts, dim=-1)[:, :VOCAB]
    return torch.multinomial(torch.softmax(logits / 0.7, dim=-1), 1)


def _three_d_functional(hidden, weight_shard):
    """gpt-fast's TP generate: the model's [B, T, V / P] output gathered on the last dim,
    then the last position's logits."""
    import torch.distributed._functional_collectives as funcol

    states = torch.stack([hidden.flip(0), hidden], dim=1)  # [B, T = 2, D]
    logits = funcol.all_gather_tensor(F.linear(states, weight_shard), -1, dist.group.WORLD)
    return torch.multinomial(torch.softmax(logits[..., :VOCAB][:, -1] / 0.7, dim=-1), 1)


def _three_d_unsliced(hidden, weight_shard):
    """The same at T = 1 without a slice to V (V % P == 0 in the model, as gpt-fast's)."""
    import torch.distributed._functional_collectives as funcol

    logits = funcol.all_gather_tensor(F.linear(hidden[:, None], weight_shard), -1, dist.group.WORLD)
    return torch.argmax(logits[:, -1], dim=-1)


def _logits_returned(hidden, weight_shard):
    import torch.distributed._functional_collectives as funcol

    logits = funcol.all_gather_tensor(hidden @ weight_shard.T, -1, dist.group.WORLD)
    return torch.argmax(logits, dim=-1), logits


def _top_k_functional(hidden, weight_shard):  # gpt-fast's top-k after the gather
    import torch.distributed._functional_collectives as funcol

    logits = funcol.all_gather_tensor(hidden @ weight_shard.T, -1, dist.group.WORLD)[:, :VOCAB]
    pivot = torch.topk(logits, 5)[0].select(-1, -1).unsqueeze(-1)
    logits = torch.where(logits < pivot, -float("Inf"), logits)
    return torch.multinomial(torch.softmax(logits, dim=-1), 1)


def _hf_top_k_top_p(hidden, weight_shard):  # transformers' TopK then TopP warpers
    import torch.distributed._functional_collectives as funcol

    logits = funcol.all_gather_tensor(hidden @ weight_shard.T, -1, dist.group.WORLD)
    scores = logits[:, :VOCAB] / 0.7
    scores = scores.masked_fill(scores < torch.topk(scores, 10)[0][..., -1, None], -float("inf"))
    sorted_logits, sorted_indices = torch.sort(scores, descending=False)
    cumulative_probs = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    sorted_indices_to_remove = cumulative_probs <= (1 - 0.8)
    sorted_indices_to_remove[..., -1:] = 0
    remove = sorted_indices_to_remove.scatter(1, sorted_indices, sorted_indices_to_remove)
    scores = scores.masked_fill(remove, -float("inf"))
    return torch.multinomial(torch.softmax(scores, dim=-1), 1)


def _top_p_alone(hidden, weight_shard):  # transformers' TopP warper without a top-k
    import torch.distributed._functional_collectives as funcol

    logits = funcol.all_gather_tensor(hidden @ weight_shard.T, -1, dist.group.WORLD)
    sorted_logits, sorted_indices = torch.sort(logits[:, :VOCAB], descending=False)
    cumulative_probs = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    sorted_indices_to_remove = cumulative_probs <= (1 - 0.8)
    sorted_indices_to_remove[..., -1:] = 0
    remove = sorted_indices_to_remove.scatter(1, sorted_indices, sorted_indices_to_remove)
    scores = logits[:, :VOCAB].masked_fill(remove, -float("inf"))
    return torch.multinomial(torch.softmax(scores, dim=-1), 1)


def _min_p_functional(hidden, weight_shard):
    import torch.distributed._functional_collectives as funcol

    logits = funcol.all_gather_tensor(hidden @ weight_shard.T, -1, dist.group.WORLD)
    logits = logits[:, :VOCAB] / 0.7
    probs = torch.softmax(logits, -1)
    top = probs.max(-1, keepdim=True).values
    logits = logits.masked_fill(probs < 0.2 * top, float("-inf"))
    return torch.multinomial(torch.softmax(logits, -1), 1)


def _bias_functional(hidden, weight_shard, bias_shard):  # a sharded head with a bias
    import torch.distributed._functional_collectives as funcol

    logits = F.linear(hidden, weight_shard, bias_shard)
    logits = funcol.all_gather_tensor(logits, -1, dist.group.WORLD)[:, :VOCAB]
    return torch.multinomial(torch.softmax(logits / 0.7, dim=-1), 1)


def _recorded_seeds() -> list[int]:
    """From now on in this rank, the seed each TP call takes (group rank 0's draw), in
    order: what TP = 1 draws with is then known."""
    from flashsampling_inductor import tp

    seeds, agreed = [], tp._agreed_seed

    def record(seed, group_name, device):
        seed = agreed(seed, group_name, device)
        seeds.append(int(seed))
        return seed

    tp._agreed_seed = record
    return seeds


def _bias_worker(rank, world):
    """The bias step's graph after the pass, its tokens over 3 calls and their seeds."""
    hidden, _, padded, shard = _problem(world)
    bias = torch.cat([BIAS, torch.zeros(world * shard - VOCAB)])
    args = (
        hidden,
        padded[rank * shard : (rank + 1) * shard],
        bias[rank * shard : (rank + 1) * shard],
    )
    graph, rewrites = graph_after_pass(_bias_functional, *args)
    torch._dynamo.reset()
    step = torch.compile(_bias_functional, backend="flashsampling", fullgraph=True)
    seeds = _recorded_seeds()
    return graph, rewrites, [step(*args) for _ in range(3)], seeds


def _temperature_before(hidden, weight_shard):  # the shard's logits scaled, then gathered
    import torch.distributed._functional_collectives as funcol

    logits = funcol.all_gather_tensor((hidden @ weight_shard.T) / 0.7, -1, dist.group.WORLD)
    return torch.multinomial(torch.softmax(logits[:, :VOCAB], dim=-1), 1)


def _softcap_before(hidden, weight_shard):  # Gemma 2's soft-cap on the shard, then gathered
    import torch.distributed._functional_collectives as funcol

    logits = torch.tanh((hidden @ weight_shard.T) / 30.0) * 30.0
    logits = funcol.all_gather_tensor(logits, -1, dist.group.WORLD)[:, :VOCAB]
    return torch.multinomial(torch.softmax(logits / 0.7, dim=-1), 1)


def _noise_before(hidden, weight_shard):  # near miss: noise that spans the vocabulary
    import torch.distributed._functional_collectives as funcol

    logits = (hidden @ weight_shard.T) * torch.rand(weight_shard.shape[0])
    logits = funcol.all_gather_tensor(logits, -1, dist.group.WORLD)[:, :VOCAB]
    return torch.multinomial(torch.softmax(logits, dim=-1), 1)


def _softcap_functional(hidden, weight_shard):  # Gemma 2's soft-cap after the gather
    import torch.distributed._functional_collectives as funcol

    logits = funcol.all_gather_tensor(hidden @ weight_shard.T, -1, dist.group.WORLD)[:, :VOCAB]
    logits = torch.tanh(logits / 30.0) * 30.0
    return torch.multinomial(torch.softmax(logits, dim=-1), 1)


def _single_row_functional(hidden, weight_shard):
    """B = 1 with gather_dim=1: the functional gather's re-layout is then one view. (With
    gather_dim=-1 torch itself mis-shapes that view at B = 1, in eager too.)"""
    import torch.distributed._functional_collectives as funcol

    logits = funcol.all_gather_tensor(hidden[:1] @ weight_shard.T, 1, dist.group.WORLD)
    return torch.multinomial(torch.softmax(logits[:, :VOCAB] / 0.7, dim=-1), 1)


def _last_position(hidden, weight_shard):
    """An HF model's decode step: its last hidden state [B, 1, D], the sharded head's [B, 1,
    V / P] logits gathered on the last dim, the last position, then the slice to V."""
    import torch.distributed._functional_collectives as funcol

    logits = funcol.all_gather_tensor(F.linear(hidden[:, None], weight_shard), -1, dist.group.WORLD)
    return torch.multinomial(torch.softmax(logits[:, -1, :VOCAB] / 0.7, dim=-1), 1)


def _last_position_one_row(hidden, weight_shard):
    """The same at B = 1 (gather_dim=2: torch's own B = 1 view of gather_dim=-1 is broken):
    the gathered [P, 1, V / P] rows are one view of the [1, 1, V] logits."""
    import torch.distributed._functional_collectives as funcol

    states = hidden[:1, None]
    logits = funcol.all_gather_tensor(F.linear(states, weight_shard), 2, dist.group.WORLD)
    return torch.multinomial(torch.softmax(logits[:, -1, :VOCAB] / 0.7, dim=-1), 1)


STEPS = {
    "functional": _functional,
    "single_row": _single_row_functional,
    "top_k": _top_k_functional,
    "temperature_before": _temperature_before,
    "softcap_before": _softcap_before,
    "noise_before": _noise_before,
    "hf_top_k_top_p": _hf_top_k_top_p,
    "top_p_alone": _top_p_alone,
    "min_p": _min_p_functional,
    "softcap": _softcap_functional,
    "sliced": _sliced_functional,
    "into_tensor": _into_tensor,
    "megatron": _megatron_chunk_cat,
    "all_gather_list": _all_gather_list,
    "three_d": _three_d_functional,
    "three_d_unsliced": _three_d_unsliced,
    "logits_returned": _logits_returned,
    "last_position": _last_position,
    "last_position_one_row": _last_position_one_row,
}


def _graph_worker(rank, world, names):
    """name -> (the step's graph after the pass, its rewrites), or the traceback of its
    failure: a step that fails fails its own test only."""
    hidden, _, padded, shard = _problem(world)
    weight_shard = padded[rank * shard : (rank + 1) * shard]
    graphs = {}
    for name in names:
        try:
            graphs[name] = graph_after_pass(STEPS[name], hidden, weight_shard)
        except Exception:
            graphs[name] = traceback.format_exc()
    return graphs


def _explain_worker(rank, world, names):
    from flashsampling_inductor import explain

    hidden, _, padded, shard = _problem(world)
    sites = {}
    for name in names:
        torch._dynamo.reset()
        sites[name] = explain(STEPS[name], hidden, padded[rank * shard : (rank + 1) * shard])
    return sites


TOKEN_STEPS = ("sliced", "into_tensor", "megatron", "all_gather_list", "three_d", "softcap",
               "top_k", "hf_top_k_top_p", "min_p", "temperature_before", "softcap_before",
               "last_position")  # fmt: skip
# What TP = 1 draws for the steps that are not plain sampling at T = 0.7.
TP1_KNOBS = {
    "softcap": dict(softcap=30.0),
    "top_k": dict(top_k=5),
    "hf_top_k_top_p": dict(temperature=0.7, top_k=10, top_p=0.8),
    "min_p": dict(temperature=0.7, min_p=0.2),
    "softcap_before": dict(softcap=30.0, temperature=0.7),
}


def test_the_cuda_switch_is_part_of_the_catalogs_hash(monkeypatch):
    """Graphs compiled with TP truncation lowered on CUDA or not are cached apart."""
    from flashsampling_inductor import patterns

    before = patterns.source_hash()
    monkeypatch.setattr(tp_gather, "TRUNCATION_ON_CUDA", not tp_gather.TRUNCATION_ON_CUDA)
    assert patterns.source_hash() != before


def _as_if_on_cuda_worker(rank, world, names, truncation_on_cuda=True):
    """The pass's decisions for steps as if their logits were on a GPU, with the switch."""
    tp_gather.TRUNCATION_ON_CUDA = truncation_on_cuda
    tp_gather._on_cuda = lambda logits: not tp_gather.TRUNCATION_ON_CUDA
    graphs, sites = _graph_worker(rank, world, names), _explain_worker(rank, world, names)
    return [(graphs[name], sites[name]) for name in names]


def _tokens_worker(rank, world):
    """Compiled steps on every rank, and what TP = 1 draws with the same seeds."""
    hidden, weight, padded, shard = _problem(world)
    weight_shard = padded[rank * shard : (rank + 1) * shard]
    torch.manual_seed(rank)  # ranks seeded apart: the pass must make them agree
    out = {}
    for name in TOKEN_STEPS:
        torch._dynamo.reset()
        step = torch.compile(STEPS[name], backend="flashsampling", fullgraph=True)
        seeds = _recorded_seeds()
        out[name] = [step(hidden, weight_shard) for _ in range(3)]
        out[name, "seeds"] = seeds
    return out


# The steps whose graphs TestTpPass reads, per world size: each set is traced in one run of
# the ranks, on first use. A rank is a fresh process, whose first trace costs seconds
# (imports, Dynamo's set-up) where the next ones cost a tenth of one.
GRAPHS = {
    2: ("functional", "into_tensor", "single_row", "top_k", "hf_top_k_top_p", "min_p",
        "temperature_before", "softcap_before", "noise_before", "top_p_alone", "softcap",
        "last_position_one_row", "three_d_unsliced", "logits_returned"),
    3: ("sliced", "last_position"),
}  # fmt: skip


class TestTpPass(TestCase):
    traced: dict[int, list[dict]] = {}  # world -> each rank's {name: graph, rewrites}

    def graph(self, name, world=2):
        if world not in self.traced:
            self.traced[world] = run_ranks(world, _graph_worker, GRAPHS[world])
        per_rank = [graphs[name] for graphs in self.traced[world]]
        if isinstance(per_rank[0], str):
            raise AssertionError(f"rank 0 failed to trace {name}:\n{per_rank[0]}")
        assert per_rank[1] == per_rank[0], "ranks traced different graphs"
        return per_rank[0]

    def test_functional_gather_then_multinomial(self):
        graph, rewrites = self.graph("functional")
        self.assertEqual(rewrites.get("tp_all_gather"), 1, graph)
        self.assertExpectedInline(
            graph,
            """\
graph():
    %arg0_1 : [num_users=1] = placeholder[target=arg0_1]
    %arg1_1 : [num_users=1] = placeholder[target=arg1_1]
    %randint_low : [num_users=1] = call_function[target=torch.ops.aten.randint.low](args = (0, 4611686018427387904, []), kwargs = {device: cpu, pin_memory: False})
    %view_default : [num_users=1] = call_function[target=torch.ops.aten.view.default](args = (%arg0_1, [-1, 16]), kwargs = {})
    %tp_fused_sample_default : [num_users=1] = call_function[target=torch.ops.flashsampling.tp_fused_sample.default](args = (%view_default, %arg1_1, None, None, 0.7, %randint_low, 0, 1, None, auto, -19, 38, 0, True), kwargs = {})
    return (tp_fused_sample_default,)""",
        )

    def test_padded_gather_sliced_to_the_vocabulary(self):
        graph, rewrites = self.graph("sliced", world=3)
        self.assertEqual(rewrites.get("tp_all_gather"), 1, graph)
        self.assertExpectedInline(
            graph,
            """\
graph():
    %arg0_1 : [num_users=1] = placeholder[target=arg0_1]
    %arg1_1 : [num_users=1] = placeholder[target=arg1_1]
    %randint_low : [num_users=1] = call_function[target=torch.ops.aten.randint.low](args = (0, 4611686018427387904, []), kwargs = {device: cpu, pin_memory: False})
    %view_default : [num_users=1] = call_function[target=torch.ops.aten.view.default](args = (%arg1_1, [-1, 16]), kwargs = {})
    %tp_fused_sample_default : [num_users=1] = call_function[target=torch.ops.flashsampling.tp_fused_sample.default](args = (%view_default, %arg0_1, None, None, 0.7, %randint_low, 0, 1, None, auto, -13, 37, 0, True), kwargs = {})
    return (tp_fused_sample_default,)""",
        )

    def test_gather_into_a_buffer_then_greedy(self):
        graph, rewrites = self.graph("into_tensor")
        self.assertEqual(rewrites.get("tp_all_gather"), 1, graph)
        self.assertExpectedInline(
            graph,
            """\
graph():
    %arg0_1 : [num_users=1] = placeholder[target=arg0_1]
    %arg1_1 : [num_users=1] = placeholder[target=arg1_1]
    %empty : [num_users=0] = call_function[target=torch.ops.aten.empty.memory_format](args = ([6, 19],), kwargs = {dtype: torch.float32, device: cpu, pin_memory: False})
    %view_default : [num_users=1] = call_function[target=torch.ops.aten.view.default](args = (%arg0_1, [-1, 16]), kwargs = {})
    %tp_fused_sample_default : [num_users=1] = call_function[target=torch.ops.flashsampling.tp_fused_sample.default](args = (%view_default, %arg1_1, None, None, 0.0, None, 0, 1, None, auto, -19, 37, 0, False), kwargs = {})
    %view_default_1 : [num_users=1] = call_function[target=torch.ops.aten.view.default](args = (%tp_fused_sample_default, [3]), kwargs = {})
    return (view_default_1,)""",
        )

    def test_single_row_gather_is_one_view_and_rewritten(self):
        graph, rewrites = self.graph("single_row")
        self.assertEqual(rewrites.get("tp_all_gather"), 1, graph)
        self.assertIn("tp_fused_sample", graph)
        self.assertNotIn("all_gather_into_tensor", graph)

    def test_top_k_top_p_min_p_after_the_gather_are_rewritten(self):
        """gpt-fast's top-k, transformers' TopK + TopP warpers, a min-p mask: one TP call
        with the truncation's knobs, no gather of the logits left."""
        for name, knobs in (
            ("top_k", "True, 0.0, 5)"),
            ("hf_top_k_top_p", "True, 0.0, 10, None, 0.8)"),
            ("min_p", "True, 0.0, 0, None, 1.0, None, 0.2)"),
        ):
            graph, rewrites = self.graph(name)
            self.assertEqual(rewrites.get("tp_all_gather"), 1, (name, rewrites))
            (call,) = [line for line in graph.splitlines() if "tp_fused_sample.default" in line]
            self.assertTrue(call.rstrip().endswith(knobs + ", kwargs = {})"), call)
            for gone in ("all_gather_into_tensor", "aten.topk", "aten.sort", "aten.multinomial"):
                self.assertNotIn(gone, graph, name)

    def test_steps_on_the_shard_before_the_gather_are_rewritten(self):
        """A temperature or a soft-cap applied to the shard's logits before the gather
        commutes with it: the TP call takes them; noise that spans the vocabulary does
        not, and that gather is left alone."""
        for name, knobs in (
            ("temperature_before", "None, 0.7, %randint_low, 0, 1, None, auto, -19, 37, 0, True)"),
            (
                "softcap_before",
                "None, 0.7, %randint_low, 0, 1, None, auto, -19, 37, 0, True, 30.0)",
            ),
        ):
            graph, rewrites = self.graph(name)
            self.assertEqual(rewrites, {"multinomial": 1, "tp_all_gather": 1}, name)
            (call,) = [line for line in graph.splitlines() if "tp_fused_sample.default" in line]
            self.assertTrue(call.rstrip().endswith(knobs + ", kwargs = {})"), call)
            self.assertNotIn("all_gather_into_tensor", graph)
        graph, rewrites = self.graph("noise_before")
        self.assertNotIn("tp_all_gather", rewrites)
        self.assertIn("all_gather_into_tensor", graph)
        self.assertNotIn("tp_gathered_weight", graph)

    def test_truncation_after_the_gather_on_cuda_follows_the_switch(self):
        """On GPUs top-k / top-p / min-p after the gather are rewritten (the TP op's kernels
        beat the gathered logits there); with ``TRUNCATION_ON_CUDA`` off they are left
        alone, and said so, while plain sampling and the soft-cap are still rewritten."""
        truncating = ("top_k", "hf_top_k_top_p", "min_p")
        for (_, rewrites), _ in run_ranks(2, _as_if_on_cuda_worker, truncating)[0]:
            self.assertEqual(rewrites.get("tp_all_gather"), 1, rewrites)
        names = (*truncating, "sliced", "softcap")
        decisions = run_ranks(2, _as_if_on_cuda_worker, names, False)[0]
        for name, ((graph, rewrites), sites) in zip(names, decisions, strict=True):
            if name in truncating:
                self.assertNotIn("tp_all_gather", rewrites)
                self.assertIn("all_gather_into_tensor", graph)
                self.assertNotIn("tp_gathered_weight", graph)
                assert "TRUNCATION_ON_CUDA = False" in sites[0].reason, sites
            else:
                self.assertEqual(rewrites.get("tp_all_gather"), 1, name)

    def test_top_p_without_top_k_after_the_gather_is_left_to_stock_inductor(self):
        """The nucleus of a whole row needs every token's mass: the gather is not lifted (a
        fused call on the gathered weight would gather the whole weight each step)."""
        graph, rewrites = self.graph("top_p_alone")
        self.assertNotIn("tp_all_gather", rewrites)
        self.assertNotIn("tp_fused_sample", graph)
        self.assertNotIn("tp_gathered_weight", graph)
        self.assertIn("all_gather_into_tensor", graph)
        self.assertIn("aten.multinomial", graph)

    def test_softcap_after_the_gather_is_rewritten(self):
        """Gemma 2's soft-cap is elementwise: each rank caps its shard's logits."""
        graph, rewrites = self.graph("softcap")
        assert rewrites == {"multinomial": 1, "tp_all_gather": 1}, rewrites
        (call,) = [line for line in graph.splitlines() if "tp_fused_sample.default" in line]
        self.assertTrue(call.rstrip().endswith("True, 30.0), kwargs = {})"), call)
        for gone in ("all_gather_into_tensor", "aten.tanh", "aten.multinomial"):
            self.assertNotIn(gone, graph)

    def test_a_gather_left_alone_says_why(self):
        """explain() (and the warning) name the gather and the step the TP op cannot take,
        not the re-layout the walk from the sampling op stops at."""
        (site,) = run_ranks(2, _explain_worker, ("top_p_alone",))[0]["top_p_alone"]
        assert not site.rewritten, site
        assert "gathered across tensor-parallel ranks" in site.reason, site
        assert "(aten.sort.default): a sort of the whole row (top-p without" in site.reason, site

    def test_an_hf_last_position_then_the_slice_is_rewritten(self):
        """[B, 1, D] hidden states: the position picked before the slice to V (rewritten
        as the slice first), and at B = 1 the one view of the gathered rows."""
        for name, world in (("last_position", 3), ("last_position_one_row", 2)):
            graph, rewrites = self.graph(name, world)
            self.assertEqual(rewrites.get("tp_all_gather"), 1, (name, world, graph))
            self.assertNotIn("all_gather_into_tensor", graph)

    def test_a_three_d_gather_without_a_slice_is_rewritten(self):
        _, rewrites = self.graph("three_d_unsliced")
        assert rewrites == {"greedy": 1, "tp_all_gather": 1}, rewrites

    def test_gathered_logits_with_another_user_are_not_rewritten(self):
        graph, rewrites = self.graph("logits_returned")
        self.assertNotIn("tp_all_gather", rewrites)
        self.assertIn("all_gather_into_tensor", graph)
        self.assertNotIn("tp_gathered_weight", graph)


@pytest.mark.parametrize("world", [3, 4])
def test_compiled_tp_steps_draw_the_tokens_of_tp1(world):
    per_rank = run_ranks(world, _tokens_worker)
    hidden, weight, _, _ = _problem(world)
    for name in TOKEN_STEPS:
        for other in per_rank[1:]:
            for a, b in zip(other[name], per_rank[0][name], strict=True):
                assert torch.equal(a, b), name
        for call, tokens in enumerate(per_rank[0][name]):
            if name == "into_tensor":  # greedy
                expected = fused_sample(hidden, weight, temperature=0.0, impl="torch")[:, 0]
                assert torch.equal(tokens, expected)
                continue
            seed = per_rank[0][name, "seeds"][call]
            if name in TP1_KNOBS:  # the reference on both sides: exact
                expected = fused_sample(hidden, weight, seed=seed, impl="torch", **TP1_KNOBS[name])
                assert torch.equal(tokens, expected), name
                continue
            expected = fused_sample(hidden, weight, temperature=0.7, seed=seed, impl="torch")
            assert_pathwise_equal(tokens, expected, hidden, weight, temperature=0.7, seed=seed)


def _tp1_step(hidden, weight):
    return torch.multinomial(torch.softmax(hidden @ weight.T / 0.7, dim=-1), 1)


def _manual_seed_worker(rank, world, apart):
    """Steps under torch.manual_seed: compiled (the pass lowers the TP step) and eager
    (tp_fused_sample with seed=None), TP = P on the shard, then TP = 1 on the whole head
    under rank 0's seed. ``apart``: each rank seeds its generator apart."""
    from flashsampling_inductor import tp_fused_sample

    hidden, weight, padded, shard = _problem(world)
    weight_shard = padded[rank * shard : (rank + 1) * shard]
    torch._dynamo.reset()
    tp_step = torch.compile(_sliced_functional, backend="flashsampling", fullgraph=True)
    tp1_step = torch.compile(_tp1_step, backend="flashsampling", fullgraph=True)
    torch.manual_seed(1234 + rank * apart)
    compiled = [tp_step(hidden, weight_shard) for _ in range(3)]
    eager = [
        tp_fused_sample(hidden, weight_shard, vocab_start=rank * shard, vocab_size=VOCAB,
                        temperature=0.7)
        for _ in range(3)
    ]  # fmt: skip
    torch.manual_seed(1234)
    compiled_tp1 = [tp1_step(hidden, weight) for _ in range(3)]
    eager_tp1 = [fused_sample(hidden, weight, temperature=0.7) for _ in range(3)]
    return compiled, eager, compiled_tp1, eager_tp1


@pytest.mark.parametrize("world, apart", [(2, False), (3, True)])
def test_seed_none_draws_the_tokens_of_tp1_under_the_same_manual_seed(world, apart):
    """seed=None: TP = P draws TP = 1's tokens under the same torch.manual_seed (compiled:
    the graph keeps its in-graph draw of the seed, Inductor's RNG as at TP = 1; eager: the
    default generator's draw, as fused_sample), and ranks seeded apart agree on rank 0's."""
    per_rank = run_ranks(world, _manual_seed_worker, int(apart))
    compiled, eager, compiled_tp1, eager_tp1 = per_rank[0]
    for other in per_rank[1:]:
        assert all(
            torch.equal(a, b) for a, b in zip(other[0] + other[1], compiled + eager, strict=True)
        )
    assert all(torch.equal(a, b) for a, b in zip(compiled, compiled_tp1, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(eager, eager_tp1, strict=True))
    assert not torch.equal(eager[0], eager[1]) or not torch.equal(eager[1], eager[2])


@pytest.mark.parametrize("world", [2, 3])
def test_a_sharded_head_with_a_bias_is_rewritten_with_its_bias_shard(world):
    """F.linear(hidden, W_shard, b_shard) then the gather: the TP call takes each rank's
    bias rows (no gather of the bias left) and draws TP=1's tokens."""
    per_rank = run_ranks(world, _bias_worker)
    graph, rewrites, tokens, seeds = per_rank[0]
    assert rewrites == {"multinomial": 1, "tp_all_gather": 1}, rewrites
    (call,) = [line for line in graph.splitlines() if "tp_fused_sample.default" in line]
    assert call.rstrip().endswith("0.0, 0, None, 1.0, None, 0.0, True), kwargs = {})"), call
    assert "all_gather" not in graph and "tp_gathered" not in graph, graph
    hidden, weight, _, _ = _problem(world)
    for other in per_rank[1:]:
        assert all(torch.equal(a, b) for a, b in zip(other[2], tokens, strict=True))
    for drawn, seed in zip(tokens, seeds, strict=True):
        expected = fused_sample(hidden, weight, bias=BIAS, temperature=0.7, seed=seed, impl="torch")
        assert torch.equal(drawn, expected)


def _padded_by_hand_worker(rank, world):
    """Unpadded shards of V = 37 (19 and 18 rows): the short rank pads its logits with -inf
    and nothing slices the gathered [B, 38] (a program whose graph differs between ranks).
    Every rank must rewrite alike, or the logits' all-gather on one rank meets the
    candidates' exchange on the other."""
    import torch.distributed._functional_collectives as funcol

    hidden, weight, _, shard = _problem(world)
    weight_shard = weight[rank * shard : (rank + 1) * shard]

    def step(hidden, weight_shard):
        logits = hidden @ weight_shard.T
        if logits.shape[-1] < shard:
            logits = F.pad(logits, (0, shard - logits.shape[-1]), value=float("-inf"))
        gathered = funcol.all_gather_tensor(logits, -1, dist.group.WORLD)
        return torch.multinomial(torch.softmax(gathered / 0.7, dim=-1), 1)

    _, rewrites = graph_after_pass(step, hidden, weight_shard)
    torch._dynamo.reset()
    torch.manual_seed(rank)  # ranks seeded apart: the pass must make them agree
    seeds = _recorded_seeds()
    tokens = torch.compile(step, backend="flashsampling")(hidden, weight_shard)
    return rewrites, tokens, seeds[0]


def test_a_short_rank_padding_with_minus_inf_is_rewritten_like_the_others():
    per_rank = run_ranks(2, _padded_by_hand_worker)
    hidden, weight, _, _ = _problem(2)
    (rewrites, tokens, seed), (other_rewrites, other_tokens, _) = per_rank
    assert rewrites == other_rewrites and rewrites.get("tp_all_gather") == 1, per_rank
    assert torch.equal(tokens, other_tokens)
    expected = fused_sample(hidden, weight, temperature=0.7, seed=seed, impl="torch")
    assert_pathwise_equal(tokens, expected, hidden, weight, temperature=0.7, seed=seed)


class _Head(torch.nn.Module):
    """A decode step's LM head and sampling, as a model writes them."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.lm_head = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
        self.lm_head.weight.data.copy_(weight)
        if bias is not None:
            self.lm_head.bias.data.copy_(bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.multinomial(torch.softmax(self.lm_head(hidden) / 0.7, dim=-1), 1)


def _dtensor_worker(rank, world, weight, bias):
    """The LM head a DTensor ColwiseParallel(output_layouts=Replicate()) plan shards,
    compiled whole."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (world,))
    model = _Head(weight, bias)
    parallelize_module(model, mesh, {"lm_head": ColwiseParallel(output_layouts=Replicate())})
    hidden, _ = make_problem(BATCH, 1, DIM, device=torch.device("cpu"))
    graph, rewrites = graph_after_pass(model, hidden)
    torch._dynamo.reset()
    torch.manual_seed(rank)  # ranks seeded apart
    step = torch.compile(model, backend="flashsampling", fullgraph=True)
    seeds = _recorded_seeds()
    return rewrites, [step(hidden) for _ in range(3)], seeds, hidden


@pytest.mark.parametrize(
    "world, vocab_size, with_bias",
    [
        pytest.param(2, 38, False, id="tp2-even"),
        # Uneven: DTensor pads the short shard's logits before the gather, slices after.
        pytest.param(2, 37, False, id="tp2-uneven"),
        pytest.param(3, 37, False, id="tp3-uneven"),
        pytest.param(3, 37, True, id="tp3-uneven-bias"),
    ],
)
def test_dtensor_lm_head_compiled_whole_draws_the_tokens_of_tp1(world, vocab_size, with_bias):
    weight = make_problem(1, vocab_size, DIM, device=torch.device("cpu"), seed=5)[1]
    bias = torch.linspace(-2.0, 2.0, vocab_size) if with_bias else None
    per_rank = run_ranks(world, _dtensor_worker, weight, bias)
    rewrites, tokens, seeds, hidden = per_rank[0]
    assert rewrites.get("tp_all_gather") == 1, rewrites
    for other in per_rank[1:]:
        assert other[0] == rewrites
        assert all(torch.equal(a, b) for a, b in zip(other[1], tokens, strict=True))
    for drawn, seed in zip(tokens, seeds, strict=True):
        expected = fused_sample(hidden, weight, bias=bias, temperature=0.7, seed=seed, impl="torch")
        assert_pathwise_equal(
            drawn, expected, hidden, weight, bias=bias, temperature=0.7, seed=seed
        )
