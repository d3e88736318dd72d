"""The scaling law of our heads: offline tau against training tokens, fitted log-linearly.

Reads the eval-heads metrics of the same configuration trained at several token budgets
(``docs/bench/heads/scaling.json``: ``runs[config][tokens]`` = eval-heads' JSON entry), fits

    E[accepted](N) = a + b ln N          (tau = 1 + E[accepted]; Scylla's log-linear law)

by least squares per configuration, and prints the fit, its largest residual, the predicted
tau at 29M tokens (the whole bundled ShareGPT set) and 300M tokens, and the budget at which
the fit reaches a target tau. With ``--plot`` it draws the points and the lines.

Worked example: points (1e5, 0.2) and (1e6, 0.4) give b = 0.2 / ln 10 = 0.0869 and
a = 0.2 - b ln 1e5 = -0.800; at 1e7 tokens the fit says 0.6 (tau 1.6), and tau 2.2 needs
E = 1.2, i.e. N = exp((1.2 - a) / b) = 1e10 tokens.

    python benchmarks/scaling_law.py --json docs/bench/heads/scaling.json \
        --plot docs/bench/heads/scaling.png
"""

from __future__ import annotations

import argparse
import json
import math


def fit(points: dict[int, float]) -> tuple[float, float, float]:
    """(a, b, largest |residual|) of the least-squares line E = a + b ln N through points."""
    xs = [math.log(n) for n in points]
    ys = list(points.values())
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
    a = my - b * mx
    worst = max(abs(a + b * x - y) for x, y in zip(xs, ys, strict=True))
    return a, b, worst


def summarise(runs: dict, predict_at: list[int], target_tau: float) -> dict:
    """Per configuration: the points, the fit and what it predicts (module docstring)."""
    out = {}
    for name, by_tokens in runs.items():
        points = {int(n): m["expected_accepted"] for n, m in by_tokens.items()}
        a, b, worst = fit(points)
        out[name] = {
            "points": {n: 1 + e for n, e in sorted(points.items())},
            "a": a,
            "b": b,
            "tau_per_10x_tokens": b * math.log(10),
            "largest_residual": worst,
            "predicted_tau": {n: 1 + a + b * math.log(n) for n in predict_at},
            f"tokens_for_tau_{target_tau}": math.exp((target_tau - 1 - a) / b),
        }
    return out


def plot(summary: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, s in summary.items():
        ns = sorted(s["points"])
        line = ax.plot(ns, [s["points"][n] for n in ns], "o", label=name)[0]
        grid = [ns[0] * (3e8 / ns[0]) ** (i / 40) for i in range(41)]
        ax.plot(
            grid, [1 + s["a"] + s["b"] * math.log(n) for n in grid], "--", color=line.get_color()
        )
    ax.set_xscale("log")
    ax.set_xlabel("training tokens")
    ax.set_ylabel("offline tau (held-out MT-Bench, K=4 chain)")
    ax.axvline(2.9e7, color="grey", lw=0.5)
    ax.axvline(3e8, color="grey", lw=0.5)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True, help="scaling.json (see the docstring)")
    parser.add_argument("--predict-at", type=int, nargs="+", default=[29_000_000, 300_000_000])
    parser.add_argument("--target-tau", type=float, default=2.2)
    parser.add_argument("--plot", help="write the figure here")
    args = parser.parse_args()
    with open(args.json) as f:
        runs = json.load(f)["runs"]
    summary = summarise(runs, args.predict_at, args.target_tau)
    for name, s in summary.items():
        predicted = ", ".join(f"{n:.0e}: {t:.2f}" for n, t in s["predicted_tau"].items())
        print(
            f"{name}: tau = {1 + s['a']:.3f} + {s['b']:.4f} ln N "
            f"(+{s['tau_per_10x_tokens']:.3f} per 10x tokens, worst residual "
            f"{s['largest_residual']:.3f}); predicted {predicted}; tau {args.target_tau} "
            f"at {s[f'tokens_for_tau_{args.target_tau}']:.2e} tokens"
        )
    print(json.dumps(summary, indent=1))
    if args.plot:
        plot(summary, args.plot)


if __name__ == "__main__":
    main()
