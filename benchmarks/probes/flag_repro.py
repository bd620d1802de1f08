"""Whether the rows stage 2 sends to the exact fallback depend on more than a call's inputs
(issue 38: one process flagged a row of top-p alone at D = 2048, B = 64 and another did not,
+55-60 us a call; their rows differed after all: torch seeded each process at random. On an
H200 (2026-11-28 17:2x UTC) no disturbance below changed a flag or a buffer; docs/
performance.md, big10).

    python benchmarks/probes/flag_repro.py [--cells 2048x64,2048x128,2048x224]
        [--out-dir DIR]

Per cell (top-p 0.9 alone on bench_sampling's rows, as sweep_cells_ab.py makes them, and its
call: bf16 logits, the fixed 0-d seed): checksums of the inputs (to compare processes), then
eager calls, each after a step that disturbs what a correct call cannot depend on: nothing,
the caching allocator's free blocks filled with 0x00 / 0xFF / 0x7F bytes, PDL off for the
tail (``truncation_kernel.pdl_launch``), both. Per call, without adding a kernel to it (the
buffers are held, not copied): the flagged rows with their codes, whether stage 1's buffers
(top-m keys and indices, left-out keys, mass partials), the merged ones and the tokens equal
the first call's, and stage 1's invariants: per tile its keys descending, the left-out key
at or below the last kept one, the mass maximum the top key's value and the sum in [1, 128].
A line per call into ``flag_repro.txt``. Needs a Hopper GPU (elsewhere it says so).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a plain checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_cells_ab import bench_inputs, flags  # noqa: E402  (this folder)

from flashsampling_inductor import dispatch, fused_sample, truncation_kernel  # noqa: E402

START = time.time()


def fill_free_memory(byte: int) -> None:
    """Fill what the caching allocator holds free (the last call's buffers) with ``byte``."""
    torch.cuda.synchronize()
    blocks = []
    for size in (64 << 10, 256 << 10, 1 << 20, 2 << 20, 8 << 20):
        for _ in range(48):
            blocks.append(torch.empty(size, dtype=torch.uint8, device="cuda").fill_(byte))
    torch.cuda.synchronize()
    del blocks


def no_pdl(device, trigger_first=False):
    return {"PDL": False}


@contextlib.contextmanager
def held_buffers(seen: dict):
    """Hold (not copy) stage 1's buffers, the merged ones and the overflow codes of a call."""
    finish, merge, fallback = (
        dispatch._finish_truncation, truncation_kernel._merge, truncation_kernel.launch_fallback
    )  # fmt: skip

    def finishing(hidden, weight, bias, params, stage1, *args, **kwargs):
        seen["stage1"] = stage1
        return finish(hidden, weight, bias, params, stage1, *args, **kwargs)

    def merging(*args, **kwargs):
        seen["merged"] = merge(*args, **kwargs)
        return seen["merged"]

    def falling_back(*args, **kwargs):
        seen["overflow"] = args[6]
        return fallback(*args, **kwargs)

    with flags([
        (dispatch, "_finish_truncation", finishing),
        (truncation_kernel, "_merge", merging),
        (truncation_kernel, "launch_fallback", falling_back),
    ]):  # fmt: skip
        yield


def key_value(keys: torch.Tensor) -> torch.Tensor:
    bits = torch.where(keys < 0, keys ^ 0x7FFFFFFF, keys)
    return bits.view(torch.float32)


def invariants(stage1: dict, batch: int) -> str:
    """Violations of stage 1's per-tile invariants, per kind: (tiles, rows)."""
    hidden = stage1["hidden_key"]
    tiles = hidden.shape[1]
    keys = stage1["top_m_key"].view(batch, tiles, -1)
    out = []
    checks = {
        "unsorted": (keys[..., :-1] < keys[..., 1:]).any(-1),
        "left-out-above": hidden > keys[..., -1],
    }
    mass = stage1.get("mass")
    if mass is not None:
        top = key_value(keys[..., 0])
        real = keys[..., 0] != -(2**31)
        checks["mass-max"] = real & (mass[..., 0] != top)
        checks["mass-sum"] = real & ~((mass[..., 1] >= 1.0) & (mass[..., 1] <= 128.0))
    for name, bad in checks.items():
        if bad.any():
            rows = bad.any(1).nonzero().flatten().tolist()
            out.append(f"{name}: {int(bad.sum())} tiles, rows {rows[:8]}")
    return "; ".join(out) or "ok"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cells", default="2048x64,2048x128,2048x224,4096x224,2048x96,2048x160")
    parser.add_argument("--budget", type=float, default=100.0)
    parser.add_argument("--out-dir", default=".")
    args = parser.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("flag_repro.py needs a Hopper GPU; there is none here: nothing run")
        return
    drawn = bench_inputs()
    seed = torch.tensor(1234, dtype=torch.int64, device="cuda")
    steps = [
        ("first", None, False), ("again", None, False), ("fill00", 0x00, False),
        ("fillFF", 0xFF, False), ("fill7F", 0x7F, False), ("nopdl", None, True),
        ("nopdl-fillFF", 0xFF, True), ("last", None, False),
    ]  # fmt: skip
    lines = []
    for cell in args.cells.split(","):
        if time.time() - START > args.budget:
            lines.append(f"{cell}: skipped (budget)")
            continue
        dim, batch = (int(x) for x in cell.split("x"))
        weight, hiddens = drawn[dim]
        hidden = hiddens[batch]
        bits = int(hidden.view(torch.int16).long().sum())
        lines.append(
            f"D={dim} B={batch}: weight sum {weight.double().sum().item():.6f}, hidden sum "
            f"{hidden.double().sum().item():.6f}, hidden bits {bits}"
        )
        print(lines[-1], flush=True)
        first = None
        for name, byte, pdl_off in steps:
            if byte is not None:
                fill_free_memory(byte)
            seen = {}
            settings = [(truncation_kernel, "pdl_launch", no_pdl)] if pdl_off else []
            with held_buffers(seen), flags(settings):
                tokens = fused_sample(
                    hidden, weight, logits_dtype=torch.bfloat16, seed=seed, top_p=0.9
                )
            torch.cuda.synchronize()
            overflow = seen["overflow"]
            flagged = overflow.nonzero().flatten().tolist()
            codes = [int(overflow[r]) for r in flagged]
            buffers = {
                "tokens": tokens,
                **{f"s1.{k}": v for k, v in seen["stage1"].items() if torch.is_tensor(v)},
                **{f"m.{k}": v for k, v in seen.get("merged", {}).items() if torch.is_tensor(v)},
            }
            names = ("tokens", "s1.top_m_key", "s1.top_m_index", "s1.hidden_key", "s1.mass",
                     "m.top_m_key", "m.hidden_key", "m.mass")  # fmt: skip
            if first is None:
                first = {k: buffers[k].clone() for k in names if k in buffers}
                differ = "-"
            else:
                differ = ",".join(
                    k for k in first
                    if not torch.equal(torch.nan_to_num(first[k].float(), 7.0),
                                       torch.nan_to_num(buffers[k].float(), 7.0))
                ) or "none"  # fmt: skip
            lines.append(
                f"  {name}: flagged rows {list(zip(flagged, codes, strict=True))}; differ from "
                f"first: {differ}; stage 1: {invariants(seen['stage1'], batch)}"
            )
            print(lines[-1], flush=True)
            del seen, buffers, tokens
        Path(args.out_dir).mkdir(parents=True, exist_ok=True)
        (Path(args.out_dir) / "flag_repro.txt").write_text("\n".join(lines) + "\n")
    print(f"done in {time.time() - START:.0f} s", flush=True)


if __name__ == "__main__":
    main()
