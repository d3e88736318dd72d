"""Median (range) of new / old tokens/s per engine mode and batch size, pairing the runs of
each tree in file order (one pair a round). usage: python summary.py ab.jsonl..."""

import json
import statistics
import sys
from collections import defaultdict


def ratios_line(mode: str, batch: int, old: list[float], new: list[float]) -> str:
    ratios = [n / o for o, n in zip(old, new, strict=False)]
    by_round = " / ".join(f"{r:.2f}" for r in ratios)
    spread = f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
    old_s, new_s = (" / ".join(f"{x:.1f}" for x in xs) for xs in (old, new))
    return f"| {mode} | {batch} | {old_s} | {new_s} | {by_round} | {spread} |"


runs = defaultdict(list)  # (mode, batch, tag) -> tokens/s in file order
for path in sys.argv[1:]:
    for line in open(path):
        row = json.loads(line)
        runs[row["mode"], row["batch"], row["tag"]].append(row["tps"])
print("| engine | batch | old tokens/s | new tokens/s | new / old by round | median (range) |")
print("|---|---:|---|---|---|---:|")
cells = {(m, b) for m, b, _ in runs}
for mode, batch in sorted(cells, key=lambda k: (k[0] != "multiprocess", k[1])):
    print(ratios_line(mode, batch, runs[mode, batch, "old"], runs[mode, batch, "new"]))
