#!/usr/bin/env bash
# Set everything up, lint and format-check the tree (ruff), then run the whole test suite
# (extra arguments go to pytest, e.g. `bash scripts/test.sh -m unit` for the fast layer only).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV=${CLOVER_VENV:-.venv}
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
# Test files run on two pytest-xdist workers where there are two cores, each worker on cores
# of its own (tests/conftest.py); `-n 0` runs them in this process.
WORKERS=$(( $(nproc) < 2 ? 0 : 2 ))
exec "$VENV/bin/python" -m pytest -n "$WORKERS" --dist loadfile --durations=15 "$@"
