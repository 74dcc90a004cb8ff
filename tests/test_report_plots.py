"""The run report's pictures: valid % against stage (the warm start first, intervals, an axis from 0), and the
per-size chart on the sizes evaluated only."""

from __future__ import annotations

import pytest

from nodes.report_plots import evaluated_levels, plot, stage_points


def _metrics(valid: float, optimal: float, n: int = 150, sizes=(3, 4, 5)) -> dict:
    m = {"eval/valid_rate": valid, "eval/optimal_rate": optimal, "eval/n": n}
    m.update({f"eval/valid_rate/level_{s}": valid for s in sizes})
    m.update({f"eval/optimal_rate/level_{s}": optimal for s in sizes})
    return m


def test_stage_points_put_the_start_first_with_wilson_intervals():
    start = _metrics(0.16, 0.10)
    stages = [{"stage": 0, "metrics": _metrics(0.20, 0.12)}, {"stage": 1, "metrics": _metrics(0.0, 0.0)}]
    pts = stage_points(stages, start)
    assert [p["label"] for p in pts] == ["start", "0", "1"]
    assert pts[0]["rate"] == pytest.approx(16.0) and pts[0]["low"] < 16.0 < pts[0]["high"]
    assert 10.0 < pts[1]["low"] < 20.0 < pts[1]["high"] < 30.0  # 30 of 150: about [14.4, 27.2]
    assert pts[2]["low"] == 0.0 < pts[2]["high"] < 3.0  # none of 150: the interval still has a width
    assert [p["label"] for p in stage_points(stages, None, "optimal_rate")] == ["0", "1"]


def test_the_per_size_chart_shows_only_the_sizes_evaluated_and_every_plot_is_written(tmp_path):
    start, m0 = _metrics(0.16, 0.1), _metrics(0.2, 0.1, sizes=(3, 4))
    grid = list(range(3, 11))  # the family's levels: MAPF's grid sizes
    assert evaluated_levels([start, m0], grid) == [3, 4, 5]
    assert evaluated_levels([m0], grid) == [3, 4]
    data = {"start": start, "stages": [{"stage": 0, "metrics": m0, "config": None}]}
    files = plot(data, tmp_path)
    assert files[:2] == ["stages.png", "rates.png"]
    assert all((tmp_path / f).read_bytes()[:4] == b"\x89PNG" for f in files)
