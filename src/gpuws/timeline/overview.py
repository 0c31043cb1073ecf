"""The timeline overview of a run as an SVG: GPU tracks across time, kernels coloured by
family, idle gaps, the judged steady window shaded and the one-time phases it left out.

Input is a Chrome trace as :func:`gpuws.live.tracefile.validate` leaves it (the pulled
``timeline.trace.json.gz`` of a Tier 2 run: ``pid`` = rank, ``tid`` = ``stream N``, the
``gpuws`` marks on each rank's ``verdict`` track). Its size is the pod's choice, so the
picture is bounded whatever it holds: at most :data:`MAX_TRACKS` tracks, and each track
is drawn per pixel column (:data:`PLOT_WIDTH` of them), so blocks narrower than a column
merge into one: the column takes the colour of the family with the most time in it and a
shade by how busy it was. The caption says so, with what one column spans.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..remote_agent.verdicts.names import short_name
from .families import FAMILY_COLOURS, FAMILY_ORDER, kernel_family
from .svg import Svg

#: GPU tracks drawn (the rest are counted in the caption).
MAX_TRACKS = 32
#: Pixel columns of the time axis: the most blocks one track can have.
PLOT_WIDTH = 1000
#: Kernels named inside their block when at least this wide (px), at most this many.
LABEL_MIN_PX = 70.0
MAX_LABELS = 200
#: Characters of a kernel name read to shorten it (the trace checker keeps 1 KiB; a
#: longer name handed here costs time, not picture).
NAME_READ = 1024
#: Left-out phases listed per rank.
MAX_PHASES = 6
_LEFT = 220.0
_TRACK_H = 18.0
_TRACK_GAP = 4.0
_GPU_CATS = {"kernel": "kernel", "memcpy": "memcpy", "memset": "memset",
             "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
_IDLE = "#EEEEEE"
_WINDOW = "#000000"
_PHASE = "#B00020"


@dataclass(frozen=True)
class Picture:
    """An SVG and the plain-text caption the report prints under it."""

    svg: str
    caption: str


@dataclass
class _Track:
    pid: Any
    tid: Any
    events: list[tuple[float, float, str, str]]  # ts, end (µs), family, name


def short(name: str) -> str:
    """The short name of a kernel, from its first :data:`NAME_READ` characters."""
    return short_name(name[:NAME_READ])


def _cut(text: str, n: int) -> str:
    return text[:n] + "…" if len(text) > n else text


def _natural(value: Any) -> tuple[Any, ...]:
    """``stream 7`` before ``stream 13``; ints before strings; always comparable."""
    if isinstance(value, int):
        return (0, value, "")
    parts = re.split(r"(\d+)", str(value))
    return (1, 0, tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in parts))


def _num_or_none(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    x = float(value)
    return x if math.isfinite(x) and x >= 0 else None


def timeline_svg(events: Sequence[dict[str, Any]], title: str) -> Picture | None:
    """The overview of a checked trace's events; None when it has no GPU event."""
    names: dict[Any, str] = {}
    tracks: dict[tuple[Any, Any], _Track] = {}
    windows: list[tuple[Any, float, float, str]] = []
    phases: list[tuple[Any, float, str]] = []
    host_events = 0
    for ev in events:
        ph, cat = ev.get("ph"), str(ev.get("cat", "")).lower()
        ts, dur = _num_or_none(ev.get("ts")), _num_or_none(ev.get("dur", 0))
        name = str(ev.get("name", ""))
        if ph == "M" and name == "process_name" and isinstance(ev.get("args"), dict):
            names[ev.get("pid")] = str(ev["args"].get("name", ""))
        if ts is None or dur is None:
            continue
        if not math.isfinite(ts + dur):
            continue  # 1e308 + 1e308: no place on any axis
        if ph == "X" and cat in _GPU_CATS:
            key = (ev.get("pid"), ev.get("tid"))
            track = tracks.get(key)
            if track is None:
                track = tracks[key] = _Track(key[0], key[1], [])
            track.events.append((ts, ts + dur, kernel_family(name, cat), name))
        elif ph == "X" and cat == "gpuws" and name.startswith("judged window"):
            windows.append((ev.get("pid"), ts, ts + dur, name))
        elif ph == "i" and cat == "gpuws" and name.startswith("left out"):
            phases.append((ev.get("pid"), ts, name))
        elif ph == "X":
            host_events += 1
    if not tracks:
        return None
    all_tracks = sorted(tracks.values(), key=lambda t: (_natural(t.pid), _natural(t.tid)))
    # Past the cap, the busiest tracks are drawn (a rank's compute stream, not the dozens
    # of streams DDP's start-up copies once on), in their natural order.
    busiest = sorted(all_tracks, key=lambda t: -sum(e[1] - e[0] for e in t.events))
    keep = {id(t) for t in busiest[:MAX_TRACKS]}
    drawn = [t for t in all_tracks if id(t) in keep]
    n_events = sum(len(t.events) for t in all_tracks)
    t0 = min(e[0] for t in all_tracks for e in t.events)
    t1 = max(e[1] for t in all_tracks for e in t.events)
    span = max(t1 - t0, 1e-3)
    scale = PLOT_WIDTH / span  # px per µs

    phase_lines = _phase_lines(windows, phases, names)
    top = 30.0 + 14.0 * len(phase_lines) + 8.0
    plot_h = len(drawn) * (_TRACK_H + _TRACK_GAP)
    axis_y = top + plot_h + 2.0
    present = sorted({e[2] for t in drawn for e in t.events}, key=FAMILY_ORDER.index)
    legend_y = axis_y + 40.0
    height = legend_y + 20.0 * math.ceil((len(present) + 3) / 5) + 10.0
    svg = Svg(_LEFT + PLOT_WIDTH + 20.0, height, title)
    svg.text(10.0, 18.0, title, size=13.0, bold=True)
    for i, line in enumerate(phase_lines):
        svg.text(10.0, 34.0 + 14.0 * i, line, size=11.0, fill="#444444")

    rows: dict[Any, list[float]] = {}
    for i, track in enumerate(drawn):
        y = top + i * (_TRACK_H + _TRACK_GAP)
        rows.setdefault(track.pid, []).append(y)
        busy = _busy_share(track.events, t0, t1)
        # Each part cut on its own, so a long rank name cannot hide which stream it is.
        label = f"{_cut(names.get(track.pid) or f'process {track.pid}', 16)} · " \
            f"{_cut(str(track.tid), 14)}"
        svg.text(_LEFT - 6.0, y + 13.0, label, size=10.0, anchor="end", limit=40)
        svg.rect(_LEFT, y, PLOT_WIDTH, _TRACK_H, _IDLE,
                 tip=f"{label}: GPU busy {busy:.1f}% of the span")
    for pid, lo, hi, name in sorted(windows, key=lambda w: (_natural(w[0]), w[1])):
        ys = rows.get(pid)
        if not ys:
            continue
        x0, x1 = _LEFT + (lo - t0) * scale, _LEFT + (hi - t0) * scale
        x0, x1 = max(_LEFT, x0), min(_LEFT + PLOT_WIDTH, x1)
        svg.rect(x0, min(ys) - 2.0, x1 - x0, max(ys) - min(ys) + _TRACK_H + 4.0, _WINDOW,
                 opacity=0.10, tip=name)
    labels = 0
    for i, track in enumerate(drawn):
        y = top + i * (_TRACK_H + _TRACK_GAP)
        for x, w, fam, level in _columns(track.events, t0, scale):
            svg.rect(_LEFT + x, y, w, _TRACK_H, FAMILY_COLOURS[fam], opacity=level)
        free = -math.inf  # where the last label on this track ends (labels never overlap)
        for ts, end, _fam, name in sorted(track.events):
            w = (end - ts) * scale
            x = (ts - t0) * scale
            if w >= LABEL_MIN_PX and labels < MAX_LABELS and x >= free:
                labels += 1
                free = x + w
                svg.text(_LEFT + x + 3.0, y + 13.0, short(name), size=10.0,
                         limit=max(1, int(w / 6.5) - 1))
    for pid, lo, hi, _name in windows:
        for at in (lo, hi):
            ys = rows.get(pid)
            x = _LEFT + (at - t0) * scale
            if ys and _LEFT <= x <= _LEFT + PLOT_WIDTH:
                svg.line(x, min(ys) - 2.0, x, max(ys) + _TRACK_H + 2.0, "#000000", dash="4 2")
    for pid, at, _name in phases:
        ys = rows.get(pid)
        x = _LEFT + (at - t0) * scale
        if ys and _LEFT <= x <= _LEFT + PLOT_WIDTH:
            svg.line(x, min(ys) - 4.0, x, max(ys) + _TRACK_H + 4.0, _PHASE, width=1.5)

    _axis(svg, axis_y, span)
    _legend(svg, legend_y, present)
    caption = _caption(n_events, len(all_tracks), len(drawn), span, host_events, bool(windows))
    return Picture(svg.document(), caption)


def _phase_lines(windows: list[tuple[Any, float, float, str]],
                 phases: list[tuple[Any, float, str]], names: dict[Any, str]) -> list[str]:
    """The window and left-out phases per rank, as lines above the tracks."""
    out: list[str] = []
    for pid in sorted({w[0] for w in windows} | {p[0] for p in phases}, key=_natural):
        who = names.get(pid) or f"process {pid}"
        for w in windows:
            if w[0] == pid:
                out.append(f"{who}: {w[3]} (shaded)")
        mine = [p for p in phases if p[0] == pid]
        for p in mine[:MAX_PHASES]:
            out.append(f"{who}: {p[2]} (red line: where the run's GPU work began)")
        if len(mine) > MAX_PHASES:
            out.append(f"{who}: {len(mine) - MAX_PHASES} more left-out phase(s) not listed")
        if len(out) > 4 * MAX_PHASES:
            out.append("more ranks' marks not listed")
            break
    return out


def _busy_share(events: list[tuple[float, float, str, str]], t0: float, t1: float) -> float:
    """Percent of [t0, t1] covered by at least one of the track's events."""
    covered, end = 0.0, -math.inf
    for ts, te, _f, _n in sorted(events):
        if te <= end:
            continue
        covered += te - max(ts, end)
        end = te
    return 100.0 * covered / max(t1 - t0, 1e-3)


def _columns(events: list[tuple[float, float, str, str]], t0: float, scale: float
             ) -> list[tuple[float, float, str, float]]:
    """The track's blocks at one per pixel column at most: (x, width, family, opacity),
    neighbouring columns of one family and shade merged into one block."""
    busy: dict[str, list[float]] = {}
    for ts, te, fam, _name in events:
        x0, x1 = (ts - t0) * scale, (te - t0) * scale
        first = min(PLOT_WIDTH - 1, int(x0))
        last = min(PLOT_WIDTH - 1, max(first, math.ceil(x1) - 1))
        cols = busy.get(fam)
        if cols is None:
            cols = busy[fam] = [0.0] * PLOT_WIDTH
        for c in range(first, last + 1):
            # A kernel shorter than a column still leaves a trace of itself.
            cols[c] += max(min(x1, c + 1.0) - max(x0, float(c)), 0.01)
    order = sorted(busy, key=FAMILY_ORDER.index)
    out: list[tuple[float, float, str, float]] = []
    run: tuple[int, str, float] | None = None  # start column, family, level
    for c in range(PLOT_WIDTH + 1):
        cell: tuple[str, float] | None = None
        if c < PLOT_WIDTH:
            total = sum(busy[f][c] for f in order)
            if total > 0:
                fam = max(order, key=lambda f: (busy[f][c], -FAMILY_ORDER.index(f)))
                cell = (fam, math.ceil(min(total, 1.0) * 4.0) / 4.0)
        if run is not None and (cell is None or (run[1], run[2]) != cell):
            out.append((float(run[0]), float(c - run[0]), run[1], run[2]))
            run = None
        if cell is not None and run is None:
            run = (c, cell[0], cell[1])
    return out


def _unit(span_us: float) -> tuple[str, float]:
    if span_us < 1e3:
        return "µs", 1.0
    if span_us < 1e6:
        return "ms", 1e3
    return "s", 1e6


def _ticks(span: float, want: int = 8) -> list[float]:
    raw = span / want
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1.0, 2.0, 5.0, 10.0) if m * mag >= raw)
    return [i * step for i in range(int(span / step) + 1)]


def _axis(svg: Svg, y: float, span: float) -> None:
    unit, div = _unit(span)
    scale = PLOT_WIDTH / span
    svg.line(_LEFT, y, _LEFT + PLOT_WIDTH, y, "#333333")
    for t in _ticks(span):
        x = _LEFT + t * scale
        svg.line(x, y, x, y + 4.0, "#333333")
        svg.text(x, y + 15.0, _tick_label(t / div), size=10.0, anchor="middle")
    svg.text(_LEFT + PLOT_WIDTH / 2.0, y + 30.0,
             f"time since the first GPU event ({unit})", size=11.0, anchor="middle")


def _tick_label(v: float) -> str:
    s = f"{v:.3f}".rstrip("0").rstrip(".")
    return s or "0"


def _legend(svg: Svg, y: float, present: list[str]) -> None:
    items: list[tuple[str, str, float]] = [(f, FAMILY_COLOURS[f], 1.0) for f in present]
    items += [("idle (no GPU work)", _IDLE, 1.0), ("judged steady window", _WINDOW, 0.10)]
    for i, (label, colour, opacity) in enumerate(items):
        x = _LEFT + (i % 5) * 200.0
        row_y = y + 20.0 * (i // 5)
        svg.rect(x, row_y, 14.0, 12.0, colour, opacity=opacity, stroke="#666666")
        svg.text(x + 20.0, row_y + 10.5, label, size=11.0)
    i = len(items)
    x, row_y = _LEFT + (i % 5) * 200.0, y + 20.0 * (i // 5)
    svg.line(x + 7.0, row_y, x + 7.0, row_y + 12.0, _PHASE, width=1.5)
    svg.text(x + 20.0, row_y + 10.5, "one-time phases begin", size=11.0)


def _caption(n_events: int, n_tracks: int, drawn: int, span: float, host: int,
             window: bool) -> str:
    unit, div = _unit(span)
    col_unit, col_div = _unit(span / PLOT_WIDTH)
    parts = [f"{n_events:,} GPU events on {n_tracks} GPU track(s) over "
             f"{span / div:.3f} {unit}.",
             f"Drawn at {PLOT_WIDTH} columns of {span / PLOT_WIDTH / col_div:.3g} {col_unit}: "
             "blocks narrower than a column are merged, the column coloured by the family "
             "with the most time in it and shaded by how busy the track was in it; grey is "
             "idle."]
    if drawn < n_tracks:
        parts.append(f"The {drawn} busiest tracks are drawn ({n_tracks - drawn} more are in "
                     "the trace).")
    if host:
        parts.append(f"{host:,} host event(s) (CUDA runtime calls) are not drawn.")
    parts.append("Shaded: the steady window the verdict judged." if window else
                 "The trace marks no steady window.")
    return " ".join(parts)


def shares_svg(rows: Sequence[tuple[str, float]], title: str, *, source: str,
               span_ns: float | None = None, idle_pct: float | None = None,
               window: str | None = None,
               left_out: Sequence[tuple[str, float]] = ()) -> Picture | None:
    """Without a trace: a Tier 2 kernel table's time by family as one bar (and the span's
    busy and idle shares as another, where the table has them). ``rows`` are (kernel
    name, total ns); ``left_out`` the one-time phases (name, ns) the window left out.
    None when the table has no kernel time."""
    totals: dict[str, float] = {}
    for name, ns in rows:
        if math.isfinite(ns) and ns > 0:
            fam = kernel_family(name)
            totals[fam] = totals.get(fam, 0.0) + ns
    kernel_ns = sum(totals.values())
    if kernel_ns <= 0:
        return None
    fams = sorted(totals, key=lambda f: (-totals[f], FAMILY_ORDER.index(f)))
    lines = ([f"steady window: {window}"] if window else []) + \
        [f"left out: {p} ({ns / 1e6:.3f} ms)" for p, ns in left_out[:MAX_PHASES]]
    if len(left_out) > MAX_PHASES:
        lines.append(f"{len(left_out) - MAX_PHASES} more left-out phase(s) not listed")
    top = 30.0 + 14.0 * len(lines) + 8.0
    busy_bar = idle_pct is not None and 0.0 <= idle_pct <= 100.0
    legend_y = top + (70.0 if busy_bar else 35.0)
    svg = Svg(_LEFT + PLOT_WIDTH + 20.0, legend_y + 20.0 * math.ceil(len(fams) / 5) + 10.0,
              title)
    svg.text(10.0, 18.0, title, size=13.0, bold=True)
    for i, line in enumerate(lines):
        svg.text(10.0, 34.0 + 14.0 * i, line, size=11.0, fill="#444444")
    svg.text(_LEFT - 6.0, top + 13.0, "kernel time by family", size=10.0, anchor="end")
    x = _LEFT
    for fam in fams:
        w = PLOT_WIDTH * totals[fam] / kernel_ns
        share = 100.0 * totals[fam] / kernel_ns
        svg.rect(x, top, w, _TRACK_H, FAMILY_COLOURS[fam],
                 tip=f"{fam}: {share:.1f}% of kernel time ({totals[fam] / 1e6:.3f} ms)")
        if w >= LABEL_MIN_PX:
            svg.text(x + 3.0, top + 13.0, f"{fam} {share:.0f}%", size=10.0)
        x += w
    if busy_bar:
        assert idle_pct is not None
        y = top + 30.0
        busy_w = PLOT_WIDTH * (100.0 - idle_pct) / 100.0
        what = f" of {span_ns / 1e6:.3f} ms" if span_ns else ""
        svg.text(_LEFT - 6.0, y + 13.0, "GPU busy / idle", size=10.0, anchor="end")
        svg.rect(_LEFT, y, busy_w, _TRACK_H, "#555555", tip=f"busy {100.0 - idle_pct:.1f}%{what}")
        svg.rect(_LEFT + busy_w, y, PLOT_WIDTH - busy_w, _TRACK_H, _IDLE,
                 tip=f"idle {idle_pct:.1f}%{what}")
        svg.text(_LEFT + 3.0, y + 13.0, f"busy {100.0 - idle_pct:.1f}%{what}", size=10.0,
                 fill="#FFFFFF" if busy_w >= LABEL_MIN_PX else "#222222")
    for i, fam in enumerate(fams):
        lx, ly = _LEFT + (i % 5) * 200.0, legend_y + 20.0 * (i // 5)
        svg.rect(lx, ly, 14.0, 12.0, FAMILY_COLOURS[fam], stroke="#666666")
        svg.text(lx + 20.0, ly + 10.5, fam, size=11.0)
    where = "the steady window" if window else "the whole run"
    caption = (f"No timeline trace of this run is at home, so this is not a timeline: the "
               f"Tier 2 kernel table ({source}) keeps each kernel's total time, not when it "
               f"ran. Kernel time by family over {where}"
               + (", and the span's busy and idle shares." if busy_bar else "."))
    return Picture(svg.document(), caption)
