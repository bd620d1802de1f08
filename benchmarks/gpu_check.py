"""Run every ``gpu``- and ``device_math``-marked test in one call on the GPU machine, and
summarise.

Runs ``pytest -m "gpu or device_math" tests`` in a subprocess from the repository root,
streaming its output, then prints the GPU name, the torch / triton versions, passed / failed /
skipped counts per test file, the failing tests and the total time. With $OUT set, the junit
XML and the full log go there (gpu_check.xml, gpu_check.log); otherwise into a temporary
folder.

Without CUDA the ``gpu`` tests skip and the ``device_math`` ones run on the CPU (the Triton
interpreter), which checks the script, not the GPU. Exits non-zero when a test fails or
errors, when pytest is stopped by ``--timeout``, when nothing was collected, or when a GPU is
present but not one test passed (nothing was checked).

    python benchmarks/gpu_check.py                   # all gpu and device_math tests
    python benchmarks/gpu_check.py --timeout 240 -- -k statistical -x
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ElementTree
from collections import Counter, defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUTCOMES = ("passed", "failed", "error", "skipped")


def environment() -> tuple[str, bool]:
    """(a line naming the GPU and versions, whether CUDA is usable)."""
    try:
        import torch
        import triton
    except Exception as error:
        return f"cannot import torch / triton: {error}", False
    cuda = torch.cuda.is_available()
    gpu = torch.cuda.get_device_name() if cuda else "no CUDA device"
    return (
        f"GPU: {gpu} | torch {torch.__version__} (CUDA {torch.version.cuda}) | "
        f"triton {triton.__version__} | Python {sys.version.split()[0]}",
        cuda,
    )


def run_pytest(command: list[str], log_path: Path, timeout_s: float) -> tuple[int, bool]:
    """Run pytest, echoing each line to stdout and the log; (return code, timed out)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with log_path.open("w") as log:
        process = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, bufsize=1,
        )  # fmt: skip
        timed_out = threading.Event()

        def stop():
            timed_out.set()
            process.kill()

        timer = threading.Timer(timeout_s, stop)
        timer.start()
        for line in process.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            log.write(line)
        returncode = process.wait()
        timer.cancel()
    return returncode, timed_out.is_set()


def test_file(case: ElementTree.Element) -> str:
    """tests/test_x.py for a junit testcase (xunit1 gives `file`; else from classname)."""
    if case.get("file"):
        return case.get("file")
    parts = case.get("classname", "?").split(".")
    modules = [i for i, part in enumerate(parts) if part.startswith("test")]
    return "/".join(parts[: modules[0] + 1]) + ".py" if modules else ".".join(parts)


def outcome(case: ElementTree.Element) -> tuple[str, str]:
    """(outcome, first line of its message) of a junit testcase."""
    for tag in ("failure", "error", "skipped"):
        element = case.find(tag)
        if element is not None:
            message = (element.get("message") or "").strip().splitlines()
            return ("failed" if tag == "failure" else tag), (message[0] if message else "")
    return "passed", ""


def summarise(xml_path: Path) -> tuple[dict[str, Counter], list[str]]:
    """Counts per test file, and 'file::test: message' for each failure or error."""
    per_file: dict[str, Counter] = defaultdict(Counter)
    problems = []
    for case in ElementTree.parse(xml_path).getroot().iter("testcase"):
        path = test_file(case)
        result, message = outcome(case)
        per_file[path][result] += 1
        if result in ("failed", "error"):
            problems.append(f"{path}::{case.get('name')} [{result}] {message[:200]}")
    return per_file, problems


def print_summary(per_file: dict[str, Counter]) -> Counter:
    total = Counter()
    width = max([len(p) for p in per_file] + [len("total")])
    print(f"{'file':<{width}}  " + "  ".join(f"{o:>7}" for o in OUTCOMES))
    for path in sorted(per_file):
        total.update(per_file[path])
        print(f"{path:<{width}}  " + "  ".join(f"{per_file[path][o]:>7}" for o in OUTCOMES))
    print(f"{'total':<{width}}  " + "  ".join(f"{total[o]:>7}" for o in OUTCOMES))
    return total


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--timeout", type=float, default=540, help="seconds (default 540)")
    parser.add_argument("pytest_args", nargs="*", help="after --: extra pytest arguments")
    args = parser.parse_args()

    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else Path(tempfile.mkdtemp())
    out_dir.mkdir(parents=True, exist_ok=True)
    xml_path, log_path = out_dir / "gpu_check.xml", out_dir / "gpu_check.log"
    xml_path.unlink(missing_ok=True)
    env_line, cuda = environment()
    print(env_line, flush=True)
    command = [
        sys.executable, "-m", "pytest", "-m", "gpu or device_math", "tests",
        "-rfE", "--durations=10", "-p", "no:cacheprovider",
        f"--junitxml={xml_path}", "-o", "junit_family=xunit1", *args.pytest_args,
    ]  # fmt: skip
    print("$ " + " ".join(command), flush=True)
    start = time.perf_counter()
    returncode, timed_out = run_pytest(command, log_path, args.timeout)
    elapsed = time.perf_counter() - start

    print(f"\n## gpu_check summary\n{env_line}")
    print(f"pytest exit code {returncode}, {elapsed:.0f} s; log {log_path}, junit {xml_path}")
    if timed_out:
        print(f"FAILED: pytest stopped after the {args.timeout:.0f} s timeout")
        return 124
    if not xml_path.exists():
        print("FAILED: pytest wrote no junit XML (see the log)")
        return returncode or 1
    if returncode == 5:
        print("FAILED: pytest collected no gpu test")
        return returncode
    per_file, problems = summarise(xml_path)
    total = print_summary(per_file)
    for problem in problems:
        print(f"  {problem}")
    if returncode == 0 and cuda and total["passed"] == 0:
        print("FAILED: a GPU is present but no gpu test passed: nothing was checked")
        return 1
    print("PASSED" if returncode == 0 else f"FAILED (pytest exit code {returncode})")
    return returncode


if __name__ == "__main__":
    sys.exit(main())
