"""The sampling tails the idioms end in: softmax, Exp(1) noise, ``argmax``, ``multinomial``.

Each matcher takes the node where the tail starts and either returns what feeds it (the
logits under a softmax) or says it is not this tail (False / None) or raises ``NoMatch``
when it is but cannot be rewritten.
"""

from __future__ import annotations

import math

from torch.fx import Node

from ._walk import (
    ROW_OPS,
    NoMatch,
    Walk,
    arguments,
    aten,
    is_call,
    keepdim_of,
    last_dim,
    over_last_dim,
    same_shape,
    strip_converts,
    val,
)


def match_softmax(walk: Walk, probs: Node) -> Node:
    """``softmax(x, -1)`` in any of its decomposed spellings -> ``x``.

    Accepted: ``exp(x - amax) / sum``, ``exp(x) / sum``, ``exp(log_softmax(x))`` and the
    undecomposed ``_softmax`` / ``_log_softmax``; the max and sum must run over the last dim.
    Row selections after the softmax (``probs.squeeze(1)``) commute with it and are kept
    in ``walk.tail_rows``. Raises NoMatch if ``probs`` is none of them.
    """
    node = strip_converts(walk, probs)
    while is_call(node, *ROW_OPS):
        walk.tail_rows.insert(0, walk.take(node))
        node = strip_converts(walk, node.args[0])
    if is_call(node, aten._softmax.default):
        return _softmax_input(walk, node, node.args[0], node.args[1])
    if is_call(node, aten.div.Tensor) and is_call(node.args[1], aten.sum.dim_IntList):
        exp, total = node.args
        if total.args[0] is exp and is_call(exp, aten.exp.default):
            if not over_last_dim(total.args[1], keepdim_of(total), val(exp).dim()):
                raise NoMatch("the softmax does not normalize over the vocabulary dim")
            walk.take(node), walk.take(total), walk.take(exp)
            return _unshift(walk, exp.args[0])
    if is_call(node, aten.exp.default):
        log_probs = walk.take(node).args[0]
        if is_call(log_probs, aten._log_softmax.default):
            return _softmax_input(walk, log_probs, log_probs.args[0], log_probs.args[1])
        decomposed = decomposed_log_softmax(log_probs)
        if decomposed is not None:
            shifted, total, steps = decomposed
            if not over_last_dim(total.args[1], keepdim_of(total), val(total).dim()):
                raise NoMatch("the log_softmax does not normalize over the vocabulary dim")
            for n in steps:
                walk.take(n)
            return _unshift(walk, shifted)
    raise NoMatch(f"{probs.name} is not a softmax of the logits")


def decomposed_log_softmax(node) -> tuple[Node, Node, list[Node]] | None:
    """``shifted - log(sum(exp(shifted), dims))``, ``log_softmax`` as aten decomposes it ->
    (``shifted``, the sum, the nodes of the normalization); None for anything else. Which
    dims the sum runs over is the caller's to check."""
    if not (is_call(node, aten.sub.Tensor) and is_call(node.args[1], aten.log.default)):
        return None
    shifted, log_total = node.args
    total = log_total.args[0]
    if not (is_call(total, aten.sum.dim_IntList) and is_call(total.args[0], aten.exp.default)):
        return None
    if total.args[0].args[0] is not shifted:
        return None
    return shifted, total, [node, log_total, total, total.args[0]]


def _softmax_input(walk: Walk, node: Node, x: Node, dim) -> Node:
    if not last_dim(dim, val(x).dim()):
        raise NoMatch(f"{node.name} is not over the vocabulary dim")
    walk.take(node)
    return x


def _unshift(walk: Walk, node: Node) -> Node:
    """``x - amax(x, -1, keepdim=True)`` -> ``x`` (the shift leaves the softmax unchanged);
    then ``x - logsumexp(x, -1, keepdim=True)`` -> ``x`` as well (the normalized logits of
    ``torch.distributions.Categorical(logits=x)``, another shift by one value per row)."""
    if is_call(node, aten.sub.Tensor) and is_call(node.args[1], aten.amax.default):
        x, amax = node.args
        if amax.args[0] is not x or not over_last_dim(amax.args[1], keepdim_of(amax), val(x).dim()):
            raise NoMatch("the softmax subtracts a max over another dim")
        walk.take(node), walk.take(amax)
        node = x
    if is_call(node, aten.sub.Tensor) and "alpha" not in node.kwargs:
        x, lse = node.args
        steps = logsumexp_of(lse, x) if isinstance(x, Node) else None
        if steps is not None:
            for step in (node, *steps):
                if isinstance(step, Node):
                    walk.take(step)
            return x
    return node


def logsumexp_of(lse, x: Node) -> list[Node] | None:
    """The nodes of ``torch.logsumexp(x, -1, keepdim=True)`` as it decomposes,
    ``log(sum(exp(x - m), -1, keepdim)) + m`` with ``m`` the row max (0 where it is
    infinite); None if ``lse`` is not that."""
    if not (is_call(lse, aten.add.Tensor) and "alpha" not in lse.kwargs):
        return None
    log, shift = lse.args
    if not (is_call(log, aten.log.default) and is_call(log.args[0], aten.sum.dim_IntList)):
        return None
    total = log.args[0]
    exp = total.args[0]
    if not (is_call(exp, aten.exp.default) and is_call(exp.args[0], aten.sub.Tensor)):
        return None
    shifted = exp.args[0]
    if shifted.args[0] is not x or shifted.args[1] is not shift:
        return None
    if not over_last_dim(total.args[1], keepdim_of(total), val(x).dim()):
        return None
    steps = [lse, log, total, exp, shifted]
    amax = shift
    if is_call(shift, aten.where.self):  # where(|m| == inf, 0, m)
        infinite, zero, amax = shift.args
        if not (is_call(infinite, aten.eq.Scalar) and is_call(infinite.args[0], aten.abs.default)):
            return None
        steps += [shift, infinite, infinite.args[0], zero]
        if infinite.args[0].args[0] is not amax:
            return None
    if not (is_call(amax, aten.amax.default) and amax.args[0] is x):
        return None
    if not over_last_dim(amax.args[1], keepdim_of(amax), val(x).dim()):
        return None
    return [*steps, amax]


def unnormalized(walk: Walk, probs: Node) -> Node:
    """``p / p.sum(-1, keepdim=True)`` -> ``p``: a renormalization before ``multinomial``,
    which normalizes anyway."""
    if is_call(probs, aten.div.Tensor) and is_call(probs.args[1], aten.sum.dim_IntList):
        top, total = probs.args
        ndim = val(top).dim()
        if total.args[0] is top and over_last_dim(total.args[1], keepdim_of(total), ndim):
            walk.take(probs), walk.take(total)
            return top
    return probs


# A clamp of the noise from below at eps changes a draw only when some noise value falls
# below eps, an event of probability <= eps per value (for U uniform on [0, 1) and for E
# Exp(1) alike); at eps <= 1e-9 that is accepted as the same distribution (the op's noise is
# never clamped: its Exp(1) values are never 0).
MAX_NOISE_CLAMP = 1e-9


def strip_noise_clamp(walk: Walk, node):
    """``x.clamp_min(eps)`` / ``x.clamp(min=eps)`` -> (x, eps); (node, None) for any other
    node. The caller checks eps once it knows that x is noise (``check_noise_clamp``)."""
    if is_call(node, aten.clamp_min.default):
        eps = node.args[1]
    elif is_call(node, aten.clamp.default):
        args = arguments(node, "min", "max")
        if args.get("max") is not None:
            return node, None
        eps = args.get("min")
    else:
        return node, None
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        return node, None
    return walk.take(node).args[0], float(eps)


def check_noise_clamp(clamp_eps) -> None:
    if clamp_eps is not None and not 0.0 <= clamp_eps <= MAX_NOISE_CLAMP:
        raise NoMatch(
            f"the noise is clamped at {clamp_eps}: that changes the draw with probability up"
            f" to {clamp_eps} per token (accepted up to {MAX_NOISE_CLAMP})"
        )


def match_noise(walk: Walk, node: Node, scores) -> bool:
    """True if ``node`` is Exp(1) noise of exactly ``scores``' shape, drawn by Inductor.

    Accepted: ``exponential_(1)`` as Inductor decomposes it, ``-log(U)``, ``-log(U + eps)``
    and ``-log(1 - U)``, with ``U`` from ``rand``/``rand_like``/``uniform_(0, 1)`` of any
    tensor (no generator),
    each maybe clamped from below at eps <= 1e-9 (``q.clamp_min_(1e-10)``,
    ``u.clamp(min=1e-20)``: ``MAX_NOISE_CLAMP``). Shared noise broadcast across rows would
    sample correlated rows: refused.
    """
    node, clamp_eps = strip_noise_clamp(walk, strip_converts(walk, node))
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
    check_noise_clamp(clamp_eps)
    return True


def _match_uniform(walk: Walk, node: Node) -> bool:
    """``U`` in (0, 1], optionally ``U + eps``, ``1 - U`` or ``U.clamp(min=eps)``, from
    Inductor's RNG."""
    node, clamp_eps = strip_noise_clamp(walk, node)
    if is_call(node, aten.add.Tensor) and isinstance(node.args[1], float):
        if not 0.0 <= node.args[1] <= 1e-3:
            return False
        node = walk.take(node).args[0]
    elif is_call(node, aten.rsub.Scalar) and node.args[1] == 1:
        node = walk.take(node).args[0]
    elif is_call(node, aten.sub.Tensor) and node.args[0] == 1:
        node = walk.take(node).args[1]
    node = _rand_of_uniform_decomposition(walk, strip_converts(walk, node))
    if is_call(node, aten.uniform.default):
        # ``torch.zeros_like(t).uniform_(0, 1)`` (x-transformers): the values it overwrites
        # are unread, and U is on [0, 1) as ``rand``'s
        args = arguments(node, "from", "to")
        if (args.get("from", 0), args.get("to", 1)) != (0, 1) or args.get("generator") is not None:
            return False
        check_noise_clamp(clamp_eps)
        walk.take(node)
        if isinstance(node.args[0], Node):
            walk.leftovers.append(node.args[0])
        return True
    if not is_call(node, aten.rand.default) or node.kwargs.get("generator") is not None:
        return False
    check_noise_clamp(clamp_eps)
    walk.take(node)
    return True


def _rand_of_uniform_decomposition(walk: Walk, node: Node) -> Node:
    """torch 2.15 writes ``t.uniform_(0, 1)`` as ``rand([numel]) * 1.0 + 0.0`` seen through
    ``as_strided`` with ``t``'s contiguous shape: -> that ``rand``, else ``node``."""
    if not is_call(node, aten.as_strided.default):
        return node
    args = arguments(node, "size", "stride", "storage_offset")
    add = node.args[0]
    mul = add.args[0] if is_call(add, aten.add.Tensor) and add.args[1] == 0.0 else None
    rand = mul.args[0] if is_call(mul, aten.mul.Tensor) and mul.args[1] == 1.0 else None
    if not is_call(rand, aten.rand.default):
        return node
    size, stride = list(args["size"]), list(args["stride"])
    contiguous = [math.prod(size[i + 1 :]) for i in range(len(size))]
    if list(rand.args[0]) != [math.prod(size)] or stride != contiguous:
        return node
    if args.get("storage_offset") not in (None, 0):
        return node
    for step in (node, add, mul):
        walk.take(step)
    return rand


def argmax_keepdim(walk: Walk) -> bool:
    """Check the terminal ``argmax`` reduces the vocabulary dim; -> its ``keepdim``."""
    argmax = walk.terminal
    args = arguments(argmax, "dim", "keepdim")
    dim, ndim = args.get("dim"), val(argmax.args[0]).dim()
    if not (last_dim(dim, ndim) or (dim is None and ndim == 1)):
        raise NoMatch(f"{argmax.name} reduces dim {dim}, not the vocabulary dim")
    return bool(args.get("keepdim", False))


def multinomial_draws(multinomial: Node) -> int:
    """-> ``num_samples`` of a ``torch.multinomial`` the fused op can draw: independent
    draws (``replacement=True`` when there are several) from Inductor's RNG."""
    args = arguments(multinomial, "num_samples", "replacement")
    num_samples, replacement = args["num_samples"], args.get("replacement", False)
    if args.get("generator") is not None:
        raise NoMatch("it draws from a user's torch.Generator")
    if not isinstance(num_samples, int) or num_samples < 1:
        raise NoMatch(f"num_samples={num_samples} is not a positive Python int")
    if num_samples > 1 and not replacement:
        raise NoMatch("it draws several samples without replacement")
    return num_samples
