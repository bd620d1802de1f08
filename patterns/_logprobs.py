"""The log-probability of the drawn token, as programs read it beside their sampling.

Serving engines return each drawn token's logprob. Programs read it from the scores they
sampled from, with the drawn tokens as the index::

    logprobs = logits.log_softmax(-1, dtype=torch.float32)   # vLLM's "raw" logprobs
    token_logprob = logprobs.gather(-1, tokens.unsqueeze(-1))
    probs.gather(-1, tokens).log()                           # the sampler's probabilities
    torch.log(probs).gather(-1, tokens)
    logprobs[torch.arange(B), tokens]

Such a reader is the op's logprob output (``return_logprobs``), computed in the same pass:
the rewrite emits ``fused_sample_logprobs`` and the reader's value becomes its second output.
What the reader computes decides the mode, and only an exact match is rewritten:

* "raw": the log-softmax of a chain node that holds the op's raw logits (the matmul's
  output, with its bias, rounded as ``logits_dtype`` says, maybe upcast; before any scale,
  soft-cap or mask: ``LMHead.raw_logits``).
* "processed": the log-softmax of the very scores the sampler draws from (``LMHead.scores``:
  temperature, soft-cap and masks applied, -inf on the masked tokens), when the op draws
  from exactly their softmax: no truncation or temperature of the tail's own beyond the
  chain's (a sorted nucleus renormalizes other probabilities), and no greedy row (the op's
  processed logprob there is 0, the program's that of a distribution it never draws from).

Both must be computed in fp32 (a bf16 log-softmax is another rounding than the op's), over
the vocabulary dim, of a [B, V] table whose rows are the drawn tokens' rows, indexed by the
drawn tokens themselves (the sampling op's output, maybe viewed; not a branch of a mixed
batch). ``log(p)`` of a probability that underflows to 0 is -inf where the op's logprob is
finite; the op draws such a token with probability < V * 1e-38, so ``log(softmax)`` readers
are accepted as the same value (as the near-ties of the masks are). A reader the walk
recognizes but cannot rewrite raises NoMatch with the reason; any other read of the scores
is left to ``Walk.check_private`` (the program needs them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch.fx import Node

from ._tails import decomposed_log_softmax, logsumexp_of, match_softmax
from ._walk import (
    CONVERTS,
    NoMatch,
    Walk,
    aten,
    is_call,
    keepdim_of,
    last_dim,
    over_last_dim,
    prims,
    same,
    same_shape,
    slice_args,
    val,
)

if TYPE_CHECKING:
    from ._rewrite import SamplingMatch

# Views of the drawn tokens that keep their order: the index a reader gathers with.
_TOKEN_VIEWS = (
    aten.unsqueeze.default,
    aten.view.default,
    aten.reshape.default,
    aten._unsafe_view.default,
    aten.squeeze.dim,
    aten.squeeze.dims,
    aten.clone.default,
    *CONVERTS,
)


@dataclass
class LogprobReader:
    """One read of the drawn tokens' logprobs: ``output`` becomes the op's logprobs
    ([N, num_samples]; squeezed to [N] when ``squeeze``)."""

    output: Node
    mode: str
    squeeze: bool = False


def take_logprob_readers(walk: Walk, found: SamplingMatch) -> list[LogprobReader]:
    """The logprob readers of ``walk``'s drawn tokens, their nodes taken by ``walk`` (their
    outputs in ``walk.outputs``); [] if there is none. NoMatch: a reader that the op's
    logprobs cannot replace exactly, or readers of both modes."""
    if not isinstance(val(walk.terminal), torch.Tensor):
        return []  # (``sample_logits_logprobs``: the op's own two outputs)
    readers = []
    for tokens in _token_views(walk.terminal):
        for user in list(tokens.users):
            reader = _reader(walk, found, user, tokens)
            if reader is not None:
                readers.append(reader)
    if len({reader.mode for reader in readers}) > 1:
        raise NoMatch("it reads both raw and processed logprobs; the op returns one kind")
    walk.outputs += [reader.output for reader in readers]
    return readers


def _token_views(terminal: Node) -> list[Node]:
    """The drawn tokens and their views that keep each token's value at its place in
    row-major order (so a view of shape [N, num_samples] reads row r's tokens in row r)."""
    views, frontier = [terminal], [terminal]
    while frontier:
        for user in frontier.pop().users:
            if user.args[0] in views and user not in views and _keeps_order(user):
                if val(user).dtype == torch.int64:
                    views.append(user)
                    frontier.append(user)
    return views


def _keeps_order(step: Node) -> bool:
    if is_call(step, *_TOKEN_VIEWS):
        return True
    source = val(step.args[0]).shape
    if is_call(step, aten.permute.default):  # (of one non-1 dim: ``multinomial(...).T``)
        return sum(not same(size, 1) for size in source) <= 1
    # Categorical.log_prob: ``broadcast_tensors(t[..., None], log_pmf)[0][..., :1]``, an
    # expand of the last dim, of size 1, then its first column.
    if is_call(step, aten.expand.default):
        out = val(step).shape
        return len(out) == len(source) and same(source[-1], 1) and same_shape(source[:-1], out[:-1])
    if is_call(step, aten.slice.Tensor):
        dim, start, end, stride = slice_args(step)
        return last_dim(dim, len(source)) and start == 0 and same(val(step).shape[-1], 1)
    return False


def _reader(walk: Walk, found: SamplingMatch, user: Node, tokens: Node) -> LogprobReader | None:
    """``user`` of the drawn tokens as a logprob reader, or None if it is none."""
    if is_call(user, aten.gather.default) and user.args[2] is tokens and len(user.args) == 3:
        table, dim = user.args[0], user.args[1]
        if not last_dim(dim, val(table).dim()):
            return None
        squeeze = False
    elif is_call(user, aten.index.Tensor) and _rows_then_tokens(user, tokens):
        table, squeeze = user.args[0], True
    else:
        return None
    probe = Walk(user)
    rounded = table
    while is_call(table, *CONVERTS):  # (a log-softmax in bf16 runs in fp32, then rounds)
        table = probe.take(table).args[0]
    output, x = user, _log_softmax_input(probe, table)
    if x is None and is_call(table, aten.log.default):  # torch.log(probs)[token]
        x = _softmax_input(probe, table.args[0])
        probe.take(table)
    if x is None and not squeeze and len(user.users) == 1:  # probs.gather(-1, token).log()
        log = next(iter(user.users))
        if is_call(log, aten.squeeze.dim) and log.args[1] in (-1, 1) and len(log.users) == 1:
            squeezed, log = log, next(iter(log.users))  # (transformers' CB: squeeze, then log)
            squeeze = is_call(log, aten.log.default)
            if squeeze:
                probe.take(squeezed)
        if is_call(log, aten.log.default):
            x = _softmax_input(probe, table)
            output = log
            probe.take(user)
    if x is None:
        return None
    if val(rounded).dtype != torch.float32:
        raise NoMatch(f"the logprob is computed in {val(rounded).dtype}, the op's in fp32")
    reader = LogprobReader(output, _mode(probe, found, x, table), squeeze)
    _check_shape(found, x, tokens, output, squeeze, gathered=user.target == aten.gather.default)
    inside = set(walk.owned) | set(probe.owned) | {walk.terminal, output}
    for node in probe.owned:
        outside = [user for user in node.users if user not in inside]
        if outside:
            raise NoMatch(
                f"the log-probabilities are also read by {outside[0].name} (the token's rank,"
                " the top-n logprobs, ...): the op returns the drawn token's logprob alone"
            )
    for node in probe.owned:
        walk.take(node)
    return reader


def _rows_then_tokens(index: Node, tokens: Node) -> bool:
    """``table[torch.arange(N), tokens]``: row i reads its own token."""
    indices = index.args[1]
    if len(indices) != 2 or indices[1] is not tokens or val(tokens).dim() != 1:
        return False
    rows = indices[0]
    if is_call(rows, prims.iota.default):  # (how aten decomposes torch.arange)
        start, step = rows.kwargs.get("start"), rows.kwargs.get("step")
    elif is_call(rows, aten.arange.default):
        start, step = 0, 1
    elif is_call(rows, aten.arange.start, aten.arange.start_step):
        start, step = rows.args[0], rows.args[2] if len(rows.args) > 2 else 1
    else:
        return False
    return start == 0 and step == 1 and same_shape(val(rows).shape, val(tokens).shape)


def _log_softmax_input(walk: Walk, table) -> Node | None:
    """``log_softmax(x, -1)`` as aten decomposes it, ``(x - amax) - log(sum(exp(x - amax)))``,
    or undecomposed -> x (the fp32 table the program reads); None for anything else."""
    if is_call(table, aten._log_softmax.default):
        if not last_dim(table.args[1], val(table).dim()):
            return None
        walk.take(table)
        return table.args[0]
    if is_call(table, aten.sub.Tensor) and "alpha" not in table.kwargs:
        # ``x - logsumexp(x)``: Categorical(logits=x)'s normalized logits, its log_prob's table
        x, lse = table.args
        steps = logsumexp_of(lse, x) if isinstance(x, Node) else None
        if steps is not None:
            for node in (table, *steps):
                if isinstance(node, Node):
                    walk.take(node)
            return x
    decomposed = decomposed_log_softmax(table)
    if decomposed is None:
        return None
    shifted, total, steps = decomposed
    if not over_last_dim(total.args[1], keepdim_of(total), val(total).dim()):
        return None
    if not (is_call(shifted, aten.sub.Tensor) and is_call(shifted.args[1], aten.amax.default)):
        return None
    x, amax = shifted.args
    if amax.args[0] is not x or not over_last_dim(amax.args[1], keepdim_of(amax), val(x).dim()):
        return None
    for node in (*steps, shifted, amax):
        walk.take(node)
    return x


def _softmax_input(walk: Walk, probs) -> Node | None:
    if not isinstance(probs, Node):
        return None
    probe = Walk(walk.terminal)
    try:
        x = match_softmax(probe, probs)
    except NoMatch:
        return None
    if probe.tail_rows:
        return None
    if val(probs).dtype != torch.float32:
        raise NoMatch(f"the logprob reads {val(probs).dtype} probabilities, not fp32 ones")
    walk.owned += [node for node in probe.owned if node not in walk.owned]
    return x


def _mode(walk: Walk, found: SamplingMatch, x: Node, table: Node) -> str:
    """ "raw" or "processed": what the log-softmax of ``x`` is, if the op gives it exactly."""
    head = found.lm_head
    if val(table).dtype != torch.float32:
        raise NoMatch(f"the logprob is computed in {val(table).dtype}, the op's in fp32")
    source = x
    while source not in head.raw_logits and is_call(source, *CONVERTS):
        if val(source).dtype != torch.float32:
            break  # (a rounding: not the value the op reads)
        source = walk.take(source).args[0]
    if source in head.raw_logits:
        return "raw"
    if source is not head.scores:
        raise NoMatch(
            "the logprob reads a log-softmax of other scores than the raw logits or the scores"
            " the sampler draws from"
        )
    if val(source).dtype != torch.float32:
        raise NoMatch(f"the logprob reads the sampled scores in {val(source).dtype}, not fp32")
    if found.greedy_rows is not None or head.temperature == 0.0:
        raise NoMatch(
            "it reads the processed logprob of greedy rows: the op gives 0 there (the argmax"
            " is drawn with probability 1), the program log_softmax of scores it never draws from"
        )
    own = (found.top_k, found.top_p, found.min_p) != (head.top_k, head.top_p, head.min_p)
    if own or not (isinstance(found.temperature, float) and found.temperature == 1.0):
        raise NoMatch(
            "it reads the log-softmax of the scores before the sampler's own truncation or"
            " temperature: not the distribution it draws from"
        )
    return "processed"


def _check_shape(found, x: Node, tokens: Node, output: Node, squeeze: bool, gathered: bool):
    table, out = val(x), val(output)
    scores = val(found.lm_head.scores)
    if table.dim() != 2 or tuple(table.shape) != tuple(scores.shape):
        raise NoMatch("the logprob reads a table of other rows than the drawn tokens'")
    rows, samples = table.shape[0], found.num_samples
    if samples != 1 and squeeze:
        raise NoMatch("the logprob indexes several samples per row by one token")
    expected = (rows,) if squeeze else (rows, samples)
    index = (rows, samples) if gathered else (rows,)
    if tuple(out.shape) != expected or tuple(val(tokens).shape) != index:
        raise NoMatch(f"the logprob reads {tuple(out.shape)} values, not one per drawn token")
