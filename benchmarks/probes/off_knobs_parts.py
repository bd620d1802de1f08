"""Where the time of off-valued knobs goes after stage 1: ``bench_off_knobs.py`` with
variants that leave parts of a truncating call's tail out, for timing only (issue 35 item
2). A variant value ``@NAME`` stands for one of the stand-ins below:

* ``@no_fallback`` for ``truncation_kernel.launch_fallback``: the fallback's two launches
  left out (their cost; rows whose knobs are off are never flagged, so their tokens stay);
* ``@plain_stage2`` for ``dispatch._finish_truncation``: stage 1 as it is, then the plain
  stage 2 over its plain candidates (the floor of any tail after that stage 1; off rows'
  tokens stay, truncated rows' do not).

    python benchmarks/probes/off_knobs_parts.py --zero-d --knobs plain,off --variants \\
        nofb:truncation_kernel.launch_fallback=@no_fallback,floor:_finish_truncation=@plain_stage2
"""

from __future__ import annotations

import contextlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
import bench_off_knobs  # noqa: E402


def no_fallback(*args, **kwargs) -> None:
    pass


def plain_stage2(hidden, weight, bias, params, stage1, block_v, temperature_mode, out,
                 *args, **kwargs):  # fmt: skip
    from flashsampling_inductor import sampling_kernel

    sampling_kernel.launch_stage2(stage1["plain_score"], stage1["plain_index"], out)


STAND_INS = {"@no_fallback": no_fallback, "@plain_stage2": plain_stage2}
_dispatch_set = bench_off_knobs.dispatch_set


@contextlib.contextmanager
def dispatch_set(settings: dict):
    with _dispatch_set({attr: STAND_INS.get(value, value) for attr, value in settings.items()}):
        yield


bench_off_knobs.dispatch_set = dispatch_set

if __name__ == "__main__":
    bench_off_knobs.main()
