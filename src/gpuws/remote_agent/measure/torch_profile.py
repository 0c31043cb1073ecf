"""Tier 2 through torch.profiler: preparing the injection and reading what it left.

The profiler itself runs inside the workload (:mod:`.torch_inject`, written into the
run as ``sitecustomize.py``; the ``torchprof`` child mode uses the same writer). This
module gives the workload's environment the two variables that switch it on, and turns
the files it left into one ranked kernel table with the GPU idle and memcpy shares.
The files lie in the workload's own run directory, so they are read as untrusted:
regular files only, bounded in size, a broken one skipped with a reason.

Standard library only: this runs on the pod's python3 (>= 3.8).
"""

from __future__ import annotations

import json
import os
import pkgutil
import re
from typing import Any, Dict, List, Optional

from ..safefiles import read_regular
from .tier2_parse import (
    Tier2ParseError,
    merge_timelines,
    parse_torch_key_averages,
    parse_torch_trace,
    rank_kernels,
)
from .timeline_trace import Merger
from .torch_inject import DIR_ENV
from .trace_analysis import INSTANCE_KEYS, analyse

#: The most bytes of traces and tables read back (all processes together). A Chrome
#: trace takes about 300 B per kernel; this is ~1.5 M kernels, and json.load of it a
#: few GB of memory at most.
MAX_READ_BYTES = 512 << 20
_FILE = re.compile(r"^torch-(trace|keyavg)-(\d+)(?:-r(\d{1,6}))?\.(json|txt)$")
#: Rows kept in each rank's own table (the merged table keeps them all).
RANK_ROWS = 20


def prepare(run_dir: str, env: Dict[str, str], inject: bool, name: str = "torchprof") -> str:
    """Make ``env`` write torch.profiler results under ``run_dir/<name>/out``.

    With ``inject`` the ``sitecustomize`` goes to ``run_dir/<name>/site``, first on
    ``PYTHONPATH``; without, only the output directory is set (the ``torchprof`` child
    starts the profiler itself, and must not get a second one).

    Returns:
        The directory the profiles will be written to (emptied first).
    """
    site = os.path.join(run_dir, name, "site")
    out = os.path.join(run_dir, name, "out")
    os.makedirs(out, mode=0o700, exist_ok=True)
    for old in os.listdir(out):
        try:
            os.unlink(os.path.join(out, old))
        except OSError:
            pass
    if not inject:
        env[DIR_ENV] = out
        return out
    os.makedirs(site, mode=0o700, exist_ok=True)
    source = pkgutil.get_data(__package__ or "gpuws.remote_agent.measure", "torch_inject.py")
    if source is None:
        raise OSError("the agent bundle has no torch_inject.py")
    tmp = os.path.join(site, "sitecustomize.py.tmp")
    with open(tmp, "wb") as f:
        f.write(source)
    os.replace(tmp, os.path.join(site, "sitecustomize.py"))
    old_path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = site + (os.pathsep + old_path if old_path else "")
    env[DIR_ENV] = out
    return out


def prepare_rank(run_dir: str, env: Dict[str, str], rank: int) -> List[str]:
    """Make ``env`` mark rank ``rank``'s process for Tier 3 (see ``torch_inject.mark_rank``)
    without profiling anything; returns the ncu options that profile only inside the mark.

    ncu's NVTX filter (``--nvtx --nvtx-include NAME``, a start/end range without the
    trailing ``/`` that push/pop ranges take) keeps every other process of ``torchrun`` or
    ``mpirun`` unprofiled while they still run, so the collectives complete."""
    from .torch_inject import NVTX_RANK_ENV, RANK_RANGE

    env.pop(DIR_ENV, None)
    prepare(run_dir, env, True, name="ncu-rank")
    env.pop(DIR_ENV, None)
    env[NVTX_RANK_ENV] = str(rank)
    return ["--nvtx", "--nvtx-include", RANK_RANGE % rank]


def ranks_seen(out: str) -> List[int]:
    """The ranks whose profiles lie in ``out`` (from the files' names)."""
    try:
        names = os.listdir(out)
    except OSError:
        return []
    return sorted({int(m.group(3)) for m in map(_FILE.match, names)
                   if m is not None and m.group(3) is not None})


def read_results(out: str, max_bytes: int = MAX_READ_BYTES,
                 merger: Optional[Merger] = None) -> Dict[str, Any]:
    """The ranked kernel table and shares from the files the profiled processes left.

    Kernel rows come from ``key_averages`` tables (:func:`parse_torch_key_averages`),
    or from the traces when there is no table or it cut names short; the idle and memcpy
    shares come from the traces.

    Returns:
        ``{"kernels": ranked rows (may be empty), "gpu_idle_pct", "memcpy_pct",
        "processes": n, "problems": [why a file was skipped, ...]}``.

    With ``merger``, each trace's GPU events and judged window also go into it (the run's
    merged timeline trace, :mod:`.timeline_trace`).
    """
    problems: List[str] = []
    table_rows: List[Dict[str, Any]] = []
    trace_rows: List[Dict[str, Any]] = []
    timelines: List[Dict[str, Any]] = []
    procs: List[Dict[str, Any]] = []
    pids = set()
    budget = max_bytes
    try:
        names = sorted(os.listdir(out))
    except OSError as exc:
        return {"kernels": [], "gpu_idle_pct": None, "memcpy_pct": None, "processes": 0,
                "problems": ["no profile directory: %s" % exc.strerror]}
    for name in names:
        m = _FILE.match(name)
        if m is None:
            if name.endswith(".err"):
                problems.extend(_err_lines(os.path.join(out, name)))
            continue
        if budget <= 0:
            problems.append("%s: over the %d MiB read budget" % (name, max_bytes >> 20))
            continue
        try:
            data = read_regular(os.path.join(out, name), budget + 1)
        except OSError as exc:
            problems.append("%s: %s" % (name, exc.strerror or exc))
            continue
        if len(data) > budget:
            problems.append("%s: over the %d MiB read budget" % (name, max_bytes >> 20))
            budget = 0
            continue
        budget -= len(data)
        pids.add(m.group(2))
        try:
            if m.group(1) == "keyavg":
                table_rows.extend(parse_torch_key_averages(data.decode("utf-8", "replace")))
            else:
                trace = json.loads(data.decode("utf-8", "replace"))
                parsed = parse_torch_trace(trace)
                trace_rows.extend(parsed["kernels"])
                timelines.append(parsed)
                found = analyse(trace)
                if found["kernels"]:
                    if found["rank"] is None and m.group(3) is not None:
                        found["rank"] = int(m.group(3))
                    found["pid"] = int(m.group(2))
                    procs.append(found)
                if merger is not None:
                    merger.add(trace, found["rank"] if found["rank"] is not None else (
                        int(m.group(3)) if m.group(3) is not None else None), found)
        except (Tier2ParseError, ValueError, RecursionError) as exc:
            problems.append("%s: %s" % (name, ("%s" % exc)[:200]))
    if procs:
        return dict(_from_analyses(procs), processes=len(pids), problems=problems)
    shares = merge_timelines(timelines)
    # The table names kernels in full unless this torch cut them ("…..."); the trace
    # never does, and the name feeds Tier 3's kernel regex.
    cut = any(row.get("truncated") for row in table_rows)
    rows = trace_rows if trace_rows and (cut or not table_rows) else table_rows
    return {"kernels": rank_kernels(rows),
            "gpu_idle_pct": shares["gpu_idle_pct"], "memcpy_pct": shares["memcpy_pct"],
            # No trace, no timeline: None, not a span of 0 with no gaps.
            "span_ns": shares["span_ns"] or None,
            "gap_count": shares["gap_count"] if shares["span_ns"] else None,
            "largest_gap_ns": shares["largest_gap_ns"] if shares["span_ns"] else None,
            "sync_count": shares["sync_count"] if shares["span_ns"] else None,
            "sync_ns": shares["sync_ns"] if shares["span_ns"] else None,
            "processes": len(pids), "problems": problems}


def _from_analyses(procs: List[Dict[str, Any]]) -> Dict[str, Any]:
    """One table from each process's steady window (:func:`.trace_analysis.analyse`):
    the rows and shares merged over processes, the window and host time of rank 0 (else
    the busiest process), communication summed, and a table per rank where several ran."""
    procs.sort(key=lambda p: (p["rank"] is None, p["rank"] if p["rank"] is not None else 0,
                              -sum(r["total_ns"] for r in p["kernels"])))
    main = procs[0]
    shares = merge_timelines(procs)
    codes: Dict[str, Any] = {}
    for p in procs:
        for row in p["kernels"]:
            best = codes.get(row["name"])
            if row.get("code") and (best is None or row["calls"] > best[0]):
                codes[row["name"]] = (row["calls"], row["code"])
    rows = rank_kernels(r for p in procs for r in p["kernels"])
    # The instance (launch configuration, launches to skip) is one process's: the main
    # one's, the rank Tier 3 profiles by default.
    instances = {r["name"]: r for r in main["kernels"] if "launch_skip" in r}
    for row in rows:
        if row["name"] in codes:
            row["code"] = codes[row["name"]][1]
        if row["name"] in instances:
            row.update({k: instances[row["name"]][k] for k in INSTANCE_KEYS})
    comms = [p["comm"] for p in procs if p.get("comm")]
    comm = None
    if comms:
        span = sum(float(p.get("span_ns") or 0) for p in procs if p.get("comm"))
        c_ns = sum(c["comm_ns"] for c in comms)
        e_ns = sum(c["exposed_ns"] for c in comms)
        comm = {"where": comms[0]["where"], "comm_ns": c_ns, "exposed_ns": e_ns,
                "comm_pct": 100.0 * c_ns / span if span > 0 else None,
                "exposed_pct": 100.0 * e_ns / span if span > 0 else None}
    ranks = []
    if len(procs) > 1:
        ranks = [{"rank": p["rank"], "pid": p.get("pid"), "kernels": p["kernels"][:RANK_ROWS],
                  "gpu_idle_pct": p.get("gpu_idle_pct"), "span_ns": p.get("span_ns") or None,
                  "window": p.get("window"), "host": p.get("host"), "comm": p.get("comm")}
                 for p in procs]
    timed = bool(shares["span_ns"])
    return {"kernels": rows,
            "gpu_idle_pct": shares["gpu_idle_pct"], "memcpy_pct": shares["memcpy_pct"],
            "span_ns": shares["span_ns"] or None,
            "gap_count": shares["gap_count"] if timed else None,
            "largest_gap_ns": shares["largest_gap_ns"] if timed else None,
            "sync_count": shares["sync_count"] if timed else None,
            "sync_ns": shares["sync_ns"] if timed else None,
            "window": main.get("window"), "host": main.get("host"), "comm": comm,
            "ranks": ranks}


def _err_lines(path: str) -> List[str]:
    try:
        text = read_regular(path, 4096).decode("utf-8", "replace")
    except OSError:
        return []
    return [line.strip()[:300] for line in text.splitlines() if line.strip()][:5]


def source_label(injected: bool) -> str:
    """How the kernel table names this path (``KernelTable.source``)."""
    return "torch.profiler (injected)" if injected else "torch.profiler"
