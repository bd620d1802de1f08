"""benchmarks/probes/kernel_sass.py compiles stage 1 for Hopper without a GPU: the noise's SASS cost
stays where docs/performance.md says (it is what bounds large batches)."""

import os
import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "probes" / "kernel_sass.py"


def test_noise_costs_under_40_sass_instructions_per_score_on_hopper():
    """The large-batch default config, compiled by Triton's own ptxas for sm_90a: about 35
    instructions per score (48 before the wide multiply and the reciprocal division)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    child = subprocess.run(
        [sys.executable, str(SCRIPT), "--batch", "256"], capture_output=True, text=True, env=env
    )
    assert child.returncode == 0, child.stderr[-2000:]
    per_score = re.search(r"([\d.]+) per score", child.stdout)
    assert per_score, child.stdout
    assert float(per_score.group(1)) < 40, child.stdout
    assert re.search(r"sample .*STACK:\d+", child.stdout), child.stdout
