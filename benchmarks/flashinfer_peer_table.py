"""The peer tables of docs/performance.md from bench_sampling.py CSVs (issue 38 item 2).

Each CSV is one process: one peer source, matmul and the fused providers timed beside it, so
every ratio is taken in-process: a peer's time over the time of the fused provider of the same
form (bench_sampling.FUSED_OF). A source is a FlashInfer version (the CSV's ``flashinfer``
column) or, for a CSV of the ``hf_*`` providers, transformers (its warpers compiled by stock
Inductor; plain sampling's peer there is ``inductor_multinomial_cg``). Each form's peer is
taken at its best: the fastest of that source's calls for the form (plain: FI2
``sampling_from_logits`` or FI1 ``top_k_top_p_sampling_from_logits(V, 1.0)``; top-k: the
default top-k-first path, the joint order, or cake on the fp32 softmax). A cell reads
``0.7.2 / 0.6.9 / transformers`` (the sources present, in that order); below 1.00 (bold) the
peer is faster than fused.

    python benchmarks/flashinfer_peer_table.py benchmarks/results/bench_sampling_*_flashinfer-*.csv
"""

from __future__ import annotations

import csv
import re
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sampling import FUSED_OF  # noqa: E402

# form -> (the fused provider, the peers of that form)
FORMS = {
    "plain": ("fused", ("flashinfer_fi2", "flashinfer_fi1", "inductor_multinomial_cg")),
    "top-k 50": (
        "fused_topk50",
        ("flashinfer_topk50", "flashinfer_topk50_joint", "flashinfer_cake_topk50", "hf_topk50"),
    ),
    "k 50 + p 0.9": (
        "fused_topk50_topp09",
        (
            "flashinfer_topk50_topp09",
            "flashinfer_topk50_topp09_joint",
            "flashinfer_cake_topk50_topp09",
            "hf_topk50_topp09",
        ),
    ),
    "top-p 0.9": ("fused_topp09", ("flashinfer_topp09", "hf_topp09")),
    "min-p 0.1": ("fused_minp01", ("flashinfer_minp01", "hf_minp01")),
}
SHORT = {
    "flashinfer_fi2": "FI2",
    "flashinfer_fi1": "FI1",
    "flashinfer_topk50": "default",
    "flashinfer_topk50_topp09": "default",
    "flashinfer_topk50_joint": "joint",
    "flashinfer_topk50_topp09_joint": "joint",
    "flashinfer_cake_topk50": "cake",
    "flashinfer_cake_topk50_topp09": "cake",
    "flashinfer_topp09": "",
    "flashinfer_minp01": "",
    "inductor_multinomial_cg": "",
    "hf_topk50": "",
    "hf_topk50_topp09": "",
    "hf_topp09": "",
    "hf_minp01": "",
}


def source_of(rows: list[dict]) -> str:
    """The peer source of one CSV (one process): transformers where it timed the hf_*
    providers (the version from their note), else its FlashInfer version."""
    for row in rows:
        if row["provider"].startswith("hf_"):
            version = re.search(r"transformers (\S+?)(;|$)", row["note"])
            return f"transformers {version[1] if version else '?'}"
    return (
        f"FlashInfer {rows[0].get('flashinfer') or '0.6.9'}" if rows else "?"
    )  # (column came later)


def read(paths: list[str], timing: str = "graph") -> dict:
    """{(source, D, B): {provider: median us}} of the rows timed in ``timing`` mode."""
    times: dict = defaultdict(dict)
    for path in paths:
        rows = list(csv.DictReader(open(path)))
        source = source_of(rows)
        for row in rows:
            if row["timing"] != timing or not row["median_us"]:
                continue
            times[(source, int(row["D"]), int(row["B"]))][row["provider"]] = float(row["median_us"])
    return times


def ordered_sources(times: dict) -> tuple[str, ...]:
    """FlashInfer versions newest first, then transformers."""
    sources = {s for s, _, _ in times}
    flashinfer = sorted((s for s in sources if s.startswith("FlashInfer")), reverse=True)
    return (*flashinfer, *sorted(sources - set(flashinfer)))


def best_peer(point: dict, form: str) -> tuple[float, str] | None:
    """(peer time / fused time, the peer) of the fastest peer of ``form`` at one point."""
    fused, peers = FORMS[form]
    ratios = [
        (point[p] / point[fused], p)
        for p in peers
        if p in point and fused in point and FUSED_OF.get(p, "fused") == fused
    ]
    return min(ratios) if ratios else None


def cell(ratio: tuple[float, str] | None) -> str:
    if ratio is None:
        return "-"
    text = f"{ratio[0]:.2f}"
    return f"**{text}**" if ratio[0] < 1.0 else text


def table(times: dict, sources: tuple[str, ...]) -> str:
    lines = []
    dims = sorted({d for _, d, _ in times})
    for dim in dims:
        lines += [
            f"\nD = {dim}: peer / fused, {' / '.join(sources)} (each its fastest call of the "
            "form; fused over matmul from the first source's process)\n",
            "| B | matmul us | fused / matmul | " + " | ".join(FORMS) + " |",
            "|---|---|---|" + "---|" * len(FORMS),
        ]
        batches = sorted({b for v, d, b in times if d == dim})
        for batch in batches:
            points = [times.get((source, dim, batch), {}) for source in sources]
            first = next((p for p in points if "matmul" in p), {})
            matmul, fused = first.get("matmul"), first.get("fused")
            cells = [str(batch), f"{matmul:.0f}" if matmul else "-"]
            cells.append(f"{fused / matmul:.2f}" if fused and matmul else "-")
            for form in FORMS:
                cells.append(" / ".join(cell(best_peer(p, form)) for p in points))
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def losses(times: dict) -> list[str]:
    """Every (source, D, B, form) where the fastest peer beats fused, with the peer."""
    out = []
    for (source, dim, batch), point in sorted(times.items()):
        for form in FORMS:
            ratio = best_peer(point, form)
            if ratio and ratio[0] < 1.0:
                call = f" ({SHORT[ratio[1]]})" if SHORT[ratio[1]] else ""
                out.append(f"{source} {form}{call}, D = {dim}, B = {batch}: {ratio[0]:.2f}")
    return out


def main(argv: list[str]) -> int:
    times = read(argv)
    print(table(times, ordered_sources(times)))
    print("\npeer faster than fused:")
    print("\n".join(losses(times)) or "none")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
