"""The rewrite: an idiom's ``SamplingMatch`` becomes one ``flashsampling::fused_sample`` call.

Every idiom registers its terminal node (``aten.multinomial``, ``aten.argmax``, ...) with
Inductor's pattern matcher on ``PASS``; the handler runs the idiom's check, and a match
replaces the terminal and everything the walk owns by one call traced with
``Match.replace_by_example`` (so symbolic batch sizes need no special handling). What the
handler decided about each terminal is recorded as a ``SamplingSite`` for the pass's
warning and ``flashsampling_inductor.explain``.
"""

from __future__ import annotations

import logging
import operator
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

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

from ..op import why_not_fused_on
from ._lm_head import LMHead, row_op
from ._logprobs import LogprobReader, take_logprob_readers
from ._walk import (
    GIVEN_LOGITS,
    TP_GATHER_NOT_LIFTED,
    NoMatch,
    ReadOutside,
    Walk,
    aten,
    is_call,
    val,
)

log = logging.getLogger("flashsampling_inductor")

# Every idiom registers its terminal op here; ``graph_pass.py`` applies it.
PASS = PatternMatcherPass(pass_name="flashsampling")

# Seeds are drawn on the device from Inductor's RNG; 62 bits keep randint's range in int64.
SEED_RANGE = 2**62


@dataclass
class SamplingMatch:
    """What an idiom's check found: the parameters of one ``fused_sample`` call.

    The output is ``[*rows, num_samples]`` if ``keep_dim`` else ``[*rows]``. ``top_k`` is a
    Python int or a node (a SymInt, or a [B] int64 tensor), ``top_p`` and ``min_p`` a float
    or a node (a [B] fp32 tensor); None is off. ``temperature`` is the sampling op's own,
    applied on top of the LM-head chain's. ``seed`` None draws a fresh seed in the graph.
    The soft-cap is the LM head's (``lm_head.softcap``).
    """

    lm_head: LMHead
    num_samples: int = 1
    keep_dim: bool = True
    top_k: int | Node | None = None
    top_p: float | Node | None = None
    min_p: float | Node | None = None
    # top-p measured on the whole row, not on the top-k survivors (the op's own flag)
    top_p_whole_row: bool = False
    # The program's token ids in another integer dtype than the op's int64 (SGLang's int32)
    out_dtype: torch.dtype | None = None
    temperature: float | Node = 1.0
    seed: int | Node | None = None
    impl: str = "auto"
    # Rows drawn greedily (temperature 0): a boolean node, one per row, and the value that
    # means greedy; the output then has ``out_dim`` dims ([B] or [B, 1]).
    greedy_rows: Node | None = None
    greedy_rows_when: bool = True
    out_dim: int | None = None
    # The tensor knobs are the op's own, already checked (``sample_logits``), not values the
    # program computed with (a per-row k, p or min_p of its masks), which the rewrite checks.
    knobs_checked: bool = False
    # The drawn tokens' logprobs the op returns ("raw" / "processed", as ``return_logprobs``):
    # the terminal's own second output (``returns_logprobs``: ``sample_logits_logprobs``)
    # and / or what the program's readers read (``_logprobs.py``).
    logprobs: str | None = None
    returns_logprobs: bool = False
    logprob_readers: list[LogprobReader] = field(default_factory=list)

    @classmethod
    def of(cls, head: LMHead, **fields) -> SamplingMatch:
        """A match that carries the chain's own truncation (its top-k / top-p / min-p
        masks)."""
        return cls(
            head, top_k=head.top_k, top_p=head.top_p, min_p=head.min_p,
            top_p_whole_row=head.top_p_whole_row, **fields,
        )  # fmt: skip


@dataclass(frozen=True)
class SamplingSite:
    """One sampling op of a compiled graph and what the pass made of it."""

    op: str  # the terminal op, e.g. "aten.multinomial"
    node: str  # its name in the aten graph
    idiom: str  # the idiom that rewrote it, or the first whose check refused it
    rewritten: bool
    reason: str = ""  # why it was not rewritten
    sampling: bool = True  # a random draw (False: an argmax only the greedy idiom knows)
    # Matched, but left stock on purpose: the fused op is slower there (op.why_not_fused_on:
    # off CUDA, or an fp32 LM head with TF32 off).
    off_cuda: bool = False

    def __str__(self) -> str:
        if self.rewritten:
            return f"{self.node} ({self.op}): rewritten by {self.idiom}"
        return f"{self.node} ({self.op}): not rewritten ({self.idiom}): {self.reason}"


_sites: dict[Node, SamplingSite] | None = None


@contextmanager
def recording() -> Iterator[dict[Node, SamplingSite]]:
    """Collect the handlers' decisions, per terminal node, while the pass runs."""
    global _sites
    outer, _sites = _sites, {}
    try:
        yield _sites
    finally:
        _sites = outer


def _record(terminal: Node, site: SamplingSite) -> None:
    if _sites is None:
        return
    first = _sites.get(terminal)
    if first is None or site.rewritten or site.off_cuda:
        _sites[terminal] = replace(site, sampling=site.sampling or (first or site).sampling)
    elif site.sampling and not first.sampling:
        _sites[terminal] = replace(first, sampling=True)


def _dtype(head: LMHead) -> torch.dtype | None:
    """The LM head's weight dtype (None where the graph does not say, or for given logits)."""
    value = val(head.weight)
    return value.dtype if isinstance(value, torch.Tensor) else None


def _device(head: LMHead) -> torch.device:
    """Where the LM head runs (its operands' fake tensors; CUDA if neither has one, as a
    graph the pass cannot place is one it has always rewritten)."""
    for node in (head.hidden, head.weight):
        if isinstance(value := val(node), torch.Tensor):
            return value.device
    return torch.device("cuda")


def register(idiom: str, target, check: Callable[[Walk], SamplingMatch | None], *, sampling=True):
    """Register ``check`` for the terminal op ``target``; a match becomes one fused-op call.

    ``check(walk)`` returns None if the terminal is not this idiom, raises NoMatch (recorded
    as a near miss) if it is but cannot be rewritten, else a ``SamplingMatch``.
    ``sampling``: the idiom draws at random (an unrewritten site is worth a warning).
    """
    op = str(target).rsplit(".", 1)[0]

    def handler(match: Match, *args, **kwargs) -> None:
        terminal = match.output_node()
        # An argmax of scores that read random numbers draws a sample, whatever idiom
        # claims it (noise the sampling idioms did not recognize must not pass for greedy).
        draws = sampling or reads_random(terminal)
        site = SamplingSite(op, terminal.name, idiom, rewritten=False, sampling=draws)
        try:
            found, walk = _check_cutting(check, terminal)
            if found is None:
                return
            # Row selections after the softmax (``probs.squeeze(1)``) act on the tokens.
            tail_rows = [row_op(node, found.lm_head.vocab_size) for node in walk.tail_rows]
            if torch._inductor.config.fallback_random:
                raise NoMatch("fallback_random is set: the program asked for eager's RNG")
        except NoMatch as why:
            log.debug("flashsampling: %s at %s not rewritten: %s", idiom, terminal.name, why)
            _record(terminal, replace(site, reason=_tp_gather_reason(terminal) or str(why)))
            return
        except Exception as error:
            # A check that breaks on a graph it did not foresee must not fail the user's
            # compile: nothing was changed yet, so the site stays as stock Inductor compiles
            # it. The tests set FLASHSAMPLING_STRICT=1, where it raises.
            if os.environ.get("FLASHSAMPLING_STRICT") == "1":
                raise
            log.warning(
                "flashsampling: %s at %s not rewritten: the pass's check failed (%r); please"
                " report it", idiom, terminal.name, error,
            )  # fmt: skip
            _record(terminal, replace(site, reason=f"the pass's check failed: {error!r}"))
            return
        if why := why_not_fused_on(_device(found.lm_head), _dtype(found.lm_head)):
            log.debug("flashsampling: %s at %s not rewritten: %s", idiom, terminal.name, why)
            _record(terminal, replace(site, reason=why, off_cuda=True))
            return
        _rewrite(match, walk, found, tail_rows)
        _record(terminal, replace(site, rewritten=True))
        counters["flashsampling"][idiom] += 1
        log.debug("flashsampling: rewrote %s at %s", idiom, terminal.name)

    register_graph_pattern(CallFunctionVarArgs(target), pass_dict=PASS)(handler)


def _check_cutting(check: Callable[[Walk], SamplingMatch | None], terminal: Node):
    """-> (the match, its walk): ``check`` on a fresh walk, the logprob readers, then the
    walk's privacy. Where a node the match would consume is read outside it too (a step that
    returns its logits, an in-place op written back into an input), the check runs again
    with that node taken as logits the graph holds anyway (``_walk.GIVEN_LOGITS``): the
    sampling after it becomes one ``sample_logits`` call on them, which reads them once. A
    node that is not on the LM-head chain (the probabilities, a top-k's values) stays read
    outside on the retry, and the match is refused with that reason."""
    cuts: dict[Node, str] = {}
    while True:
        walk = Walk(terminal)
        token = GIVEN_LOGITS.set(cuts)
        try:
            found = check(walk)
            if found is None:
                return None, walk
            readers = take_logprob_readers(walk, found)
            if readers:
                mode = readers[0].mode
                if found.logprobs not in (None, mode):
                    raise NoMatch(f"it reads {mode} logprobs beside the op's {found.logprobs} ones")
                found.logprobs, found.logprob_readers = mode, readers
            walk.check_private()
            return found, walk
        except ReadOutside as read:
            if read.node in cuts or _tp_stand_in(read.node):
                raise
            cuts = {**cuts, read.node: str(read)}
        finally:
            GIVEN_LOGITS.reset(token)


def _tp_stand_in(node: Node) -> bool:
    """A tensor-parallel gather's lifted stand-in LM head (``tp_gather.lift``): its logits
    exist only once lowered, so it is never cut."""
    return is_call(node, aten.mm.default, aten.addmm.default) and any(
        is_call(arg, aten.permute.default)
        and is_call(arg.args[0], torch.ops.flashsampling.tp_gathered_weight.default)
        for arg in node.args
    )


_MATMULS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default)
_RANDOM_OPS = (
    torch.ops.aten.rand.default,
    torch.ops.aten.randn.default,
    torch.ops.aten.uniform.default,
    torch.ops.aten.exponential.default,
    torch.ops.aten.bernoulli.default,
    torch.ops.aten.multinomial.default,
)


def reads_random(terminal: Node, limit: int = 64) -> bool:
    """True if a random op is among the ``limit`` nodes nearest to ``terminal`` upstream,
    short of a matmul (the model's own dropout is no noise of the scores)."""
    seen, frontier = {terminal}, [terminal]
    while frontier and len(seen) < limit:
        node = frontier.pop(0)
        if node.op == "call_function" and node.target in _RANDOM_OPS:
            return True
        if node.op == "call_function" and node.target in _MATMULS:
            continue
        for source in node.all_input_nodes:
            if source not in seen:
                seen.add(source)
                frontier.append(source)
    return False


def _tp_gather_reason(terminal: Node, limit: int = 256) -> str | None:
    """Why the pass left alone a tensor-parallel gather that feeds ``terminal`` (within
    ``limit`` nodes upstream), if one does: the first reason a user needs, whatever step of
    the chain the idiom's check stopped at (``tp_gather.lift``)."""
    seen, frontier = set(), [terminal]
    while frontier and len(seen) < limit:
        node = frontier.pop()
        if node in seen:
            continue
        seen.add(node)
        if TP_GATHER_NOT_LIFTED in node.meta:
            return node.meta[TP_GATHER_NOT_LIFTED]
        frontier.extend(node.all_input_nodes)
    return None


BAD_TEMPERATURE = (
    "flashsampling: a rewritten sampling step divides its logits by a temperature of 0, inf or"
    " NaN, or by a negative temperature it cannot fold (per row with a bias, after a top-k /"
    " top-p mask, or of logits the graph is given); the fused sampler cannot draw from what"
    " those make of softmax (compile without backend='flashsampling' for them)"
)


def _positive_temperature(hidden, bias, t, negative_allowed: bool):
    """-> (hidden, bias, |t|) for a temperature tensor t (0-d or one value per row).

    The program divides its logits by any T; the fused op samples for finite T > 0. For
    T < 0, softmax(l / T) is softmax(-l / |T|), and -l is exactly what the matmul makes of
    -hidden (and -bias: negation is exact and commutes with every rounding on the way), so
    negative temperatures are folded into the operands instead of refused. A 0 or NaN makes
    the program's probabilities NaN, where torch.multinomial fails; an infinite T (uniform
    draws), a negative per-row T with one shared bias, and a negative T dividing masked
    logits (-inf / T = +inf) have no such folding. Those fail as loudly, through an assert
    in the graph (no host sync). Without ``negative_allowed`` every T < 0 does so, and
    ``hidden`` (then maybe the [B, V] logits the graph is given) is returned untouched.
    """
    negative = t < 0
    valid = t.isfinite() & (t != 0)
    if not negative_allowed or (bias is not None and t.dim() == 1):
        valid = valid & ~negative
    torch._assert_async(valid.all(), BAD_TEMPERATURE)
    if not negative_allowed:
        return hidden, bias, t
    sign = torch.where(negative, -1.0, 1.0).to(hidden.dtype)
    if t.dim() == 1:
        hidden = hidden * sign.view(*hidden.shape[:-1], 1)
    else:
        hidden = hidden * sign
        bias = None if bias is None else bias * sign.to(bias.dtype)
    return hidden, bias, t.abs()


def _as_device_float(t, device) -> torch.Tensor:
    """A symbolic float or a 0-d CPU tensor as an fp32 tensor on ``device``, without a copy
    that would sync: Inductor reads both on the host as a kernel argument."""
    if not isinstance(t, torch.Tensor):
        return torch.full((), t, dtype=torch.float32, device=device)
    if t.device != device:
        t = t * torch.ones((), dtype=t.dtype, device=device)
    return t.to(torch.float32)


def _rewrite(match: Match, walk: Walk, found: SamplingMatch, tail_rows: list) -> None:
    head = found.lm_head
    inputs = [head.hidden]
    for extra in (head.weight, head.bias, head.temperature, found.top_k, found.top_p, found.min_p):
        if isinstance(extra, Node):
            inputs.append(extra)
    for extra in (found.temperature, found.seed, found.greedy_rows):
        if isinstance(extra, Node):
            inputs.append(extra)
    for _, args in head.row_ops + tail_rows:
        tree_map(lambda a: inputs.append(a) if isinstance(a, Node) else None, args)
    position = {node: i for i, node in enumerate(inputs)}

    def replacement(*values):
        def value(x):
            return values[position[x]] if isinstance(x, Node) else x

        hidden, weight, bias = values[0], value(head.weight), value(head.bias)
        if head.weight_transposed:
            weight = weight.t()
        for target, args in head.row_ops:
            hidden = target(hidden, *tree_map(value, args))
        rows = hidden.shape[:-1]
        greedy = None
        if found.greedy_rows is not None:
            greedy = value(found.greedy_rows).reshape(-1)
            if not found.greedy_rows_when:
                greedy = ~greedy
        temperature, scalar_temperature = None, head.temperature
        if isinstance(head.temperature, Node):
            t = _as_device_float(value(head.temperature), hidden.device)
            t = t.reshape(-1 if head.temperature_per_row else ())
            if greedy is not None:
                # The program's temperature on greedy rows is never read (its draw there
                # is dropped): any valid value, replaced by 0 below.
                t = torch.where(greedy, 1.0, t)
            # (given logits: -logits would be one more pass over them, as long as a third
            # to half of the sampling itself; no sampler in the catalog divides by T < 0)
            hidden, bias, temperature = _positive_temperature(
                hidden, bias, t,
                negative_allowed=not head.temperature_after_mask and weight is not None,
            )  # fmt: skip
            if head.temperature_factor != 1.0:
                temperature = temperature * head.temperature_factor
            scalar_temperature = 1.0
        # The sampling op's own temperature divides logits already divided by the chain's
        # (> 0 once folded): the two multiply.
        own = value(found.temperature)
        if isinstance(own, (torch.SymFloat, torch.SymInt)):
            own = _as_device_float(own, hidden.device)
        if isinstance(own, torch.Tensor):
            temperature = own.float() * (scalar_temperature if temperature is None else temperature)
            scalar_temperature = 1.0
        elif temperature is None:
            scalar_temperature = scalar_temperature * own
        else:
            temperature = temperature * own
        if greedy is not None:
            if temperature is None:
                temperature = torch.full_like(greedy, scalar_temperature, dtype=torch.float32)
                scalar_temperature = 1.0
            temperature = torch.where(greedy, 0.0, temperature.expand(greedy.shape))
        seed, scalar_seed = value(found.seed), 0
        if not isinstance(seed, torch.Tensor):
            seed, scalar_seed = None, 0 if seed is None else seed
            if found.seed is None and (scalar_temperature != 0.0 or temperature is not None):
                # Drawn by Inductor's RNG in the graph: each call and CUDA-graph replay
                # differs. Greedy rows draw no noise.
                seed = torch.randint(0, SEED_RANGE, (), device=hidden.device)
        rows_2d = hidden.reshape(-1, hidden.shape[-1])
        options = dict(
            **_truncation(
                value(found.top_k), value(found.top_p), value(found.min_p), hidden.device,
                found.knobs_checked, rows_2d.shape[0],
            ),
            **({} if head.softcap is None else {"softcap": head.softcap}),
            **({"top_p_whole_row": True} if found.top_p_whole_row else {}),
            **({} if found.logprobs is None else {"logprobs": found.logprobs}),
        )  # fmt: skip
        logprobs_op, ops = found.logprobs is not None, torch.ops.flashsampling
        if weight is None:  # logits the graph is given, rounded as the chain rounds them
            logits = rows_2d
            if head.logits_dtype not in (None, logits.dtype):
                logits = logits.to(head.logits_dtype)
            tokens = (ops.sample_logits_logprobs if logprobs_op else ops.sample_logits)(
                logits, temperature, scalar_temperature, seed, scalar_seed, found.num_samples,
                impl=found.impl, **options,
            )  # fmt: skip
        else:
            tokens = (ops.fused_sample_logprobs if logprobs_op else ops.fused_sample)(
                rows_2d, weight, bias, temperature, scalar_temperature, seed, scalar_seed,
                found.num_samples, head.logits_dtype, found.impl, **options,
            )  # fmt: skip
        if found.logprobs is not None:
            tokens, logprobs = tokens
        if found.out_dtype is not None:
            tokens = tokens.to(found.out_dtype)
        if found.returns_logprobs:
            shape = (*rows, found.num_samples)
            return tokens.view(shape), logprobs.view(shape)
        if found.out_dim is not None:
            return tokens.reshape(-1) if found.out_dim == 1 else tokens.reshape(-1, 1)
        if not (found.keep_dim or tail_rows):
            return tokens.view(rows)
        tokens = tokens.view(*rows, found.num_samples)
        for target, args in tail_rows:
            tokens = target(tokens, *tree_map(value, args))
        return tokens if found.keep_dim else tokens.squeeze(-1)

    # Erase what the fused op replaces; replace_by_example only erases nodes left unused.
    order = {node: i for i, node in enumerate(walk.terminal.graph.nodes)}
    erase = set(walk.owned) | set(walk.leftovers) | set(match.nodes)
    match.nodes = sorted(erase, key=order.__getitem__)
    match.replace_by_example(replacement, inputs)
    if found.logprob_readers:
        _read_logprobs(found.logprob_readers, erase | set(walk.outputs))


_LOGPROB_OPS = (
    torch.ops.flashsampling.fused_sample_logprobs.default,
    torch.ops.flashsampling.sample_logits_logprobs.default,
)


def _read_logprobs(readers: list[LogprobReader], erase: set[Node]) -> None:
    """Each reader's value becomes the fused op's logprobs, then what it read goes. The op
    is found upstream of the reader's index (the drawn tokens, now the op's), through the
    first argument of each step (views of the op's token output)."""
    for reader in readers:
        read = reader.output
        while is_call(read, aten.log.default, aten.squeeze.dim):
            read = read.args[0]
        index = read.args[1][1] if is_call(read, aten.index.Tensor) else read.args[2]
        node = index
        while not is_call(node, *_LOGPROB_OPS):
            node = node.args[0]
        graph = node.graph
        with graph.inserting_after(node):
            logprobs = graph.call_function(operator.getitem, (node, 1))
            logprobs.meta["val"] = node.meta["val"][1]
        if reader.squeeze:
            with graph.inserting_after(logprobs):
                squeezed = graph.call_function(aten.squeeze.dim, (logprobs, -1))
                squeezed.meta["val"] = logprobs.meta["val"].squeeze(-1)
            logprobs = squeezed
        reader.output.replace_all_uses_with(logprobs)
        erase.add(index)
    for node in reversed(list(next(iter(erase)).graph.nodes)):
        if node in erase and not node.users and not node._erased:
            node.graph.erase_node(node)


BAD_TRUNCATION = (
    "flashsampling: a rewritten sampling step reads a per-row top_k below 1, or a top_p or"
    " min_p outside [0, 1] (or NaN): the program's own gather fails on such a k, and the"
    " fused sampler takes no such p (compile without backend='flashsampling' for them)"
)
BAD_KNOB_ROWS = (
    "flashsampling: a rewritten sampling step reads a per-row top_k, top_p or min_p with"
    " another number of rows than its logits (the program's own mask fails there too)"
)
# The smallest positive fp32: a per-row p of 0 keeps the top token (and its ties), as the
# program's nucleus does, where the op reads p in (0, 1].
_TINY = torch.finfo(torch.float32).tiny


def _truncation(top_k, top_p, min_p, device, checked: bool, rows) -> dict:
    """The op's top-k / top-p / min-p arguments; none at all for those that are off, so an
    untruncated rewrite is the call it always was. A per-row tensor from the program
    ([*rows] or [*rows, 1], any int / float dtype) is checked in the graph (an assert, no
    host sync), as the op's own argument checks do for tensors, its number of ``rows`` too
    where the graph does not prove it (``_walk.one_per_row``); so is a 0-d p of every row
    (a float Dynamo made dynamic: a CPU tensor, moved to ``device`` as ``_as_device_float``
    does); ``checked``: the tensors are the op's own arguments, checked already."""
    kwargs = {}
    if top_k is not None:
        if isinstance(top_k, torch.Tensor):
            if not checked:
                top_k = top_k.reshape(-1).to(torch.int64)
                torch._assert_async((top_k >= 1).all(), BAD_TRUNCATION)
                _check_rows(top_k, rows)
            kwargs.update(top_k=top_k, scalar_top_k=0)
        else:
            kwargs.update(top_k=None, scalar_top_k=top_k)
    for name, knob, off in (("top_p", top_p, 1.0), ("min_p", min_p, 0.0)):
        if isinstance(knob, torch.Tensor) and checked:
            kwargs.update({name: knob.float(), f"scalar_{name}": off})
        elif isinstance(knob, torch.Tensor):
            # (on the device first: a check of a CPU scalar would be a CPU kernel in a step
            # that CUDA graphs capture)
            knob = _as_device_float(knob if knob.dim() == 0 else knob.reshape(-1), device)
            torch._assert_async(((knob >= 0) & (knob <= 1)).all(), BAD_TRUNCATION)
            _check_rows(knob, rows)
            if name == "top_p":
                knob = knob.clamp_min(_TINY)
            kwargs.update({name: knob, f"scalar_{name}": off})
        elif knob is not None:
            kwargs.update({name: None, f"scalar_{name}": float(knob)})
    return kwargs


def _check_rows(knob: torch.Tensor, rows) -> None:
    """A per-row knob whose length the graph does not prove to be ``rows`` (another symbol
    for the batch: ``_walk.one_per_row``) is compared with it when the graph runs, so that a
    mismatch fails the call, as the program's own mask would, instead of the kernels reading
    past the knob."""
    if knob.dim() == 0 or statically_known_true(knob.shape[0] == rows):
        return
    length = torch.full((), knob.shape[0], dtype=torch.int64, device=knob.device)
    torch._assert_async(length == rows, BAD_KNOB_ROWS)
