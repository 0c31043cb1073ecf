"""The watch chart's scaling: equal medians, one huge CI, a single point, values that are
no time (the pure layout of ``widgets/run/ci_chart.py``, no terminal needed)."""

from __future__ import annotations

import math

from gpuws.tui.fmt import ms
from gpuws.tui.widgets.run.ci_chart import MIN_WINDOW, PAD, Point, Scale, draw, fit, usable

W, H = 60, 14  # a pane: 12 rows of plot, the iteration numbers, the caption
ROWS = H - 2


def plot(points: list[Point], baseline: float | None = None) -> list[str]:
    return [line.plain for line in draw(points, W, H, baseline)]


def column_of(lines: list[str], char: str) -> list[int]:
    """The rows of the plot holding ``char``."""
    return [r for r, line in enumerate(lines[:ROWS]) if char in line]


def test_equal_medians_get_a_window_with_distinct_labels() -> None:
    points = [Point(n, 0.2) for n in (1, 2, 3)]
    scale = fit(points, ROWS)
    assert scale is not None
    assert math.isclose(scale.hi - scale.lo, MIN_WINDOW * 0.2 * (1 + 2 * PAD))
    assert scale.lo < 0.2 < scale.hi  # centred on them, not on an edge
    lines = plot(points)
    assert len(column_of(lines, "●")) == 1 and lines[column_of(lines, "●")[0]].count("●") == 3
    top, bottom = lines[0].split("┤")[0].strip(), lines[ROWS - 1].split("┤")[0].strip()
    assert top == ms(scale.hi) and bottom == ms(scale.lo) and top != bottom
    assert top.endswith("µs")  # the unit is said


def test_one_huge_ci_is_cut_with_arrows_and_the_rest_stay_apart() -> None:
    points = [Point(1, 0.200, 0.199, 0.201), Point(2, 0.190, 0.189, 0.191),
              Point(3, 0.180, 0.179, 0.181), Point(4, 0.185, 0.001, 50.0)]
    scale = fit(points, ROWS)
    assert scale is not None
    # The axis follows the medians (and one span of them more), not the wild CI.
    window = 0.06 * (1 + 2 * PAD)
    assert scale.hi <= 0.180 + window + 1e-12 and scale.lo >= 0.200 - window - 1e-12
    rows = [scale.row(p.median_ms) for p in points if p.median_ms is not None]
    assert len(set(rows[:3])) == 3  # 200, 190, 180 µs on three different rows
    lines = plot(points)
    (up,), (down,) = column_of(lines, "▲"), column_of(lines, "▼")
    assert up < min(rows) and down > max(rows)  # cut beyond every other point


def test_a_single_point_sits_in_the_middle_with_its_ci() -> None:
    lines = plot([Point(1, 0.2, 0.199, 0.2012)])
    (median_row,) = column_of(lines, "●")
    assert abs(median_row - (ROWS - 1) / 2) <= 1
    assert column_of(lines, "┬") and column_of(lines, "┴")
    assert column_of(lines, "┬")[0] < median_row < column_of(lines, "┴")[0]
    assert "1" in lines[ROWS]  # its iteration number under it


def test_values_that_are_no_time_are_refused_not_drawn() -> None:
    points = [Point(1, 0.2, 0.199, 0.201), Point(2, float("nan")), Point(3, math.inf),
              Point(4, -1.0), Point(5, 0.19, float("nan"), math.inf)]
    kept, refused = usable(points)
    assert refused == 3 and [p.n for p in kept] == [1, 5]
    assert kept[1].low_ms is None and kept[1].high_ms is None  # its median stays
    lines = plot(points, baseline=float("nan"))
    assert "3 left out (not a time)" in lines[-1] and "baseline" not in lines[-1]
    assert sum(line.count("●") for line in lines) == 2
    # Nothing that is no time reaches the arithmetic: the axis is finite.
    scale = fit(kept, ROWS)
    assert scale is not None and math.isfinite(scale.lo) and math.isfinite(scale.hi)
    # Only refused values: nothing to draw, said so.
    assert plot([Point(1, math.nan)])[0] == "no iteration measured yet"


def test_failed_iterations_sit_on_the_floor_and_the_baseline_is_a_line() -> None:
    lines = plot([Point(1, 0.2, 0.199, 0.201), Point(2, None, failed=True),
                  Point(3, 0.19, 0.189, 0.191)], baseline=0.2)
    assert column_of(lines, "✗") == [ROWS - 1]
    assert "┈" in lines[column_of(lines, "●")[0]]  # the baseline's row, through its median
    assert "✗ failed" in lines[-1] and "┈ baseline" in lines[-1]


def test_scale_rows_are_clamped() -> None:
    scale = Scale(1.0, 2.0, 5)
    assert [scale.row(v) for v in (3.0, 2.0, 1.5, 1.0, 0.0)] == [0, 0, 2, 4, 4]
    assert scale.value(0) == 2.0 and scale.value(4) == 1.0


def test_a_baseline_off_the_chart_is_said_not_drawn_at_an_edge() -> None:
    lines = plot([Point(1, 0.2, 0.199, 0.201)], baseline=0.5)
    assert "┈" not in "".join(lines[:ROWS])
    assert "baseline 500.0 µs off the chart" in lines[-1]
