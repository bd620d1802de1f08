"""Tensor parallelism: the all-gather of vocabulary-sharded logits, then any idiom of the
catalog, becomes one ``flashsampling::tp_fused_sample`` call (candidates exchanged, never the
logits).

Each rank computes ``mm(hidden, W_shard.T)`` [B, S] and gathers it over the group into the
[B, V] logits, then samples. The gather is written three ways, all found here as one
``AllGatherMatch`` (the model: Inductor's ``micro_pipeline_tp._AllGatherMatch``):

* ``funcol.all_gather_tensor(logits, gather_dim=-1, group)`` (also what a DTensor
  ``ColwiseParallel(output_layouts=Replicate())`` head redistributes with):
  ``all_gather_into_tensor`` + ``wait_tensor``, then ``split`` of the [P * B, S] result into
  P row blocks and their ``cat`` on the last dim, or one ``view`` when B == 1;
* ``dist.all_gather_into_tensor`` into a [P * B, S] buffer (vLLM, Megatron): the same
  collective, a ``copy`` into the buffer, then ``view(P, B, S).movedim(0, 1)`` and a reshape,
  or ``torch.cat(buffer.chunk(P, 0), -1)`` (one ``split`` per chunk once functionalized);
* ``dist.all_gather(parts, x)`` then ``torch.cat(parts, -1)``: the same collective, its row
  blocks sliced out and copied into the list's tensors;
* either one followed by a slice to the real vocabulary size (padded vocabularies).

The catalog is reused, not copied: before it runs, each gather is *lifted*, i.e. its [B, V]
result is replaced by ``mm(hidden, gathered.T)``, where ``gathered`` is a stand-in node
(``flashsampling::tp_gathered_weight``: the shards' weight rows gathered, padding dropped,
which is what the gather of the logits computes, written as an LM head). The idioms then
match the chain as usual and make a ``fused_sample`` call on the stand-in, which is *lowered*
to ``tp_fused_sample`` on the local shard; the gather is erased. A lifted gather that no idiom
consumed is put back as it was. A lowered call keeps the graph's draw of its seed (Inductor's
RNG, as at TP = 1: the same tokens under the same ``torch.manual_seed``) and takes group rank
0's draw where ranks were seeded apart (``tp._agreed_seed``).
"""

from __future__ import annotations

import logging
import operator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch.fx import Graph, Node

from ._truncation import MASKING_OPS
from ._walk import (
    RESHAPES,
    TP_GATHER_NOT_LIFTED,
    aten,
    is_call,
    last_dim,
    prims,
    same,
    slice_args,
    val,
)

log = logging.getLogger("flashsampling_inductor")

IDIOM = "tp_all_gather"
_c10d = torch.ops._c10d_functional
_RANDINTS = (aten.randint.low, aten.randint.default)


def search_functional(hidden, weight_shard, group, temperature: float) -> torch.Tensor:
    """The gather as torchtitan / DTensor code writes it, then multinomial sampling."""
    logits = funcol.all_gather_tensor(F.linear(hidden, weight_shard), gather_dim=-1, group=group)
    return torch.multinomial(torch.softmax(logits / temperature, dim=-1), 1)


def search_into_tensor(hidden, weight_shard, group, vocab_size: int) -> torch.Tensor:
    """vLLM's / Megatron's gather into a [P * B, S] buffer, a slice to V, then greedy."""
    batch, shard = hidden.shape[0], weight_shard.shape[0]
    world = dist.get_world_size(group)
    gathered = torch.empty(world * batch, shard, dtype=hidden.dtype, device=hidden.device)
    dist.all_gather_into_tensor(gathered, F.linear(hidden, weight_shard), group=group)
    logits = gathered.view(world, batch, shard).movedim(0, 1).reshape(batch, world * shard)
    return torch.argmax(logits[:, :vocab_size], dim=-1)


@dataclass
class AllGatherMatch:
    """One gather of vocabulary-sharded logits: ``gathered`` [B, V] is
    ``mm(hidden, weight_shard.T)`` (plus ``bias_shard`` where the shard's LM head has a
    bias: an addmm) (padded to ``shard_width`` columns) gathered over ``group_name`` on the
    last dim, then cut to ``vocab_size``. ``chain`` holds the gather's nodes, from the
    collective to ``gathered``."""

    hidden: Node
    weight_shard: Node
    shard_logits: Node
    group_name: str
    group_size: int
    shard_width: int  # every rank's block of the gathered vocabulary (padded shards included)
    vocab_size: int
    gathered: Node
    chain: list[Node] = field(default_factory=list)
    # [B, T, V / P] logits of [B, T, D] hidden states: the shape the matmul's rows were viewed
    # as (its last entry the shard's width), else None
    rows_shape: list | None = None
    stand_in: list[Node] = field(default_factory=list)  # the lifted nodes, once lifted
    bias_shard: Node | None = None
    gathered_bias: Node | None = None  # its stand-in, once lifted
    # elementwise steps between the shard's matmul and the gather, matmul side first
    pre_ops: list[Node] = field(default_factory=list)

    def lift(self, graph: Graph) -> None:
        """Replace the gathered logits by ``mm(hidden, gathered_weight.T)`` (an addmm with
        the gathered bias where the shard's head has one)."""
        weight = val(self.weight_shard)
        with graph.inserting_after(self.gathered):
            gathered_weight = graph.call_function(
                torch.ops.flashsampling.tp_gathered_weight.default,
                (self.weight_shard, self.group_size, self.group_name, self.vocab_size),
            )
            gathered_weight.meta["val"] = weight.new_empty((self.vocab_size, weight.shape[1]))
        with graph.inserting_after(gathered_weight):
            transposed = graph.call_function(aten.permute.default, (gathered_weight, [1, 0]))
            transposed.meta["val"] = gathered_weight.meta["val"].permute(1, 0)
        inputs, anchor = (self.hidden, transposed), transposed
        if self.bias_shard is not None:
            with graph.inserting_after(transposed):
                self.gathered_bias = graph.call_function(
                    torch.ops.flashsampling.tp_gathered_bias.default,
                    (self.bias_shard, self.shard_width, self.group_size, self.group_name,
                     self.vocab_size),
                )  # fmt: skip
                bias = val(self.bias_shard)
                self.gathered_bias.meta["val"] = bias.new_empty((self.vocab_size,))
            inputs, anchor = (self.gathered_bias, *inputs), self.gathered_bias
        with graph.inserting_after(anchor):
            op = aten.addmm.default if self.bias_shard is not None else aten.mm.default
            logits = graph.call_function(op, inputs)
            logits.meta["val"] = val(self.hidden) @ inputs[-1].meta["val"]
        result = logits
        if self.rows_shape is not None:
            shape = [*self.rows_shape[:-1], self.vocab_size]
            with graph.inserting_after(logits):
                result = graph.call_function(aten.view.default, (logits, shape))
                result.meta["val"] = logits.meta["val"].view(val(self.gathered).shape)
        replayed = []
        for step in self.pre_ops:
            with graph.inserting_after(result):
                node = graph.call_function(step.target, (result, *step.args[1:]), step.kwargs)
                node.meta["val"] = val(result).new_empty(val(result).shape, dtype=val(step).dtype)
            replayed.append(node)
            result = node
        self.gathered.replace_all_uses_with(result)
        self.stand_in = [gathered_weight, transposed, logits, result, *replayed]

    def finish(self, graph: Graph) -> bool:
        """After the catalog: lower its fused call on the stand-in and erase the gather, or
        put the gather back. -> whether the gather was rewritten."""
        gathered_weight, transposed, logits, result, *replayed = self.stand_in
        calls = [user for user in gathered_weight.users if is_call(user, *_FUSED_CALLS)]
        if (
            len(calls) == 1
            and len(gathered_weight.users) == 1
            and _lowerable(calls[0])
            and (self.gathered_bias is None or _bias_is_private(self.gathered_bias, calls[0]))
        ):
            self._lower(graph, calls[0])
            _erase_unused(
                [*reversed(self.chain), *reversed(self.pre_ops), self.shard_logits,
                 gathered_weight, self.gathered_bias]
            )  # fmt: skip
            return True
        if calls:
            # The catalog made a call this op cannot take (a per-row k, top-p without a top-k
            # that _blocker did not see): it stays as correct as the program (the stand-in
            # gathers the weight), only slower.
            _erase_unused([*reversed(self.chain), *reversed(self.pre_ops), self.shard_logits])
            log.warning(
                "flashsampling: a tensor-parallel sampling step at %s keeps the gathered "
                "weight (a per-row k, top-p without a top-k or measured on the whole row, or "
                "logprobs are not fused across ranks)",
                self.gathered.name,
            )
            return False
        result.replace_all_uses_with(self.gathered)
        _erase_unused(
            [*reversed(replayed), result, logits, transposed, gathered_weight, self.gathered_bias]
        )
        return False

    def _lower(self, graph: Graph, call: Node) -> None:
        (hidden, _, bias, temperature, scalar_temperature, seed, scalar_seed, num_samples,
         logits_dtype, impl) = call.args[:10]  # fmt: skip
        shared_seed = is_call(seed, *_RANDINTS)
        local_bias = bias is not None and bias is self.gathered_bias
        if local_bias:
            bias = self.bias_shard  # (the op takes the rank's own rows: no gather of the bias)
        extra = [_argument(call, name, off) for name, off in _TP_TRUNCATION.items()]
        extra.append(local_bias)
        defaults = [*_TP_TRUNCATION.values(), False]
        while extra and extra[-1] == defaults[len(extra) - 1]:
            extra.pop()  # (the schema's defaults: the call reads as before they existed)
        with graph.inserting_before(call):
            lowered = graph.call_function(
                torch.ops.flashsampling.tp_fused_sample.default,
                (
                    hidden, self.weight_shard, bias, temperature, scalar_temperature,
                    seed, scalar_seed, num_samples, logits_dtype,
                    impl, -self.shard_width, self.vocab_size, self.group_name, shared_seed,
                    *extra,
                ),
            )  # fmt: skip
        # Only what describes the output: the call's other meta (eager_input_vals) is of its
        # own arguments.
        lowered.meta.update({k: call.meta[k] for k in ("val", "stack_trace") if k in call.meta})
        call.replace_all_uses_with(lowered)
        graph.erase_node(call)


def _bias_is_private(gathered_bias: Node, call: Node) -> bool:
    """The gathered bias feeds only the fused call, as its bias (what lowering replaces)."""
    return list(gathered_bias.users) == [call] and _argument(call, "bias", None) is gathered_bias


# (a logprobs call keeps the gathered weight: the TP op returns no logprobs yet)
_FUSED_CALLS = (
    torch.ops.flashsampling.fused_sample.default,
    torch.ops.flashsampling.fused_sample_logprobs.default,
)


def _lowerable(call: Node) -> bool:
    """A fused call the TP op takes: a k fixed in the graph (no per-row k tensor), and top-p
    only after it, on its survivors (``tp.tp_fused_sample``); no logprobs."""
    if is_call(call, torch.ops.flashsampling.fused_sample_logprobs.default):
        return False
    if _argument(call, "top_p_whole_row", False):
        return False  # (the TP op measures top-p on the gathered top-k survivors only)
    if _argument(call, "top_k", None) is not None:
        return False
    k = _argument(call, "scalar_top_k", 0)
    if not isinstance(k, int):
        return False
    p_off = _argument(call, "top_p", None) is None and _argument(call, "scalar_top_p", 1.0) >= 1
    # (k >= V is off; V: the rows of fused_sample's weight, sample_logits' last dim)
    fused = is_call(call, torch.ops.flashsampling.fused_sample.default)
    vocab_size = val(call.args[1]).shape[0] if fused else val(call.args[0]).shape[-1]
    return 0 < k < vocab_size or p_off


# A fused call's truncation knobs (but a per-row k tensor) and their values that turn them
# off; after the soft-cap, the TP op's arguments past shared_seed, in its order (the lowered
# call passes them only when one is on).
_TRUNCATION_OFF = {
    "scalar_top_k": 0,
    "top_p": None,
    "scalar_top_p": 1.0,
    "min_p": None,
    "scalar_min_p": 0.0,
}
_TP_TRUNCATION = {"softcap": 0.0, **_TRUNCATION_OFF}


def _argument(call: Node, name: str, default):
    """An argument of a fused call, read by the op's schema: the catalog's calls hold them
    positionally, a hand-made one may name them."""
    names = [argument.name for argument in call.target._schema.arguments]
    return dict(zip(names, call.args, strict=False), **call.kwargs).get(name, default)


def _erase_unused(nodes: list[Node]) -> None:
    for node in nodes:
        if isinstance(node, Node) and not node.users and not node._erased:
            inputs = node.all_input_nodes
            node.graph.erase_node(node)
            _erase_unused([n for n in inputs if n.op == "call_function" and n.target in _DEAD])


# What may go once a gather is rewritten: its own nodes and the shard's matmul inputs.
_DEAD = (aten.permute.default, aten.empty.memory_format, *RESHAPES)


def find_gathers(graph: Graph) -> list[AllGatherMatch]:
    """Every gather of vocabulary-sharded LM-head logits in the graph."""
    found = []
    for collective in graph.find_nodes(
        op="call_function", target=_c10d.all_gather_into_tensor.default
    ):
        match = _match_gather(collective)
        if match is not None:
            found.append(match)
    return found


def _match_gather(collective: Node) -> AllGatherMatch | None:
    gathered_input, group_size, group_name = collective.args[:3]
    shard_logits, chain, pad_value = gathered_input, [collective], None
    if is_call(gathered_input, aten.constant_pad_nd.default):
        # DTensor's uneven shards: the short ranks pad their logits at the end of the
        # vocabulary dim to the common width, and the gathered logits are sliced to V after.
        shard_logits, padding = gathered_input.args[:2]
        pad_value = gathered_input.args[2] if len(gathered_input.args) > 2 else 0.0
        if len(padding) != 2 or padding[0] != 0:
            return None
        chain.append(gathered_input)
    # Elementwise steps on the shard's logits before the gather (a temperature, a soft-cap,
    # a cast): lifting puts them after the stand-in LM head, where the catalog reads them.
    pre_ops = []
    while _per_logit(shard_logits):
        pre_ops.insert(0, shard_logits)
        shard_logits = shard_logits.args[0]
    rows_shape = None
    if is_call(shard_logits, aten.view.default) and is_call(
        shard_logits.args[0], aten.mm.default, aten.addmm.default
    ):
        # [B, T, S] logits of [B, T, D] hidden states (gpt-fast's and torchtitan's generate
        # gather the model's output): the matmul's rows viewed as [B, T], its columns kept.
        rows_shape = list(shard_logits.args[1])
        if not same(val(shard_logits).shape[-1], val(shard_logits.args[0]).shape[-1]):
            return None
        chain.insert(0, shard_logits)
        shard_logits = shard_logits.args[0]
    bias_shard = None
    matmul_args = shard_logits.args
    if is_call(shard_logits, aten.addmm.default) and not shard_logits.kwargs:
        # F.linear with a bias (the shard's rows of it): addmm(bias, hidden, weight.T)
        bias_shard, matmul_args = shard_logits.args[0], shard_logits.args[1:]
        if val(bias_shard).dim() != 1:
            return None
    elif not is_call(shard_logits, aten.mm.default):
        return None
    if not (
        is_call(matmul_args[1], aten.permute.default)
        and list(matmul_args[1].args[1]) == [1, 0]
        and isinstance(group_size, int)
    ):
        return None
    hidden, weight_shard = matmul_args[0], matmul_args[1].args[0]
    *lead, shard = val(gathered_input).shape  # the shard's width in the gathered logits
    if not isinstance(shard, int):
        return None
    node = _only_user(collective)
    if not is_call(node, _c10d.wait_tensor.default):
        return None
    chain.append(node)
    after = _only_user(node)
    if is_call(after, aten.copy.default) and after.args[1] is node:
        # all_gather_into_tensor(buffer, ...) functionalized: a copy into an empty buffer.
        if not is_call(after.args[0], aten.empty.memory_format):
            return None
        node = after
        chain.append(node)
    node = _relayout(node, chain, group_size, lead, shard)
    if node is None:
        return None
    vocab_size = group_size * shard
    _slice_before_select(node, len(lead) + 1)
    after = _only_user(node)
    if is_call(after, aten.slice.Tensor):
        # aten.slice.Tensor(self, dim=0, start=None, end=None, step=1)
        dim, start, end, step = slice_args(after)
        last = dim in (len(lead), -1)
        if last and start in (0, None) and step == 1 and isinstance(end, int) and end > 0:
            vocab_size = min(end, vocab_size)
            node = after
            chain.append(node)
    if is_call(gathered_input, aten.constant_pad_nd.default) and vocab_size == group_size * shard:
        # Padded columns that the gathered logits keep. With -inf, the program never draws
        # them, as the op never draws a column no shard holds: rewritten, as the full ranks'
        # graphs (which have no pad to see) are; ranks must decide alike, or their
        # collectives mismatch. Any other value makes them tokens the program may draw.
        if pad_value != float("-inf"):
            return None
    return AllGatherMatch(
        hidden, weight_shard, shard_logits, group_name, group_size, shard, vocab_size, node, chain,
        rows_shape, bias_shard=bias_shard, pre_ops=pre_ops,
    )  # fmt: skip


def _relayout(
    node: Node, chain: list[Node], group_size: int, lead: list, shard: int
) -> Node | None:
    """The [P * B, (T,) S] gathered rows -> the [B, (T,) P * S] logits node, or None."""
    users = list(node.users)
    batch, full = lead[0], [*lead, group_size * shard]
    if len(users) == group_size and all(is_call(u, aten.split.Tensor) for u in users):
        return _chunks_cat(users, chain, group_size, batch, full)
    if len(users) == group_size and all(is_call(u, aten.slice.Tensor) for u in users):
        return _slices_cat(users, chain, group_size, batch, full)
    if len(users) != 1:
        return None
    step = users[0]
    if is_call(step, aten.split.Tensor, aten.split_with_sizes.default):
        if not all(p.target is operator.getitem for p in step.users):
            return None
        pieces = _in_rank_order(step.users, group_size)
        cat = _blocks_cat(pieces, group_size, full)
        if cat is not None:
            chain += [step, *pieces, cat]
        return cat
    if is_call(step, *RESHAPES) and all(same(n, 1) for n in lead) and _shape_is(step, full):
        chain.append(step)
        return step  # one row ([1, V / P] or [1, 1, V / P]): the gathered rows are its logits
    if len(lead) > 1:
        return None  # (the view below re-lays [P * B, S] rows only)
    if is_call(step, *RESHAPES) and _shape_is(step, [group_size, batch, shard]):
        permute = _only_user(step)
        if not is_call(permute, aten.permute.default) or list(permute.args[1]) != [1, 0, 2]:
            return None
        chain += [step, permute]
        node = _only_user(permute)
        if is_call(node, aten.clone.default):
            chain.append(node)
            node = _only_user(node)
        if is_call(node, *RESHAPES) and _shape_is(node, full):
            chain.append(node)
            return node
    return None


def _slice_before_select(logits: Node, ndim: int) -> None:
    """``logits[:, -1][:, :V]`` (a position picked from [B, T, V] logits, then the slice to
    the real vocabulary, as an HF model's last hidden state [B, 1, D] gives) rewritten as
    ``logits[..., :V][:, -1]``: the same values, with the slice right after the gather,
    where ``_match_gather`` reads the real vocabulary size. Left as is otherwise."""
    select = _only_user(logits)
    if not is_call(select, aten.select.int) or ndim < 3:
        return
    dim = select.args[1] % ndim
    cut = _only_user(select)
    if dim == ndim - 1 or not is_call(cut, aten.slice.Tensor) or cut.kwargs:
        return
    cut_dim, start, end, step = slice_args(cut)
    if not (last_dim(cut_dim, ndim - 1) and start in (0, None) and step == 1):
        return
    if not isinstance(end, int) or end <= 0:
        return
    graph = logits.graph
    with graph.inserting_after(logits):
        sliced = graph.call_function(aten.slice.Tensor, (logits, ndim - 1, 0, end))
        sliced.meta["val"] = val(logits)[..., :end]
    with graph.inserting_after(sliced):
        picked = graph.call_function(aten.select.int, (sliced, dim, select.args[2]))
        picked.meta["val"] = val(sliced).select(dim, select.args[2])
    cut.replace_all_uses_with(picked)
    graph.erase_node(cut)
    graph.erase_node(select)


def _chunks_cat(splits: list[Node], chain: list[Node], group_size: int, batch, full) -> Node | None:
    """Megatron-core's ``torch.cat(output.chunk(P, dim=0), dim=-1)``, which functionalization
    writes as one ``split`` of the gathered rows per chunk taken -> the ``cat``, or None."""
    pieces = []
    for split in splits:
        size, dim = (*split.args[1:], 0)[:2]
        if split.kwargs or not same(size, batch) or dim != 0 or len(split.users) != 1:
            return None
        (piece,) = split.users
        if piece.target is not operator.getitem:
            return None
        pieces.append(piece)
    pieces = _in_rank_order(pieces, group_size)
    cat = _blocks_cat(pieces, group_size, full)
    if cat is not None:
        chain += [*splits, *pieces, cat]
    return cat


def _slices_cat(slices: list[Node], chain: list[Node], group_size: int, batch, full) -> Node | None:
    """``dist.all_gather(parts, x); torch.cat(parts, dim=-1)`` (fairscale, older Megatron),
    which functionalization writes as one all-gather, the P row blocks sliced out and copied
    into the list's tensors -> the ``cat``, or None."""
    by_rank, owned = {}, []
    for block in slices:
        dim, start, end, step = slice_args(block)
        rank = next((r for r in range(group_size) if same(start, r * batch)), None)
        if block.kwargs or dim != 0 or step != 1 or rank is None or rank in by_rank:
            return None
        if not same(end, (rank + 1) * batch) or len(block.users) != 1:
            return None
        piece = next(iter(block.users))
        owned.append(block)
        if is_call(piece, aten.copy.default) and piece.args[1] is block:
            if not is_call(piece.args[0], aten.empty.memory_format) or len(piece.users) != 1:
                return None
            owned.append(piece)
        else:
            piece = block
        by_rank[rank] = piece
    cat = _blocks_cat([by_rank[r] for r in range(group_size)], group_size, full)
    if cat is not None:
        chain += [*owned, cat]
    return cat


def _blocks_cat(blocks: list[Node], group_size: int, full) -> Node | None:
    """The ``cat`` over the last dim of the ranks' row blocks, in rank order (block r the
    only node reading rank r's rows), with the gathered logits' shape; None otherwise."""
    if len(blocks) != group_size or not all(len(block.users) == 1 for block in blocks):
        return None
    cat = next(iter(blocks[0].users))
    if not is_call(cat, aten.cat.default) or len(cat.args) < 2:
        return None
    if cat.args[1] not in (len(full) - 1, -1) or list(cat.args[0]) != blocks:
        return None
    return cat if _shape_is(cat, full) else None


def _in_rank_order(pieces, group_size: int) -> list[Node]:
    """The ``getitem``s of the gathered rows' P blocks ordered by block, or [] unless they
    are blocks 0 .. P - 1, once each."""
    pieces = sorted(pieces, key=lambda piece: piece.args[1])
    return pieces if [p.args[1] for p in pieces] == list(range(group_size)) else []


def _per_logit(node: Node) -> bool:
    """An elementwise step on the logits that commutes with the gather: a cast, a tanh, or a
    multiply / divide by a number or by a tensor that does not span the vocabulary (a
    per-row temperature [B, 1]), read by one node."""
    if not isinstance(node, Node) or len(node.users) != 1 or node.kwargs:
        return False
    if is_call(node, prims.convert_element_type.default, aten.tanh.default):
        return True
    if is_call(node, aten.div.Tensor, aten.mul.Tensor) and len(node.args) == 2:
        other = node.args[1]
        if not isinstance(other, Node):
            return isinstance(other, (int, float)) and not isinstance(other, bool)
        value = val(other)
        if not isinstance(value, torch.Tensor) or value.dim() > val(node).dim():
            return False
        # 0-d, or a last dim of 1: broadcast over the vocabulary
        return value.dim() == 0 or same(value.shape[-1], 1)
    return False


def _only_user(node: Node) -> Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _shape_is(node: Node, shape) -> bool:
    value = val(node)
    return (
        value is not None and len(value.shape) == len(shape) and all(map(same, value.shape, shape))
    )


def lift(graph: Graph) -> list[AllGatherMatch]:
    """Lift every gather before the catalog runs; -> the lifted ones for ``finish``.

    A gather is not lifted where what follows it needs more than the TP op takes (top-p
    without a top-k before it: the mass of every token; see ``_blocker``): the catalog's
    call would then keep the stand-in, which gathers the whole weight (correct, but slower
    than gathering the logits). Its nodes carry the reason (``TP_GATHER_NOT_LIFTED`` in
    their meta), which the walk from a sampling op gives when it stops there, so
    ``explain()`` and the warning name it."""
    gathers = []
    for gather in find_gathers(graph):
        blocked = _blocker(gather.gathered)
        if blocked is None:
            gathers.append(gather)
            continue
        node, why = blocked
        reason = (
            f"the logits are gathered across tensor-parallel ranks ({gather.gathered.name}) "
            f"and then reach {node.name} ({node.target}): {why}"
        )
        for node in (*gather.chain, gather.gathered):
            node.meta[TP_GATHER_NOT_LIFTED] = reason
    for gather in gathers:
        gather.lift(graph)
    return gathers


_SORTS = (aten.sort.default, aten.sort.stable, aten.cumsum.default)


def _blocker(logits: Node, limit: int = 64) -> tuple[Node, str] | None:
    """Why a sampling step after the gathered ``logits`` cannot take the TP op, judged from
    the first ``limit`` nodes that read them, or None (a rank-independent test: every rank's
    program is the same after the gather). The TP op takes top-k with a k fixed in the
    graph, top-p after it and min-p (each rank sends its shard's k largest scores); a sort
    or cumsum with no such top-k is top-p over the whole row (or a k read from a tensor)."""
    seen, frontier = set(), [logits]
    sort, top_k = None, False
    on_cuda = _on_cuda(logits)
    while frontier and len(seen) < limit:
        node = frontier.pop()
        if node in seen:
            continue
        seen.add(node)
        if on_cuda and (
            is_call(node, aten.topk.default, *_SORTS, *MASKING_OPS)
            or (is_call(node, torch.ops.flashsampling.sample_logits.default) and _truncates(node))
        ):
            return node, (
                "tensor-parallel top-k / top-p / min-p on CUDA are turned off "
                "(patterns.tp_gather.TRUNCATION_ON_CUDA = False)"
            )
        if is_call(node, aten.topk.default):
            if not isinstance(node.args[1], int):
                return node, "tensor-parallel top-k takes a k fixed in the graph"
            top_k = True
        elif is_call(node, *_SORTS) and sort is None:
            sort = node
        elif is_call(node, torch.ops.flashsampling.sample_logits.default) and not _lowerable(node):
            if _argument(node, "top_k", None) is not None:
                return node, (
                    "tensor-parallel top-k takes a k fixed in the graph (a Python int), not a "
                    "tensor: each rank sends k scores a row"
                )
            return node, "tensor-parallel sampling takes top-p only after a top-k"
        frontier.extend(node.users)
    if sort is not None and not top_k:
        return sort, (
            "a sort of the whole row (top-p without a top-k before it, or a k or min-p read"
            " through a sort): tensor-parallel sampling takes top-p only after a top-k with a"
            " k fixed in the graph, since the nucleus of a whole row needs every token's mass"
        )
    return None


# Let the pass lower top-k / top-p / min-p after a gather on CUDA (on: the TP op's kernels,
# ``tp_truncation.py``, beat gathering the logits for FlashInfer or stock Inductor, docs/tp.md;
# False leaves them to stock Inductor on CUDA). Part of the catalog's hash, so graphs
# compiled either way are cached apart.
TRUNCATION_ON_CUDA = True


def _on_cuda(logits: Node) -> bool:
    value = val(logits)
    return (
        not TRUNCATION_ON_CUDA and isinstance(value, torch.Tensor) and value.device.type == "cuda"
    )


def _truncates(call: Node) -> bool:
    """A sample_logits / fused_sample call with top-k, top-p or min-p on."""
    if _argument(call, "top_k", None) is not None:
        return True
    values = {name: _argument(call, name, off) for name, off in _TRUNCATION_OFF.items()}
    return any(
        values[name] is not None if off is None else values[name] != off
        for name, off in _TRUNCATION_OFF.items()
    )


def finish(graph: Graph, gathers: list[AllGatherMatch]) -> int:
    """Lower or put back every lifted gather; -> how many were rewritten."""
    from torch._dynamo.utils import counters

    rewritten = 0
    for gather in gathers:
        if gather.finish(graph):
            rewritten += 1
            counters["flashsampling"][IDIOM] += 1
    return rewritten
