"""A roofline in braille: each kernel placed by arithmetic intensity under the pod's roofs."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import RenderableType
from rich.text import Text
from textual.widget import Widget

from .... import physical, protocol
from ....text.textsafe import visible
from .metrics_table import ProfiledLaunch

# Braille dot bits by (column, row) inside one character cell of 2×4 dots.
_DOT = ((0x01, 0x02, 0x04, 0x40), (0x08, 0x10, 0x20, 0x80))
_Y_LABEL = 9


@dataclass(frozen=True)
class Ceilings:
    """The roofs: memory bandwidth (GB/s) and compute (TFLOP/s), and where they came from."""

    peak_gbps: float
    peak_tflops: float
    source: str

    @property
    def ridge(self) -> float:
        """Arithmetic intensity (FLOP/B) where the two roofs meet."""
        return self.peak_tflops * 1e3 / self.peak_gbps

    def roof(self, ai: float) -> float:
        """Attainable TFLOP/s at this arithmetic intensity."""
        return min(self.peak_gbps * ai / 1e3, self.peak_tflops)


@dataclass(frozen=True)
class RoofPoint:
    """One measured kernel (or the whole workload) on the chart."""

    label: str
    ai: float
    tflops: float
    source: str


def ceilings_from(tier1: protocol.Tier1Result | None,
                  probe: protocol.Probe | None) -> Ceilings | None:
    """Tier 1's peaks (measured bandwidth where it measured it), else the GPU's datasheet."""
    if (tier1 is not None and _roof(tier1.peak_gbps, _GBPS_RANGE)
            and _roof(tier1.peak_tflops, _TFLOPS_RANGE)):
        assert tier1.peak_gbps is not None and tier1.peak_tflops is not None
        return Ceilings(tier1.peak_gbps, tier1.peak_tflops, tier1.peak_source or "Tier 1")
    if probe is not None and probe.gpus:
        from ....remote_agent.measure.tier1 import datasheet_peaks

        row = datasheet_peaks(probe.gpus[0].name)
        if row is not None:
            return Ceilings(row.memory_gbps, row.fp32_tflops, f"datasheet: {row.model} (FP32)")
    return None


def points_from(model_tier1: protocol.Tier1Result | None,
                launches: Sequence[ProfiledLaunch]) -> tuple[list[RoofPoint], list[str]]:
    """Points for the workload (Tier 1: declared bytes and FLOPs) and each profiled kernel.

    Returns:
        The points, and a note for each kernel that cannot be placed (and why).
    """
    points: list[RoofPoint] = []
    notes: list[str] = []
    t1 = model_tier1
    if t1 is not None and t1.bytes and t1.flops and t1.tflops:
        _place(points, notes, RoofPoint("workload (Tier 1)", t1.flops / t1.bytes, t1.tflops,
                                        "declared bytes and FLOPs, CUDA-event time"))
    for launch in launches:
        m = launch.metrics
        flops, dram, dur = m.get("flops"), m.get("dram_bytes"), m.get("duration_ns")
        ai = m.get("arithmetic_intensity")
        if ai is None and flops and dram:
            ai = flops / dram
        seconds = dur * 1e-9 if dur else 0.0  # 0 also when a stored 5e-324 ns underflows
        if ai and flops and seconds > 0:
            _place(points, notes, RoofPoint(f"{launch.kernel} #{launch.launch}", ai,
                                            flops / seconds / 1e12, "ncu: FLOPs / DRAM bytes"))
        else:
            notes.append(f"{launch.kernel}: ncu measured no FLOP count, so it has no point")
    return points, notes


#: Where a point can sit on the chart: arithmetic intensity (FLOP/B) and TFLOP/s.
_AI_RANGE = (1e-6, 1e9)
_TFLOPS_RANGE = (1e-9, physical.BOUNDS["tflops"].high)


_GBPS_RANGE = (1e-3, physical.BOUNDS["gbps"].high)


def _roof(value: float | None, bounds: tuple[float, float]) -> bool:
    """A roof must be a figure a GPU has (a stored 1e308 or 5e-324 is no roof: the log
    axes would overflow or reach log10(0))."""
    return value is not None and bounds[0] <= value <= bounds[1]


def _place(points: list[RoofPoint], notes: list[str], point: RoofPoint) -> None:
    """Add ``point``, or a note when its figures are none a kernel can have (they were
    stored by a gpuws that did not check them; on a log axis they would overflow)."""
    if (_AI_RANGE[0] <= point.ai <= _AI_RANGE[1]
            and _TFLOPS_RANGE[0] <= point.tflops <= _TFLOPS_RANGE[1]):
        points.append(point)
    else:
        notes.append(f"{point.label}: {point.ai:.3g} FLOP/B at {point.tflops:.3g} TFLOP/s "
                     "is no physical value, so it has no point")


class Roofline(Widget):
    """The chart, then a legend line per point (its share of the roof it sits under)."""

    DEFAULT_CSS = """
    Roofline { height: 1fr; min-height: 8; padding: 0 1; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._ceilings: Ceilings | None = None
        self._points: list[RoofPoint] = []
        self._notes: list[str] = []

    def show(self, ceilings: Ceilings | None, points: list[RoofPoint], notes: list[str]) -> None:
        """Redraw with these roofs and points."""
        self._ceilings, self._points, self._notes = ceilings, points, notes
        self.refresh()

    def render(self) -> RenderableType:
        c = self._ceilings
        if c is None:
            return Text("no ceilings: Tier 1 measured no peaks and the GPU has no datasheet "
                        "entry", "dim")
        legend = self._legend(c)
        full = max(20, self.size.width - 2)
        legend_rows = sum(max(1, math.ceil(len(line) / full)) for line in legend.plain.split("\n"))
        width = max(10, full - _Y_LABEL - 1)
        height = max(3, self.size.height - legend_rows - 2)
        return Text("\n").join([self._chart(c, width, height), legend])

    def _ranges(self, c: Ceilings) -> tuple[float, float, float, float]:
        ais = [p.ai for p in self._points] + [c.ridge]
        perfs = [p.tflops for p in self._points]
        x0 = math.log10(min(min(ais) / 4, 0.01))
        x1 = math.log10(max(max(ais) * 4, c.ridge * 10))
        y1 = math.log10(c.peak_tflops * 2)
        y0 = math.log10(min([c.roof(10**x0)] + [p / 2 for p in perfs if p > 0]))
        return x0, x1, y0, y1

    def _chart(self, c: Ceilings, width: int, height: int) -> Text:
        x0, x1, y0, y1 = self._ranges(c)
        dots = [[0] * width for _ in range(height)]
        cols, rows = width * 2, height * 4

        def row_of(tflops: float) -> int:
            frac = (math.log10(tflops) - y0) / (y1 - y0)
            return round((1 - frac) * (rows - 1))

        prev: int | None = None
        for px in range(cols):
            ai = 10 ** (x0 + (x1 - x0) * px / (cols - 1))
            py = row_of(c.roof(ai))
            for y in range(min(py, prev if prev is not None else py),
                           max(py, prev if prev is not None else py) + 1):
                if 0 <= y < rows:
                    dots[y // 4][px // 2] |= _DOT[px % 2][y % 4]
            prev = py
        marks: dict[tuple[int, int], str] = {}
        for i, p in enumerate(self._points, 1):
            if p.ai <= 0 or p.tflops <= 0:
                continue
            cx = int((math.log10(p.ai) - x0) / (x1 - x0) * (width - 1))
            cy = row_of(p.tflops) // 4
            if 0 <= cx < width and 0 <= cy < height:
                marks[(cy, cx)] = str(i)
        text = Text()
        labels = {0: f"{c.peak_tflops * 2:.3g}", height - 1: f"{10 ** y0:.2g}"}
        labels[row_of(c.peak_tflops) // 4] = f"{c.peak_tflops:.3g}"
        for r in range(height):
            text.append(labels.get(r, "").rjust(_Y_LABEL - 1) + " │", "dim")
            for col in range(width):
                if (r, col) in marks:
                    text.append(marks[(r, col)], "bold reverse yellow")
                else:
                    text.append(chr(0x2800 + dots[r][col]), "cyan")
            text.append("\n")
        text.append(" " * (_Y_LABEL - 1) + " └" + "─" * width + "\n", "dim")
        left, right = f"{10 ** x0:.2g}", f"{10 ** x1:.3g} FLOP/B"
        ridge = f"ridge {c.ridge:.1f}"
        pad = max(1, width - len(left) - len(ridge) - len(right))
        text.append(" " * (_Y_LABEL + 1) + left + " " * (pad // 2) + ridge
                    + " " * (pad - pad // 2) + right, "dim")
        return text

    def _legend(self, c: Ceilings) -> Text:
        # "bandwidth: measured: how…; FP32 FLOPs: datasheet: which…" → the first two levels.
        source = "; ".join(":".join(part.split(":")[:2]) for part in c.source.split("; "))
        text = Text()
        text.append(f"TFLOP/s vs FLOP/B (log-log). Roofs: {c.peak_gbps:,.0f} GB/s, "
                    f"{c.peak_tflops:.3g} TFLOP/s ({visible(source, 400)})", "dim")
        for i, p in enumerate(self._points, 1):
            bound = "memory-bound" if p.ai < c.ridge else "compute-bound"
            share = 100 * p.tflops / c.roof(p.ai)
            text.append(f"\n{i} ", "bold reverse yellow")
            # A point's label holds a kernel's name (the pod's word): visible.
            text.append(f" {visible(p.label, 300)}: {p.ai:.3g} FLOP/B, {p.tflops:.3g} TFLOP/s — "
                        f"{share:.0f}% of its roof ({bound})")
            if share > 100:
                # A kernel engineer questions a point above a roof: say what the roof is.
                roof = "bandwidth" if p.ai < c.ridge else "compute"
                parts = [part for part in c.source.split("; ")
                         if part.lower().startswith("bandwidth") == (roof == "bandwidth")]
                what = ":".join(parts[0].split(":")[1:3]).strip() if parts else "?"
                text.append(f"\n   above its roof: the {roof} roof is {visible(what, 200)} "
                            "— not a hard limit; data served from L2, or clocks above those "
                            "the roof was taken at, read over 100%", "italic yellow")
        for note in self._notes:
            text.append(f"\n· {visible(note)}", "dim")
        return text
