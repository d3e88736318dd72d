"""Same-round ratios of fresh engines to vanilla: python fresh_summary.py FILE.jsonl
Rows in the order run.sh / run2.sh wrote them: each engine's timed runs (its "run" 0, 1, ...),
each round one engine per tag."""

import json
import sys
from statistics import median


def rounds(rows: list[dict]) -> list[dict[str, list[dict]]]:
    """[{tag: [the engine's runs]}] per round: a round ends where a tag comes back."""
    out: list[dict[str, list[dict]]] = [{}]
    for row in rows:
        tag, run = row["tag"], row.get("run", 0)
        if run == 0 and tag in out[-1]:
            out.append({})
        out[-1].setdefault(tag, []).append(row)
    return out


def main() -> None:
    table = rounds([json.loads(line) for line in open(sys.argv[1])])
    tags = sorted({tag for r in table for tag in r} - {"vanilla"})
    for run in range(max(len(runs) for r in table for runs in r.values())):
        for tag in tags:
            ratio = [r[tag][run]["tps"] / r["vanilla"][run]["tps"] for r in table if tag in r]
            drafts = [r[tag][run]["drafts"] for r in table if tag in r]
            each = " ".join(f"{x:.2f}" for x in ratio)
            print(
                f"run {run} {tag}: {median(ratio):.3f}x vanilla"
                f" ({min(ratio):.2f}-{max(ratio):.2f}), rounds {each}; draft tokens {drafts}"
            )
    vanilla = [r["vanilla"][0]["tps"] for r in table]
    print(f"vanilla tok/s (run 0): {' '.join(f'{x:.1f}' for x in vanilla)}")


if __name__ == "__main__":
    main()
