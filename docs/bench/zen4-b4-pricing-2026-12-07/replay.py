"""python replay.py obs.jsonl [BATCH]: replay the budget's observations (hook/) into a fresh
controller; every 50 steps the model's f at the first knots, g, c, e and its predicted ms of
a K = 0 and a K = 1 step at BATCH; then the measured median ms of BATCH's decode steps by
kind (R: K = 0 verifying none, A: K = 0 verifying, C: K > 0 verifying none, D: K > 0
verifying) and the K it ran."""

import json
import sys
from statistics import median

import numpy as np

from vllm_clover.budget.goodput import GoodputConfig, GoodputController

rows = [json.loads(line) for line in open(sys.argv[1])]
batch = int(sys.argv[2]) if len(sys.argv) > 2 else 4
head, rows = rows[0], rows[1:]
ctl = GoodputController(GoodputConfig(max_k=head["max_k"], max_tokens=head["max_tokens"]))
kinds = {}
for i, r in enumerate(rows):
    ctl.observe_step(r["s"] / 1e3, r["n"], r["k"], r["b"], [tuple(x) for x in r["v"]])
    decode = len(r["v"]) == r["b"] and r["n"] == r["b"] + sum(x[0] for x in r["v"])
    if r["b"] == batch and decode:
        verifies = any(x[0] for x in r["v"])
        kind = ("D" if verifies else "C") if r["k"] else ("A" if verifies else "R")
        kinds.setdefault(kind, []).append(r["s"])
    if i % 50 == 49:
        values = ctl.cost.knot_values() * 1e3
        _, drafted = ctl.acceptance.optimistic_rates(1.0)
        k0 = ctl.cost.predict(batch, 0, batch) * 1e3
        k1 = ctl.cost.predict(batch * (1 + drafted[0]), 1, batch) * 1e3
        goodput = ctl.predicted_goodput(batch)
        print(
            f"{i + 1:4d} f {np.round(values[:6], 1).tolist()} gce "
            f"{np.round(values[-3:], 2).tolist()} | b{batch} K0 {k0:.1f} K1 {k1:.1f} ms, "
            f"K1/K0 goodput {goodput[1] / goodput[0]:.3f}"
        )
for kind, times in sorted(kinds.items()):
    print(kind, len(times), "median", round(median(times), 1), "ms")
ks = {}
for r in rows:
    if r["b"] == batch:
        ks[r["k"]] = ks.get(r["k"], 0) + 1
print("K at batch", batch, ks)
