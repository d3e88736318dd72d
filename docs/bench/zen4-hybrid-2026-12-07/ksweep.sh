# ngram at K = 4 and 8 beside the hybrid (K = 4), in-process, float32, batch 1, 16 prompts x 64
# tokens, 3 alternating rounds: bash ksweep.sh TREE WORKLOADS (quotes.jsonl, black.jsonl there)
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
for round in 1 2 3; do
  for w in quotes black mt; do
    case $w in mt) P=mt ;; *) P=$2/$w.jsonl ;; esac
    for meth in ngram4 ngram8 lookup; do
      TAG=$w-r$round PYTHONPATH=$1 python "$HERE/hyrun.py" $meth $P 16 | grep RESULT
    done
  done
done
