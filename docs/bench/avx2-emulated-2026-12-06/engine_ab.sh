#!/bin/bash
# End-to-end A/B of the AVX2 GEMM, AVX2 emulated on an AMX Xeon: two rounds of
# {old, new} x {batch 1, 4} x {vanilla, the default Clover}, one engine per line.
# usage: bash engine_ab.sh OLD_CHECKOUT NEW_CHECKOUT > engine_ab.jsonl
# (run with the venv's python first on PATH; sitecustomize.py here asks for the AMX tile
# state that vLLM's kernels use once oneDNN is capped at AVX2: docs/benchmarks.md)
here=$(cd "$(dirname "$0")" && pwd)
for r in 1 2; do
  for code in old new; do
    src=$1; [ "$code" = new ] && src=$2
    for b in 1 4; do for m in vanilla goodput; do
      CODE=$code PYTHONPATH=$src:$here ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 \
        python "$here/engine_run.py" $m $b 2>/dev/null | grep '^{'
    done; done
  done
done
