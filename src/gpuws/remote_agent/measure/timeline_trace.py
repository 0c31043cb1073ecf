"""One Chrome/Perfetto trace of a Tier 2 run: the timeline a person opens first.

torch.profiler leaves one trace per process in the run directory and nothing of it comes
home; nsys leaves its SQLite export (:meth:`Merger.add_nsys` reads its GPU activity, a
track per process and stream). From each torch trace this module keeps the GPU's events
(kernels, memcpy/memset) and optionally the host's CUDA runtime calls, puts each process
on its own track (``pid`` = rank, named ``rank N``), marks the steady window the verdict
judged and the one-time phases it left out, and writes ``timeline.trace.json.gz`` into
the run's artifact dir so it is pulled like every artifact (checksummed, bounded).

Input is the workload's own files, so everything is bounded here: names cut to
:data:`MAX_NAME`, at most :data:`MAX_EVENTS` events (the rest dropped and counted),
non-finite or negative times skipped.

Standard library only: this runs on the pod's python3 (>= 3.8).
"""

from __future__ import annotations

import gzip
import json
import math
import os
from typing import Any, Dict, List, Optional, Tuple

#: The artifact's file name (the laptop's ``gpuws trace`` looks for it).
FILE_NAME = "timeline.trace.json.gz"
#: Characters kept of a name (kernel names of templated code run to several KiB).
MAX_NAME = 1024
#: Events kept over all processes: ~100 B each gzipped, so the artifact stays far
#: under the pull caps.
MAX_EVENTS = 1000000
_GPU_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "memcpy": "memcpy",
             "gpu_memset": "memset", "memset": "memset"}
_HOST_CATS = ("cuda_runtime", "cuda_driver")


def _num(value: Any) -> Optional[float]:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) and x >= 0 else None


def _track(ev: Dict[str, Any], gpu: bool) -> Any:
    """The thread of an event inside its rank's process: a stream on the GPU, else the
    host thread (kept apart by a prefix, since torch numbers both from small ints)."""
    args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
    assert isinstance(args, dict)
    if gpu:
        stream = args.get("stream", ev.get("tid"))
        return "stream %s" % str(stream)[:40]
    return "host %s" % str(ev.get("tid"))[:40]


def events_of(trace: Any, rank: int, host: bool = False, limit: int = MAX_EVENTS
              ) -> Tuple[List[Dict[str, Any]], int]:
    """The GPU events (and with ``host`` the CUDA runtime calls) of one process's trace,
    as Chrome ``X`` events on process ``rank``; returns (events, how many were dropped
    over ``limit``)."""
    raw = trace.get("traceEvents") if isinstance(trace, dict) else None
    out: List[Dict[str, Any]] = []
    dropped = 0
    if not isinstance(raw, list):
        return out, 0
    for ev in raw:
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        cat = str(ev.get("cat", "")).lower()
        kind = _GPU_CATS.get(cat)
        if kind is None and not (host and cat in _HOST_CATS):
            continue
        ts, dur = _num(ev.get("ts")), _num(ev.get("dur") or 0)
        if ts is None or dur is None:
            continue
        if len(out) >= limit:
            dropped += 1
            continue
        out.append({"ph": "X", "cat": kind or "runtime", "name": str(ev.get("name", ""))[:MAX_NAME],
                    "ts": ts, "dur": dur, "pid": rank, "tid": _track(ev, kind is not None)})
    return out, dropped


def marks(rank: int, bounds_ns: Optional[Tuple[int, int]], window: Optional[Dict[str, Any]],
          start_us: Optional[float]) -> List[Dict[str, Any]]:
    """The judged window as a complete event on its own ``verdict`` track, and each
    one-time phase it left out as an instant event at the run's first GPU event."""
    out: List[Dict[str, Any]] = []
    if bounds_ns is None or window is None:
        return out
    lo, hi = bounds_ns
    label = str(window.get("label") or "steps")[:100]
    name = "judged window: %s %s-%s" % (label, window.get("first_step"), window.get("last_step"))
    out.append({"ph": "X", "cat": "gpuws", "name": name[:MAX_NAME], "ts": lo / 1000.0,
                "dur": max(0.0, (hi - lo) / 1000.0), "pid": rank, "tid": "verdict"})
    for phase in window.get("left_out") or []:
        if not isinstance(phase, dict):
            continue
        ns = _num(phase.get("ns")) or 0.0
        at = start_us if start_us is not None else lo / 1000.0
        out.append({"ph": "i", "s": "p", "cat": "gpuws", "pid": rank, "tid": "verdict",
                    "name": ("left out: %s (%.3f ms)" % (phase.get("phase"), ns / 1e6))[:MAX_NAME],
                    "ts": at, "dur": 0})
    return out


class Merger:
    """Collects each process's events as it is read (the whole traces are never kept)."""

    def __init__(self, host: bool = False, limit: int = MAX_EVENTS) -> None:
        self.host = host
        self.limit = limit
        self.events: List[Dict[str, Any]] = []
        self.meta: List[Dict[str, Any]] = []
        self.dropped = 0
        self.ranks: List[int] = []

    def add(self, trace: Any, rank: Optional[int], found: Optional[Dict[str, Any]]) -> None:
        """One process: ``rank`` (None: the next free number), ``found`` its analysis."""
        r = rank if rank is not None and rank not in self.ranks else (
            max(self.ranks) + 1 if self.ranks else 0)
        self.ranks.append(r)
        got, dropped = events_of(trace, r, self.host, self.limit - len(self.events))
        self.dropped += dropped
        start = min((e["ts"] for e in got), default=None)
        self.events.extend(got)
        if found:
            self.events.extend(marks(r, found.get("bounds_ns"), found.get("window"), start))
        self.meta.append({"ph": "M", "name": "process_name", "pid": r, "tid": 0, "ts": 0,
                          "dur": 0, "args": {"name": "rank %d" % r}})
        self.meta.append({"ph": "M", "name": "process_sort_index", "pid": r, "tid": 0,
                          "ts": 0, "dur": 0, "args": {"sort_index": r}})

    def add_nsys(self, sqlite_path: str) -> None:
        """The GPU's events of an ``nsys … --export=sqlite`` file, a track per process
        (nsys's ``globalPid``) and per stream. Raises ``sqlite3.Error``/``OSError`` when
        the file cannot be read; a table nsys did not create is skipped."""
        import sqlite3
        from urllib.parse import quote

        con = sqlite3.connect("file:" + quote(os.path.abspath(sqlite_path)) + "?mode=ro",
                              uri=True)
        try:
            pids: Dict[int, int] = {}
            for table, kind in _NSYS_TABLES:
                for row in _nsys_rows(con, table):
                    if len(self.events) >= self.limit:
                        self.dropped += 1
                        continue
                    ev = _nsys_event(row, kind, pids, self.ranks)
                    if ev is not None:
                        self.events.append(ev)
            self.ranks.extend(r for r in pids.values() if r not in self.ranks)
            for pid, rank in pids.items():
                self.meta.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
                                  "ts": 0, "dur": 0,
                                  "args": {"name": "process %d (pid %d)" % (rank, pid)}})
        finally:
            con.close()

    def document(self) -> Dict[str, Any]:
        """The merged Chrome trace (``displayTimeUnit`` ms, times in µs as Chrome wants)."""
        doc: Dict[str, Any] = {"traceEvents": self.meta + self.events,
                               "displayTimeUnit": "ms",
                               "otherData": {"producer": "gpuws", "ranks": len(self.ranks)}}
        if self.dropped:
            doc["otherData"]["dropped_events"] = self.dropped
        return doc

    def write(self, artifact_dir: str) -> Optional[str]:
        """Write the trace into ``artifact_dir`` atomically; returns its path, or None
        when no process gave a GPU event (no file, rather than an empty timeline)."""
        if not self.events:
            return None
        path = os.path.join(artifact_dir, FILE_NAME)
        tmp = path + ".tmp"
        # The workload owns the artifact dir: a link it left at the temporary name must
        # not redirect this write elsewhere (O_NOFOLLOW, O_EXCL after removing it).
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0),
                     0o600)
        with os.fdopen(fd, "wb") as raw:
            with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6) as gz:
                gz.write(json.dumps(self.document(), separators=(",", ":")).encode("utf-8"))
        os.replace(tmp, path)
        return path


#: nsys's SQLite tables of GPU activity (nsys creates each only when it has rows).
_NSYS_TABLES = (("CUPTI_ACTIVITY_KIND_KERNEL", "kernel"), ("CUPTI_ACTIVITY_KIND_MEMCPY", "memcpy"),
                ("CUPTI_ACTIVITY_KIND_MEMSET", "memset"))
#: CUPTI's copy kinds (CUpti_ActivityMemcpyKind), as the names read in nsys.
_COPY_KINDS = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA",
               8: "DtoD", 9: "HtoH", 10: "PtoP"}


def _nsys_rows(con: Any, table: str) -> Any:
    """``(start, end, stream, pid, name)`` of each row of ``table`` (none if it is absent)."""
    cols = [str(r[1]) for r in con.execute("PRAGMA table_info(%s)" % table)]
    if not {"start", "end"} <= set(cols):
        return iter(())
    stream = "streamId" if "streamId" in cols else "0"
    pid = "globalPid" if "globalPid" in cols else "0"
    if table.endswith("KERNEL"):
        name_col = next((c for c in ("demangledName", "shortName") if c in cols), None)
        has_strings = con.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND "
                                  "name='StringIds'").fetchone() is not None
        if name_col is not None and has_strings:
            return con.execute(
                "SELECT t.start, t.end, %s, %s, COALESCE(s.value, 'kernel') FROM %s AS t "
                "LEFT JOIN StringIds AS s ON s.id = t.%s ORDER BY t.start"
                % (stream, pid, table, name_col))
        return con.execute("SELECT start, end, %s, %s, 'kernel' FROM %s ORDER BY start"
                           % (stream, pid, table))
    kind = "copyKind" if "copyKind" in cols else "NULL"
    return con.execute("SELECT start, end, %s, %s, %s FROM %s ORDER BY start"
                       % (stream, pid, kind, table))


def _nsys_event(row: Any, kind: str, pids: Dict[int, int], taken: List[int]
                ) -> Optional[Dict[str, Any]]:
    """One row as a Chrome ``X`` event (µs), its process numbered in order of appearance
    after the numbers ``taken`` already; None for a row CUPTI could not time."""
    start, end, stream, gpid, name = row
    lo, hi = _num(start), _num(end)
    if lo is None or hi is None or hi <= lo:
        return None
    try:
        pid = (int(gpid) >> 24) & 0xFFFFFF  # nsys's globalPid holds the OS pid here
    except (TypeError, ValueError):
        pid = 0
    if pid not in pids:
        pids[pid] = max(taken + list(pids.values()), default=-1) + 1
    if kind == "memcpy":
        label = "memcpy %s" % _COPY_KINDS.get(name, "?") if isinstance(name, int) else "memcpy"
    elif kind == "memset":
        label = "memset"
    else:
        label = str(name)[:MAX_NAME]
    return {"ph": "X", "cat": kind, "name": label, "ts": lo / 1000.0, "dur": (hi - lo) / 1000.0,
            "pid": pids[pid], "tid": "stream %s" % str(stream)[:40]}
