#!/bin/bash
# Engines held alive, runs alternating among them. usage: held.sh DIR MODE BATCH CHATS ROUNDS TAG=TREE...
dir=$1 mode=$2 b=$3 chats=$4 rounds=$5; shift 5
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$dir"; rm -f "$dir"/go-* "$dir"/done-* "$dir"/ready-* "$dir"/stop
tags=()
for spec in "$@"; do
  tag=${spec%%=*} tree=${spec#*=}; tags+=("$tag")
  PYTHONPATH=$tree python "$here/held.py" "$tag" "$mode" "$b" "$chats" "$dir" 2>>"$dir/$tag.log" &
  while [ ! -e "$dir/ready-$tag" ]; do sleep 1; done   # start them one at a time
done
n=${#tags[@]}
for r in $(seq 0 $((rounds - 1))); do
  for i in $(seq 0 $((n - 1))); do
    tag=${tags[$(( (i + r) % n ))]}
    touch "$dir/go-$tag-$r"
    while [ ! -e "$dir/done-$tag-$r" ]; do sleep 0.5; done
  done
done
touch "$dir/stop"; wait
