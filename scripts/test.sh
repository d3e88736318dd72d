#!/usr/bin/env bash
# Set everything up, then run the whole test suite (extra arguments go to pytest,
# e.g. `bash scripts/test.sh -m unit` for the fast layer only).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
exec "${CLOVER_VENV:-.venv}/bin/python" -m pytest --durations=15 "$@"
