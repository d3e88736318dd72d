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
exec "$VENV/bin/python" -m pytest --durations=15 "$@"
