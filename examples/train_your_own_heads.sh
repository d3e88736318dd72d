#!/usr/bin/env bash
# Clover heads for your own model, end to end, at a size a CPU does in minutes.
#
#   bash examples/train_your_own_heads.sh
#   TARGET=/path/to/your-model WORK=my-heads bash examples/train_your_own_heads.sh
#
# 1. generate-data  the target answers SAMPLES ShareGPT prompts itself (self-distillation:
#                   heads should learn what the target writes, not what ChatGPT wrote)
# 2. train          distil Clover heads from the frozen target (bf16 autocast)
# 3. eval-heads     held-out top-1/top-5 per head and expected acceptance (offline)
# 4. generate       with the new heads through vLLM, printing vLLM's own acceptance counters
#
# This is a smoke-scale recipe: its heads accept few drafts. Heads that speed decoding up
# need thousands of conversations and more steps (docs/training.md; a GPU helps:
# examples/gpu/README.md). Needs the project's environment (`source .venv/bin/activate`).
set -euo pipefail
cd "$(dirname "$0")/.."

# Your model: a folder, or a Hugging Face id already in the local cache (nothing is downloaded).
TARGET=${TARGET:-smollm2-135m-instruct}
WORK=${WORK:-${TMPDIR:-/tmp}/clover-recipe}  # gets data.jsonl, heads/, eval.json
SAMPLES=${SAMPLES:-32}        # ShareGPT conversations to regenerate
EPOCHS=${EPOCHS:-20}          # ~220 optimizer steps of 2 sequences at 32 samples
# Split and sequence length: eval-heads must use the same ones as train to get the same
# held-out sequences.
SPLIT=(--eval-fraction 0.1 --seed 0 --max-seq-len 384)
mkdir -p "${WORK}"
# vLLM engines in this process: on a small CPU a separate engine-core process busy-polls a core.
export VLLM_ENABLE_V1_MULTIPROCESSING=0
# PyTorch threads for train/eval: 1 is fastest on a small, shared CPU (docs/training.md);
# raise it on a bigger machine.
TORCH_THREADS=${TORCH_THREADS:-1}

echo "== 1. self-distilled data: ${SAMPLES} conversations, first turn, up to 128 new tokens"
vllm-clover generate-data --target "${TARGET}" --out "${WORK}/data.jsonl" \
    --max-samples "${SAMPLES}" --max-turns 1 --max-new-tokens 128

echo "== 2. train 4 Clover heads"
OMP_NUM_THREADS=${TORCH_THREADS} vllm-clover train --target "${TARGET}" \
    --data "${WORK}/data.jsonl" --out "${WORK}/heads" --overwrite "${SPLIT[@]}" \
    --num-heads 4 --draft-vocab-size 4096 --dtype bfloat16 \
    --batch-size 2 --epochs "${EPOCHS}" --lr 3e-3 --eval-every 0 --save-every 0 --no-progress
# On a GPU the default --device picks it; for more data raise SAMPLES, and scale out with
# `torchrun --nproc_per_node N -m vllm_clover.cli train ...` (examples/gpu/README.md).

echo "== 3. offline head quality on the held-out answers"
OMP_NUM_THREADS=${TORCH_THREADS} vllm-clover eval-heads --target "${TARGET}" \
    --heads "${WORK}/heads" --data "${WORK}/data.jsonl" "${SPLIT[@]}" \
    --json "${WORK}/eval.json" --no-progress

echo "== 4. generate with the new heads through vLLM"
python examples/offline_generation.py --target "${TARGET}" --heads "${WORK}/heads"
