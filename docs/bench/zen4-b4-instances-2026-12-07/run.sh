#!/bin/bash
# Alternating rounds of vanilla, the old default and the new default (issue 62's hurdle).
# usage: run.sh OLD NEW OUT.jsonl MODE BATCH CHATS ROUNDS
old=$1 new=$2 out=$3 mode=$4 b=$5 chats=$6 rounds=$7
here=$(cd "$(dirname "$0")" && pwd)
orders=("vanilla old new" "new vanilla old" "old new vanilla")
for r in $(seq 1 "$rounds"); do
  for t in ${orders[$(( (r - 1) % 3 ))]}; do
    tree=$new; [ "$t" = old ] && tree=$old
    PYTHONPATH=$tree python "$here/ab.py" "$t" "$mode" "$b" "$chats" "${RUNS:-1}" 2>>"$out.log" \
      | grep '^{"src"' >> "$out"
  done
done
