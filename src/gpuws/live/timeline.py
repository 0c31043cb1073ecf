"""A run's timeline as rows across time, for a face to draw (no Textual here).

The pulled trace (``timeline.trace.json.gz``, checked by :func:`.tracefile.validate`)
becomes one :class:`Track` per rank and stream of GPU events (kernels, memcpy, memset),
sorted by start, plus the judged steady window and the one-time phases it left out, and
per rank the idle gaps between GPU work.

A view (a time range drawn in ``n`` columns) is aggregated per column, so a redraw costs
what the columns and the events in view cost, never the whole trace:

- a track of many events keeps an overview of :data:`BINS` bins, made once when the
  trace is read; a view whose column covers at least two bins is drawn from it;
- a narrower view walks the events inside it, at most :data:`MAX_WALK` of them (beyond,
  every k-th, its time counted k times: the view says so in :attr:`Columns.stride`).

Times are microseconds from the first GPU event (Chrome traces count in µs).
"""

from __future__ import annotations

import bisect
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..timeline.families import FAMILY_ORDER, kernel_family
from . import tracefile

#: The trace's artifact name (remote_agent/measure/timeline_trace.FILE_NAME).
FILE_NAME = "timeline.trace.json.gz"
#: The families blocks are coloured by, in legend order (the index is what a track keeps):
#: the one classifier the export's pictures and the verdict use.
FAMILIES = FAMILY_ORDER
_FAMILY_INDEX = {name: i for i, name in enumerate(FAMILIES)}
#: Idle time of a rank's GPU at least this long is a gap (``g`` jumps to the next): a few
#: launch latencies; shorter idle is the launch overhead between back-to-back kernels.
GAP_MIN_US = 20.0
#: Overview bins of a track with at least :data:`BINS_MIN_EVENTS` events.
BINS = 8192
BINS_MIN_EVENTS = 2 * BINS
#: Most events one view walks (beyond, a stride): ~50 ms of Python on a laptop core.
MAX_WALK = 40_000
#: Bytes of a pulled trace read (the agent keeps ~10^6 events, ~100 MB gzipped at most).
MAX_FILE_BYTES = 512 << 20
_GPU_CATS = {"kernel", "memcpy", "memset"}


@dataclass
class Track:
    """One stream of one rank: its GPU events in start order (parallel lists).

    Attributes:
        rank: the process's label (``rank 0``).
        stream: the stream's label (``stream 7``).
        starts: each event's start (µs from the timeline's origin).
        ends: each event's end.
        reach: the running maximum of ``ends`` (events of a hostile trace may overlap;
            the first event reaching past a time is found by bisecting this).
        names: each event's name, as an index into :attr:`Timeline.names`.
        fams: each event's family, as an index into :data:`FAMILIES`.
        bins: the overview (busy fraction and family per bin), or None for a short track.
    """

    rank: str
    stream: str
    starts: list[float] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)
    reach: list[float] = field(default_factory=list)
    names: list[int] = field(default_factory=list)
    fams: list[int] = field(default_factory=list)
    bins: Columns | None = None
    _instances: dict[int, list[int]] = field(default_factory=dict, repr=False)

    @property
    def label(self) -> str:
        """``rank 0 · stream 7``."""
        return f"{self.rank} · {self.stream}"

    def __len__(self) -> int:
        return len(self.starts)

    def instances(self, name: int) -> list[int]:
        """The indexes of every event of one name on this track, in time order."""
        got = self._instances.get(name)
        if got is None:
            got = self._instances[name] = [i for i, n in enumerate(self.names) if n == name]
        return got

    def at(self, t: float) -> int | None:
        """The event running at ``t``, else the first one after it (None: none after)."""
        i = bisect.bisect_right(self.reach, t)
        return i if i < len(self.starts) else None


@dataclass(frozen=True)
class Columns:
    """A view of one track aggregated per column.

    Attributes:
        busy: the share of each column's time the stream was busy (0 to 1).
        family: the family that took most of each column's busy time (-1: idle).
        stride: 1 when every event in view was walked; k when every k-th was.
    """

    busy: list[float]
    family: list[int]
    stride: int = 1


@dataclass
class Timeline:
    """A run's GPU timeline.

    Attributes:
        tracks: one per rank and stream, ranks in order.
        names: every distinct event name (tracks index into it).
        end: the last GPU event's end (µs from the origin, the first event's start).
        window: the judged steady window ``(start, end, label)`` of the first rank that
            has one, if the trace marks one.
        windows: each rank's judged window, by the rank's label.
        phases: the one-time phases the verdict left out, as the trace names them.
        gaps: per rank, the idle stretches of its GPU of at least :data:`GAP_MIN_US`.
        note: what the trace's check clipped ("" if nothing).
    """

    tracks: list[Track]
    names: list[str]
    end: float
    window: tuple[float, float, str] | None = None
    windows: dict[str, tuple[float, float, str]] = field(default_factory=dict)
    phases: list[str] = field(default_factory=list)
    gaps: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    note: str = ""

    @property
    def events(self) -> int:
        """GPU events over all tracks."""
        return sum(len(t) for t in self.tracks)

    def next_gap(self, rank: str, after: float) -> tuple[float, float] | None:
        """The first gap of ``rank`` that starts at or after ``after`` (None: no more)."""
        gaps = self.gaps.get(rank, [])
        i = bisect.bisect_left(gaps, (after, -math.inf))
        return gaps[i] if i < len(gaps) else None


def _natural(text: str) -> tuple[tuple[int, int | str], ...]:
    """A sort key putting ``stream 7`` before ``stream 15`` (numbers as numbers)."""
    return tuple((0, int(part)) if part.isdigit() else (1, part)
                 for part in re.split(r"(\d+)", text) if part)


def _label(value: Any, prefix: str) -> str:
    text = str(value)[:64]
    return text if text.startswith(prefix) else f"{prefix} {text}"


def build(doc: dict[str, Any], note: str = "") -> Timeline:
    """The timeline of a checked trace (the output of :func:`.tracefile.validate`).

    Args:
        doc: the trace: ``{"traceEvents": [...]}``, every event with ``ph``, ``ts``,
            ``dur``, ``pid``, ``tid`` and ``name`` (validate guarantees them).
        note: what the check clipped, kept for the view to say.
    """
    raw: dict[tuple[str, str], list[tuple[float, float, int, int]]] = {}
    names: dict[str, int] = {}
    rank_names: dict[str, str] = {}
    marked: dict[str, tuple[float, float, str]] = {}
    families: dict[tuple[int, str], int] = {}
    phases: list[str] = []
    for ev in doc["traceEvents"]:
        ph, cat = ev["ph"], ev.get("cat", "")
        pid = str(ev["pid"])
        if ph == "M":
            if ev["name"] == "process_name" and isinstance(ev.get("args"), dict) \
                    and isinstance(ev["args"].get("name"), str):
                rank_names[pid] = ev["args"]["name"][:64]
            continue
        if cat == "gpuws":
            if ph == "X" and pid not in marked and len(marked) < 4096:
                marked[pid] = (ev["ts"], ev["ts"] + ev["dur"], ev["name"])
            elif ph == "i" and len(phases) < 32:
                phases.append(ev["name"])
            continue
        if ph != "X" or cat not in _GPU_CATS:
            continue
        name = ev["name"]
        index = names.setdefault(name, len(names))
        # Once per distinct kernel: a trace repeats a few dozen names thousands of times,
        # and the classifier's substring tests were 2/3 of the build's time.
        fam = families.get((index, cat))
        if fam is None:
            fam = families[(index, cat)] = _FAMILY_INDEX[kernel_family(name, cat)]
        raw.setdefault((pid, str(ev["tid"])), []).append(
            (ev["ts"], ev["ts"] + ev["dur"], index, fam))
    for evs in raw.values():
        evs.sort()
    origin = min((evs[0][0] for evs in raw.values()), default=0.0)
    if marked:
        first = min(w[0] for w in marked.values())
        origin = min(origin, first) if raw else first
    tracks: list[Track] = []

    for key in sorted(raw, key=lambda k: (_natural(k[0]), _natural(k[1]))):
        pid, tid = key
        track = Track(rank=rank_names.get(pid) or _label(pid, "rank"),
                      stream=_label(tid, "stream"))
        top = -math.inf
        for s, e, n, f in raw[key]:
            track.starts.append(s - origin)
            track.ends.append(e - origin)
            top = max(top, e - origin)
            track.reach.append(top)
            track.names.append(n)
            track.fams.append(f)
        tracks.append(track)
    end = max((t.reach[-1] for t in tracks), default=0.0)
    for track in tracks:
        if len(track) >= BINS_MIN_EVENTS and end > 0:
            track.bins = _walk(track, 0.0, end, BINS, limit=None)
    windows = {rank_names.get(pid) or _label(pid, "rank"): (lo - origin, hi - origin, name)
               for pid, (lo, hi, name) in sorted(marked.items(), key=lambda kv: _natural(kv[0]))}
    window = next(iter(windows.values()), None)
    return Timeline(tracks=tracks, names=list(names), end=end, window=window, windows=windows,
                    phases=phases,
                    gaps=_gaps(tracks), note=note)


def _gaps(tracks: list[Track]) -> dict[str, list[tuple[float, float]]]:
    """Per rank, where none of its streams ran anything for at least GAP_MIN_US."""
    by_rank: dict[str, list[Track]] = {}
    for t in tracks:
        by_rank.setdefault(t.rank, []).append(t)
    out: dict[str, list[tuple[float, float]]] = {}
    for rank, group in by_rank.items():
        spans = sorted(((s, e) for t in group for s, e in zip(t.starts, t.ends, strict=True)))
        gaps: list[tuple[float, float]] = []
        reach = -math.inf
        for s, e in spans:
            if reach != -math.inf and s - reach >= GAP_MIN_US:
                gaps.append((reach, s))
            reach = max(reach, e)
        out[rank] = gaps
    return out


def columns(track: Track, lo: float, hi: float, n: int) -> Columns:
    """``track`` between ``lo`` and ``hi`` (µs) aggregated into ``n`` columns."""
    if n <= 0 or hi <= lo:
        return Columns([0.0] * max(n, 0), [-1] * max(n, 0))
    bins = track.bins
    if bins is not None and track.reach:
        width = track.reach[-1] / len(bins.busy) if bins.busy else 0.0
        if width > 0 and (hi - lo) / n >= 2 * width:
            return _from_bins(bins, width, lo, hi, n)
    return _walk(track, lo, hi, n, limit=MAX_WALK)


def _walk(track: Track, lo: float, hi: float, n: int, limit: int | None) -> Columns:
    dt = (hi - lo) / n
    nf = len(FAMILIES)
    # Per family: time in the column's partial ends, and a difference array for the
    # columns an event covers whole (O(1) per event, however long it is).
    part = [[0.0] * n for _ in range(nf)]
    whole = [[0.0] * (n + 1) for _ in range(nf)]
    i0 = bisect.bisect_right(track.reach, lo)
    i1 = bisect.bisect_left(track.starts, hi)
    stride = 1 if limit is None else max(1, math.ceil((i1 - i0) / limit))
    starts, ends, fams = track.starts, track.ends, track.fams
    for i in range(i0, i1, stride):
        s, e = max(starts[i], lo), min(ends[i], hi)
        if e <= s:
            continue
        f = fams[i]
        c0 = min(n - 1, int((s - lo) / dt))
        c1 = min(n - 1, int((e - lo) / dt))
        if c0 == c1:
            part[f][c0] += (e - s) * stride
            continue
        part[f][c0] += (lo + (c0 + 1) * dt - s) * stride
        part[f][c1] += (e - (lo + c1 * dt)) * stride
        if c1 > c0 + 1:
            whole[f][c0 + 1] += dt * stride
            whole[f][c1] -= dt * stride
    busy = [0.0] * n
    best = [-1] * n
    top = [0.0] * n
    for f in range(nf):
        run = 0.0
        pf, wf = part[f], whole[f]
        for c in range(n):
            run += wf[c]
            t = pf[c] + run
            if t > 0:
                busy[c] += t
                if t > top[c]:
                    top[c], best[c] = t, f
    return Columns([min(1.0, b / dt) for b in busy], best, stride)


def _from_bins(bins: Columns, width: float, lo: float, hi: float, n: int) -> Columns:
    """A wide view from the overview: each bin goes to the column holding its middle."""
    dt = (hi - lo) / n
    busy = [0.0] * n
    weight = [[0.0] * len(FAMILIES) for _ in range(n)]
    b0 = max(0, int(lo / width))
    b1 = min(len(bins.busy), math.ceil(hi / width))
    for b in range(b0, b1):
        mid = (b + 0.5) * width
        if not lo <= mid < hi or bins.family[b] < 0:
            continue
        c = min(n - 1, int((mid - lo) / dt))
        t = bins.busy[b] * width
        busy[c] += t
        weight[c][bins.family[b]] += t
    fam = [max(range(len(FAMILIES)), key=w.__getitem__) if busy[c] > 0 else -1
           for c, w in enumerate(weight)]
    return Columns([min(1.0, b / dt) for b in busy], fam)


class TimelineError(tracefile.TraceError):
    """The run's timeline cannot be drawn (why, and what to do)."""


def load(path: str | Path) -> Timeline:
    """Read a pulled trace file, check it (:mod:`.tracefile`) and build its timeline.

    Raises:
        TraceError: unreadable, too big, not a Chrome trace, or over the bounds.
    """
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise TimelineError(f"cannot read the run's timeline trace {path}: "
                            f"{exc.strerror or exc}", title="Trace unreadable",
                            remedy="pull the run again (`gpuws pull RUN`)") from None
    if len(data) > MAX_FILE_BYTES:
        raise TimelineError(f"the run's timeline trace is over {MAX_FILE_BYTES >> 20} MiB",
                            title="Trace refused",
                            remedy="open it in Perfetto instead (`gpuws trace RUN`)")
    doc, note = tracefile.validate(tracefile.read_json(data))
    return build(doc, note)
