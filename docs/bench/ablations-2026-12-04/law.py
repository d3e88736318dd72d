"""The per-recipe law's input from the arms: table.json -> law-SET.json, one per held-out set,
in `benchmarks/scaling_law.py`'s format (runs[recipe][training tokens] = eval-heads entry).

An arm belongs to a recipe by its name (RECIPES); the seeds of one budget (same conversations,
`-seed1`) are averaged into one point, at the larger of their token counts.

    python law.py && python ../../../benchmarks/scaling_law.py --json law-chat.json
"""

import json
import re
import statistics

RECIPES = {
    "today (h10, soft labels)": r"s(\d+)-h10(-seed1)?$",
    "top-1 labels (h10)": r"s(\d+)-h10-top1(-seed1)?$",
    "top-1 labels, no hidden loss": r"s(\d+)-h0-top1(-seed1)?$",
    "EAGLE-3": r"e3-s(\d+)(-seed1)?$",
    "Medusa-1": r"s(\d+)-medusa$",
}
SETS = ("chat", "quotes", "black", "mt")


def points(rows: list[dict], pattern: str, held_out: str) -> dict[int, dict]:
    by_budget: dict[int, list[dict]] = {}
    for row in rows:
        match = re.match(pattern, row["arm"])
        if match and held_out in row:
            by_budget.setdefault(int(match[1]), []).append(row)
    return {
        max(r["tokens"] for r in arms): {
            "expected_accepted": statistics.mean(r[held_out + "_e"] for r in arms),
            "top1": [statistics.mean(r[held_out + "_top1"][i] for r in arms) for i in range(4)],
            "seeds": len(arms),
        }
        for arms in by_budget.values()
    }


def main() -> None:
    with open("table.json") as f:
        rows = json.load(f)
    for held_out in SETS:
        runs = {name: points(rows, p, held_out) for name, p in RECIPES.items()}
        runs = {name: by_tokens for name, by_tokens in runs.items() if len(by_tokens) >= 2}
        with open(f"law-{held_out}.json", "w") as f:
            json.dump({"runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
