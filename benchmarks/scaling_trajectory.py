"""The shipped heads' training history as scaling points: docs/bench/heads/scaling_trajectory.json.

``scaling.json`` fits the law on short runs from scratch (36k-1.17M tokens). The shipped
``-clover2`` and ``-medusa`` heads then grew in stages to 65M and 34M tokens (docs/heads.md),
each stage a warm restart on more data, and every stage was scored by ``eval-heads`` on the
same held-out self-distilled MT-Bench answers. This script gathers those scores from the
stages' raw JSON files into ``scaling_law.py``'s format (``runs[config][tokens]`` = the
eval-heads entry), so that the law can be refitted on the budgets the goal is about:

- ``-clover2, H alone``: 1.17M (stage 1), 3.23M, 5.66M, 25.3M, 39.1M and 56.7M tokens, the
  last the control arm of the middle-layer comparison (the same 17.6M tokens, no layers);
- ``-medusa``: 3.23M, 5.72M, 25.3M and 33.5M tokens;
- ``shifted["-clover2, layers 2 15 27"]``: the 56.7M and 64.9M points of the shipped
  lineage, which read the target's middle layers; two points 1.14x apart cannot fit a slope,
  so ``scaling_law.py`` puts them on a line parallel to ``H alone``'s.

    python benchmarks/scaling_trajectory.py --out docs/bench/heads/scaling_trajectory.json
    python benchmarks/scaling_law.py --json docs/bench/heads/scaling_trajectory.json \\
        --online docs/bench/heads/offline_online_b1.json \\
        --predict-at 29000000 300000000 1000000000 \\
        --plot docs/bench/heads/scaling_trajectory.png --plot-until 1e10
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HEADS = Path(__file__).resolve().parent.parent / "docs" / "bench" / "heads"
MT = ("mt_bench_self", "results")
# (tokens seen over every stage, raw file under docs/bench/heads, keys to the eval entry)
CLOVER2_H = [
    (1_165_718, "continued.json", ("heads", "clover2_1.17M (the previous -clover2, stage 1)")),
    (3_230_439, "continued.json", ("heads", "clover2_3.23M (shipped -clover2)")),
    (5_659_598, "gpu_selfdistilled.json", ("results", "clover2_gate_3chunks (shipped -clover2)")),
    (25_271_776, "gpu_mix_20m.json", (*MT, "c2: -clover2 continued, 2 epochs (+19,612,178)")),
    (
        39_148_307,
        "gpu_mix_20m.json",
        (*MT, "c3: c2 continued, cut to 745 steps (+13,876,531; shipped as -clover2)"),
    ),
    (56_743_434, "gpu_layers_65m.json", (*MT, "c4-control")),
]
MEDUSA = [
    (3_230_439, "continued.json", ("heads", "medusa_3.23M (shipped -medusa)")),
    (5_722_535, "gpu_selfdistilled.json", ("results", "medusa1_2chunks (shipped -medusa)")),
    (25_334_713, "gpu_mix_20m.json", (*MT, "md: -medusa continued, 2 epochs (+19,612,178)")),
    (
        33_528_925,
        "gpu_mix_20m.json",
        (*MT, "md2: md continued, cut to 440 steps (+8,194,212; shipped as -medusa)"),
    ),
]
CLOVER2_LAYERS = [
    (56_743_434, "gpu_layers_65m.json", (*MT, "c4-layers")),
    (64_911_492, "gpu_layers_65m.json", (*MT, "c5-layers (shipped -clover2)")),
]


def entries(
    points: list[tuple[int, str, tuple[str, ...]]], files: dict[str, dict]
) -> dict[str, dict]:
    """{tokens: eval-heads entry} from the raw files, each with its source noted; ``files``
    holds each file parsed once, by name, across calls."""
    out = {}
    for tokens, name, keys in points:
        if name not in files:
            files[name] = json.loads((HEADS / name).read_text())
        entry = files[name]
        for key in keys:
            entry = entry[key]
        out[str(tokens)] = {**entry, "source": f"{name}: {' / '.join(keys)}"}
    return out


def trajectory() -> dict:
    files: dict[str, dict] = {}
    return {
        "runs": {
            "-clover2, H alone": entries(CLOVER2_H, files),
            "-medusa": entries(MEDUSA, files),
        },
        "shifted": {
            "-clover2, layers 2 15 27": {
                "base": "-clover2, H alone",
                "runs": entries(CLOVER2_LAYERS, files),
            }
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.write_text(json.dumps(trajectory(), indent=1) + "\n")


if __name__ == "__main__":
    main()
