"""A text histogram of Tier-1 samples, with the median and its CI marked on the axis."""

from __future__ import annotations

import bisect
import math

from rich.console import RenderableType
from rich.text import Text
from textual.widget import Widget

from ....physical import BOUNDS
from ...fmt import ms

_BLOCKS = " ▁▂▃▄▅▆▇█"


class Histogram(Widget):
    """Counts of samples per time bin, as vertical bars filling the widget.

    The range is the 1st to 99th percentile, so one preempted call does not squash the
    rest into a single bar; how many samples fall outside is said under the axis.
    """

    DEFAULT_CSS = """
    Histogram { height: 1fr; min-height: 4; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._sorted: list[float] = []
        self._marks: tuple[float, float, float] | None = None
        self._empty = "no samples yet"

    def show(self, sorted_samples: list[float],
             marks: tuple[float, float, float] | None,
             empty: str = "no samples yet") -> None:
        """Redraw for these samples (ascending); ``marks`` is (CI low, median, CI high);
        ``empty`` is what an empty histogram says (no "yet" once none will come)."""
        self._sorted = sorted_samples
        self._marks = marks
        self._empty = empty
        self.refresh()

    def render(self) -> RenderableType:
        values = _physical(self._sorted)
        width, height = self.size.width, self.size.height
        if not values or width < 10 or height < 3:
            return Text(self._empty, style="dim")
        n = len(values)
        lo = values[int(0.01 * (n - 1))]
        hi = values[int(0.99 * (n - 1))]
        if hi <= lo:
            lo, hi = values[0], values[-1]
        if hi <= lo:  # every sample equal
            hi = lo * 1.001 + 1e-9
        # About 2·√n bins (at most one per column): enough to show the shape, few enough
        # that each bar holds several samples instead of a comb of ones and zeros.
        bins = max(8, min(width, int(2 * n ** 0.5)))
        edges = [lo + (hi - lo) * i / bins for i in range(bins + 1)]
        counts = [bisect.bisect_left(values, edges[i + 1]) - bisect.bisect_left(values, edges[i])
                  for i in range(bins)]
        counts[-1] += bisect.bisect_right(values, hi) - bisect.bisect_left(values, hi)
        outside = bisect.bisect_left(values, lo) + (n - bisect.bisect_right(values, hi))
        columns = [counts[min(bins - 1, c * bins // width)] for c in range(width)]
        bar_rows = height - 2
        top = max(counts) or 1
        lines = Text()
        for row in range(bar_rows, 0, -1):
            base = (row - 1) * 8
            lines.append("".join(_BLOCKS[max(0, min(8, int(c / top * bar_rows * 8) - base))]
                                 for c in columns) + "\n", "cyan")
        lines.append(self._axis(lo, hi, width))
        lines.append("\n")
        left, right = ms(lo), ms(hi)
        note = f", {outside} outside" if outside else ""
        middle = f"distribution of n={n}{note}"
        pad = max(1, width - len(left) - len(right) - len(middle))
        lines.append(f"{left}{' ' * (pad // 2)}{middle}{' ' * (pad - pad // 2)}{right}", "dim")
        return lines

    def _axis(self, lo: float, hi: float, bins: int) -> Text:
        axis = ["─"] * bins
        if self._marks is not None:
            for value, char in zip(self._marks, "[┃]", strict=True):
                where = (value - lo) / (hi - lo) * bins
                if not math.isfinite(where):  # a stored 1e308 median: no mark, no crash
                    continue
                pos = int(where)
                if 0 <= pos < bins:
                    axis[pos] = char
        text = Text("".join(axis), "dim")
        for i, char in enumerate(axis):
            if char in "[┃]":
                text.stylize("bold yellow", i, i + 1)
        return text


def _physical(values: list[float]) -> list[float]:
    """The ascending samples that are times a call can take (a slice, only when needed).

    The model leaves others out already; this keeps the arithmetic below finite whatever
    it is handed (1e308 − (−1e308) is inf, and int(inf) raises).
    """
    bound = BOUNDS["ms"]
    if not values or (values[0] >= bound.low and values[-1] <= bound.high):
        return values
    lo = bisect.bisect_left(values, bound.low)
    hi = bisect.bisect_right(values, bound.high)
    return [v for v in values[lo:hi] if math.isfinite(v)]
