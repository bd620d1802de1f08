"""Where an eager ``sample_logits`` / ``fused_sample`` call's host time goes, on CUDA: per
form, the host's time a call (no sync), the same with every ``launch`` replaced by a no-op
(the Python and torch work around the launches), and the time inside ``launch`` split into
its key and the launcher call; then a cProfile (own time) of the launch-free calls.

    python benchmarks/probes/eager_host_parts.py --batches 1,64
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import flashsampling_inductor as fs  # noqa: E402
from flashsampling_inductor import launch as fs_launch  # noqa: E402

FORMS = {"plain": {}, "top_k50": {"top_k": 50}, "top_k50_top_p09": {"top_k": 50, "top_p": 0.9}}
_real_launch = fs_launch.launch
_real_key = fs_launch._key
_clock = {"launch": 0.0, "key": 0.0, "count": 0}


def _timed_key(*args):
    start = time.perf_counter()
    try:
        return _real_key(*args)
    finally:
        _clock["key"] += time.perf_counter() - start


def _timed_launch(*args, **kwargs):
    start = time.perf_counter()
    try:
        return _real_launch(*args, **kwargs)
    finally:
        _clock["launch"] += time.perf_counter() - start
        _clock["count"] += 1


def _no_launch(*args, **kwargs):
    _clock["count"] += 1


def _install(replacement) -> None:
    for module in list(sys.modules.values()):
        name = getattr(module, "__name__", "") or ""
        if name.startswith("flashsampling_inductor") and hasattr(module, "launch"):
            if module.launch in (_real_launch, _timed_launch, _no_launch):
                module.launch = replacement


def _per_call(call, calls: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    elapsed = (time.perf_counter() - start) / calls
    torch.cuda.synchronize()
    return elapsed * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", default="1,64")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--profile", default="sample_logits:top_k50")
    args = parser.parse_args()
    torch.manual_seed(0)
    weight = torch.randn(151936, 2048, device="cuda", dtype=torch.bfloat16) * 0.05
    for batch in (int(b) for b in args.batches.split(",")):
        hidden = torch.randn(batch, 2048, device="cuda", dtype=torch.bfloat16)
        logits = (5 * torch.randn(batch, 151936, device="cuda")).bfloat16()
        entries = {
            "sample_logits": lambda knobs, logits=logits: fs.sample_logits(
                logits, temperature=0.7, **knobs
            ),
            "fused_sample": lambda knobs, hidden=hidden: fs.fused_sample(
                hidden, weight, temperature=0.7, **knobs
            ),
        }
        for entry, call in entries.items():
            for form, knobs in FORMS.items():

                def one(call=call, knobs=knobs):
                    return call(knobs)

                _install(_real_launch)
                for _ in range(5):
                    one()
                total = min(_per_call(one, args.calls) for _ in range(3))
                _install(_timed_launch)
                fs_launch._key = _timed_key
                _clock.update(launch=0.0, key=0.0, count=0)
                timed = _per_call(one, args.calls)
                launches = _clock["count"] / args.calls
                in_launch = _clock["launch"] / args.calls * 1e6
                in_key = _clock["key"] / args.calls * 1e6
                fs_launch._key = _real_key
                _install(_no_launch)
                bare = min(_per_call(one, args.calls) for _ in range(3))
                _install(_real_launch)
                print(
                    f"B={batch} {entry} {form}: host {total:.0f} us a call; {launches:.0f}"
                    f" launches, inside launch {in_launch:.0f} us (key {in_key:.0f}) of"
                    f" {timed:.0f}; without launches {bare:.0f} us",
                    flush=True,
                )
                if f"{entry}:{form}" == args.profile and batch == int(args.batches.split(",")[0]):
                    _install(_no_launch)
                    profile = cProfile.Profile()
                    profile.enable()
                    for _ in range(200):
                        one()
                    profile.disable()
                    _install(_real_launch)
                    pstats.Stats(profile).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
