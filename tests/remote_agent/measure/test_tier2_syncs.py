"""The host's waits for the GPU on Tier 2's timeline (``KernelTable.sync_count`` and
``sync_ns``), read from the real nsys exports of tests/fixtures/nsys-2023.4.4-h100 and
from torch.profiler traces, and what the program verdict makes of them."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Any

from gpuws.remote_agent.measure import tier2_parse as t2
from gpuws.remote_agent.verdicts.program import program_verdict

FIX = Path(__file__).parents[2] / "fixtures" / "nsys-2023.4.4-h100"


def sync_calls(path: Path) -> int:
    con = sqlite3.connect(path)
    try:
        return int(con.execute(
            "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME AS r JOIN StringIds AS s "
            "ON s.id = r.nameId WHERE s.value LIKE '%Synchronize%'").fetchone()[0])
    finally:
        con.close()


def test_the_real_exports_count_the_waits_inside_the_kernel_span() -> None:
    # CuPy: 50 saxpy launches, then a stream and a device sync after the last kernel;
    # torch: its four .item()-style syncs come before the one kernel nsys 2023.4 traced.
    for name, calls in (("nsys_cupy.sqlite", 2), ("nsys_torch.sqlite", 4)):
        assert sync_calls(FIX / name) == calls  # there are waits: none inside the span
        got = t2.parse_nsys_sqlite(str(FIX / name))
        assert (got["sync_count"], got["sync_ns"]) == (0, 0), name


def test_waits_inside_the_span_are_counted_with_their_time(tmp_path: Path) -> None:
    db = tmp_path / "cupy.sqlite"
    shutil.copy(FIX / "nsys_cupy.sqlite", db)
    con = sqlite3.connect(db)
    lo, hi = con.execute("SELECT min(start), max(end) FROM CUPTI_ACTIVITY_KIND_KERNEL "
                         "WHERE end > start").fetchone()
    con.executemany("INSERT INTO StringIds (id, value) VALUES (?, ?)",
                    [(900001, "cudaStreamSynchronize_v3020"), (900002, "cuCtxSynchronize"),
                     (900004, "myDeviceSynchronize")])
    rows = [(lo + 1000, lo + 5000, 900001), (hi - 9000, hi - 1000, 900002),
            (hi + 10, hi + 500, 900001),  # after the span
            (lo + 2000, lo + 3000, 900004)]  # not a CUDA wait
    con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, end, eventClass, "
                    "nameId, returnValue) VALUES (?, ?, 0, ?, 0)", rows)
    con.commit()
    con.close()
    got = t2.parse_nsys_sqlite(str(db))
    # The two CUDA waits inside the span, with the host time blocked in them.
    assert (got["sync_count"], got["sync_ns"]) == (2, 4000 + 8000)


def trace(*extra: dict[str, Any]) -> dict[str, Any]:
    def k(ts: float) -> dict[str, Any]:
        return {"ph": "X", "cat": "kernel", "name": "k", "ts": ts, "dur": 10.0,
                "args": {"device": 0}}
    return {"traceEvents": [k(1000.0), k(1100.0), k(1200.0), *extra]}


def rt(name: str, ts: float, dur: float) -> dict[str, Any]:
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "ts": ts, "dur": dur}


def test_torch_traces_count_the_waits_too() -> None:
    got = t2.parse_torch_trace(trace(rt("cudaLaunchKernel", 999.0, 1.0),
                                     rt("cudaStreamSynchronize", 1050.0, 60.0),
                                     rt("cudaDeviceSynchronize", 1300.0, 5.0),
                                     rt("cudaStreamSynchronize", "bad", 1.0)))
    assert (got["sync_count"], got["sync_ns"]) == (1, 60_000)
    # Host API calls traced, none a wait: 0. No host API calls at all: not known.
    assert t2.parse_torch_trace(trace(rt("cudaLaunchKernel", 999.0, 1.0)))["sync_count"] == 0
    assert t2.parse_torch_trace(trace())["sync_count"] is None
    merged = t2.merge_timelines([t2.parse_torch_trace(trace()),
                                 t2.parse_torch_trace(trace(rt("cudaStreamSynchronize",
                                                               1050.0, 60.0)))])
    assert (merged["sync_count"], merged["sync_ns"]) == (1, 60_000)


def table(sync_count: int | None) -> dict[str, Any]:
    # 100 launches of 20 µs in a 10 ms span, 80% idle in 20 gaps of 400 µs: the host away.
    return {"source": "nsys", "gpu_idle_pct": 80.0, "memcpy_pct": 0.0, "span_ns": 10e6,
            "gap_count": 20, "largest_gap_ns": 500_000.0, "sync_count": sync_count,
            "sync_ns": None if sync_count is None else sync_count * 300_000.0,
            "kernels": [{"name": "k", "calls": 100, "total_ns": 2e6, "mean_ns": 20_000.0,
                         "share_pct": 100.0}]}


def test_the_waits_tell_sync_bound_from_host_bound() -> None:
    unknown = program_verdict(table(None))
    assert unknown["findings"][0]["title"].startswith("Host- or sync-bound")
    synced = program_verdict(table(20))  # a wait before every gap
    first = synced["findings"][0]
    assert (synced["bound"], first["code"]) == ("host", "sync_bound")
    assert first["title"] == "Sync-bound: the GPU is idle 80% of the time after the host " \
        "waits on it"
    assert "20 times (1.00 per idle gap, 400.0 µs idle each)" in first["detail"]
    assert any(".item()" in r for r in first["remedies"])
    away = program_verdict(table(2))
    assert away["findings"][0]["code"] == "host_bound"
    assert away["findings"][0]["title"].startswith("Host-bound:")
    ev = {e["name"]: e["value"] for e in away["evidence"]}
    assert (ev["host waits for the GPU in the span"], ev["host time blocked in them"]) == (
        2, 600_000.0)
