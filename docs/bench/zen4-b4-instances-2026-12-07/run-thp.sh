#!/bin/bash
# Fresh engines, a method with and without THP_MEM_ALLOC_ENABLE=1 (PyTorch's CPU allocator
# backs large blocks with 2 MB pages), alternating. usage: run-thp.sh TREE OUT MODE BATCH CHATS ROUNDS METHOD
tree=$1 out=$2 mode=$3 b=$4 chats=$5 rounds=$6 method=$7
here=$(cd "$(dirname "$0")" && pwd)
for r in $(seq 1 "$rounds"); do
  order="4k thp"; [ $((r % 2)) = 0 ] && order="thp 4k"
  for t in $order; do
    if [ $t = thp ]; then export THP_MEM_ALLOC_ENABLE=1; else unset THP_MEM_ALLOC_ENABLE; fi
    (sleep 75; grep AnonHugePages /proc/meminfo >> "$out.huge") &
    PYTHONPATH=$tree python "$here/ab.py" "$method-$t" "$mode" "$b" "$chats" 1 2>>"$out.log" \
      | grep '^{"src"' >> "$out"
    wait
  done
done
