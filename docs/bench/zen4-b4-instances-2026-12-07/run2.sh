#!/bin/bash
# Fresh engines, vanilla and the default alternating (the default first in even rounds), RUNS
# timed runs each. usage: run2.sh TREE OUT.jsonl MODE BATCH CHATS ROUNDS RUNS
tree=$1 out=$2 mode=$3 b=$4 chats=$5 rounds=$6 runs=$7
here=$(cd "$(dirname "$0")" && pwd)
for r in $(seq 1 "$rounds"); do
  order="vanilla old"; [ $((r % 2)) = 0 ] && order="old vanilla"
  for t in $order; do
    PYTHONPATH=$tree python "$here/ab.py" "$t" "$mode" "$b" "$chats" "$runs" 2>>"$out.log" \
      | grep '^{"src"' >> "$out"
  done
done
