"""The mixed total of several bench runs (benchmarks/mixed_total.py): the docstring's example,
and rounds matched by index across workloads."""

import pytest
from test_scaling_law import load_script

pytestmark = pytest.mark.unit

mixed_total = load_script("mixed_total")


def run(method: str, repeat: int, tokens: int, seconds: float) -> dict:
    return {
        "method": method,
        "engine_mode": "in-process",
        "batch_size": 1,
        "temperature": 0.0,
        "repeat": repeat,
        "output_tokens": tokens,
        "seconds": seconds,
    }


def test_the_docstring_example():
    workloads = {
        "A": [run("lookup", 0, 1000, 20.0), run("ngram", 0, 1000, 25.0)],
        "B": [run("lookup", 0, 1000, 40.0), run("ngram", 0, 1000, 38.0)],
    }
    figures = mixed_total.mixed(workloads)
    key = ("lookup", "in-process", 1, 0.0)
    assert figures[key]["mixed"]["median"] == pytest.approx(2000 / 60)
    (ratios,) = mixed_total.compare(figures, "lookup", ["ngram"])
    assert ratios["mixed"] == pytest.approx(round(63 / 60, 3))
    assert ratios["A"] == 1.25 and ratios["B"] == pytest.approx(round(38 / 40, 3))


def test_rounds_pair_by_index_and_a_round_missing_anywhere_is_left_out():
    workloads = {
        "A": [run("ngram", r, 100, s) for r, s in enumerate((1.0, 2.0, 4.0))],
        "B": [run("ngram", r, 100, s) for r, s in enumerate((1.0, 2.0))],
    }
    entry = mixed_total.mixed(workloads)[("ngram", "in-process", 1, 0.0)]
    assert entry["rounds"] == 2
    assert entry["mixed"] == {"median": pytest.approx(75.0), "min": 50.0, "max": 100.0}
    assert mixed_total.compare({("ngram", "in-process", 1, 0.0): entry}, "lookup", ["ngram"]) == []
