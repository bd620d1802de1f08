"""Where a truncating stage 2's time goes, phase by phase, per row: a copy of
``truncation_kernel.py`` with ``%globaltimer`` stamps between the phases of ``_stage2_row``
(written to a [B, 16] buffer), swapped in for the run. CUDA only; eager calls (the phases are
inside one kernel, so launch gaps do not matter); each phase's median over rows and calls, us.

    python benchmarks/probes/stage2_phases.py --batches 1,16,64 --forms k50,k50p09,p09,minp,off

Phases (a row's consecutive stamps; a phase a row skips is left out of its medians):
  start->knobs  the row's knobs read (after the PDL wait and the plain prefetch)
  knobs->load   the row's candidates loaded (untruncated rows: -> plain, their whole draw)
  load->top     the row's maximum and its token
  top->topk     top-k's bound (the k-th key's search)
  topk->pack    the top-k survivors counted (and packed, where they fit)
  pack->topp    top-p's nucleus bound
  topp->flag    min-p's bound and the completeness check (hidden keys of every tile / group)
  flag->kept    the kept candidates packed (where that shrinks the noise's lanes)
  kept->drawn   the noise and the Gumbel-max (and the token's store)

--hot: each stage-2 program runs its row twice (a runtime loop around the kernel's body, so
its code is the same instructions both times) and the stamps are the second run's: the
phases with the program's code already fetched into its SM's instruction caches. The gap
between the two tables is what a cold start costs each phase.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys

import torch
from module_ab import import_source, patched  # (this folder)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

SLOTS = ["start", "knobs", "load", "top", "topk", "pack", "topp", "flag", "kept", "drawn"]
PLAIN_SLOT = 15  # an untruncated row's end (its plain draw)
FORMS = {
    "k50": dict(top_k=50),
    "k50p09": dict(top_k=50, top_p=0.9),
    "p09": dict(top_p=0.9),
    "minp": dict(min_p=0.1),
    "off": "off",  # 0-d tensors at their off values, as generate passes them
}

STAMP = """
@triton.jit
def _stamp(stamp_ptr, row, SLOT: tl.constexpr):
    if stamp_ptr is not None:
        now = tl.inline_asm_elementwise(
            "mov.u64 $0, %globaltimer;", "=l,r", [row], dtype=tl.int64, is_pure=False, pack=1
        )
        tl.store(stamp_ptr + row.to(tl.int64) * 16 + SLOT, now)

"""


def _insert_before(source: str, anchor: str, line: str) -> str:
    assert source.count(anchor) == 1, anchor
    return source.replace(anchor, line + anchor)


def _run_twice(source: str, kernel: str) -> str:
    """``kernel``'s body moved into a function of its own, called twice in a runtime loop."""
    start = source.index(f"def {kernel}(")
    end = source.index("\n\n\n@triton.jit", start)
    text = source[start:end]
    head, body = text.split("\n):  # fmt: skip\n", 1)
    params = head[len(f"def {kernel}(") :]
    names = []
    for line in params.splitlines():
        line = line.split("#", 1)[0]
        for part in line.split(","):
            name = part.split(":")[0].split("=")[0].strip()
            if name:
                names.append(name)
    body = body.split('"""', 2)[2] if body.lstrip().startswith('"""') else body
    inner = f"@triton.jit\ndef {kernel}_body({params}\n):  # fmt: skip{body}\n\n\n"
    outer = (
        f"def {kernel}({params}\n):  # fmt: skip\n"
        f"    for _hot in range(1 + (V > 0)):\n        {kernel}_body({', '.join(names)})\n"
    )
    decorator = source.rindex("\n\n\n", 0, start) + 3
    return source[:decorator] + inner + source[decorator:start] + outer + source[end:]


def probe_module(stamps_holder: dict, patches: tuple[tuple[str, str], ...] = (), hot=False):
    """truncation_kernel with stamps (and each (old, new) text of ``patches`` replaced: an
    A/B of a change inside a phase), imported from a file of its own (module_ab.py's)."""
    from flashsampling_inductor import truncation_kernel

    source = patched(open(truncation_kernel.__file__).read(), patches)
    source = re.sub(r"_stage2_row\(\n(\s*)row,", r"_stage2_row(\n\1stamp_ptr, row,", source)
    for kernel in ("_truncated_stage2", "_fallback_stage2"):
        source = source.replace(
            f"def {kernel}(\n    key_ptr,", f"def {kernel}(\n    stamp_ptr, key_ptr,"
        )
    source = source.replace(
        "\n@triton.jit\ndef _stage2_row(", STAMP + "\n@triton.jit\ndef _stage2_row("
    )
    body = source[source.index("def _stage2_row(") : source.index("def _prefetch_plain(")]
    new = body
    marks = [
        ("    min_p_on = (min_p > 0.0) & (temperature > 0)\n", "knobs", True),
        ("    if PATCHED:\n        row_keys, row_index = _patched_keys(", "load", False),
        ("\n    row_log_mass_ptr = log_mass_ptr\n", "top", False),
        ("    keep_bound = survivor_bound\n", "topk", False),
        ("    # Top-p alone, pruned:", "pack", False),
        ("    if min_p_on:\n", "topp", False),
        ("    compact, small_keys, small_index = _pack_kept(", "flag", False),
        ("    _draw_kept(\n", "kept", False),
    ]
    for anchor, slot, after in marks:
        stamp = f"    _stamp(stamp_ptr, row, {SLOTS.index(slot)})\n"
        assert new.count(anchor) == 1, anchor
        new = new.replace(anchor, anchor + stamp if after else stamp + anchor)
    end = new.rindex("\n\n\n@triton.jit\n")
    new = new[:end] + f"\n    _stamp(stamp_ptr, row, {SLOTS.index('drawn')})" + new[end:]
    plain_end = "PLAIN_BLOCK, PREFETCH_PLAIN,\n            )  # fmt: skip\n"
    new = new.replace(plain_end, plain_end + f"            _stamp(stamp_ptr, row, {PLAIN_SLOT})\n")
    source = source.replace(body, new)
    # The first stamp: each program's start, after its PDL wait.
    first = "    await_previous_kernel(PDL)\n    row = tl.program_id(0)\n"
    source = source.replace(
        first + "    prefetched", first + "    _stamp(stamp_ptr, row, 0)\n    prefetched"
    )
    source = source.replace(
        "    runtime = dict(\n        key_ptr=keys,",
        "    runtime = dict(\n        stamp_ptr=None if complete or patched else"
        " _STAMPS.get('first'), key_ptr=keys,",
    )
    source = source.replace("_FALLBACK_SHARED = (\n", '_FALLBACK_SHARED = (\n    "stamp_ptr",\n')
    if hot:
        source = _run_twice(source, "_truncated_stage2")
    source += "\n_STAMPS = {}\n"
    module = import_source(source, "truncation_kernel_stamped")
    module._STAMPS = stamps_holder
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--forms", default=",".join(FORMS))
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument(
        "--patch", action="append", default=[],
        help="OLD=>NEW: a text of truncation_kernel.py replaced in the probe's copy (repeatable)",
    )  # fmt: skip
    parser.add_argument("--hot", action="store_true", help="stamps of each row's second run")
    parser.add_argument(
        "--bf16-logits", action="store_true",
        help="logits rounded to bf16 (bench_sampling's calls; the default fp32 logits search"
        " 24 key bits where bf16's search 8)",
    )  # fmt: skip
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("stage2_phases.py needs a CUDA GPU: nothing to run here")
        return
    from flashsampling_inductor import dispatch, fused_sample

    holder: dict = {}
    patches = tuple(tuple(patch.split("=>", 1)) for patch in args.patch)
    dispatch.truncation_kernel = probe_module(holder, patches, args.hot)
    if args.hot:
        print("hot: the stamps of each row's second run in its program")
    if patches:
        print("patched:", "; ".join(f"{old!r} -> {new!r}" for old, new in patches))
    torch.manual_seed(0)
    weight = torch.randn(args.vocab, args.hidden, device="cuda", dtype=torch.bfloat16)
    logits_dtype = torch.bfloat16 if args.bf16_logits else None
    print(f"{torch.cuda.get_device_name()}, D = {args.hidden}, V = {args.vocab},"
          f" {'bf16' if args.bf16_logits else 'fp32'} logits; us, median")  # fmt: skip
    names = [f"{a}->{b}"[:13].rjust(13) for a, b in zip(SLOTS, SLOTS[1:], strict=False)]
    print("form   B  " + " ".join(names) + "  plain-end  total")
    for batch in map(int, args.batches.split(",")):
        # (std-5 logits over the vocabulary, as bench_sampling's)
        hidden = torch.randn(batch, args.hidden, device="cuda", dtype=torch.bfloat16)
        hidden *= 5 / (args.hidden**0.5)
        for form in args.forms.split(","):
            knobs = FORMS[form]
            if knobs == "off":
                knobs = dict(
                    top_k=torch.tensor(0, device="cuda"),
                    top_p=torch.tensor(1.0, device="cuda"),
                    min_p=torch.tensor(0.0, device="cuda"),
                )
            stamps = torch.zeros(batch, 16, dtype=torch.int64, device="cuda")
            holder["first"] = stamps
            phases = {i: [] for i in range(len(SLOTS) - 1)}
            plain_end, totals = [], []
            for call in range(args.calls + 2):
                stamps.zero_()
                fused_sample(
                    hidden, weight, temperature=0.7, seed=call, logits_dtype=logits_dtype, **knobs
                )
                torch.cuda.synchronize()
                if call < 2:
                    continue  # (compiles)
                rows = stamps.cpu().tolist()
                for row in rows:
                    if row[0] == 0:
                        continue
                    if row[PLAIN_SLOT]:
                        plain_end.append((row[PLAIN_SLOT] - row[0]) / 1e3)
                        continue
                    last = 0
                    for i in range(1, len(SLOTS)):
                        if row[i] and row[last]:
                            phases[i - 1].append((row[i] - row[last]) / 1e3)
                            last = i
                    if row[len(SLOTS) - 1]:
                        totals.append((row[len(SLOTS) - 1] - row[0]) / 1e3)

            def med(values):
                return f"{statistics.median(values):13.2f}" if values else " " * 13

            print(f"{form:6s}{batch:3d}  " + " ".join(med(phases[i]) for i in phases)
                  + f"  {med(plain_end)[-9:]}  {med(totals)[-6:]}", flush=True)  # fmt: skip
    holder.clear()


if __name__ == "__main__":
    main()
