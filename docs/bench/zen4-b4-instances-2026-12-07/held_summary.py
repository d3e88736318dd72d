"""Same-round ratios of held engines: python held_summary.py DIR [BASE]"""

import json
import sys
from pathlib import Path
from statistics import median

folder, base = Path(sys.argv[1]), (sys.argv[2] if len(sys.argv) > 2 else "vanilla")
rows = [json.loads(line) for f in sorted(folder.glob("*.jsonl")) for line in open(f)]
by = {(r["tag"], r["run"]): r for r in rows}
tags = sorted({r["tag"] for r in rows})
runs = sorted({r["run"] for r in rows})
for tag in tags:
    tps = [by[(tag, n)]["tps"] for n in runs if (tag, n) in by]
    line = f"{tag:10s} tok/s {median(tps):6.1f} ({min(tps):.1f}-{max(tps):.1f})"
    if tag != base:
        ratio = [
            by[(tag, n)]["tps"] / by[(base, n)]["tps"]
            for n in runs
            if (tag, n) in by and (base, n) in by
        ]
        drafts = [by[(tag, n)]["drafts"] for n in runs if (tag, n) in by]
        wins = sum(x >= 1 for x in ratio)
        line += f"  vs {base} {median(ratio):.3f}x ({min(ratio):.2f}-{max(ratio):.2f})"
        line += f", >=1 in {wins}/{len(ratio)}"
        line += f"  draft tokens {median(drafts):.0f} ({min(drafts)}-{max(drafts)})"
    print(line)
