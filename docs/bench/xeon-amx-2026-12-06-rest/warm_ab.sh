# Warm-engine A/B at one batch size: vanilla, old tree, new tree, alternating, ROUNDS times;
# each engine runs the same 2 x BATCH MT-Bench first turns RUNS times (warm_ab.py).
# usage, from a checkout with .venv: bash warm_ab.sh BATCH ROUNDS RUNS OUT OLD_TREE NEW_TREE
B=$1; R=$2; N=$3; OUT=$4; OLD=$5; NEW=$6
HERE=$(cd "$(dirname "$0")" && pwd)
for r in $(seq "$R"); do
  PYTHONPATH=$OLD .venv/bin/python "$HERE/warm_ab.py" vanilla "$B" van "$N" 2>/dev/null | grep '^{' >> "$OUT"
  PYTHONPATH=$OLD .venv/bin/python "$HERE/warm_ab.py" clover "$B" old "$N" 2>/dev/null | grep '^{' >> "$OUT"
  PYTHONPATH=$NEW .venv/bin/python "$HERE/warm_ab.py" clover "$B" new "$N" 2>/dev/null | grep '^{' >> "$OUT"
done
