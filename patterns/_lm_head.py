"""The LM-head chain: from the scores a sampling tail reads back to the ``mm``/``addmm``.

Between the matmul and the tail, user code puts a variety of steps that are all the same to
the fused op: last-token selection (``h[:, -1]``, ``logits[:, -1, :]``, ``x[:, [-1], :]``),
views, ``.float()`` upcasts, a bias, a soft-cap ``tanh(l / c) * c`` (Gemma 2), constant
logit scales (Cohere's ``logit_scale``, Granite's ``logits_scaling``, muP multipliers) and one
temperature, which fold into the op's one temperature, top-k / top-p / min-p masks. A
pre-traced template would need one variant per combination of these; a walk over the aten
graph covers them all and checks each step's literals on the way, so the idiom modules match
only their tail and leave the chain to ``match_lm_head``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.fx import Node

from ._truncation import MASKING_OPS, match_gathered, match_mask, match_scattered
from ._walk import (
    CONVERTS,
    COPIES,
    GIVEN_LOGITS,
    RESHAPES,
    ROW_OPS,
    SQUEEZES,
    NoMatch,
    Walk,
    aten,
    is_call,
    last_dim,
    same,
    same_shape,
    slice_args,
    val,
)

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
SUPPORTED_DEVICES = ("cuda", "cpu")
HALF_DTYPES = (torch.bfloat16, torch.float16)


@dataclass
class LMHead:
    """``logits = (hidden[rows] @ weight.T + bias) / temperature``, maybe truncated, as found
    in the graph; or, with ``weight`` None, ``logits[rows] / temperature`` of logits the graph
    is given (``hidden``: an input; ``sample_logits`` samples them)."""

    hidden: Node  # [*S, D] before the row selection (given logits: [*S, V])
    weight: Node | None  # [V, D], or [D, V] when ``weight_transposed``; None: given logits
    vocab_size: int
    weight_transposed: bool
    bias: Node | None
    row_ops: list[tuple[Callable, tuple]]  # applied to ``hidden`` in order
    temperature: float | Node  # a Python float, a tensor, or a float Dynamo made dynamic
    temperature_per_row: bool  # a [*rows, 1] tensor rather than one value
    logits_dtype: torch.dtype | None
    # From the masks on the chain: Python numbers, or nodes of per-row tensors.
    top_k: int | Node | None = None
    top_p: float | Node | None = None
    min_p: float | Node | None = None
    # top-p measured on the whole row, a top-k cut after it (the op's ``top_p_whole_row``)
    top_p_whole_row: bool = False
    softcap: float | None = None  # tanh(l / c) * c of the raw logits: c
    temperature_after_mask: bool = False  # -inf / T: only T > 0 keeps the program's meaning
    # Constant scales around a tensor temperature, folded: the op divides by temperature * this.
    temperature_factor: float = 1.0
    # The scores the tail reads (the walk's start: temperature, soft-cap and masks applied),
    # and the chain's nodes that hold the op's raw logits (bias added, rounded to
    # ``logits_dtype``, nothing else): what a logprob reader may read (``_logprobs.py``).
    scores: Node | None = None
    raw_logits: tuple[Node, ...] = ()
    # Why the logits are taken as given (``weight`` None): a graph input, or read outside.
    given: str = ""


def match_lm_head(walk: Walk, logits: Node, *, greedy: bool = False) -> LMHead:
    """Walk from the (scaled, truncated) logits back to the ``mm``/``addmm`` of the LM head.

    ``greedy``: the scores only feed an argmax, so positive constant scales and the masks
    (which always keep the largest logit) are dropped, and a tensor temperature (which might
    hold 0 or negative values) is refused. A soft-cap stays: the op's argmax is of its
    soft-capped scores, as the program's is.
    """
    node, walked, masks = logits, [], {}
    cuts = GIVEN_LOGITS.get()

    def given(node) -> bool:  # logits the graph is given, or holds anyway (``_given_logits``)
        return isinstance(node, Node) and (node.op == "placeholder" or node in cuts)

    while not (given(node) or is_call(node, aten.mm.default, aten.addmm.default)):
        if not isinstance(node, Node) or node.op != "call_function":
            raise NoMatch(f"the logits come from {node}, not from an LM-head matmul")
        scattered = _scattered_back(node)
        if scattered is not None:
            # An in-place write into a slice of the logits, read back through that slice: the
            # read is what was written (the rest of the whole tensor goes unread).
            node, consumed = scattered
            for step in consumed:
                walk.take(step)
            continue
        walked.append(walk.take(node))
        if is_call(node, *MASKING_OPS):
            masks[node] = [match_mask(walk, node)]
            node = masks[node][0].source
        elif is_call(node, aten.scatter.src):
            masks[node] = match_scattered(walk, node)
            node = masks[node][0].source
        elif is_call(node, aten.gather.default):
            masks[node] = match_gathered(walk, node)
            node = masks[node][0].source
        else:
            node = _chain_input(node)
    is_given = given(node)
    source = node if is_given else walk.take(node)  # the matmul, or the given logits

    head = _Chain()
    if not is_given and is_call(source, aten.addmm.default):
        head.bias = _check_addmm(source)
    for step in reversed(walked):  # from the matmul to the tail
        if step in masks:
            for mask in masks[step]:
                head.mask(step, mask)
        elif is_call(step, *CONVERTS):
            head.convert(step)
        elif is_call(step, aten.add.Tensor):
            head.add_bias(step)
        elif is_call(step, aten.div.Tensor, aten.mul.Tensor):
            head.scale(step, greedy)
        elif is_call(step, aten.tanh.default):
            head.soft_cap(step)
        elif is_call(step, *ROW_OPS):
            if head.per_row and not _keeps_rows(step):
                raise NoMatch(f"{step.name} selects rows after a per-row temperature")
            head.row_ops.append(step)
    if not is_given:  # the flatten of the hidden states and the transpose of the weight
        walk.leftovers.extend(
            a
            for a in source.args[-2:]
            if is_call(a, *RESHAPES, aten.unsqueeze.default, aten.permute.default)
        )
    if greedy:
        head.temperature, head.factor = 0.0, 1.0
        head.top_k = head.top_p = head.min_p = None
        head.top_p_whole_row = False
    found = _given_logits(source, head, cuts.get(source)) if is_given else _lm_head(source, head)
    found.scores = logits
    found.raw_logits = _raw_logits(source, [step for step in reversed(walked)], masks)
    return found


def _keeps_rows(step: Node) -> bool:
    """Each row stays the row it was, in order (transformers' continuous batching views its
    warped [N, V] scores as [1, N, V] and reads ``[0]``): the per-row knobs still match."""
    if is_call(step, *RESHAPES, *SQUEEZES, aten.unsqueeze.default):
        return True
    return is_call(step, aten.select.int) and same(val(step.args[0]).shape[step.args[1]], 1)


def _raw_logits(matmul: Node, steps: list[Node], masks) -> tuple[Node, ...]:
    """The nodes of the chain (``steps``, from the matmul on) whose values are the op's raw
    logits: after the bias and the last rounding to bf16/fp16, before any scale, soft-cap
    or mask (the op's ``return_logprobs="raw"``); () if a rounding comes later."""
    raw = [matmul]
    for i, step in enumerate(steps):
        if step in masks or not is_call(step, *CONVERTS, *COPIES, *ROW_OPS, aten.add.Tensor):
            if any(_rounds(later) for later in steps[i:]):
                return ()  # (counted in logits_dtype: the op's raw logits are rounded)
            break
        if _rounds(step) or is_call(step, aten.add.Tensor):
            raw = [step]  # (the chain's one add is its bias: match_lm_head checked it)
        else:
            raw.append(step)
    return tuple(raw)


def _rounds(step: Node) -> bool:
    return is_call(step, *CONVERTS) and val(step).dtype in HALF_DTYPES


@dataclass
class _Chain:
    """What the walk from the matmul to the tail has seen so far, and the order it came in:
    the op soft-caps the raw logits, then applies temperature, top-k, top-p and min-p, so the
    program must not differ."""

    bias: Node | None = None
    row_ops: list[Node] = field(default_factory=list)
    temperature: float | Node = 1.0  # the one tensor temperature, if any
    factor: float = 1.0  # the constant scales, as one temperature: l / factor
    per_row: bool = False
    scales: list[Node] = field(default_factory=list)
    softcap: float | None = None
    top_k: int | Node | None = None
    top_p: float | Node | None = None
    min_p: float | Node | None = None
    exact_k: bool = False  # the top-k keeps exactly k (ties broken by a sort or topk)
    top_p_whole_row: bool = False  # a top-k mask after the top-p one
    masked: Node | None = None
    half_dtypes: set[torch.dtype] = field(default_factory=set)
    temperature_after_mask: bool = False

    def convert(self, step: Node) -> None:
        dtype = val(step).dtype
        if not val(step).is_floating_point():
            raise NoMatch(f"{step.name} casts the logits to {dtype}")
        if dtype in HALF_DTYPES and self.masked is not None:
            raise NoMatch(f"{step.name} rounds the logits to {dtype} after the mask")
        if dtype in HALF_DTYPES and not self.scales:
            self.half_dtypes.add(dtype)

    def add_bias(self, step: Node) -> None:
        if self.bias is not None:
            raise NoMatch(f"{step.name} adds a second bias")
        if self.scales or self.masked is not None or self.softcap is not None:
            # The op adds its bias to the raw logits, before all of them.
            raise NoMatch(f"{step.name} adds a bias after the temperature, a soft-cap or a mask")
        self.bias = _bias_operand(step)

    def scale(self, step: Node, greedy: bool) -> None:
        if step.args[1] == 1 and not isinstance(step.args[1], bool):
            return  # ``l / 1.0`` (x-transformers' default temperature) changes nothing
        for name, value in (("top-p", self.top_p), ("min-p", self.min_p)):
            if value is not None:
                # The mask kept the tokens of softmax(l / T) for the T it saw, not another.
                raise NoMatch(f"{step.name} scales the logits after the {name} mask")
        temperature, per_row = _temperature(step)
        if isinstance(temperature, Node):
            if greedy:
                raise NoMatch(f"{step.name} scales greedy scores by a tensor (may hold T <= 0)")
            if isinstance(self.temperature, Node):
                raise NoMatch(f"{step.name} divides the logits by a second tensor temperature")
            self.temperature, self.per_row = temperature, per_row
            self.temperature_after_mask = self.masked is not None
        else:
            self.factor *= temperature
            if not 0.0 < self.factor < math.inf:
                raise NoMatch(f"{step.name}: the constant scales fold to T = {self.factor}")
        self.scales.append(step)

    def soft_cap(self, step: Node) -> None:
        """``tanh(l / c)`` is ``softcap_c(l) / c``: the op's ``softcap=c`` followed by the
        temperature ``c`` that the constant scales before the tanh already put on the chain
        (Gemma 2's ``/ c``, maybe with a temperature; none: ``c = 1``); the ``* c`` after it
        is one more scale."""
        if self.softcap is not None:
            raise NoMatch(f"{step.name} soft-caps the logits a second time")
        if isinstance(self.temperature, Node) or self.masked is not None:
            raise NoMatch(
                f"{step.name} soft-caps logits divided by a tensor or masked: the op soft-caps"
                " the raw logits, before the temperature and the masks"
            )
        self.softcap = self.factor

    def mask(self, step: Node, mask) -> None:
        if mask.top_k is not None:
            # (after a min-p mask alone it keeps what it keeps before: both keep a prefix of
            # the sorted row, and top-k keeps the max that min-p measures against)
            # After a top-p mask: that nucleus was measured on the whole row, and the top k of
            # it are the row's top k that it keeps (both keep a prefix of the sorted row):
            # the op's top_p_whole_row.
            if self.top_k is not None:
                raise NoMatch(f"{step.name} is a second top-k mask")
            self.top_p_whole_row = self.top_p is not None
            self.top_k, self.exact_k = mask.top_k, mask.exact_k
        elif mask.top_p is not None:
            if self.top_p is not None:
                raise NoMatch(f"{step.name} is a second top-p mask")
            if self.min_p is not None:
                raise NoMatch(f"{step.name} is a top-p mask after the min-p mask (min-p goes last)")
            self.top_p = mask.top_p
        else:
            if self.min_p is not None:
                raise NoMatch(f"{step.name} is a second min-p mask")
            self.min_p = mask.min_p
        self.masked = step


def _scattered_back(node: Node) -> tuple[Node, list[Node]] | None:
    """``x[:, -1, :]`` read back after an in-place write into it (nanoGPT's
    ``logits[logits < v[:, [-1]]] = -inf`` on ``lm_head(x)[:, -1, :]``, ``masked_fill_`` on
    such a view): functionalization writes the new slice into a fresh copy of the whole
    tensor with ``select_scatter`` / ``slice_scatter`` and reads it back with the same
    ``select`` / ``slice``, maybe through views that end in the scatter's own shape (a
    reshape round trip: the identity). The value read is the slice written: that node, and
    the nodes the read-back consumes (the read, the views, the scatter and the views of the
    whole tensor it copied); None for any other node or a read of another slice."""
    for read, scatter in (
        (aten.select.int, aten.select_scatter.default),
        (aten.slice.Tensor, aten.slice_scatter.default),
    ):
        if not is_call(node, read) or node.kwargs:
            continue
        written, views = node.args[0], []
        while is_call(written, *RESHAPES):
            views.append(written)
            written = written.args[0]
        if not is_call(written, scatter) or written.kwargs:
            continue
        if not same_shape(val(node.args[0]).shape, val(written).shape):
            continue
        ndim = val(written).dim()
        if read is aten.select.int:  # (dim, index)
            here, there = node.args[1:], written.args[2:]
        else:
            here, there = slice_args(node), slice_args(written, 2)
        here, there = (here[0] % ndim, *here[1:]), (there[0] % ndim, *there[1:])
        if len(here) != len(there) or not all(map(same, here, there)):
            continue
        base, bases = written.args[0], []
        while is_call(base, *RESHAPES):
            bases.append(base)
            base = base.args[0]
        return written.args[1], [node, *views, written, *bases]
    return None


def _chain_input(node: Node) -> Node:
    """The operand of ``node`` that carries the logits, if ``node`` may sit in the chain."""
    if is_call(node, *CONVERTS, *COPIES, *ROW_OPS, aten.div.Tensor, aten.tanh.default):
        return node.args[0]
    if is_call(node, aten.mul.Tensor, aten.add.Tensor):
        if "alpha" in node.kwargs:
            raise NoMatch(f"{node.name} uses alpha")
        a, b = node.args
        # The chain continues through the operand that has the [..., V] shape of the logits.
        if isinstance(b, Node) and not isinstance(a, Node):
            return b
        if isinstance(a, Node) and isinstance(b, Node) and val(b).dim() > val(a).dim():
            return b
        return a
    raise NoMatch(f"{node.name} ({node.target}) sits between the LM head and the sampling")


def _check_addmm(matmul: Node) -> Node:
    if matmul.kwargs.get("beta", 1) != 1 or matmul.kwargs.get("alpha", 1) != 1:
        raise NoMatch(f"{matmul.name} scales its bias or product")
    return matmul.args[0]


def _bias_operand(step: Node) -> Node:
    a, b = step.args
    bias = b if not is_call(b, aten.mm.default) and val(b).dim() <= val(a).dim() else a
    if not isinstance(bias, Node) or val(bias).dim() != 1 or not _is_input(bias):
        raise NoMatch(f"{step.name} adds {bias}, not a [V] bias parameter")
    return bias


def _is_input(node: Node) -> bool:
    """A graph input (a parameter), maybe cast: a bias, not noise or a mask computed here."""
    while is_call(node, *CONVERTS, *COPIES):
        node = node.args[0]
    return node.op in ("placeholder", "get_attr")


def _temperature(step: Node) -> tuple[float | Node, bool]:
    """-> (temperature, per_row) for ``logits / T`` or ``logits * (1 / T)``: a positive
    finite Python float, or the node of a tensor (or of a float Dynamo made dynamic)."""
    logits, factor = step.args
    if isinstance(logits, Node) and not isinstance(factor, Node):
        pass
    elif step.target == aten.mul.Tensor and isinstance(factor, Node):
        if not isinstance(logits, Node) or val(logits).dim() < val(factor).dim():
            logits, factor = factor, logits
    if isinstance(factor, (int, float)) and not isinstance(factor, bool):
        temperature = float(factor)
        if step.target == aten.mul.Tensor:
            temperature = 1.0 / temperature if temperature != 0.0 else math.inf
        if not (0.0 < temperature < math.inf):
            raise NoMatch(f"{step.name} scales by {factor}, not a positive finite temperature")
        return temperature, False
    if step.target == aten.mul.Tensor:
        factor = _reciprocal_of(factor)
        if factor is None:
            raise NoMatch(f"{step.name} multiplies the logits by a tensor, not by 1 / T")
    t, scores = val(factor), val(step)
    if isinstance(t, (torch.SymFloat, torch.SymInt)):
        # A float temperature that Dynamo made dynamic (``dynamic=True``, or once its value
        # changed between calls): read from a 0-d CPU input with ``.item()``, any sign.
        return factor, False
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        raise NoMatch(f"{step.name} divides by {factor}, not a float tensor")
    if same(t.numel(), 1) and t.dim() <= scores.dim():
        return factor, False
    rows = scores.shape[:-1]
    if t.dim() == scores.dim() and same(t.shape[-1], 1) and all(map(same, t.shape[:-1], rows)):
        return factor, True
    raise NoMatch(f"{step.name} divides by a {tuple(t.shape)} tensor, not one value per row")


def _reciprocal_of(factor: Node) -> Node | None:
    """``1 / T`` (aten: ``reciprocal(T) * 1``) or ``T.reciprocal()`` as a factor -> T; None
    for any other tensor. ``l * (1 / T)`` rounds ``1 / T`` first, ``l / T`` does not: an
    fp32 rounding of the scores, as for the constant scales folded into one temperature."""
    if is_call(factor, aten.mul.Tensor):
        a, b = factor.args
        one = next((x for x in (a, b) if not isinstance(x, Node)), None)
        if isinstance(one, bool) or one != 1:
            return None
        factor = b if one is a else a
    return factor.args[0] if is_call(factor, aten.reciprocal.default) else None


def _lm_head(matmul: Node, chain: _Chain) -> LMHead:
    lhs, rhs = matmul.args[-2:]
    hidden_val, rhs_val = val(lhs), val(rhs)
    if hidden_val.dtype not in SUPPORTED_DTYPES or hidden_val.dtype != rhs_val.dtype:
        raise NoMatch(f"the LM head runs in {hidden_val.dtype}, not bf16/fp16/fp32")
    if hidden_val.device.type not in SUPPORTED_DEVICES:
        raise NoMatch(f"the LM head runs on {hidden_val.device.type}")
    hidden, replay = _undo_flatten(lhs, chain.row_ops)
    weight, transposed = rhs, True
    if is_call(rhs, aten.permute.default) and list(rhs.args[1]) == [1, 0]:
        weight, transposed = rhs.args[0], False
    return _head(chain, val(matmul), hidden, replay, weight, transposed, rhs_val.shape[1])


def _given_logits(source: Node, chain: _Chain, read_outside: str | None) -> LMHead:
    """Logits the graph is given, not made by a matmul in it: a sampler compiled on its own
    (nano-vllm's ``Sampler``, a serving engine's sampling function); or a node of the chain
    that the program reads outside the sampling too (``read_outside``: why), so it holds
    them anyway (a step that returns its logits). ``sample_logits``' kernels read them once
    and draw what the rest of the chain defines; stock Inductor's code for the same chain
    took 2-20x as long on an H200 (``benchmarks/probes/logits_input_ab.py``)."""
    logits = val(source)
    if not isinstance(logits, torch.Tensor) or logits.dtype not in SUPPORTED_DTYPES:
        raise NoMatch(f"the scores come from {source.name}, not from bf16/fp16/fp32 logits")
    if logits.device.type not in SUPPORTED_DEVICES:
        raise NoMatch(f"the logits live on {logits.device.type}")
    vocab_size = logits.shape[-1]
    if not isinstance(vocab_size, int):
        raise NoMatch(f"{source.name}'s vocabulary dim is symbolic")
    if chain.bias is not None:
        raise NoMatch(f"{chain.bias.name} is added to the logits the graph is given")
    head = _head(chain, logits, source, chain.row_ops, None, False, vocab_size)
    head.given = read_outside or f"the logits come from the graph's input {source.name}"
    return head


def _head(chain: _Chain, raw, hidden, row_ops, weight, transposed, vocab_size) -> LMHead:
    """The checks every head takes, and its ``LMHead``: ``raw`` the value of the matmul's
    output (or of the given logits), ``row_ops`` the chain's row selections to replay on
    ``hidden``."""
    if chain.bias is not None:
        bias_val = val(chain.bias)
        if bias_val.shape != (vocab_size,) or bias_val.dtype not in SUPPORTED_DTYPES:
            raise NoMatch(f"the bias is {tuple(bias_val.shape)} {bias_val.dtype}, not [V]")
    t = val(chain.temperature)
    cpu_scalar = isinstance(t, torch.Tensor) and t.dim() == 0 and t.device.type == "cpu"
    if isinstance(t, torch.Tensor) and t.device != raw.device and not cpu_scalar:
        # A 0-d CPU tensor is a scalar to a CUDA op (how Dynamo passes a dynamic float).
        raise NoMatch("the temperature lives on another device than the logits")
    half_dtypes = (chain.half_dtypes | {raw.dtype}) & set(HALF_DTYPES)
    if len(half_dtypes) > 1:
        raise NoMatch("the logits are rounded to both bf16 and fp16")
    if half_dtypes and chain.exact_k:
        raise NoMatch(
            f"an exact top-k on logits rounded to {str(next(iter(half_dtypes)))[6:]}: ties at"
            " the k-th value are common there, and the op keeps them all where the program"
            " keeps exactly k"
        )
    if half_dtypes and chain.top_p is not None:
        raise NoMatch(
            f"top-p on logits rounded to {str(next(iter(half_dtypes)))[6:]}: ties at the"
            " token crossing p are common there, and the op would keep all of them where"
            " the sort-based mask keeps those its sort puts on the kept side (top_p_mask.py)"
        )
    tensor_temperature = isinstance(chain.temperature, Node)
    return LMHead(
        hidden=hidden,
        weight=weight,
        vocab_size=vocab_size,
        weight_transposed=transposed,
        bias=chain.bias,
        row_ops=[row_op(step, vocab_size) for step in row_ops],
        temperature=chain.temperature if tensor_temperature else chain.temperature * chain.factor,
        temperature_per_row=chain.per_row,
        logits_dtype=next(iter(half_dtypes), None),
        top_k=chain.top_k,
        top_p=chain.top_p,
        min_p=chain.min_p,
        top_p_whole_row=chain.top_p_whole_row,
        softcap=chain.softcap,
        temperature_after_mask=chain.temperature_after_mask,
        temperature_factor=chain.factor if tensor_temperature else 1.0,
    )


def _undo_flatten(lhs: Node, row_ops: list[Node]) -> tuple[Node, list[Node]]:
    """``linear`` on [*S, D] flattens to [N, D] before the mm and unflattens the logits after.

    When both are there, start from the [*S, D] hidden and drop the unflatten, so no view
    with symbolic sizes has to be replayed.
    """
    if (
        row_ops
        and is_call(lhs, *RESHAPES, aten.unsqueeze.default)
        and is_call(row_ops[0], *RESHAPES, *SQUEEZES)
    ):
        original, unflattened = val(lhs.args[0]), val(row_ops[0])
        if original.dim() == unflattened.dim() and all(
            map(same, original.shape[:-1], unflattened.shape[:-1])
        ):
            return lhs.args[0], row_ops[1:]
    return lhs, row_ops


def reshape_rows(x: torch.Tensor, rows: tuple) -> torch.Tensor:
    """``x`` with its leading dims reshaped to ``rows`` (one of them may be -1), its last
    dim kept: a reshape of [..., V] logits, replayed on [..., D] hidden states or on
    [..., n] tokens."""
    return x.reshape(*rows, x.shape[-1])


def row_op(step: Node, vocab_size: int) -> tuple[Callable, tuple]:
    """A row selection on [..., V] scores, as the same selection on any [..., X] tensor
    (the hidden states before the matmul, the tokens after the draw)."""
    source, out = val(step.args[0]), val(step)
    if step.target in RESHAPES:
        # (``logits.view(B, -1)`` too: the vocabulary dim stays whole and last)
        shape = step.args[1]
        if not (same(source.shape[-1], vocab_size) and same(out.shape[-1], vocab_size)):
            raise NoMatch(f"{step.name} reshapes across the vocabulary dim")
        return reshape_rows, (tuple(shape[:-1]),)
    if step.target == aten.permute.default:
        # ``[s, b, V] -> [b, s, V]``: the same permutation of the hidden states' leading dims
        dims = list(step.args[1])
        if not last_dim(dims[-1], source.dim()):
            raise NoMatch(f"{step.name} moves the vocabulary dim")
        return step.target, (dims,)
    if step.target == aten.index.Tensor:
        indices = step.args[1]
        if len(indices) >= source.dim() and indices[source.dim() - 1] is not None:
            raise NoMatch(f"{step.name} indexes the vocabulary dim")
        return step.target, (list(indices),)
    args = step.args[1:]
    if any(isinstance(a, Node) for a in args):
        raise NoMatch(f"{step.name} selects rows with a symbolic index")
    dims = args[0] if step.target == aten.squeeze.dims else [args[0]]
    ndim = out.dim() if step.target == aten.unsqueeze.default else source.dim()
    if any(last_dim(d, ndim) for d in dims):
        raise NoMatch(f"{step.name} works on the vocabulary dim")
    return step.target, tuple(args)
