"""Tier 2 parsers: which kernels matter, and how busy the GPU was between them.

Standard library only (runs on the pod's python3 >= 3.8). Three sources feed one ranked
kernel table (:func:`rank_kernels`, dicts shaped like ``protocol.KernelRow``):

- ``nsys stats --report cuda_gpu_kern_sum --format csv`` (and the pre-2023 report name
  ``gpukernsum``, whose columns differ): :func:`parse_nsys_kern_sum_csv`;
- the sqlite that ``nsys export --type sqlite`` writes: :func:`parse_nsys_sqlite`, which
  also measures GPU idle gaps and the memcpy share over the kernel span;
- torch.profiler's ``key_averages().table()`` text, for Python workloads when nsys is
  missing or broken: :func:`parse_torch_key_averages`.

Intermediate rows are dicts with at least ``name``, ``calls`` and ``total_ns``; extra
keys are allowed and dropped by :func:`rank_kernels`.
"""

from __future__ import annotations

import csv
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import quote


class Tier2ParseError(ValueError):
    """The input is not the report the parser expects."""


_UNIT_NS = {"ns": 1.0, "us": 1e3, "\u00b5s": 1e3, "\u03bcs": 1e3, "usec": 1e3, "ms": 1e6,
            "msec": 1e6, "s": 1e9, "sec": 1e9, "nsec": 1.0}


def _to_float(text: str) -> float:
    # nsys prints plain numbers in CSV, but its text tables use thousands separators;
    # accept both so a --format mixup is not fatal.
    return float(text.strip().replace(",", ""))


# ----------------------------------------------------------------------------- nsys CSV
# Column headers, from NVIDIA's report scripts that nsys runs (<nsys>/host-linux-x64/reports/):
#
# cuda_gpu_kern_sum.py (nsys >= 2023.1; StatsReport renders "Total Time:dur_ns" as
# "Total Time (ns)"; NVIDIA forum thread https://forums.developer.nvidia.com/t/280209 shows
# the same columns printed by nsys):
#   Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Name
# gpukernsum.py of nsys 2022.x uses the same StatsReport headers, and nsys 2022.4 adds
# GridXYZ,BlockXYZ before Name (one row per name+grid+block);
# gpukernsum.py of nsys 2020.x/2021.x (nsysstats.Report, query aliases verbatim):
#   Time(%),Total Time (ns),Instances,Average,Minimum,Maximum,Name
# `nsys stats --timeunit` changes "(ns)" to "(us)", "(ms)" or "(s)".
def _header_key(cell: str) -> tuple[str, float]:
    """Canonical column key and the ns factor of its unit for one header cell."""
    text = cell.strip().strip('"').strip()
    unit = 1.0
    m = re.match(r"^(.*?)\s*\(([^)]*)\)\s*$", text)
    if m:
        text, unit_text = m.group(1), m.group(2).strip().lower()
        unit = _UNIT_NS.get(unit_text, 1.0)
    low = re.sub(r"\s+", " ", text.lower())
    keys = {
        "time": "time_pct", "time(%)": "time_pct", "total time": "total", "instances": "calls",
        "count": "calls", "avg": "avg", "average": "avg", "med": "med", "median": "med",
        "min": "min", "minimum": "min", "max": "max", "maximum": "max", "stddev": "stddev",
        "std dev": "stddev", "name": "name", "gridxyz": "grid", "blockxyz": "block",
    }
    return keys.get(low, low), unit


def parse_nsys_kern_sum_csv(text: str) -> list[dict[str, Any]]:
    """Kernel rows from ``nsys stats --report cuda_gpu_kern_sum|gpukernsum --format csv``.

    Lines before the header (``Generating SQLite file …``, ``Processing […] with […]…``)
    are skipped; the table ends at the first blank or malformed line.

    Returns:
        Rows with ``name``, ``calls``, ``total_ns``, ``mean_ns`` and, when the report has
        them, ``median_ns``, ``min_ns``, ``max_ns``, ``stddev_ns``, ``grid``, ``block``.
        Empty when nsys says the report holds no CUDA kernel data.

    Raises:
        Tier2ParseError: No kernel-summary header in ``text``.
    """
    lines = text.splitlines()
    header_at = None
    columns: list[tuple[str, float]] = []
    for i, line in enumerate(lines):
        if "instances" not in line.lower() or "name" not in line.lower():
            continue
        cells = next(csv.reader([line]))
        columns = [_header_key(c) for c in cells]
        keys = [k for k, _ in columns]
        if "total" in keys and "calls" in keys and "name" in keys:
            header_at = i
            break
    if header_at is None:
        if re.search(r"does not contain (CUDA kernel|any) data|SKIPPED", text, re.I):
            return []
        first = next((ln.strip() for ln in lines if ln.strip()), "empty output")
        raise Tier2ParseError(f"no CUDA kernel summary table in nsys output: {first[:200]}")
    rows: list[dict[str, Any]] = []
    for cells in csv.reader(lines[header_at + 1:]):
        if not cells or not "".join(cells).strip() or len(cells) != len(columns):
            break
        row: dict[str, Any] = {}
        try:
            for (key, unit), cell in ((columns[j], cells[j]) for j in range(len(cells))):
                if key == "name":
                    row["name"] = cell.strip()
                elif key in ("grid", "block"):
                    row[key] = " ".join(cell.split())
                elif key == "calls":
                    row["calls"] = int(_to_float(cell))
                elif key in ("total", "avg", "med", "min", "max", "stddev"):
                    row[key] = _to_float(cell) * unit
        except ValueError:
            break
        calls = row["calls"]
        out: dict[str, Any] = {
            "name": row["name"], "calls": calls, "total_ns": row["total"],
            "mean_ns": row["avg"] if "avg" in row else (row["total"] / calls if calls else 0.0),
        }
        for key, out_key in (("med", "median_ns"), ("min", "min_ns"), ("max", "max_ns"),
                             ("stddev", "stddev_ns"), ("grid", "grid"), ("block", "block")):
            if key in row:
                out[out_key] = row[key]
        rows.append(out)
    return rows


# ----------------------------------------------------------------------------- torch.profiler
_TORCH_TIME = re.compile(r"^([-+]?\d+(?:\.\d+)?)\s*(ns|us|ms|s)$")
_MEMOP = re.compile(r"^(Memcpy|Memset)\b")


def _torch_time_ns(text: str) -> float:
    m = _TORCH_TIME.match(text.strip())
    if not m:
        raise ValueError(f"not a torch.profiler time: {text!r}")
    return float(m.group(1)) * _UNIT_NS[m.group(2)]


def _column_spans(separator: str) -> list[tuple[int, int]]:
    """Column [start, end) from a ``-----  -----`` line; each runs to the next column."""
    starts = [m.start() for m in re.finditer(r"-+", separator)]
    return [(s, starts[i + 1] if i + 1 < len(starts) else 1 << 30)
            for i, s in enumerate(starts)]


def parse_torch_key_averages(text: str, include_memops: bool = False) -> list[dict[str, Any]]:
    """Device-side rows of torch.profiler's ``key_averages().table()``.

    A GPU kernel's row has no CPU time of its own (``CPU total`` is 0) and a non-zero
    ``Self CUDA`` (``Self XPU`` etc. on other devices); operator rows (``aten::…``) carry
    their kernels' time too and are skipped so nothing is counted twice.

    Args:
        text: The printed table (warnings before it are fine).
        include_memops: Keep ``Memcpy …``/``Memset …`` device rows (not kernels).

    Returns:
        Rows with ``name``, ``calls``, ``total_ns`` (self device time), ``mean_ns`` and
        ``truncated`` (torch cut the name to the column width and appended ``...``).

    Raises:
        Tier2ParseError: No key_averages table in ``text``.
    """
    lines = text.splitlines()
    for i in range(len(lines) - 2):
        if not re.fullmatch(r"\s*-+(\s+-+)+\s*", lines[i]):
            continue
        spans = _column_spans(lines[i])
        headers = [lines[i + 1][a:b].strip() for a, b in spans]
        if "Name" in headers and "# of Calls" in headers:
            return _torch_rows(lines[i + 3:], spans, headers, include_memops)
    raise Tier2ParseError("no torch.profiler key_averages table (no 'Name' / '# of Calls' header)")


def _torch_rows(lines: list[str], spans: list[tuple[int, int]], headers: list[str],
                include_memops: bool) -> list[dict[str, Any]]:
    col = {h: j for j, h in enumerate(headers)}
    # torch names the device columns after use_device.upper(): "Self CUDA", "Self XPU".
    self_dev = next((j for j, h in enumerate(headers)
                     if re.fullmatch(r"Self (?!CPU\b)\S+", h)), None)
    if self_dev is None:
        raise Tier2ParseError("torch.profiler table has no 'Self CUDA' column "
                              "(was the profiler run without ProfilerActivity.CUDA?)")
    cpu = col.get("CPU total", col.get("Self CPU"))
    rows: list[dict[str, Any]] = []
    for line in lines:
        if re.fullmatch(r"\s*-+(\s+-+)+\s*", line) or not line.strip():
            break
        cells = [line[a:b].strip() for a, b in spans]
        try:
            total = _torch_time_ns(cells[self_dev])
            calls = int(cells[col["# of Calls"]])
            cpu_ns = _torch_time_ns(cells[cpu]) if cpu is not None else 0.0
        except (ValueError, IndexError):
            continue
        name = cells[col["Name"]]
        if cpu_ns > 0 or total <= 0 or (not include_memops and _MEMOP.match(name)):
            continue
        rows.append({"name": name, "calls": calls, "total_ns": total,
                     "mean_ns": total / calls if calls else 0.0,
                     "truncated": name.endswith("...")})
    return rows


# ----------------------------------------------------------------------------- nsys sqlite
class _Union:
    """Running length of a union of intervals fed in order of start."""

    def __init__(self) -> None:
        self.total = 0
        self.gaps: list[int] = []
        self._cur: tuple[int, int] | None = None

    def add(self, start: int, end: int) -> None:
        if self._cur is None:
            self._cur = (start, end)
        elif start > self._cur[1]:
            self.total += self._cur[1] - self._cur[0]
            self.gaps.append(start - self._cur[1])
            self._cur = (start, end)
        elif end > self._cur[1]:
            self._cur = (self._cur[0], end)

    def close(self) -> None:
        if self._cur is not None:
            self.total += self._cur[1] - self._cur[0]
            self._cur = None


def timeline_stats(spans: Mapping[int, tuple[int, int]],
                   intervals: Iterable[tuple[int, int, int, str]]) -> dict[str, Any]:
    """GPU busy/idle time over each device's kernel span.

    Per device the span runs from its first kernel's start to its last kernel's end.
    The GPU is busy while a kernel, memcpy or memset runs (overlaps counted once);
    idle time is the rest of the span. Devices are summed.

    Args:
        spans: deviceId → (first kernel start, last kernel end), ns.
        intervals: (deviceId, start, end, kind) with kind ``kernel``/``memcpy``/``memset``,
            sorted by (deviceId, start).

    Returns:
        ``span_ns``, ``busy_ns``, ``idle_ns``, ``kernel_ns``, ``memcpy_ns``,
        ``memset_ns``, ``gap_count`` (idle gaps inside spans), ``largest_gap_ns``,
        ``gpu_idle_pct`` and ``memcpy_pct`` (of the span; None when there is no span).
    """
    totals = {"busy": 0, "kernel": 0, "memcpy": 0, "memset": 0}
    gaps: list[int] = []
    device: int | None = None
    unions: dict[str, _Union] = {}

    def flush() -> None:
        for key, union in unions.items():
            union.close()
            totals[key] += union.total
        gaps.extend(unions["busy"].gaps if "busy" in unions else [])

    for dev, start, end, kind in intervals:
        if dev != device:
            if device is not None:
                flush()
            device = dev
            unions = {k: _Union() for k in totals}
        if dev not in spans:
            continue  # copies on a device that ran no kernel are outside any span
        lo, hi = spans[dev]
        start, end = max(start, lo), min(end, hi)
        if end <= start:
            continue
        unions["busy"].add(start, end)
        unions[kind].add(start, end)
    if device is not None:
        flush()
    span = sum(hi - lo for lo, hi in spans.values())
    idle = span - totals["busy"]
    return {
        "span_ns": span,
        "busy_ns": totals["busy"],
        "idle_ns": idle,
        "kernel_ns": totals["kernel"],
        "memcpy_ns": totals["memcpy"],
        "memset_ns": totals["memset"],
        "gap_count": len(gaps),
        "largest_gap_ns": max(gaps) if gaps else 0,
        "gpu_idle_pct": 100.0 * idle / span if span > 0 else None,
        "memcpy_pct": 100.0 * totals["memcpy"] / span if span > 0 else None,
    }


_KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
#: A launch's grid and block in the kernel table.
_DIMS = ("gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ")
_RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
#: The host calls that wait for the GPU (runtime and driver API; nsys suffixes the
#: runtime's with its version, ``cudaStreamSynchronize_v3020``). A blocking copy to the
#: host (``.item()``) is a cudaMemcpyAsync then a cudaStreamSynchronize: counted once.
SYNC_CALL = re.compile(r"^(cuda(Stream|Device|Event)Synchronize|cu(Stream|Ctx|Event)Synchronize)")
_COPY_TABLES = (("CUPTI_ACTIVITY_KIND_MEMCPY", "memcpy"), ("CUPTI_ACTIVITY_KIND_MEMSET", "memset"))


def parse_nsys_sqlite(path: str) -> dict[str, Any]:
    """Kernel rows and GPU idle/memcpy figures from an ``nsys export --type sqlite`` file.

    Uses the documented tables (nsys SQLite export schema reference,
    https://docs.nvidia.com/nsight-systems/ exported_data): ``CUPTI_ACTIVITY_KIND_KERNEL``
    (``start``, ``end``, ``deviceId``, ``demangledName``/``shortName`` → ``StringIds``),
    ``CUPTI_ACTIVITY_KIND_MEMCPY`` and ``_MEMSET`` (``start``, ``end``, ``deviceId``).
    nsys creates tables lazily, so each may be missing.

    Returns:
        ``{"kernels": rows (name, calls, total_ns, mean_ns), "kernel_count": n,
        "devices": n, "instances": :func:`launch_instances` (empty where the export has no
        grid/block columns), **timeline_stats(...)}``.

    Raises:
        Tier2ParseError: The file cannot be opened as sqlite, or this python3 has no
            sqlite3 module.
    """
    try:
        import sqlite3  # some minimal pythons are built without it
    except ImportError as exc:
        raise Tier2ParseError(f"this python3 has no sqlite3 module ({exc})") from exc
    if not os.path.isfile(path):
        raise Tier2ParseError(f"{path}: no such file")
    uri = "file:" + quote(os.path.abspath(path)) + "?mode=ro"
    try:
        con = sqlite3.connect(uri, uri=True)
    except sqlite3.Error as exc:
        raise Tier2ParseError(f"{path}: {exc}") from exc
    try:
        return _read_nsys_db(con)
    except sqlite3.DatabaseError as exc:
        raise Tier2ParseError(f"{path}: not an nsys sqlite export ({exc})") from exc
    finally:
        con.close()


def _columns(con: Any, table: str) -> list[str]:
    return [str(r[1]) for r in con.execute(f"PRAGMA table_info({table})")]


def _read_nsys_db(con: Any) -> dict[str, Any]:
    tables = {str(r[0]) for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    empty = timeline_stats({}, [])
    if _KERNEL not in tables:
        return {"kernels": [], "kernel_count": 0, "devices": 0, **empty}
    kcols = _columns(con, _KERNEL)
    name_col = next((c for c in ("demangledName", "shortName", "mangledName", "name")
                     if c in kcols), None)
    dev = "deviceId" if "deviceId" in kcols else "0"
    if name_col is None:
        name_sql, join = "'unknown kernel'", ""
    elif "StringIds" in tables:
        name_sql = f"COALESCE(s.value, 'kernel #' || k.{name_col})"
        join = f"LEFT JOIN StringIds AS s ON s.id = k.{name_col}"
    else:
        name_sql, join = f"'kernel #' || k.{name_col}", ""
    kernels = [
        {"name": str(name), "calls": int(calls), "total_ns": float(total),
         "mean_ns": float(total) / int(calls) if calls else 0.0}
        for name, calls, total in con.execute(
            f"SELECT {name_sql}, count(*), sum(k.end - k.start) FROM {_KERNEL} AS k {join} "
            # start = end = 0 marks a kernel CUPTI could not time; it has no duration.
            "WHERE k.end > k.start GROUP BY 1")
    ]
    spans = {int(d): (int(lo), int(hi)) for d, lo, hi in con.execute(
        f"SELECT {dev}, min(start), max(end) FROM {_KERNEL} WHERE end > start GROUP BY 1")}
    parts = [f"SELECT {dev} AS d, start, end, 'kernel' FROM {_KERNEL} WHERE end > start"]
    for table, kind in _COPY_TABLES:
        if table in tables:
            tdev = "deviceId" if "deviceId" in _columns(con, table) else "0"
            parts.append(f"SELECT {tdev}, start, end, '{kind}' FROM {table} WHERE end > start")
    ordered = con.execute(" UNION ALL ".join(parts) + " ORDER BY 1, 2")
    stats = timeline_stats(spans, ((int(d), int(s), int(e), str(k)) for d, s, e, k in ordered))
    syncs = None
    if _RUNTIME in tables and "StringIds" in tables and "nameId" in _columns(con, _RUNTIME):
        syncs = [(int(lo), int(hi)) for name, lo, hi in con.execute(
            f"SELECT s.value, r.start, r.end FROM {_RUNTIME} AS r JOIN StringIds AS s "
            "ON s.id = r.nameId WHERE s.value LIKE '%ynchronize%' AND r.end >= r.start")
            if SYNC_CALL.match(str(name))]
    instances: dict[str, dict[str, Any]] = {}
    if all(c in kcols for c in _DIMS):
        instances = launch_instances(con.execute(
            f"SELECT {name_sql}, {', '.join('k.' + c for c in _DIMS)}, k.end - k.start "
            # GPU order: one stream's is its launch order, which is what ncu counts.
            f"FROM {_KERNEL} AS k {join} WHERE k.end > k.start ORDER BY k.start"))
    return {"kernels": kernels, "kernel_count": sum(k["calls"] for k in kernels),
            "devices": len(spans), "instances": instances, **stats,
            **sync_stats(spans, syncs)}


def ncu_dims(text: Any) -> list[Any]:
    """``[x, y, z]`` of ncu's ``(262144, 1, 1)`` (Grid Size, Block Size); ``[None] * 3``
    for anything else."""
    m = re.fullmatch(r"\((\d{1,10}), (\d{1,10}), (\d{1,10})\)", str(text or "").strip())
    return [int(v) for v in m.groups()] if m else [None] * 3


def launch_instances(launches: Iterable[Sequence[Any]]) -> dict[str, dict[str, Any]]:
    """``{name: {"grid", "block", "launch_skip"}}`` from launches in launch order (``name,
    gridX, gridY, gridZ, blockX, blockY, blockZ, ns``: an nsys export's, ncu's): each kernel's
    launch configuration that took most of its time, and its launches before the first
    of it (the ``--launch-skip`` that brings ncu there). A launch with dimensions no GPU
    runs (0, negative, not integers) counts but names no configuration."""
    seen: dict[str, int] = {}
    first: dict[str, dict[tuple[str, str], int]] = {}
    took: dict[str, dict[tuple[str, str], float]] = {}
    for name, gx, gy, gz, bx, by, bz, ns in launches:
        key = str(name)
        index = seen.get(key, 0)
        seen[key] = index + 1
        dims = [gx, gy, gz, bx, by, bz]
        if not all(isinstance(v, int) and not isinstance(v, bool) and 0 < v < 1 << 32
                   for v in dims):
            continue
        config = ("(%d, %d, %d)" % tuple(dims[:3]), "(%d, %d, %d)" % tuple(dims[3:]))
        first.setdefault(key, {}).setdefault(config, index)
        per = took.setdefault(key, {})
        per[config] = per.get(config, 0.0) + float(ns or 0)
    out: dict[str, dict[str, Any]] = {}
    for key, per in took.items():
        # dicts keep first-seen order, so a tie goes to the configuration seen first.
        config = max(per.items(), key=lambda kv: kv[1])[0]
        out[key] = {"grid": config[0], "block": config[1], "launch_skip": first[key][config]}
    return out


def sync_stats(spans: Mapping[int, tuple[int, int]], syncs: list[tuple[int, int]] | None
               ) -> dict[str, Any]:
    """The host's waits for the GPU that end inside the kernel span (first kernel's start
    to the last one's end, over every device): how many, and the host time blocked in them.
    None for both where the trace has no host API calls to look in."""
    if syncs is None:
        return {"sync_count": None, "sync_ns": None}
    if not spans:
        return {"sync_count": 0, "sync_ns": 0}
    lo = min(a for a, _ in spans.values())
    hi = max(b for _, b in spans.values())
    inside = [(a, b) for a, b in syncs if lo <= b <= hi]
    return {"sync_count": len(inside), "sync_ns": sum(b - a for a, b in inside)}


# ----------------------------------------------------------------------------- ranking
def rank_kernels(rows: Iterable[Mapping[str, Any]], limit: int | None = None
                 ) -> list[dict[str, Any]]:
    """The ranked kernel table: ``protocol.KernelRow`` dicts, most total time first.

    Rows with the same name (nsys 2022.4 splits a kernel by grid/block) are merged.
    ``share_pct`` is each kernel's part of the summed time of all rows, before ``limit``.

    Args:
        rows: Dicts with ``name``, ``calls`` and ``total_ns`` (other keys ignored).
        limit: Keep only the first ``limit`` kernels.
    """
    merged: dict[str, list[float]] = {}
    for row in rows:
        acc = merged.setdefault(str(row["name"]), [0.0, 0.0])
        acc[0] += int(row.get("calls") or 0)
        acc[1] += float(row.get("total_ns") or 0.0)
    grand = sum(total for _calls, total in merged.values())
    ranked = sorted(merged.items(), key=lambda kv: (-kv[1][1], kv[0]))
    out = [
        {"name": name, "calls": int(calls), "total_ns": total,
         "mean_ns": total / calls if calls else 0.0,
         "share_pct": 100.0 * total / grand if grand > 0 else 0.0}
        for name, (calls, total) in ranked
    ]
    return out if limit is None else out[:limit]


# ----------------------------------------------------------------------------- torch trace
#: Chrome-trace categories of device activity (kineto writes them lower-case since torch
#: 1.8: ``kernel``, ``gpu_memcpy``, ``gpu_memset``; older traces say ``Kernel``, ``Memcpy``).
_TRACE_KINDS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "memcpy": "memcpy",
                "gpu_memset": "memset", "memset": "memset"}


def parse_torch_trace(trace: Mapping[str, Any]) -> dict[str, Any]:
    """Kernel rows and GPU idle/memcpy figures from torch.profiler's Chrome trace.

    ``prof.export_chrome_trace()`` writes ``{"traceEvents": [...]}``; a device activity
    is a complete event (``"ph": "X"``) of category ``kernel``/``gpu_memcpy``/
    ``gpu_memset`` with ``ts`` and ``dur`` in microseconds (fractions carry the ns) and
    the device in ``args.device`` (else ``pid``). The figures are those of
    :func:`timeline_stats` over each device's kernel span.

    Returns:
        ``{"kernels": rows (name, calls, total_ns, mean_ns), **timeline_stats(...)}``.

    Raises:
        Tier2ParseError: ``trace`` has no ``traceEvents`` list.
    """
    events = trace.get("traceEvents") if isinstance(trace, Mapping) else None
    if not isinstance(events, list):
        raise Tier2ParseError("not a Chrome trace: no traceEvents list")
    intervals: list[tuple[int, int, int, str]] = []
    kernels: dict[str, list[float]] = {}
    syncs: list[tuple[int, int]] | None = None
    for ev in events:
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        cat = str(ev.get("cat", "")).lower()
        if cat in ("cuda_runtime", "cuda_driver"):
            syncs = syncs if syncs is not None else []  # the trace has host API calls
            if SYNC_CALL.match(str(ev.get("name", ""))):
                try:
                    start = round(float(ev["ts"]) * 1000.0)
                    syncs.append((start, start + round(float(ev["dur"]) * 1000.0)))
                except (KeyError, TypeError, ValueError):
                    pass
            continue
        kind = _TRACE_KINDS.get(cat)
        if kind is None:
            continue
        try:
            start = round(float(ev["ts"]) * 1000.0)
            end = start + round(float(ev["dur"]) * 1000.0)
            args = ev.get("args")
            device = int((args if isinstance(args, dict) else {}).get("device",
                                                                       ev.get("pid")) or 0)
        except (KeyError, TypeError, ValueError):
            continue
        if end <= start:
            continue
        intervals.append((device, start, end, kind))
        if kind == "kernel":
            acc = kernels.setdefault(str(ev.get("name", "unknown kernel")), [0, 0.0])
            acc[0] += 1
            acc[1] += end - start
    intervals.sort()
    spans: dict[int, tuple[int, int]] = {}
    for device, start, end, kind in intervals:
        if kind == "kernel":
            lo, hi = spans.get(device, (start, end))
            spans[device] = (min(lo, start), max(hi, end))
    rows = [{"name": name, "calls": int(calls), "total_ns": float(total),
             "mean_ns": float(total) / calls if calls else 0.0}
            for name, (calls, total) in kernels.items()]
    return {"kernels": rows, **timeline_stats(spans, intervals), **sync_stats(spans, syncs)}


def merge_timelines(parts: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The idle and memcpy shares of several processes' timelines (spans and gaps summed,
    the longest gap kept)."""
    span = idle = memcpy = gaps = longest = 0
    sync_count: int | None = None
    sync_ns: int | None = None
    for part in parts:
        if part.get("sync_count") is not None:
            sync_count = (sync_count or 0) + int(part.get("sync_count") or 0)
            sync_ns = (sync_ns or 0) + int(part.get("sync_ns") or 0)
        span += int(part.get("span_ns") or 0)
        idle += int(part.get("idle_ns") or 0)
        memcpy += int(part.get("memcpy_ns") or 0)
        gaps += int(part.get("gap_count") or 0)
        longest = max(longest, int(part.get("largest_gap_ns") or 0))
    return {"span_ns": span, "idle_ns": idle, "memcpy_ns": memcpy, "gap_count": gaps,
            "largest_gap_ns": longest, "sync_count": sync_count, "sync_ns": sync_ns,
            "gpu_idle_pct": 100.0 * idle / span if span > 0 else None,
            "memcpy_pct": 100.0 * memcpy / span if span > 0 else None}
