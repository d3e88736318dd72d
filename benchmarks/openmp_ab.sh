#!/bin/bash
# Intel OpenMP or not: vLLM warns that speculative decoding on CPU is much slower without
# libiomp5 in LD_PRELOAD. Three alternating rounds of `vllm-clover bench` (Clover and vanilla,
# batch 1 and 4, T=0, 64 tokens, in-process) with vLLM's default (it preloads PyTorch's
# libgomp) and with .venv/lib/libiomp5.so preloaded; results in $OUT (default omp-ab/).
#
#     bash benchmarks/openmp_ab.sh     # results and figures: docs/benchmarks.md, docs/bench/openmp/
set -u
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-omp-ab}
mkdir -p "$out"
for round in 1 2 3; do
  for variant in gomp iomp; do
    preload=""
    [ "$variant" = iomp ] && preload="$repo/.venv/lib/libiomp5.so"
    rm -rf "$out/$variant-$round"
    LD_PRELOAD=$preload "$repo/.venv/bin/vllm-clover" bench --methods clover --batch-sizes 1 4 \
      --temperatures 0 --max-tokens 64 --min-prompts 8 --repeats 1 --engines in-process \
      --no-plots --out "$out/$variant-$round" > "$out/$variant-$round.log" 2>&1
    echo "$variant round $round: exit $?"
  done
done
