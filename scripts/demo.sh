#!/usr/bin/env bash
# The main job: set up what it needs, then generate with the reference target through vLLM.
set -euo pipefail
cd "$(dirname "$0")/.."
CLOVER_ASSETS="smollm2-135m-instruct mt-bench" bash scripts/setup.sh
exec "${CLOVER_VENV:-.venv}/bin/vllm-clover" demo "$@"
