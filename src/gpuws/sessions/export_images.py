"""The pictures of an exported session: SVG files written beside the markdown, linked
relatively from each run's section.

Per run, from what the store holds:
- **Timeline**: the pulled ``timeline.trace.json.gz`` (checked again by
  :mod:`gpuws.live.tracefile`, read bounded) drawn by
  :func:`gpuws.timeline.overview.timeline_svg`; without a pulled trace, the last Tier 2
  kernel table's time by family (:func:`~gpuws.timeline.overview.shares_svg`), which is
  all a table keeps: totals, not when kernels ran.
- **Roofline**: each Tier 3 launch with an ncu FLOP count, DRAM bytes and a duration,
  under the peaks the run's Tier 1 recorded (:mod:`gpuws.timeline.roofline_svg`).

Pictures are pure functions of the stored data, so the same session gives the same bytes.
A trace that cannot be read or is refused gives no picture and one sentence saying why
in the report, never a failed export.
"""

from __future__ import annotations

import hashlib
import re
import urllib.parse
from dataclasses import dataclass, field

from gpuws import protocol
from gpuws.errors import GpuwsError
from gpuws.sessions.store import RunRow, Store
from gpuws.text.textsafe import md_text
from gpuws.timeline.overview import Picture, shares_svg, timeline_svg
from gpuws.timeline.roofline_svg import (
    GBPS_RANGE,
    TFLOPS_RANGE,
    Point,
    Roofs,
    point_of,
    roofline_svg,
    usable,
)

#: The artifact a Tier 2 run keeps (remote_agent/measure/timeline_trace.FILE_NAME).
TRACE_ARTIFACT = "timeline.trace.json.gz"
#: Bytes of a pulled trace read for a picture (as ``gpuws trace`` reads it).
MAX_TRACE_BYTES = 512 << 20
_SAFE_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass
class Figures:
    """What one export draws: ``files`` (file name → SVG text) for the caller to write
    beside the markdown named ``stem`` + ``.md``, each linked from its run's section."""

    stem: str
    files: dict[str, str] = field(default_factory=dict)

    def name(self, run_id: str, what: str) -> str:
        """The file's name: the report's stem, the run (its id where it is plain, else
        a hash of it) and what it shows."""
        rid = run_id if _SAFE_ID.fullmatch(run_id) else \
            hashlib.sha256(run_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        return f"{self.stem}.{rid}.{what}.svg"

    def _figure(self, run_id: str, what: str, heading: str, pic: Picture) -> list[str]:
        name = self.name(run_id, what)
        self.files[name] = pic.svg
        # The link is relative (the file lies beside the report) and URL-quoted: a stem
        # with spaces or brackets still makes one image, and the alt text is ours.
        return [f"### {heading}", "", f"![{heading}]({urllib.parse.quote(name)})", "",
                md_text(pic.caption)]

    def timeline(self, store: Store, run: RunRow) -> list[str]:
        """The run's timeline section (nothing when the run has no Tier 2 data)."""
        trace = [a for a in store.artifacts(run.run_id) if a.name == TRACE_ARTIFACT]
        title = f"Run {run.run_id}: timeline"
        why = ""
        if trace and trace[0].status == "pulled" and trace[0].local_path:
            try:
                events, note = _trace_events(trace[0].local_path)
            except GpuwsError as exc:
                why = f"The timeline trace was not drawn: {exc.message}."
            else:
                pic = timeline_svg(events, title)
                if pic is not None:
                    if note:  # what the trace checker clipped, said where it shows
                        pic = Picture(pic.svg, f"{pic.caption} The trace as pulled: {note}.")
                    return self._figure(run.run_id, "timeline", "Timeline (Tier 2 trace)", pic)
                why = "The timeline trace holds no GPU event."
        elif trace:
            why = (f"The run's timeline trace is still on the pod ({trace[0].status}): "
                   f"gpuws pull {run.run_id} brings it home for the timeline picture.")
        tables = [e for e in store.run_events(run.run_id, ["kernel_table"])
                  if isinstance(e, protocol.KernelTable)]
        if not tables:
            return [md_text(why)] if why else []
        t = tables[-1]
        w = t.window
        pic = shares_svg([(k.name, k.total_ns) for k in t.kernels], title, source=t.source,
                         span_ns=t.span_ns, idle_pct=t.gpu_idle_pct,
                         window=(f"{w.label} {w.first_step}-{w.last_step} ({w.basis})"
                                 if w is not None else None),
                         left_out=[(p.phase, p.ns) for p in (w.left_out if w else [])])
        if pic is None:
            return [md_text(why)] if why else []
        out = self._figure(run.run_id, "timeline", "Kernel time by family (Tier 2 table)", pic)
        return out + (["", md_text(why)] if why else [])

    def roofline(self, store: Store, run: RunRow) -> list[str]:
        """The run's roofline section (nothing when Tier 3 profiled no launch)."""
        rows = store.metrics(run.run_id)
        if not rows:
            return []
        points: list[Point] = []
        notes: list[str] = []
        for r in rows:
            m = r.metrics
            got = point_of(r.kernel, r.launch, m.get("flops"), m.get("dram_bytes"),
                           m.get("duration_ns"))
            (points.append(got) if isinstance(got, Point) else notes.append(got))
        tier1 = [e for e in store.run_events(run.run_id, ["tier1_result"])
                 if isinstance(e, protocol.Tier1Result)]
        t1 = tier1[-1] if tier1 else None
        roofs = Roofs(usable(t1.peak_gbps, GBPS_RANGE) if t1 else None,
                      usable(t1.peak_tflops, TFLOPS_RANGE) if t1 else None,
                      (t1.peak_source or "no source given") if t1 else "no Tier 1 result")
        pic = roofline_svg(points, roofs, f"Run {run.run_id}: roofline", notes)
        if pic is None:
            return [md_text("No roofline: " + "; ".join(notes[:5]) + ".")] if notes else []
        return self._figure(run.run_id, "roofline", "Roofline (Tier 3)", pic)


def _trace_events(path: str) -> tuple[list[dict[str, object]], str]:
    """The pulled trace's events, checked as ``gpuws trace`` checks them, and the
    checker's line on what it clipped ("" if nothing).

    Raises:
        GpuwsError: unreadable, too large, or refused by :func:`tracefile.validate`.
    """
    # The checker of pulled traces lives with the engine that pulls them; one checker.
    from gpuws.live import tracefile

    try:
        with open(path, "rb") as f:
            data = f.read(MAX_TRACE_BYTES + 1)
    except OSError as exc:
        raise GpuwsError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_TRACE_BYTES:
        raise GpuwsError(f"the trace is over {MAX_TRACE_BYTES >> 20} MiB")
    doc, note = tracefile.validate(tracefile.read_json(data))
    events: list[dict[str, object]] = doc["traceEvents"]
    return events, note
