"""The scaling law of our heads: offline tau against training tokens, fitted log-linearly.

Reads the eval-heads metrics of the same configuration trained at several token budgets
(``docs/bench/heads/scaling.json``: ``runs[config][tokens]`` = eval-heads' JSON entry), fits

    E[accepted](N) = a + b ln N          (tau = 1 + E[accepted]; Scylla's log-linear law)

by least squares per configuration, and prints the fit, its largest residual, the predicted
tau at 29M tokens (the whole bundled ShareGPT set) and 300M tokens, and the budget at which
the fit reaches a target tau. With ``--plot`` it draws the points and the lines.

The law counts a chain started at every position (eval-heads' ``tau``); vLLM counts the steps
decoding takes, which skip the positions inside accepted runs and accept less. With
``--online offline_online.json`` (``benchmarks/offline_online.py``: both counts of the same
heads on the same answers) the budgets are also given for vLLM's tau and first-position
acceptance, scaling E[accepted] and h0's top-1 by the measured ratios vLLM / every start
(about 0.93 at tau 1.36-1.51: an extrapolation past that).

``shifted[name] = {"base": config, "runs": {tokens: entry}}`` in the JSON adds points too close
together for a slope of their own (a feature added late in a run's history) on a line parallel
to ``config``'s, offset by their mean residual (``benchmarks/scaling_trajectory.py`` writes
such a file from the shipped heads' stages).

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

FIRST_POSITION_GOAL = 0.6  # issue #13's first-position acceptance through vLLM


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


def online_ratios(report: dict) -> dict[str, float]:
    """Mean over the heads of offline_online.json of vLLM / every-start, for E[accepted]
    (tau - 1) and for the first position (vLLM's acceptance against h0's top-1)."""
    heads = [h for h in report["heads"].values() if "offline" in h]  # --medusa: online only
    accepted = [(h["vllm"]["tau"] - 1) / (h["offline"]["tau"] - 1) for h in heads]
    first = [h["vllm"]["acceptance"][0] / h["offline"]["top1"][0] for h in heads]
    return {"accepted": sum(accepted) / len(heads), "first": sum(first) / len(heads)}


def accepted(m: dict) -> float:
    return m["expected_accepted"]


def first_top1(m: dict) -> float:
    return m["top1"][0]


def line(by_tokens: dict, value, base: tuple | None = None) -> tuple[float, float, float]:
    """(a, b, largest |residual|) of value(entry) = a + b ln N over the entries of
    ``by_tokens``: fitted, or with ``base``'s slope and the points' mean offset from it."""
    points = {int(n): value(m) for n, m in by_tokens.items()}
    if base is None:
        return fit(points)
    a, b = base[0], base[1]
    residuals = [y - a - b * math.log(n) for n, y in points.items()]
    shift = sum(residuals) / len(residuals)
    return a + shift, b, max(abs(r - shift) for r in residuals)


def online_budgets(h0: tuple, a: float, b: float, ratios: dict, goals: tuple) -> dict:
    """Tokens at which vLLM's tau and first-position acceptance reach ``goals`` (tau, h0),
    given the lines of E[accepted] (a, b) and of h0's top-1 (``h0``)."""
    tau_goal, first_goal = goals
    a0, b0 = h0[0], h0[1]
    every_start = 1 + (tau_goal - 1) / ratios["accepted"]
    return {
        "ratios": ratios,
        f"vllm_tau_{tau_goal}_is_every_start_tau": every_start,
        f"tokens_for_vllm_tau_{tau_goal}": math.exp((every_start - 1 - a) / b),
        "h0_top1_fit": [a0, b0],
        f"tokens_for_vllm_first_position_{first_goal}": math.exp(
            (first_goal / ratios["first"] - a0) / b0
        ),
    }


def summarise(
    runs: dict,
    predict_at: list[int],
    target_tau: float,
    ratios: dict | None = None,
    shifted: dict | None = None,
) -> dict:
    """Per configuration: the points, the fit and what it predicts (module docstring).
    ``shifted[name] = {"base": config, "runs": {tokens: entry}}``: points on a line parallel
    to ``config``'s (a feature worth a constant at equal tokens), too close together to
    fit a slope of their own."""
    lines = {}
    for name, by_tokens in runs.items():
        lines[name] = (by_tokens, line(by_tokens, accepted), line(by_tokens, first_top1))
    for name, spec in (shifted or {}).items():
        _, base, base_h0 = lines[spec["base"]]
        by_tokens = spec["runs"]
        lines[name] = (
            by_tokens,
            line(by_tokens, accepted, base),
            line(by_tokens, first_top1, base_h0),
        )
    out = {}
    for name, (by_tokens, (a, b, worst), h0) in lines.items():
        online = None
        if ratios is not None:
            online = online_budgets(h0, a, b, ratios, (target_tau, FIRST_POSITION_GOAL))
        out[name] = {
            "points": {
                int(n): 1 + accepted(m)
                for n, m in sorted(by_tokens.items(), key=lambda kv: int(kv[0]))
            },
            "a": a,
            "b": b,
            "tau_per_10x_tokens": b * math.log(10),
            "largest_residual": worst,
            "predicted_tau": {n: 1 + a + b * math.log(n) for n in predict_at},
            f"tokens_for_tau_{target_tau}": math.exp((target_tau - 1 - a) / b),
            "vllm": online,
        }
    return out


def plot(summary: dict, path: str, until: float = 3e8, held_out: str = "MT-Bench") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, s in summary.items():
        ns = sorted(s["points"])
        line = ax.plot(ns, [s["points"][n] for n in ns], "o", label=name)[0]
        grid = [ns[0] * (until / ns[0]) ** (i / 40) for i in range(41)]
        ax.plot(
            grid, [1 + s["a"] + s["b"] * math.log(n) for n in grid], "--", color=line.get_color()
        )
    ax.set_xscale("log")
    ax.set_xlabel("training tokens")
    ax.set_ylabel(f"offline tau (held-out {held_out}, K=4 chain)")
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
    parser.add_argument("--plot-until", type=float, default=3e8, help="the lines' last token")
    parser.add_argument("--online", help="offline_online.json: also give vLLM's budgets")
    parser.add_argument("--held-out", default="MT-Bench", help="the held-out set, for the plot")
    args = parser.parse_args()
    with open(args.json) as f:
        data = json.load(f)
    ratios = None
    if args.online:
        with open(args.online) as f:
            ratios = online_ratios(json.load(f))
    summary = summarise(data["runs"], args.predict_at, args.target_tau, ratios, data.get("shifted"))
    for name, s in summary.items():
        predicted = ", ".join(f"{n:.0e}: {t:.2f}" for n, t in s["predicted_tau"].items())
        print(
            f"{name}: tau = {1 + s['a']:.3f} + {s['b']:.4f} ln N "
            f"(+{s['tau_per_10x_tokens']:.3f} per 10x tokens, worst residual "
            f"{s['largest_residual']:.3f}); predicted {predicted}; tau {args.target_tau} "
            f"at {s[f'tokens_for_tau_{args.target_tau}']:.2e} tokens"
        )
        if s["vllm"]:
            v, goal = s["vllm"], args.target_tau
            print(
                f"  through vLLM (ratios {v['ratios']['accepted']:.3f}, "
                f"{v['ratios']['first']:.3f}): tau {goal} at "
                f"{v[f'tokens_for_vllm_tau_{goal}']:.2e} tokens, first-position acceptance "
                f"{FIRST_POSITION_GOAL} at "
                f"{v[f'tokens_for_vllm_first_position_{FIRST_POSITION_GOAL}']:.2e}"
            )
    print(json.dumps(summary, indent=1))
    if args.plot:
        plot(summary, args.plot, args.plot_until, args.held_out)


if __name__ == "__main__":
    main()
