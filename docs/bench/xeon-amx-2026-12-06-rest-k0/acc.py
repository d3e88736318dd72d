"""Per run of a trace (trace.py): drafts accepted / drafted over every step, the steps by K,
tokens/s, and the same ratio over the run's first 60 steps: `python acc.py TRACE.json ...`."""

import collections
import json
import sys

for path in sys.argv[1:]:
    with open(path) as f:
        log = json.load(f)
    accepted = drafted = 0
    steps = collections.Counter()
    first = None
    for entry in log:
        if "run" in entry:
            ratio = round(accepted / max(drafted, 1), 3)
            print(
                path,
                entry["run"],
                accepted,
                drafted,
                ratio,
                dict(steps),
                round(entry["tps"], 1),
                first,
            )
            accepted = drafted = 0
            steps.clear()
            first = None
        elif "obs" in entry:
            accepted += entry["acc"]
            drafted += entry["dr"]
            steps[entry["k"]] += 1
            if first is None and sum(steps.values()) >= 60:
                first = round(accepted / max(drafted, 1), 3)
