"""A run's timeline trace, checked before it is written home (``gpuws trace``).

The trace was built on the pod (``remote_agent/measure/timeline_trace.py``) from files the
workload could write, so it is read as hostile: bounded when decompressed, the Chrome
trace schema checked (a ``traceEvents`` list of dicts with ``ph``/``ts``/``pid``/``tid``/
``name``), names cut to 1 KiB, events with non-finite or negative times dropped; a trace
over the event or track bounds is refused. What was clipped is said in one line.
"""

from __future__ import annotations

import gzip
import io
import json
import math
from typing import Any

from ..errors import GpuwsError

#: Events a trace may hold (the agent keeps at most half of this).
MAX_EVENTS = 2_000_000
#: Characters of a name kept.
MAX_NAME = 1024
#: Distinct (process, thread) tracks: a viewer and the TUI draw one row each.
MAX_TRACKS = 4096
#: Bytes of JSON a trace may decompress to (2·10^6 events of ~300 B).
MAX_JSON_BYTES = 1 << 30


class TraceError(GpuwsError):
    """The pulled trace is not one gpuws will write (what is wrong, and what to do)."""


def _time(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    x = float(value)
    return x if math.isfinite(x) and x >= 0 else None


def _refuse(why: str) -> TraceError:
    return TraceError(f"the run's timeline trace {why}", title="Trace refused",
                      remedy="pull the run again (`gpuws pull RUN`); if it persists, the pod "
                             "wrote a broken trace")


def read_json(data: bytes, max_json: int = MAX_JSON_BYTES) -> Any:
    """The JSON of ``data`` (gzip or plain), refused past ``max_json`` decompressed bytes."""
    if data[:2] == b"\x1f\x8b":
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(data)) as gz:
                data = gz.read(max_json + 1)
        except (OSError, EOFError) as exc:
            raise _refuse(f"is not valid gzip ({exc})") from None
    if len(data) > max_json:
        raise _refuse(f"decompresses past {max_json >> 20} MiB")
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise _refuse(f"is not JSON ({str(exc)[:120]})") from None


def validate(doc: Any, max_events: int = MAX_EVENTS,
             max_tracks: int = MAX_TRACKS) -> tuple[dict[str, Any], str]:
    """The trace made safe to write, and one line saying what was clipped ("" if nothing).

    Raises:
        TraceError: not a Chrome trace, or over the event or track bounds.
    """
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        raise _refuse("has no traceEvents list")
    if len(events) > max_events:
        raise _refuse(f"holds {len(events)} events (at most {max_events})")
    kept: list[dict[str, Any]] = []
    tracks: set[tuple[str, str]] = set()
    bad = cut = 0
    for ev in events:
        if not isinstance(ev, dict) or not isinstance(ev.get("ph"), str):
            bad += 1
            continue
        ts, dur = _time(ev.get("ts")), _time(ev.get("dur", 0))
        if ts is None or dur is None or "pid" not in ev or "tid" not in ev:
            bad += 1
            continue
        name = ev.get("name")
        name = name if isinstance(name, str) else str(name)
        if len(name) > MAX_NAME:
            name = name[:MAX_NAME]
            cut += 1
        pid, tid = str(ev["pid"])[:64], str(ev["tid"])[:64]
        tracks.add((pid, tid))
        if len(tracks) > max_tracks:
            raise _refuse(f"has more than {max_tracks} tracks")
        out = {"ph": ev["ph"][:4], "ts": ts, "dur": dur, "pid": ev["pid"], "tid": ev["tid"],
               "name": name}
        if not isinstance(out["pid"], (int, str)) or isinstance(out["pid"], bool):
            out["pid"] = pid
        if not isinstance(out["tid"], (int, str)) or isinstance(out["tid"], bool):
            out["tid"] = tid
        if isinstance(out["pid"], str):
            out["pid"] = out["pid"][:64]
        if isinstance(out["tid"], str):
            out["tid"] = out["tid"][:64]
        if isinstance(ev.get("cat"), str):
            out["cat"] = ev["cat"][:64]
        if ev["ph"] == "i" and ev.get("s") in ("g", "p", "t"):
            out["s"] = ev["s"]
        if ev["ph"] == "M" and isinstance(ev.get("args"), dict):
            arg = ev["args"]
            if isinstance(arg.get("name"), str):
                out["args"] = {"name": arg["name"][:MAX_NAME]}
            elif isinstance(arg.get("sort_index"), int):
                out["args"] = {"sort_index": arg["sort_index"]}
        kept.append(out)
    notes = []
    if bad:
        notes.append(f"{bad} malformed event(s) dropped (no ph/pid/tid or a negative or "
                     f"non-finite time)")
    if cut:
        notes.append(f"{cut} name(s) cut to {MAX_NAME} characters")
    clean: dict[str, Any] = {"traceEvents": kept, "displayTimeUnit": "ms"}
    return clean, "; ".join(notes)


def dump(doc: dict[str, Any], gz: bool) -> bytes:
    """The trace's bytes, gzipped when ``gz``."""
    raw = json.dumps(doc, separators=(",", ":")).encode()
    return gzip.compress(raw, compresslevel=6) if gz else raw
