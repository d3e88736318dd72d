"""Medians over the benchmark's rounds: one summary row per (method, engine mode, batch size,
temperature), the figures the tables show.

Each run's ratio is to its own round's vanilla; the summary keeps the median and [min, max]
of the per-round figures, pools acceptance and sums counts (example:
docs/design/engine-layer.md, "Medians").
"""

from __future__ import annotations

import statistics
from typing import Any

MEDIANS = ("tokens_per_second", "ratio_to_vanilla", "seconds_per_step")
OPTIONAL_MEDIANS = ("tau", "drafting_overhead", "drafting_share", "step_time_ratio")
SUMS = (
    "num_prompts",
    "output_tokens",
    "drafts",
    "draft_tokens",
    "accepted",
    "steps",
    "lookup_verified",  # the lookup's counts: 0 without "lookup"
    "lookup_accepted",
    "lookup_only_steps",
)
PARTING_SUMS = ("tie_prompts", "unknown_partings", "beyond_rounding")  # after the tie check


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Summary rows, in the order their configurations first appear in ``rows``."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        key = (row["method"], row["engine_mode"], row["batch_size"], row["temperature"])
        groups.setdefault(key, []).append(row)
    return [_summary_row(runs) for runs in groups.values()]


def _summary_row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    first = runs[0]
    row = {
        name: first[name] for name in ("method", "kind", "engine_mode", "batch_size", "temperature")
    }
    row["speculative_config"] = first["speculative_config"]
    row["rounds"] = len(runs)
    for name in MEDIANS + OPTIONAL_MEDIANS:
        values = [r[name] for r in runs if r.get(name) is not None]
        row[name] = statistics.median(values) if values else None
        row[f"{name}_range"] = [min(values), max(values)] if values else None
    for name in SUMS:
        row[name] = sum(r[name] for r in runs)
    per_pos = [sum(col) for col in zip(*(_padded(r, runs) for r in runs), strict=True)]
    row["accepted_per_pos"] = per_pos
    row["acceptance_rates"] = [n / row["drafts"] for n in per_pos] if row["drafts"] else []
    if all("equal_prompts" in r for r in runs):
        row["equal_prompts"] = sum(r["equal_prompts"] for r in runs)
        row["equal_to_vanilla"] = row["equal_prompts"] / row["num_prompts"]
    for name in PARTING_SUMS:
        if all(name in r for r in runs):
            row[name] = sum(r[name] for r in runs)
    return row


def _padded(row: dict[str, Any], runs: list[dict[str, Any]]) -> list[int]:
    size = max(len(r["accepted_per_pos"]) for r in runs)
    return list(row["accepted_per_pos"]) + [0] * (size - len(row["accepted_per_pos"]))
