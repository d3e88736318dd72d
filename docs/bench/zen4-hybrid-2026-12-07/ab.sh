# bash ab.sh OLD NEW WORKLOADS: alternating fresh engines (ngram, the hybrid on OLD, the hybrid
# on NEW), 3 rounds, each on 16 prompts of WORKLOADS/quotes.jsonl and black.jsonl
# (benchmarks/copy_workloads.py); OLD and NEW are copies of two commits' trees.
set -u
here=$(cd "$(dirname "$0")" && pwd)
for round in 1 2 3; do
 for w in quotes black; do
  for m in ngram:$1 lookup:$1 lookup:$2; do
    meth=${m%%:*}; tree=${m#*:}
    TAG=$w-$(basename "$tree")-r$round PYTHONPATH=$tree python "$here/hyrun.py" $meth "$3/$w.jsonl" 16 \
      2>/dev/null | grep RESULT
  done
 done
done
