#!/usr/bin/env bash
# The main job: set everything up, then generate with the reference target through vLLM.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${CLOVER_VENV:-.venv}/bin/vllm-clover" demo "$@"
