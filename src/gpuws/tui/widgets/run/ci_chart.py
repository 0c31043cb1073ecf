"""The watch screen's chart: each iteration's median with its 95% CI, as error bars.

Drawn in Unicode cells like the Tier-1 histogram (no plotting library): one slot per
iteration left to right, the CI as a vertical bar (``┬``/``┴`` at its ends, ``▲``/``▼``
where it runs past the chart), the median as ``●``, a failed iteration as ``✗`` on the
floor, the baseline's median as a dotted line across. The time axis is labelled in the
unit that reads best (``humanfmt.ms``) at its top, middle and bottom rows.

The layout is a pure function (:func:`fit`, :func:`draw`) so its scaling is tested without
a terminal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rich.console import RenderableType
from rich.text import Text
from textual.widget import Widget

from ....physical import BOUNDS
from ...fmt import ms

#: The narrowest window the time axis shows, as a share of the largest median: equal
#: medians still get an axis with distinct labels, and noise below this is not magnified
#: into a staircase.
MIN_WINDOW = 0.02
#: How far past the medians' own span (at least ``MIN_WINDOW`` of the largest) a CI may
#: stretch the axis before it is cut with an arrow: one wild CI must not flatten the rest.
CI_REACH = 1.0
#: Room left above and below the points, as a share of the window: a point on the
#: chart's edge reads as one cut off.
PAD = 0.1


@dataclass(frozen=True)
class Point:
    """One iteration as the chart sees it (times in ms; ``median_ms`` None: no median,
    because it ``failed`` or measured none)."""

    n: int
    median_ms: float | None
    low_ms: float | None = None
    high_ms: float | None = None
    failed: bool = False


@dataclass(frozen=True)
class Scale:
    """The time axis: ``hi`` on the top row, ``lo`` on the bottom one."""

    lo: float
    hi: float
    rows: int

    def row(self, value: float) -> int:
        """The row (0 = top) a time falls on, clamped to the chart."""
        if self.rows <= 1 or self.hi <= self.lo:
            return 0
        where = (self.hi - value) / (self.hi - self.lo) * (self.rows - 1)
        return max(0, min(self.rows - 1, round(where)))

    def value(self, row: int) -> float:
        """The time a row stands for (its label)."""
        if self.rows <= 1:
            return self.hi
        return self.hi - (self.hi - self.lo) * row / (self.rows - 1)


def is_time(value: float | None) -> bool:
    """A number a call can take, in ms (finite, within ``physical``'s bound)."""
    bound = BOUNDS["ms"]
    return value is not None and math.isfinite(value) and bound.low <= value <= bound.high


def usable(points: list[Point]) -> tuple[list[Point], int]:
    """The points the chart can draw, and how many it refused (a median that is no time:
    NaN, infinite, negative, beyond a day). A CI bound that is no time, or that does not
    hold the median, is dropped (the median is still drawn)."""
    kept: list[Point] = []
    refused = 0
    for p in points:
        if p.median_ms is None:
            kept.append(p)
            continue
        if not is_time(p.median_ms):
            refused += 1
            continue
        m = p.median_ms
        low = p.low_ms if is_time(p.low_ms) and p.low_ms is not None and p.low_ms <= m else None
        high = (p.high_ms if is_time(p.high_ms) and p.high_ms is not None and p.high_ms >= m
                else None)
        kept.append(Point(p.n, m, low, high, p.failed))
    return kept, refused


def fit(points: list[Point], rows: int) -> Scale | None:
    """The axis for these (usable) points: every median on it, each CI as far as
    :data:`CI_REACH` allows, at least :data:`MIN_WINDOW` wide, never below zero. None when
    no point has a median."""
    medians = [p.median_ms for p in points if p.median_ms is not None]
    if not medians:
        return None
    core_lo, core_hi = min(medians), max(medians)
    unit = max(core_hi - core_lo, MIN_WINDOW * core_hi)
    lows = [p.low_ms if p.low_ms is not None else p.median_ms for p in points
            if p.median_ms is not None]
    highs = [p.high_ms if p.high_ms is not None else p.median_ms for p in points
             if p.median_ms is not None]
    lo = max(min(lows), core_lo - CI_REACH * unit)
    hi = min(max(highs), core_hi + CI_REACH * unit)
    floor = MIN_WINDOW * core_hi
    if hi - lo < floor:  # equal medians, tight CIs: a window around them
        middle = (hi + lo) / 2
        lo, hi = middle - floor / 2, middle + floor / 2
    pad = PAD * (hi - lo)
    lo, hi = lo - pad, hi + pad
    if lo < 0:
        hi, lo = hi - lo, 0.0
    if hi <= lo:  # every median 0 ns: an axis from 0 to 1 ns
        hi = lo + 1e-6
    return Scale(lo, hi, rows)


@dataclass(frozen=True)
class Cell:
    """One character of the plot and its style."""

    char: str
    style: str = ""


def draw(points: list[Point], width: int, height: int,
         baseline_ms: float | None = None) -> list[Text]:
    """The chart's lines for a pane of ``width`` × ``height`` cells.

    The last rows are the iteration numbers and a caption; the rest is the plot with its
    time labels on the left. The newest iterations are kept when not all fit.
    """
    kept, refused = usable(points)
    plot_rows = height - 2
    if not any(p.median_ms is not None or p.failed for p in kept) or plot_rows < 3 \
            or width < 20:
        return [Text("no iteration measured yet", style="dim")]
    scale = fit(kept, plot_rows)
    labels = ([ms(scale.value(r)) for r in range(plot_rows)] if scale is not None
              else [""] * plot_rows)
    shown_rows = {0, plot_rows // 2, plot_rows - 1}
    gutter = max(len(labels[r]) for r in shown_rows) + 1
    plot_width = width - gutter - 1
    slot = max(2, min(8, plot_width // max(1, len(kept))))
    visible_points = kept[-max(1, plot_width // slot):]
    grid = [[Cell(" ") for _ in range(plot_width)] for _ in range(plot_rows)]
    base_note = ""
    if scale is not None and is_time(baseline_ms) and baseline_ms is not None:
        if scale.lo <= baseline_ms <= scale.hi:
            grid[scale.row(baseline_ms)] = [Cell("┈", "yellow dim") for _ in range(plot_width)]
            base_note = " · ┈ baseline"
        else:  # a stored run's median far from these: said, not drawn at an edge
            base_note = f" · baseline {ms(baseline_ms)} off the chart"
    for i, p in enumerate(visible_points):
        x = i * slot + slot // 2
        if p.median_ms is None or scale is None:
            if p.failed:
                grid[plot_rows - 1][x] = Cell("✗", "bold red")
            continue
        _bar(grid, x, p, scale)
    lines: list[Text] = []
    for r in range(plot_rows):
        label = labels[r] if r in shown_rows else ""
        line = Text(label.rjust(gutter - 1) + " ", style="dim")
        line.append("┤" if r in shown_rows else "│", "dim")
        for cell in grid[r]:
            line.append(cell.char, cell.style)
        lines.append(line)
    axis = Text(" " * gutter + "└", style="dim")
    numbers = [" "] * plot_width
    last_end = -1
    for i, p in enumerate(visible_points):
        tag = str(p.n)
        start = max(0, i * slot + slot // 2 - (len(tag) - 1) // 2)
        if start > last_end and start + len(tag) <= plot_width:
            numbers[start:start + len(tag)] = tag
            last_end = start + len(tag)
    axis.append("".join(numbers), "dim")
    lines.append(axis)
    caption = "median per iteration · bar: its 95% CI"
    if any(p.failed for p in visible_points):
        caption += " · ✗ failed"
    caption += base_note
    hidden = len(kept) - len(visible_points)
    if hidden:
        caption += f" · {hidden} older not shown"
    if refused:
        caption += f" · {refused} left out (not a time)"
    lines.append(Text(" " * gutter + " " + caption, style="dim"))
    return lines


def _bar(grid: list[list[Cell]], x: int, p: Point, scale: Scale) -> None:
    assert p.median_ms is not None
    low = p.low_ms if p.low_ms is not None else p.median_ms
    high = p.high_ms if p.high_ms is not None else p.median_ms
    top, bottom = scale.row(min(high, scale.hi)), scale.row(max(low, scale.lo))
    for r in range(top, bottom + 1):
        grid[r][x] = Cell("│", "cyan")
    if top != bottom:
        grid[top][x] = Cell("▲", "bold yellow") if high > scale.hi else Cell("┬", "cyan")
        grid[bottom][x] = (Cell("▼", "bold yellow") if low < scale.lo
                           else Cell("┴", "cyan"))
    grid[scale.row(p.median_ms)][x] = Cell("●", "bold cyan")


class CiChart(Widget):
    """Medians with their 95% CIs per iteration, scaled to the pane."""

    DEFAULT_CSS = """
    CiChart { height: 1fr; min-height: 6; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._points: list[Point] = []
        self._baseline: float | None = None

    @property
    def points(self) -> list[Point]:
        """The iterations the chart was given, in order."""
        return list(self._points)

    def show(self, points: list[Point], baseline_ms: float | None) -> None:
        """Redraw for these iterations (oldest first) and the baseline's median."""
        self._points = points
        self._baseline = baseline_ms
        self.refresh()

    def render(self) -> RenderableType:
        return Text("\n").join(draw(self._points, self.size.width, self.size.height,
                                    self._baseline))
