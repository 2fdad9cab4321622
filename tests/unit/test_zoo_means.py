"""benchmarks/start_zoo.py's averaging of a run with its repeats, against values worked out by hand."""

import sys

import pytest

from helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from start_zoo import mean_runs, spread_table, summary_table  # noqa: E402


def run(easy, medium, hard, wall_s=100.0):
    """A run whose evaluations are at steps 0, 100, 200; final = the mean of the last two."""
    out = {"wall_s": wall_s}
    for name, evals in (("easy", easy), ("medium", medium), ("hard", hard)):
        out[name] = evals
        out[f"final_{name}"] = sum(evals[1:]) / 2
    return out


def test_a_run_and_its_repeat_average_per_evaluation_and_report_their_spread():
    first = {"s": {"plain": run([0.2, 0.4, 0.6], [0.1, 0.2, 0.2], [0.0, 0.1, 0.1]),
                   "arm": run([0.2, 0.5, 0.5], [0.1, 0.3, 0.3], [0.0, 0.0, 0.2], wall_s=50.0)},
             "only_first": {"plain": run([0.3, 0.3, 0.3], [0.3, 0.3, 0.3], [0.3, 0.3, 0.3])}}
    repeat = {"s": {"plain": run([0.2, 0.6, 0.8], [0.1, 0.2, 0.4], [0.0, 0.1, 0.1]),
                    "arm": run([0.2, 0.3, 0.5], [0.1, 0.1, 0.1], [0.0, 0.2, 0.2], wall_s=70.0),
                    "only_repeat": run([0.0] * 3, [0.0] * 3, [0.0] * 3)}}
    means = mean_runs([first, repeat])
    assert set(means) == {"s"} and set(means["s"]) == {"plain", "arm"}  # only runs found in both files
    plain, arm = means["s"]["plain"], means["s"]["arm"]
    assert plain["easy"] == pytest.approx([0.2, 0.5, 0.7])
    assert plain["final_easy"] == pytest.approx(0.6)  # finals 0.5 and 0.7
    assert plain["spread_easy"] == pytest.approx(0.2)
    assert plain["final_medium"] == pytest.approx(0.25) and plain["spread_medium"] == pytest.approx(0.1)
    assert arm["final_easy"] == pytest.approx(0.45) and arm["spread_easy"] == pytest.approx(0.1)
    assert arm["final_medium"] == pytest.approx(0.2) and arm["spread_medium"] == pytest.approx(0.2)
    assert arm["final_hard"] == pytest.approx(0.15) and arm["spread_hard"] == pytest.approx(0.1)
    assert arm["wall_s"] == pytest.approx(60.0) and arm["repeats"] == 2
    # the averaged runs feed the summary: arm - plain per bucket = -0.15 / -0.05 / +0.05
    row = next(line for line in summary_table(means, ["plain", "arm"]) if line.startswith("| arm | 1 |"))
    assert "| -0.150, -0.150 | -0.050, -0.050 | +0.050, +0.050 |" in row
    assert "2: s easy, s medium" in row
    spread = next(line for line in spread_table(means, ["plain", "arm"]) if line.startswith("| arm | 2 |"))
    assert spread == "| arm | 2 | 0.100, 0.100 | 0.200, 0.200 | 0.100, 0.100 |"
