"""Several `vllm-clover bench` runs (one per workload) read as one mixed workload.

Each bench folder times every method on one prompt set. The mixed total of a method is, per
round, its output tokens summed over the workloads divided by its seconds summed over them
(as if the sets had been served one after another); the figure is the median over rounds,
with the spread. A method named by --hybrid is compared with the best of the --against
methods on every workload and on the mixed total: the ratios issue #63 asks about.

    python benchmarks/mixed_total.py bench-mtbench bench-quotes bench-black \
        --hybrid lookup --against clover ngram --json mixed.json

Example: workload A, round 0: lookup 1,000 tokens in 20 s, ngram in 25 s; workload B: 1,000
tokens in 40 s and in 38 s. Mixed: lookup 2,000 / 60 s = 33.3 tokens/s, ngram 2,000 / 63 s =
31.7 tokens/s: 1.05x, though ngram was faster on B.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

Key = tuple[str, str, int, float]  # method, engine mode, batch size, temperature


def load_runs(folder: str | Path) -> list[dict[str, Any]]:
    """The timed runs of one bench folder (its results.json)."""
    return json.loads((Path(folder) / "results.json").read_text())["runs"]


def per_round(runs: list[dict[str, Any]]) -> dict[Key, dict[int, tuple[int, float]]]:
    """(output tokens, seconds) by configuration and round."""
    table: dict[Key, dict[int, tuple[int, float]]] = defaultdict(dict)
    for run in runs:
        key = (run["method"], run["engine_mode"], run["batch_size"], run["temperature"])
        table[key][run["repeat"]] = (run["output_tokens"], run["seconds"])
    return table


def median_spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def mixed(workloads: dict[str, list[dict[str, Any]]]) -> dict[Key, dict[str, Any]]:
    """Per configuration: tokens/s per workload and on the mixed total (medians over the
    rounds every workload ran), with spreads."""
    tables = {name: per_round(runs) for name, runs in workloads.items()}
    keys = set.intersection(*(set(t) for t in tables.values()))
    result = {}
    for key in sorted(keys):
        rounds = sorted(set.intersection(*(set(t[key]) for t in tables.values())))
        if not rounds:
            continue
        each = {
            name: median_spread([t[key][r][0] / t[key][r][1] for r in rounds])
            for name, t in tables.items()
        }
        total = [
            sum(t[key][r][0] for t in tables.values()) / sum(t[key][r][1] for t in tables.values())
            for r in rounds
        ]
        result[key] = {"workloads": each, "mixed": median_spread(total), "rounds": len(rounds)}
    return result


def compare(figures: dict[Key, dict[str, Any]], hybrid: str, against: list[str]) -> list[dict]:
    """The hybrid's median tokens/s over the best of `against`, per workload and mixed, for
    every engine mode, batch size and temperature it ran at."""
    rows = []
    for (method, mode, batch, temperature), entry in figures.items():
        if method != hybrid:
            continue
        others = [figures.get((name, mode, batch, temperature)) for name in against]
        if any(o is None for o in others):
            continue
        row = {"engine_mode": mode, "batch_size": batch, "temperature": temperature}
        for name in [*entry["workloads"], "mixed"]:
            mine = _median(entry, name)
            best = max(_median(o, name) for o in others)
            row[name] = round(mine / best, 3)
        rows.append(row)
    return rows


def _median(entry: dict[str, Any], name: str) -> float:
    return entry["mixed"]["median"] if name == "mixed" else entry["workloads"][name]["median"]


def print_tables(figures: dict[Key, dict[str, Any]], ratios: list[dict], hybrid: str) -> None:
    names = list(next(iter(figures.values()))["workloads"])
    print("| method | engine | batch | T | " + " | ".join(names) + " | mixed |")
    print("|---|---|---:|---:|" + "---:|" * (len(names) + 1))
    for (method, mode, batch, temperature), entry in figures.items():
        cells = [_cell(entry["workloads"][n]) for n in names] + [_cell(entry["mixed"])]
        print(f"| {method} | {mode} | {batch} | {temperature:g} | " + " | ".join(cells) + " |")
    if ratios:
        print(f"\n{hybrid} over the better of the others (median tokens/s):\n")
        print("| engine | batch | T | " + " | ".join(names) + " | mixed |")
        print("|---|---:|---:|" + "---:|" * (len(names) + 1))
        for row in ratios:
            cells = [f"{row[n]:.2f}x" for n in [*names, "mixed"]]
            head = f"| {row['engine_mode']} | {row['batch_size']} | {row['temperature']:g} | "
            print(head + " | ".join(cells) + " |")


def _cell(figure: dict[str, float]) -> str:
    return f"{figure['median']:.1f} ({figure['min']:.1f}-{figure['max']:.1f})"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folders", nargs="+", help="bench result folders, one per workload")
    parser.add_argument("--hybrid", default="lookup", help="the method compared")
    parser.add_argument("--against", nargs="+", default=["clover", "ngram"])
    parser.add_argument("--json", help="write the figures and ratios here")
    args = parser.parse_args(argv)
    workloads = {Path(f).name: load_runs(f) for f in args.folders}
    figures = mixed(workloads)
    ratios = compare(figures, args.hybrid, args.against)
    print_tables(figures, ratios, args.hybrid)
    if args.json:
        out = {"figures": [{"key": list(k), **v} for k, v in figures.items()], "ratios": ratios}
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
