"""The roofline of a run's Tier 3 kernels as an SVG: arithmetic intensity against achieved
FLOP/s on log axes, under the roofs the run recorded.

Only recorded numbers are drawn. A point is a profiled launch with an ncu FLOP count, DRAM
bytes and a duration; a roof is a peak the run's Tier 1 recorded (memory bandwidth, the
compute peak of its workload's FLOP kind) with the source it gave. A peak not recorded is
no roof, and the caption says so; nothing is looked up from a table here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .families import FAMILY_COLOURS, FAMILY_ORDER, kernel_family
from .overview import Picture, short
from .svg import Svg

#: Points drawn (the longest launches first); the rest are counted in the caption.
MAX_POINTS = 60
#: Points named beside their dot.
MAX_NAMED = 12
#: Where a figure can sit on the chart: a stored value outside is no physical one (on a
#: log axis 1e308 overflows and 5e-324 reaches log10(0)).
AI_RANGE = (1e-6, 1e9)
TFLOPS_RANGE = (1e-9, 1e7)
GBPS_RANGE = (1e-3, 1e7)
_LEFT, _TOP, _W, _H = 80.0, 50.0, 720.0, 420.0


@dataclass(frozen=True)
class Point:
    """One profiled launch: arithmetic intensity (FLOP/B) and achieved TFLOP/s."""

    kernel: str
    launch: int
    ai: float
    tflops: float
    duration_ns: float


@dataclass(frozen=True)
class Roofs:
    """The peaks a run recorded (None: not recorded) and where they came from."""

    gbps: float | None
    tflops: float | None
    source: str


def point_of(kernel: str, launch: int, flops: float | None, dram_bytes: float | None,
             duration_ns: float | None) -> Point | str:
    """The launch's point, or why it has none (a sentence for the caption)."""
    if not flops or not dram_bytes or not duration_ns or duration_ns <= 0:
        missing = [w for w, v in (("FLOP count", flops), ("DRAM bytes", dram_bytes),
                                  ("duration", duration_ns)) if not v or v <= 0]
        return f"{short(kernel)} #{launch}: ncu measured no {' or '.join(missing)}"
    ai, tflops = flops / dram_bytes, flops / (duration_ns * 1e-9) / 1e12
    if not (AI_RANGE[0] <= ai <= AI_RANGE[1] and TFLOPS_RANGE[0] <= tflops <= TFLOPS_RANGE[1]):
        return (f"{short(kernel)} #{launch}: {ai:.3g} FLOP/B at {tflops:.3g} TFLOP/s is "
                "no physical value")
    return Point(kernel, launch, ai, tflops, duration_ns)


def usable(value: float | None, bounds: tuple[float, float]) -> float | None:
    """A recorded peak if it is one a GPU can have, else None (no roof)."""
    if value is None or not math.isfinite(value) or not bounds[0] <= value <= bounds[1]:
        return None
    return value


def roofline_svg(points: Sequence[Point], roofs: Roofs, title: str,
                 notes: Sequence[str] = ()) -> Picture | None:
    """The chart; None when there is no point to draw."""
    if not points:
        return None
    shown = sorted(points, key=lambda p: (-p.duration_ns, p.kernel, p.launch))[:MAX_POINTS]
    bw, peak = roofs.gbps, roofs.tflops
    xs = [p.ai for p in shown]
    ys = [p.tflops for p in shown]
    if bw is not None and peak is not None:
        xs.append(peak * 1e3 / bw)  # the ridge
    if peak is not None:
        ys.append(peak)
    x_lo, x_hi = math.floor(math.log10(min(xs))) - 1, math.ceil(math.log10(max(xs))) + 1
    y_lo, y_hi = math.floor(math.log10(min(ys))) - 1, math.ceil(math.log10(max(ys))) + 1

    def px(ai: float) -> float:
        return _LEFT + (math.log10(ai) - x_lo) / (x_hi - x_lo) * _W

    def py(tf: float) -> float:
        return _TOP + _H - (math.log10(tf) - y_lo) / (y_hi - y_lo) * _H

    present = sorted({kernel_family(p.kernel) for p in shown}, key=FAMILY_ORDER.index)
    svg = Svg(_LEFT + _W + 260.0, max(_TOP + _H + 50.0, _TOP + 18.0 * len(present) + 20.0),
              title)
    svg.text(10.0, 20.0, title, size=13.0, bold=True)
    svg.rect(_LEFT, _TOP, _W, _H, "#FAFAFA", stroke="#999999")
    for k in range(x_lo, x_hi + 1):
        svg.line(px(10.0 ** k), _TOP, px(10.0 ** k), _TOP + _H, "#DDDDDD")
        svg.text(px(10.0 ** k), _TOP + _H + 15.0, _decade(k), size=10.0, anchor="middle")
    for k in range(y_lo, y_hi + 1):
        svg.line(_LEFT, py(10.0 ** k), _LEFT + _W, py(10.0 ** k), "#DDDDDD")
        svg.text(_LEFT - 5.0, py(10.0 ** k) + 4.0, _decade(k), size=10.0, anchor="end")
    svg.text(_LEFT + _W / 2.0, _TOP + _H + 35.0, "arithmetic intensity (FLOP per DRAM byte)",
             size=11.0, anchor="middle")
    svg.text(10.0, _TOP - 10.0, "achieved TFLOP/s", size=11.0)

    x_min, x_max = 10.0 ** x_lo, 10.0 ** x_hi
    if bw is not None:
        end = min(x_max, peak * 1e3 / bw) if peak is not None else x_max
        seg = _clip_bandwidth(bw, x_min, end, 10.0 ** y_lo, 10.0 ** y_hi)
        if seg is not None:
            (a, b) = seg
            svg.polyline([(px(a), py(bw * a / 1e3)), (px(b), py(bw * b / 1e3))], "#B00020",
                         width=2.0)
            svg.text(px(a) + 4.0, py(bw * a / 1e3) - 6.0, f"memory roof {bw:,.0f} GB/s",
                     size=10.0, fill="#B00020")
    if peak is not None:
        start = max(x_min, peak * 1e3 / bw) if bw is not None else x_min
        svg.line(px(start), py(peak), px(x_max), py(peak), "#B00020", width=2.0)
        svg.text(px(x_max) - 4.0, py(peak) - 6.0, f"compute roof {peak:,.1f} TFLOP/s",
                 size=10.0, anchor="end", fill="#B00020")
    for i, p in enumerate(shown):
        fam = kernel_family(p.kernel)
        tip = f"{p.kernel} #{p.launch}: {p.ai:.3g} FLOP/B, {p.tflops:.3g} TFLOP/s"
        svg.circle(px(p.ai), py(p.tflops), 4.0, FAMILY_COLOURS[fam], tip=tip)
        if i < MAX_NAMED:
            svg.text(px(p.ai) + 6.0, py(p.tflops) - 4.0, short(p.kernel), size=10.0,
                     limit=60)
    lx = _LEFT + _W + 20.0
    for i, fam in enumerate(present):
        svg.circle(lx + 6.0, _TOP + 6.0 + 18.0 * i, 4.0, FAMILY_COLOURS[fam])
        svg.text(lx + 16.0, _TOP + 10.0 + 18.0 * i, fam, size=11.0)
    return Picture(svg.document(), _caption(points, shown, roofs, notes))


def _clip_bandwidth(bw: float, a: float, b: float, y_min: float, y_max: float
                    ) -> tuple[float, float] | None:
    """The part of the memory roof (y = bw·x/1000) over x in [a, b] inside the y range."""
    lo, hi = max(a, y_min * 1e3 / bw), min(b, y_max * 1e3 / bw)
    return (lo, hi) if lo < hi else None


def _decade(k: int) -> str:
    return f"{10.0 ** k:g}" if -3 <= k <= 4 else f"1e{k}"


def _caption(points: Sequence[Point], shown: Sequence[Point], roofs: Roofs,
             notes: Sequence[str]) -> str:
    parts = [f"{len(points) + len(notes)} profiled launch(es) from Nsight Compute, "
             f"{len(points)} with a point: arithmetic intensity = FLOPs / DRAM bytes, "
             "achieved = FLOPs / duration."]
    if len(shown) < len(points):
        parts.append(f"The {len(shown)} longest are drawn; {len(points) - len(shown)} more "
                     "are not.")
    have = []
    if roofs.gbps is not None:
        have.append(f"memory {roofs.gbps:,.0f} GB/s")
    if roofs.tflops is not None:
        have.append(f"compute {roofs.tflops:,.1f} TFLOP/s")
    if have:
        parts.append(f"Roofs as the run's Tier 1 recorded them ({roofs.source}): "
                     f"{', '.join(have)}.")
    if roofs.tflops is not None and any(p.tflops > roofs.tflops for p in shown):
        parts.append("A point above the compute roof ran at another precision or on other "
                     "units (tensor cores) than the peak Tier 1 recorded is for.")
    if roofs.gbps is None:
        parts.append("No memory-bandwidth peak was recorded, so no memory roof is drawn.")
    if roofs.tflops is None:
        parts.append("No compute peak was recorded, so no compute roof is drawn.")
    for note in notes[:10]:
        parts.append(f"{note}, so it has no point.")
    if len(notes) > 10:
        parts.append(f"{len(notes) - 10} more launch(es) have no point.")
    return " ".join(parts)
