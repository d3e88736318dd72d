"""python stepana.py DIR: per timed run, the engine-core steps inside it: wall, time in steps,
in post_step, outside both; steps by phase (prefill-carrying, decode at the full batch, decode
below it with requests waiting (below) or none (drain)) with ms/step and share of the wall."""

import glob
import json
import os
import sys
from collections import defaultdict

d = sys.argv[1]
marks = [json.loads(line) for line in open(os.path.join(d, "marks.jsonl"))]
steps = []
for f in glob.glob(os.path.join(d, "steps-*.jsonl")):
    steps += [json.loads(line) for line in open(f)]
steps.sort(key=lambda s: s["t"])
for m in marks:
    inside = [s for s in steps if m["t0"] <= s["t"] <= m["t1"]]
    wall = (m["t1"] - m["t0"]) * 1e3
    st = sum(s["step"] for s in inside)
    po = sum(s["post"] for s in inside)
    full = max(s["b"] for s in inside)
    ph = defaultdict(lambda: [0, 0.0, 0])
    for s in inside:
        key = (
            "prefill"
            if s["new"] or s["n"] > s["b"] + s["spec"]
            else ("full" if s["b"] == full else ("drain" if s.get("w", 1) == 0 else "below"))
        )
        key += "/K>0" if s["spec"] else "/K=0"
        ph[key][0] += 1
        ph[key][1] += s["step"]
        ph[key][2] += s["b"]
    print(
        f"{m['method']:8s} run {m['run']} wall {wall:7.0f} ms tok {m['tok']} "
        f"tok/s {m['tok'] / wall * 1e3:6.1f} "
        f"steps {len(inside)} in-step {st:7.0f} post {po:5.0f} outside {wall - st - po:6.0f}"
    )
    for k in sorted(ph):
        n, ms, b = ph[k]
        print(
            f"    {k:14s} {n:4d} steps {ms / n:6.1f} ms/step mean batch {b / n:5.1f}  "
            f"{ms / wall * 100:5.1f}% of wall"
        )
