#!/usr/bin/env bash
# Set-up and the two jobs of this repository, on a fresh machine (CPU-only is fine):
#   ./dev.sh demo          compile a decode step with backend="flashsampling" and sample
#   ./dev.sh test [ARGS]   the test suite (pytest ARGS; GPU tests skip without CUDA)
# Both create .venv on first use. torch is installed BEFORE the project, so pip never
# resolves a bare `torch` requirement to the newest CUDA build (several GB): a torch the
# system Python already has is reused, else $TORCH_SPEC (default torch==2.13.0) is installed.
set -euo pipefail
cd "$(dirname "$0")"
venv=${VENV:-.venv}

setup() {
  if [ ! -x "$venv/bin/python" ]; then
    if python3 -c "import torch" 2>/dev/null; then
      python3 -m venv --system-site-packages "$venv"
    else
      python3 -m venv "$venv"
    fi
  fi
  if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
    "$venv/bin/pip" install -q "${TORCH_SPEC:-torch==2.13.0}"
  fi
  "$venv/bin/pip" install -q -e ".[test,hf]"
}

case "${1:-}" in
  demo)
    setup
    "$venv/bin/python" demo.py
    ;;
  test)
    shift
    setup
    # One pytest-xdist worker per core, each taking whole test files (module fixtures share
    # their compiled models and steps within a file), in collection order: the longest files
    # first (tests/conftest.py). With CUDA the tests run in one process: GPU tests share the
    # device. PYTEST_WORKERS=0 runs everything in this process.
    workers=${PYTEST_WORKERS:-$("$venv/bin/python" -c \
      "import torch; print(0 if torch.cuda.is_available() else 'auto')")}
    "$venv/bin/python" -m pytest -q -n "$workers" --dist loadfile --no-loadscope-reorder "$@"
    ;;
  *)
    echo "usage: ./dev.sh demo | test [pytest args]" >&2
    exit 2
    ;;
esac
