"""What every idiom shares: the walk from the sampled scores back to the LM-head matmul.

The idioms differ only in their tail (multinomial of a softmax, argmax of perturbed scores,
...). Between that tail and the matmul, user code puts a variety of steps that are all the
same to the fused op: last-token selection (``h[:, -1]``, ``logits[:, -1, :]``,
``x[:, [-1], :]``), views, ``.float()`` upcasts, a bias, one temperature division. A
pre-traced template would need one variant per combination of these; a walk over the aten
graph covers them all and checks each step's literals on the way, so the idiom modules match
only their tail with it and leave the chain to ``match_lm_head``.

The anchor of every idiom is its terminal node (``aten.multinomial``, ``aten.argmax``),
registered with Inductor's pattern matcher; the idiom's check walks back from it, and
``rewrite`` swaps the terminal for one ``flashsampling::fused_sample`` call traced with
``Match.replace_by_example`` (so symbolic batch sizes need no special handling).

A walk raises ``NoMatch`` with the reason as soon as one step is not one it can prove safe:
an intermediate read by another node, a reduction over another dim, a dtype or device the op
does not take, an op it does not know.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch._dynamo.utils import counters
from torch._inductor.pattern_matcher import (
    CallFunctionVarArgs,
    Match,
    PatternMatcherPass,
    register_graph_pattern,
)
from torch.fx import Node
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.utils._pytree import tree_map

log = logging.getLogger("flashsampling_inductor")
aten, prims = torch.ops.aten, torch.ops.prims

# Every idiom registers its terminal op here; ``graph_pass.py`` applies it.
PASS = PatternMatcherPass(pass_name="flashsampling")

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
SUPPORTED_DEVICES = ("cuda", "cpu")
# Seeds are drawn on the device from Inductor's RNG; 62 bits keep randint's range in int64.
SEED_RANGE = 2**62

_CONVERTS = (prims.convert_element_type.default, aten._to_copy.default)
_COPIES = (aten.clone.default, aten.alias.default)
_RESHAPES = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)
_SQUEEZES = (aten.squeeze.dim, aten.squeeze.dims)
_ROW_OPS = (
    aten.select.int,
    aten.slice.Tensor,
    aten.index.Tensor,
    aten.unsqueeze.default,
    *_SQUEEZES,
    *_RESHAPES,
)


class NoMatch(Exception):
    """A step of the chain that cannot be proved safe to rewrite; the message says why."""


@dataclass
class Walk:
    """The nodes a match consumes. All but the terminal must be read only inside the match."""

    terminal: Node
    owned: list[Node] = field(default_factory=list)
    tail_rows: list[Node] = field(default_factory=list)  # row selections after the softmax
    leftovers: list[Node] = field(default_factory=list)  # erased too, if nothing else reads them

    def take(self, node: Node) -> Node:
        if node not in self.owned:
            self.owned.append(node)
        return node

    def check_private(self) -> None:
        inside = set(self.owned) | {self.terminal}
        for node in self.owned:
            outside = [user for user in node.users if user not in inside]
            if outside:
                raise NoMatch(f"{node.name} is also read by {outside[0].name}")


@dataclass
class LMHead:
    """``logits = (hidden[rows] @ weight.T + bias) / temperature``, as found in the graph."""

    hidden: Node  # [*S, D] before the row selection
    weight: Node  # [V, D], or [D, V] when ``weight_transposed``
    weight_transposed: bool
    bias: Node | None
    row_ops: list[tuple[Callable, tuple]]  # applied to ``hidden`` in order
    temperature: float | Node  # a Python float, a tensor, or a float Dynamo made dynamic
    temperature_per_row: bool  # a [*rows, 1] tensor rather than one value
    logits_dtype: torch.dtype | None


def val(node):
    return node.meta.get("val") if isinstance(node, Node) else None


def is_call(node, *targets) -> bool:
    return isinstance(node, Node) and node.op == "call_function" and node.target in targets


def same(a, b) -> bool:
    return statically_known_true(a == b)


def same_shape(a, b) -> bool:
    return len(a) == len(b) and all(map(same, a, b))


def last_dim(dim, ndim: int) -> bool:
    return isinstance(dim, int) and ndim > 0 and dim % ndim == ndim - 1


def _over_last_dim(dims, keepdim, ndim: int) -> bool:
    return keepdim is True and len(dims) == 1 and last_dim(dims[0], ndim)


def strip_converts(walk: Walk, node: Node) -> Node:
    """Skip dtype casts between float dtypes (``.float()``, ``softmax(dtype=...)``)."""
    while is_call(node, *_CONVERTS) and val(node).is_floating_point():
        node = walk.take(node).args[0]
    return node


def match_softmax(walk: Walk, probs: Node) -> Node:
    """``softmax(x, -1)`` in any of its decomposed spellings -> ``x``.

    Accepted: ``exp(x - amax) / sum``, ``exp(x) / sum``, ``exp(log_softmax(x))`` and the
    undecomposed ``_softmax`` / ``_log_softmax``; the max and sum must run over the last dim.
    Row selections after the softmax (``probs.squeeze(1)``) commute with it and are kept
    in ``walk.tail_rows``. Raises NoMatch if ``probs`` is none of them.
    """
    node = strip_converts(walk, probs)
    while is_call(node, *_ROW_OPS):
        walk.tail_rows.insert(0, walk.take(node))
        node = strip_converts(walk, node.args[0])
    if is_call(node, aten._softmax.default):
        return _softmax_input(walk, node, node.args[0], node.args[1])
    if is_call(node, aten.div.Tensor) and is_call(node.args[1], aten.sum.dim_IntList):
        exp, total = node.args
        if total.args[0] is exp and is_call(exp, aten.exp.default):
            ndim = val(exp).dim()
            if not _over_last_dim(total.args[1], _keepdim(total), ndim):
                raise NoMatch("the softmax does not normalize over the vocabulary dim")
            walk.take(node), walk.take(total), walk.take(exp)
            return _unshift(walk, exp.args[0])
    if is_call(node, aten.exp.default):
        log_probs = walk.take(node).args[0]
        if is_call(log_probs, aten._log_softmax.default):
            return _softmax_input(walk, log_probs, log_probs.args[0], log_probs.args[1])
        if is_call(log_probs, aten.sub.Tensor) and is_call(log_probs.args[1], aten.log.default):
            shifted, log_total = log_probs.args
            total = log_total.args[0]
            if (
                is_call(total, aten.sum.dim_IntList)
                and is_call(total.args[0], aten.exp.default)
                and total.args[0].args[0] is shifted
            ):
                if not _over_last_dim(total.args[1], _keepdim(total), val(total).dim()):
                    raise NoMatch("the log_softmax does not normalize over the vocabulary dim")
                for n in (log_probs, log_total, total, total.args[0]):
                    walk.take(n)
                return _unshift(walk, shifted)
    raise NoMatch(f"{probs.name} is not a softmax of the logits")


def _keepdim(reduction: Node):
    return reduction.args[2] if len(reduction.args) > 2 else reduction.kwargs.get("keepdim")


def _softmax_input(walk: Walk, node: Node, x: Node, dim) -> Node:
    if not last_dim(dim, val(x).dim()):
        raise NoMatch(f"{node.name} is not over the vocabulary dim")
    walk.take(node)
    return x


def _unshift(walk: Walk, node: Node) -> Node:
    """``x - amax(x, -1, keepdim=True)`` -> ``x`` (the shift leaves the softmax unchanged)."""
    if is_call(node, aten.sub.Tensor) and is_call(node.args[1], aten.amax.default):
        x, amax = node.args
        if amax.args[0] is not x or not _over_last_dim(amax.args[1], _keepdim(amax), val(x).dim()):
            raise NoMatch("the softmax subtracts a max over another dim")
        walk.take(node), walk.take(amax)
        return x
    return node


def match_lm_head(walk: Walk, logits: Node, *, greedy: bool = False) -> LMHead:
    """Walk from the (scaled) logits back to the ``mm``/``addmm`` of the LM head.

    ``greedy``: the scores only feed an argmax, so a positive constant scale is dropped and
    a tensor temperature (which might hold 0 or negative values) is refused.
    """
    node, walked = logits, []
    while not is_call(node, aten.mm.default, aten.addmm.default):
        if not isinstance(node, Node) or node.op != "call_function":
            raise NoMatch(f"the logits come from {node}, not from an LM-head matmul")
        walked.append(walk.take(node))
        node = _chain_input(node)
    matmul = walk.take(node)

    temperature, per_row, scale_at = 1.0, False, None
    bias, row_ops, half_dtypes = None, [], set()
    if is_call(matmul, aten.addmm.default):
        bias = _check_addmm(matmul)
    for position, step in enumerate(reversed(walked)):  # from the matmul to the tail
        if is_call(step, *_CONVERTS):
            if not val(step).is_floating_point():
                raise NoMatch(f"{step.name} casts the logits to {val(step).dtype}")
            if scale_at is None and val(step).dtype in (torch.bfloat16, torch.float16):
                half_dtypes.add(val(step).dtype)
        elif is_call(step, aten.add.Tensor):
            if bias is not None:
                raise NoMatch(f"{step.name} adds a second bias")
            bias = _bias_operand(step)
        elif is_call(step, aten.div.Tensor, aten.mul.Tensor):
            if scale_at is not None:
                raise NoMatch(f"{step.name} scales the logits a second time")
            scale_at = position
            temperature, per_row = _temperature(step, greedy)
        elif is_call(step, *_ROW_OPS):
            if per_row:
                raise NoMatch(f"{step.name} selects rows after a per-row temperature")
            row_ops.append(step)
    # The flatten of the hidden states and the transpose of the weight, once unused.
    if greedy:
        temperature = 0.0
    walk.leftovers.extend(
        a
        for a in matmul.args[-2:]
        if is_call(a, *_RESHAPES, aten.unsqueeze.default, aten.permute.default)
    )
    return _lm_head(matmul, bias, row_ops, temperature, per_row, half_dtypes)


def _chain_input(node: Node) -> Node:
    """The operand of ``node`` that carries the logits, if ``node`` may sit in the chain."""
    if is_call(node, *_CONVERTS, *_COPIES, *_ROW_OPS, aten.div.Tensor):
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
    while is_call(node, *_CONVERTS, *_COPIES):
        node = node.args[0]
    return node.op in ("placeholder", "get_attr")


def _temperature(step: Node, greedy: bool) -> tuple[float | Node, bool]:
    """-> (temperature, per_row) for ``logits / T`` or ``logits * (1 / T)``."""
    logits, factor = step.args
    if isinstance(logits, Node) and not isinstance(factor, Node):
        pass
    elif isinstance(factor, Node) and isinstance(logits, Node) and step.target == aten.mul.Tensor:
        if val(logits).dim() < val(factor).dim():
            logits, factor = factor, logits
    if isinstance(factor, (int, float)) and not isinstance(factor, bool):
        temperature = float(factor) if step.target == aten.div.Tensor else 1.0 / float(factor)
        if not (0.0 < temperature < math.inf):
            raise NoMatch(f"{step.name} scales by {factor}, not a positive finite temperature")
        return (0.0 if greedy else temperature), False
    if greedy:
        raise NoMatch(f"{step.name} scales greedy scores by a tensor (may hold T <= 0)")
    if step.target != aten.div.Tensor:
        raise NoMatch(f"{step.name} multiplies the logits by a tensor")
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


def _lm_head(matmul, bias, row_ops, temperature, per_row, half_dtypes) -> LMHead:
    lhs, rhs = matmul.args[-2:]
    hidden_val, rhs_val = val(lhs), val(rhs)
    vocab_size = rhs_val.shape[1]
    if hidden_val.dtype not in SUPPORTED_DTYPES or hidden_val.dtype != rhs_val.dtype:
        raise NoMatch(f"the LM head runs in {hidden_val.dtype}, not bf16/fp16/fp32")
    if hidden_val.device.type not in SUPPORTED_DEVICES:
        raise NoMatch(f"the LM head runs on {hidden_val.device.type}")
    if bias is not None:
        bias_val = val(bias)
        if bias_val.shape != (vocab_size,) or bias_val.dtype not in SUPPORTED_DTYPES:
            raise NoMatch(f"the bias is {tuple(bias_val.shape)} {bias_val.dtype}, not [V]")
    t = val(temperature)
    cpu_scalar = isinstance(t, torch.Tensor) and t.dim() == 0 and t.device.type == "cpu"
    if isinstance(t, torch.Tensor) and t.device != hidden_val.device and not cpu_scalar:
        # A 0-d CPU tensor is a scalar to a CUDA op (how Dynamo passes a dynamic float).
        raise NoMatch("the temperature lives on another device than the logits")
    half_dtypes.add(val(matmul).dtype)
    half_dtypes &= {torch.bfloat16, torch.float16}
    if len(half_dtypes) > 1:
        raise NoMatch("the logits are rounded to both bf16 and fp16")
    hidden, replay = _undo_flatten(lhs, row_ops)
    replay = [_row_op(step, vocab_size) for step in replay]
    weight, transposed = rhs, True
    if is_call(rhs, aten.permute.default) and list(rhs.args[1]) == [1, 0]:
        weight, transposed = rhs.args[0], False
    return LMHead(
        hidden=hidden,
        weight=weight,
        weight_transposed=transposed,
        bias=bias,
        row_ops=replay,
        temperature=temperature,
        temperature_per_row=per_row,
        logits_dtype=next(iter(half_dtypes), None),
    )


def _undo_flatten(lhs: Node, row_ops: list[Node]) -> tuple[Node, list[Node]]:
    """``linear`` on [*S, D] flattens to [N, D] before the mm and unflattens the logits after.

    When both are there, start from the [*S, D] hidden and drop the unflatten, so no view
    with symbolic sizes has to be replayed.
    """
    if (
        row_ops
        and is_call(lhs, *_RESHAPES, aten.unsqueeze.default)
        and is_call(row_ops[0], *_RESHAPES, *_SQUEEZES)
    ):
        original, unflattened = val(lhs.args[0]), val(row_ops[0])
        if original.dim() == unflattened.dim() and all(
            map(same, original.shape[:-1], unflattened.shape[:-1])
        ):
            return lhs.args[0], row_ops[1:]
    return lhs, row_ops


def _row_op(step: Node, vocab_size: int) -> tuple[Callable, tuple]:
    """A row selection on the logits, as the same selection on the hidden states."""
    source, out = val(step.args[0]), val(step)
    if step.target in _RESHAPES:
        shape = step.args[1]
        if any(isinstance(s, Node) for s in shape) or not (
            same(source.shape[-1], vocab_size) and same(shape[-1], vocab_size)
        ):
            raise NoMatch(f"{step.name} reshapes across the vocabulary dim")
        return step.target, (tuple(shape[:-1]) + (-1,),)
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


def match_noise(walk: Walk, node: Node, scores: torch.Tensor) -> bool:
    """True if ``node`` is Exp(1) noise of exactly ``scores``' shape, drawn by Inductor.

    Accepted: ``exponential_(1)`` as Inductor decomposes it, ``-log(U)``, ``-log(U + eps)``
    and ``-log(1 - U)``, with ``U`` from ``rand``/``rand_like``/``uniform_`` (no generator).
    Shared noise broadcast across rows would sample correlated rows: refused.
    """
    node = strip_converts(walk, node)
    if is_call(node, aten.mul.Tensor) and node.args[1] == -1.0:
        # exponential_(1) decomposes to -1 * where(u >= 1 - eps/2, -eps/2, log(u))
        where = node.args[0]
        if not is_call(where, aten.where.self) or not is_call(where.args[2], aten.log.default):
            return False
        ge, _, log_u = where.args
        uniform = log_u.args[0]
        if not (is_call(ge, aten.ge.Scalar) and ge.args[0] is uniform):
            return False
        for n in (node, where, ge, log_u, where.args[1]):
            if isinstance(n, Node):
                walk.take(n)
    elif is_call(node, aten.neg.default) and is_call(node.args[0], aten.log.default):
        walk.take(node)
        uniform = walk.take(node.args[0]).args[0]
    else:
        return False
    if not _match_uniform(walk, uniform):
        return False
    if not same_shape(val(node).shape, scores.shape):
        raise NoMatch(f"the noise {node.name} is not drawn per token and row")
    return True


def _match_uniform(walk: Walk, node: Node) -> bool:
    """``U`` in (0, 1], optionally ``U + eps`` or ``1 - U``, from Inductor's RNG."""
    if is_call(node, aten.add.Tensor) and isinstance(node.args[1], float):
        if not 0.0 <= node.args[1] <= 1e-3:
            return False
        node = walk.take(node).args[0]
    elif is_call(node, aten.rsub.Scalar) and node.args[1] == 1:
        node = walk.take(node).args[0]
    elif is_call(node, aten.sub.Tensor) and node.args[0] == 1:
        node = walk.take(node).args[1]
    node = strip_converts(walk, node)
    if not is_call(node, aten.rand.default) or node.kwargs.get("generator") is not None:
        return False
    walk.take(node)
    return True


def argmax_keepdim(walk: Walk) -> bool:
    """Check the terminal ``argmax`` reduces the vocabulary dim; -> its ``keepdim``."""
    argmax = walk.terminal
    args = dict(zip(("dim", "keepdim"), argmax.args[1:], strict=False), **argmax.kwargs)
    dim, ndim = args.get("dim"), val(argmax.args[0]).dim()
    if not (last_dim(dim, ndim) or (dim is None and ndim == 1)):
        raise NoMatch(f"{argmax.name} reduces dim {dim}, not the vocabulary dim")
    return bool(args.get("keepdim", False))


def register(idiom: str, target, check: Callable[[Walk], tuple[LMHead, int, bool] | None]):
    """Register ``check`` for the terminal op ``target``; a match becomes one fused-op call.

    ``check(walk)`` returns None if the terminal is not this idiom, raises NoMatch (logged as
    a near miss) if it is but cannot be rewritten, else ``(lm_head, num_samples, keep_dim)``:
    the output is ``[*rows, num_samples]`` if ``keep_dim`` else ``[*rows]``.
    """

    def handler(match: Match, *args, **kwargs) -> None:
        terminal = match.output_node()
        if torch._inductor.config.fallback_random:
            return
        walk = Walk(terminal)
        try:
            found = check(walk)
            if found is None:
                return
            walk.check_private()
        except NoMatch as why:
            log.debug("flashsampling: %s at %s not rewritten: %s", idiom, terminal.name, why)
            return
        _rewrite(match, walk, *found)
        counters["flashsampling"][idiom] += 1
        log.debug("flashsampling: rewrote %s at %s", idiom, terminal.name)

    register_graph_pattern(CallFunctionVarArgs(target), pass_dict=PASS)(handler)


BAD_TEMPERATURE = (
    "flashsampling: a rewritten sampling step divides its logits by a temperature of 0, inf or"
    " NaN, or by a negative per-row temperature with a bias; the fused sampler cannot draw"
    " from what those make of softmax (compile without backend='flashsampling' for them)"
)


def _positive_temperature(hidden, bias, t):
    """-> (hidden, bias, |t|) for a temperature tensor t (0-d or one value per row).

    The program divides its logits by any T; the fused op samples for finite T > 0. For
    T < 0, softmax(l / T) is softmax(-l / |T|), and -l is exactly what the matmul makes of
    -hidden (and -bias: negation is exact and commutes with every rounding on the way), so
    negative temperatures are folded into the operands instead of refused. A 0 or NaN makes
    the program's probabilities NaN, where torch.multinomial fails; an infinite T (uniform
    draws) and a negative per-row T with one shared bias have no such folding. Those fail
    as loudly, through an assert in the graph (no host sync).
    """
    negative = t < 0
    valid = t.isfinite() & (t != 0)
    if bias is not None and t.dim() == 1:
        valid = valid & ~negative
    torch._assert_async(valid.all(), BAD_TEMPERATURE)
    sign = torch.where(negative, -1.0, 1.0).to(hidden.dtype)
    if t.dim() == 1:
        hidden = hidden * sign.view(*hidden.shape[:-1], 1)
    else:
        hidden = hidden * sign
        bias = None if bias is None else bias * sign.to(bias.dtype)
    return hidden, bias, t.abs()


def _rewrite(match: Match, walk: Walk, head: LMHead, num_samples: int, keep_dim: bool) -> None:
    inputs = [head.hidden, head.weight]
    for extra in (head.bias, head.temperature):
        if isinstance(extra, Node):
            inputs.append(extra)
    for _, args in head.row_ops:
        tree_map(lambda a: inputs.append(a) if isinstance(a, Node) else None, args)
    position = {node: i for i, node in enumerate(inputs)}

    def replacement(*values):
        hidden, weight = values[0], values[1]
        if head.weight_transposed:
            weight = weight.t()
        bias = values[position[head.bias]] if head.bias is not None else None
        for target, args in head.row_ops:
            args = tree_map(lambda a: values[position[a]] if isinstance(a, Node) else a, args)
            hidden = target(hidden, *args)
        rows = hidden.shape[:-1]
        temperature, scalar_temperature = None, head.temperature
        if isinstance(head.temperature, Node):
            t = values[position[head.temperature]]
            # A symbolic float or a 0-d CPU tensor becomes a device tensor, without a copy
            # that would sync: Inductor reads both on the host as a kernel argument.
            if not isinstance(t, torch.Tensor):
                t = torch.full((), t, dtype=torch.float32, device=hidden.device)
            elif t.device != hidden.device:
                t = t * torch.ones((), dtype=t.dtype, device=hidden.device)
            t = t.to(torch.float32).reshape(-1 if head.temperature_per_row else ())
            hidden, bias, temperature = _positive_temperature(hidden, bias, t)
            scalar_temperature = 1.0
        seed = None  # greedy rows draw no noise
        if scalar_temperature != 0.0 or temperature is not None:
            # Drawn by Inductor's RNG in the graph: each call and CUDA-graph replay differs.
            seed = torch.randint(0, SEED_RANGE, (), device=hidden.device)
        tokens = torch.ops.flashsampling.fused_sample(
            hidden.reshape(-1, hidden.shape[-1]),
            weight,
            bias,
            temperature,
            scalar_temperature,
            seed,
            0,
            num_samples,
            head.logits_dtype,
            "auto",
        )
        return tokens.view(*rows, num_samples) if keep_dim else tokens.view(rows)

    # Erase what the fused op replaces; replace_by_example only erases nodes left unused.
    order = {node: i for i, node in enumerate(walk.terminal.graph.nodes)}
    erase = set(walk.owned) | set(walk.leftovers) | set(match.nodes)
    match.nodes = sorted(erase, key=order.__getitem__)
    match.replace_by_example(replacement, inputs)
