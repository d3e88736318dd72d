"""PNG plots of benchmark rows (matplotlib, Agg backend, imported only when plotting).

One colour per method, one line style per temperature (solid T=0, dashed T=1, ...).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

Series = tuple[str, float]  # (method, temperature)
LINE_STYLES = ("-", "--", ":", "-.")


def ratio_series(rows: list[dict[str, Any]]) -> dict[Series, list[tuple[int, float]]]:
    """(method, T) -> [(batch size, ratio to vanilla)] sorted by batch size (vanilla is 1)."""
    series: dict[Series, list[tuple[int, float]]] = defaultdict(list)
    for row in rows:
        if row["kind"] == "vanilla":
            continue
        series[row["method"], row["temperature"]].append(
            (row["batch_size"], row["ratio_to_vanilla"])
        )
    return {key: sorted(points) for key, points in series.items()}


def acceptance_series(rows: list[dict[str, Any]]) -> dict[Series, list[float]]:
    """(method, T) -> acceptance rate per draft position, pooled over batch sizes."""
    drafts: dict[Series, int] = defaultdict(int)
    accepted: dict[Series, list[int]] = {}
    for row in rows:
        if not row["drafts"]:
            continue
        key = (row["method"], row["temperature"])
        drafts[key] += row["drafts"]
        total = accepted.setdefault(key, [0] * len(row["accepted_per_pos"]))
        for i, count in enumerate(row["accepted_per_pos"]):
            total[i] += count
    return {key: [n / drafts[key] for n in counts] for key, counts in accepted.items()}


def _styles(rows: list[dict[str, Any]]) -> dict[Series, dict[str, Any]]:
    """Line colour by method and style by temperature, stable across both plots."""
    methods = list(dict.fromkeys(row["method"] for row in rows))
    temperatures = sorted({row["temperature"] for row in rows})
    return {
        (m, t): {
            "color": f"C{methods.index(m) % 10}",
            "label": f"{m}, T={t:g}",
            "linestyle": LINE_STYLES[temperatures.index(t) % len(LINE_STYLES)],
        }
        for m in methods
        for t in temperatures
    }


def write_plots(rows: list[dict[str, Any]], out: Path) -> list[Path]:
    """throughput_ratio.png and acceptance_per_position.png in `out`; their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    styles = _styles(rows)
    paths = [out / "throughput_ratio.png", out / "acceptance_per_position.png"]
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for key, points in ratio_series(rows).items():
        batches, ratios = zip(*points, strict=True)
        axes.plot(batches, ratios, marker="o", **styles[key])
    axes.axhline(1.0, color="grey", linewidth=0.8, label="vanilla")
    axes.set_xscale("log", base=2)
    batches = sorted({row["batch_size"] for row in rows})
    axes.set_xticks(batches, [str(b) for b in batches])
    axes.set(
        xlabel="batch size (max_num_seqs)",
        ylabel="output tokens/s vs vanilla",
        title="Throughput relative to vanilla decoding",
    )
    _finish(plt, figure, axes, paths[0])
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for key, rates in acceptance_series(rows).items():
        axes.plot(range(1, len(rates) + 1), rates, marker="o", **styles[key])
    axes.xaxis.get_major_locator().set_params(integer=True)
    axes.set(
        xlabel="draft position",
        ylabel="acceptance rate",
        ylim=(0, 1),
        title="Acceptance rate per draft position (pooled over batch sizes)",
    )
    _finish(plt, figure, axes, paths[1])
    return paths


def _finish(plt: Any, figure: Any, axes: Any, path: Path) -> None:
    """Legend (if any line), save, close."""
    if axes.get_legend_handles_labels()[0]:
        axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
