"""python categories.py obs.jsonl: the budget's decode steps at batch 4 by (tokens, K), with
the measured median and the model's prediction after the whole run (same fit as replay.py)."""

import json
import sys
from collections import defaultdict
from statistics import median

from vllm_clover.budget.goodput import GoodputConfig, GoodputController

rows = [json.loads(line) for line in open(sys.argv[1])]
head, rows = rows[0], rows[1:]
ctl = GoodputController(GoodputConfig(max_k=head["max_k"], max_tokens=head["max_tokens"]))
steps = defaultdict(list)
for r in rows:
    ctl.observe_step(r["s"] / 1e3, r["n"], r["k"], r["b"], [tuple(x) for x in r["v"]])
    if r["b"] == 4 and len(r["v"]) == 4:
        steps[(r["n"], r["k"])].append(r["s"])
print("tokens  K  steps  measured median ms  mean ms  model ms")
for (n, k), xs in sorted(steps.items()):
    if len(xs) >= 3:
        pred = ctl.cost.predict(n, k, 4) * 1e3
        mean = sum(xs) / len(xs)
        print(f"{n:6d} {k:2d} {len(xs):6d} {median(xs):19.1f} {mean:8.1f} {pred:9.1f}")
