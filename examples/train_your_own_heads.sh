#!/usr/bin/env bash
# Clover heads for your own model, end to end, with one command, at a size a CPU does in minutes.
#
#   bash examples/train_your_own_heads.sh
#   TARGET=/path/to/your-model WORK=my-heads bash examples/train_your_own_heads.sh
#
# `vllm-clover make-heads` checks the target first (what it cannot do is refused in seconds,
# naming the flag that fixes it), lets the target answer SAMPLES ShareGPT prompts itself
# (self-distillation; a base model without a chat template continues them as plain text),
# trains Clover heads on the answers, scores them on held-out answers, and checks them through
# vLLM on prompts they never saw: greedy equality with vanilla, tau, acceptance per position,
# tokens/s. It prints one results table (also written into WORK/heads/README.md) and, run
# again, reuses what it has done. The separate steps are `generate-data`, `train` and
# `eval-heads` (docs/training.md).
#
# This is a smoke-scale recipe: its heads accept some drafts, not many. Heads that speed
# decoding up need thousands of answers and more steps (docs/training.md; a GPU helps:
# examples/gpu/README.md). Needs the project's environment (`source .venv/bin/activate`).
set -euo pipefail
cd "$(dirname "$0")/.."

# Your model: a folder, or a Hugging Face id already in the local cache (nothing is downloaded).
TARGET=${TARGET:-smollm2-135m-instruct}
WORK=${WORK:-${TMPDIR:-/tmp}/clover-recipe}  # gets data.jsonl, heads/, eval.json, check.json
SAMPLES=${SAMPLES:-64}

vllm-clover make-heads --target "${TARGET}" --out "${WORK}" --samples "${SAMPLES}" \
    --num-heads 4 --draft-vocab-size 4096 --epochs 8 --check-prompts 4
