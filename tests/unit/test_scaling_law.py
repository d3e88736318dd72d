"""The scaling law's fit (benchmarks/scaling_law.py) and the shipped heads' history it is
refitted on (benchmarks/scaling_trajectory.py), read from the raw JSON in docs/bench/heads."""

import importlib.util
import math

import pytest

from helpers import REPO

pytestmark = pytest.mark.unit


def load_script(name: str):
    """A script under benchmarks/ as a module (the folder is not a package)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


scaling_law = load_script("scaling_law")
scaling_trajectory = load_script("scaling_trajectory")


def entry(accepted: float, h0: float) -> dict:
    return {"expected_accepted": accepted, "top1": [h0, 0.0, 0.0, 0.0]}


def test_fit_of_the_docstring_example():
    a, b, worst = scaling_law.fit({100_000: 0.2, 1_000_000: 0.4})
    assert b == pytest.approx(0.2 / math.log(10))
    assert a == pytest.approx(-0.8, abs=1e-3)
    assert math.exp((1.2 - a) / b) == pytest.approx(1e10, rel=1e-6)
    assert worst == pytest.approx(0.0, abs=1e-12)


def test_shifted_points_take_the_base_slope_and_their_mean_offset():
    base = {"1000": entry(0.1, 0.1), "10000": entry(0.3, 0.2), "100000": entry(0.5, 0.3)}
    # 0.25 and 0.35 above the base line at 1e4 and 1e5: the shift is 0.3, residuals 0.05
    shifted = {"10000": entry(0.55, 0.2), "100000": entry(0.85, 0.3)}
    out = scaling_law.summarise(
        {"base": base}, [1_000_000], 2.2, shifted={"up": {"base": "base", "runs": shifted}}
    )
    assert out["up"]["b"] == pytest.approx(out["base"]["b"])
    assert out["up"]["a"] == pytest.approx(out["base"]["a"] + 0.3)
    assert out["up"]["largest_residual"] == pytest.approx(0.05)
    assert out["up"]["predicted_tau"][1_000_000] == pytest.approx(1.7 + 0.3)


def test_online_budgets_skip_heads_measured_online_only():
    report = {
        "heads": {
            "clover": {
                "vllm": {"tau": 1.8, "acceptance": [0.45]},
                "offline": {"tau": 2.0, "top1": [0.5]},
            },
            "medusa": {"vllm": {"tau": 1.3, "acceptance": [0.3]}},
        }
    }
    assert scaling_law.online_ratios(report) == pytest.approx({"accepted": 0.8, "first": 0.9})


def test_the_history_is_read_from_the_stages_raw_files():
    data = scaling_trajectory.trajectory()
    alone = data["runs"]["-clover2, H alone"]
    assert [int(n) for n in alone] == [n for n, _, _ in scaling_trajectory.CLOVER2_H]
    assert alone["56743434"]["tau"] == pytest.approx(1.824, abs=5e-4)
    layered = data["shifted"]["-clover2, layers 2 15 27"]["runs"]
    assert layered["64911492"]["tau"] == pytest.approx(1.993, abs=5e-4)  # the shipped heads
    out = scaling_law.summarise(data["runs"], [29_000_000], 2.2, shifted=data["shifted"])
    assert out["-clover2, H alone"]["tau_per_10x_tokens"] == pytest.approx(0.199, abs=5e-4)
    assert out["-medusa"]["tau_per_10x_tokens"] == pytest.approx(0.104, abs=5e-4)
    assert out["-clover2, layers 2 15 27"]["tokens_for_tau_2.2"] == pytest.approx(8.68e8, rel=0.01)
