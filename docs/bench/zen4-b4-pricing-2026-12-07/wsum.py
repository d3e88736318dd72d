"""python wsum.py DIR...: per runner call the worker timed (worker-sitecustomize.py), the
number of calls, the median wall ms and the median thread CPU ms (0: not recorded)."""

import glob
import json
import lzma
import statistics
import sys

for d in sys.argv[1:]:
    rows = []
    for f in glob.glob(d + "/worker-*.jsonl*"):  # as written, or xz-compressed (raw/)
        lines = lzma.open(f, "rt") if f.endswith(".xz") else open(f)
        rows += [json.loads(line) for line in lines]
    calls = {}
    for r in rows:
        calls.setdefault(r["f"], []).append(r)
    summary = {
        name: (
            len(v),
            round(statistics.median(x["ms"] for x in v), 3),
            round(statistics.median(x.get("cpu", 0) for x in v), 3),
        )
        for name, v in calls.items()
    }
    print(d, summary)
