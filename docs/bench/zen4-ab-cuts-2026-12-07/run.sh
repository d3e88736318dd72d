#!/bin/bash
# The A/B of docs/bench/zen4-ab-cuts-2026-12-07: 3 rounds, both engines, batch 4/16/64, the
# two code trees alternating (old first in odd rounds). OLD and NEW: copies of the two trees
# (`git archive REV vllm_clover`, with the repository's checkpoints/ beside vllm_clover/).
# usage: run.sh OLD NEW OUT.jsonl
old=$1 new=$2 out=$3
here=$(cd "$(dirname "$0")" && pwd)
for r in 1 2 3; do
  if [ $((r % 2)) = 1 ]; then order="old new"; else order="new old"; fi
  for mode in multiprocess in-process; do
    for b in 4 16 64; do
      for t in $order; do
        tree=$old; [ "$t" = new ] && tree=$new
        PYTHONPATH=$tree python "$here/ab.py" "$t" "$mode" "$b" 2>>"$out.log" \
          | grep '^{"src"' >> "$out"
      done
    done
  done
done
