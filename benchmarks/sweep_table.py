"""The full-sweep table of docs/performance.md from bench_sampling.py CSVs (issue 38 item 4).

Each cell is a fused call's time over cuBLAS ``hidden @ W.T`` alone at the same point of the
same process (the CSV's ``ratio_to_matmul``); **bold** over the goal (1.05: a bold 1.05 is
rounded from above). Several CSVs (a sweep split by D over calls) are read as one; a later
file's point replaces an earlier one's. Then a count of the cells over the goal and each
form's worst cell.

    python benchmarks/sweep_table.py benchmarks/results/bench_sampling_nvidia-h200_<date>.csv
"""

from __future__ import annotations

import csv
import sys

GOAL = 1.05
FORMS = {
    "fused": "plain",
    "fused_topk50": "k 50",
    "fused_topk50_topp09": "k 50 + p 0.9",
    "fused_topp09": "p 0.9",
    "fused_minp01": "min-p 0.1",
}


def read(paths: list[str], timing: str = "graph") -> dict:
    """{(D, B): {provider: (median us, ratio to matmul)}} of the rows timed in ``timing``."""
    points: dict = {}
    for path in paths:
        for row in csv.DictReader(open(path)):
            if row["timing"] != timing or not row["median_us"]:
                continue
            point = points.setdefault((int(row["D"]), int(row["B"])), {})
            point[row["provider"]] = (float(row["median_us"]), float(row["ratio_to_matmul"]))
    return points


def cell(ratio: float | None) -> str:
    if ratio is None:
        return "-"
    return f"**{ratio:.2f}**" if ratio > GOAL else f"{ratio:.2f}"


def table(points: dict) -> str:
    lines = [
        "| D | B | matmul us | " + " | ".join(FORMS.values()) + " |",
        "|---|---|---|" + "---|" * len(FORMS),
    ]
    for (dim, batch), point in sorted(points.items()):
        matmul = point.get("matmul", (None, None))[0]
        cells = [str(dim), str(batch), f"{matmul:.0f}" if matmul else "-"]
        cells += [cell(point[p][1] if p in point else None) for p in FORMS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(points: dict) -> str:
    ratios = [
        (point[p][1], p, dim, batch)
        for (dim, batch), point in points.items()
        for p in FORMS
        if p in point
    ]
    over = sum(r > GOAL for r, *_ in ratios)
    lines = [f"{over} of {len(ratios)} cells over {GOAL}"]
    for provider, form in FORMS.items():
        mine = [r for r in ratios if r[1] == provider]
        if mine:
            worst = max(mine)
            lines.append(
                f"{form}: {sum(r > GOAL for r, *_ in mine)} of {len(mine)} over {GOAL}, "
                f"range {min(mine)[0]:.2f}-{worst[0]:.2f} (worst D = {worst[2]}, B = {worst[3]})"
            )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    points = read(argv)
    print(table(points))
    print()
    print(summary(points))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
