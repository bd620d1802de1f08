"""The FlashInfer peer table of docs/performance.md from bench_sampling.py CSVs (issue 38 item 2).

Each CSV is one process: one FlashInfer version (its ``flashinfer`` column), matmul and the
fused providers timed beside it, so every ratio is taken in-process: a peer's time over the
time of the fused provider of the same form (bench_sampling.FUSED_OF). Each form's peer is
taken at its best: the fastest of that version's calls for the form (plain: FI2
``sampling_from_logits`` or FI1 ``top_k_top_p_sampling_from_logits(V, 1.0)``; top-k: the
default top-k-first path, the joint order, or cake on the fp32 softmax). A cell reads
``0.7.2 / 0.6.9``; below 1.00 (bold) the peer is faster than fused.

    python benchmarks/flashinfer_peer_table.py benchmarks/results/bench_sampling_*_flashinfer-*.csv
"""

from __future__ import annotations

import csv
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sampling import FUSED_OF  # noqa: E402

# form -> (the fused provider, the peers of that form)
FORMS = {
    "plain": ("fused", ("flashinfer_fi2", "flashinfer_fi1")),
    "top-k 50": (
        "fused_topk50",
        ("flashinfer_topk50", "flashinfer_topk50_joint", "flashinfer_cake_topk50"),
    ),
    "k 50 + p 0.9": (
        "fused_topk50_topp09",
        (
            "flashinfer_topk50_topp09",
            "flashinfer_topk50_topp09_joint",
            "flashinfer_cake_topk50_topp09",
        ),
    ),
    "top-p 0.9": ("fused_topp09", ("flashinfer_topp09",)),
    "min-p 0.1": ("fused_minp01", ("flashinfer_minp01",)),
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
}


def read(paths: list[str], timing: str = "graph") -> dict:
    """{(version, D, B): {provider: median us}} of the rows timed in ``timing`` mode."""
    times: dict = defaultdict(dict)
    for path in paths:
        for row in csv.DictReader(open(path)):
            if row["timing"] != timing or not row["median_us"]:
                continue
            version = row.get("flashinfer") or "0.6.9"  # (the column came later)
            times[(version, int(row["D"]), int(row["B"]))][row["provider"]] = float(
                row["median_us"]
            )
    return times


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


def table(times: dict, versions: tuple[str, str]) -> str:
    lines = []
    dims = sorted({d for _, d, _ in times})
    for dim in dims:
        lines += [
            f"\nD = {dim}: peer / fused, FlashInfer {versions[0]} / {versions[1]} (each its "
            "fastest call of the form; fused over matmul from the first version's process)\n",
            "| B | matmul us | fused / matmul | " + " | ".join(FORMS) + " |",
            "|---|---|---|" + "---|" * len(FORMS),
        ]
        batches = sorted({b for v, d, b in times if d == dim})
        for batch in batches:
            points = [times.get((v, dim, batch), {}) for v in versions]
            first = next((p for p in points if "matmul" in p), {})
            matmul, fused = first.get("matmul"), first.get("fused")
            cells = [str(batch), f"{matmul:.0f}" if matmul else "-"]
            cells.append(f"{fused / matmul:.2f}" if fused and matmul else "-")
            for form in FORMS:
                cells.append(" / ".join(cell(best_peer(p, form)) for p in points))
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def losses(times: dict) -> list[str]:
    """Every (version, D, B, form) where the fastest peer beats fused, with the peer."""
    out = []
    for (version, dim, batch), point in sorted(times.items()):
        for form in FORMS:
            ratio = best_peer(point, form)
            if ratio and ratio[0] < 1.0:
                call = f" ({SHORT[ratio[1]]})" if SHORT[ratio[1]] else ""
                out.append(
                    f"FlashInfer {version} {form}{call}, D = {dim}, B = {batch}: {ratio[0]:.2f}"
                )
    return out


def main(argv: list[str]) -> int:
    times = read(argv)
    versions = tuple(sorted({v for v, _, _ in times}, reverse=True))[:2]
    if len(versions) == 1:
        versions = (versions[0], "-")
    print(table(times, versions))
    print("\npeer faster than fused:")
    print("\n".join(losses(times)) or "none")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
