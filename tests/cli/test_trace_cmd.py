"""``gpuws trace RUN``: the pulled timeline trace written here, checked, with how to open
it; hostile traces clipped or refused with one line. The trace is built by the agent's
own merger from the real H200 DDP traces (tests/fixtures/real-programs-h200)."""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from cli.test_entry_points import (  # type: ignore[import-not-found]
    RECORDED,
    gpuws,
    one_clean_line,
)
from gpuws.live import tracefile
from gpuws.remote_agent.measure import timeline_trace as tt
from gpuws.remote_agent.measure.torch_profile import read_results
from gpuws.sessions.store import Store

REAL = Path(__file__).parents[1] / "fixtures" / "real-programs-h200"


def _real_trace(tmp: Path) -> bytes:
    out, art = tmp / "out", tmp / "art"
    out.mkdir()
    art.mkdir()
    for rank, pid in ((0, 100), (1, 101)):
        with gzip.open(REAL / f"ddp-rank{rank}.trace.json.gz", "rb") as src, \
                open(out / f"torch-trace-{pid}-r{rank}.json", "wb") as dst:
            shutil.copyfileobj(src, dst)
    merger = tt.Merger()
    read_results(str(out), merger=merger)
    path = merger.write(str(art))
    assert path is not None
    return Path(path).read_bytes()


def _store_run(tmp: Path, data: bytes, pulled: bool = True) -> str:
    local = tmp / "pulled.trace.json.gz"
    local.write_bytes(data)
    with Store() as store:
        sid = store.open_session("pod", "local", None, 3.99, started=RECORDED.T0)
        store.ingest_many(sid, RECORDED.saxpy_run("r1"))
        store.record_artifact("r1", tt.FILE_NAME, "/pod/art/" + tt.FILE_NAME, len(data),
                              hashlib.sha256(data).hexdigest())
        if pulled:
            store.mark_pulled("r1", tt.FILE_NAME, local)
    return "r1"


def test_writes_the_real_two_rank_trace_plain_or_gzipped(tmp_path: Path) -> None:
    run = _store_run(tmp_path, _real_trace(tmp_path))
    plain = tmp_path / "t.json"
    res = gpuws("trace", run, "-o", str(plain))
    assert res.returncode == 0, res.stderr
    assert "ui.perfetto.dev" in res.stdout and "chrome://tracing" in res.stdout
    doc = json.loads(plain.read_text())
    assert {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"} \
        == {"rank 0", "rank 1"}
    assert any(e["name"].startswith("judged window") for e in doc["traceEvents"])
    gz = tmp_path / "t.json.gz"
    assert gpuws("trace", run, "-o", str(gz)).returncode == 0
    with gzip.open(gz, "rt") as f:
        assert json.load(f) == doc


def test_a_trace_still_on_the_pod_says_pull_it(tmp_path: Path) -> None:
    run = _store_run(tmp_path, b"{}", pulled=False)
    line = one_clean_line(gpuws("trace", run, "-o", str(tmp_path / "x.json")), 2)
    assert "still on the pod" in line and "gpuws pull r1" in line


def test_a_run_without_a_trace_says_so(tmp_path: Path) -> None:
    with Store() as store:
        sid = store.open_session("pod", "local", None, 3.99, started=RECORDED.T0)
        store.ingest_many(sid, RECORDED.saxpy_run("r1"))
    assert "kept no timeline trace" in one_clean_line(gpuws("trace", "r1"), 2)


@pytest.mark.parametrize(("body", "why"), [
    (b"\x1f\x8bnot gzip", "not valid gzip"),
    (b"[1, 2]", "no traceEvents list"),
    (b"{\"traceEvents\": 5}", "no traceEvents list"),
    (b"{\"traceEvents\": [" + b"[" * 5000 + b"]" * 5000 + b"]}", "not JSON"),
], ids=["bad-gzip", "a-list", "events-not-a-list", "nested-too-deep"])
def test_a_broken_trace_is_refused_in_one_line(tmp_path: Path, body: bytes, why: str) -> None:
    run = _store_run(tmp_path, body)
    out = tmp_path / "x.json"
    assert why in one_clean_line(gpuws("trace", run, "-o", str(out)), 1)
    assert not out.exists()


def test_hostile_events_are_clipped_with_one_line(tmp_path: Path) -> None:
    events: list[Any] = [
        {"ph": "X", "name": "<b>" + "k" * 5000, "ts": 1, "dur": 2, "pid": 0, "tid": 0},
        {"ph": "X", "name": "neg", "ts": -1, "dur": 2, "pid": 0, "tid": 0},
        {"ph": "X", "name": "late", "ts": 1, "dur": -2, "pid": 0, "tid": 0},
        {"ph": "X", "name": "nopid", "ts": 1, "dur": 2},
        "junk", {"ph": 3, "ts": 1, "pid": 0, "tid": 0},
        {"ph": "X", "name": "overlap", "ts": 0, "dur": 10, "pid": 0, "tid": 0},
    ]
    run = _store_run(tmp_path, json.dumps({"traceEvents": events}).encode())
    out = tmp_path / "x.json"
    res = gpuws("trace", run, "-o", str(out))
    assert res.returncode == 0, res.stderr
    clipped = [ln for ln in res.stdout.splitlines() if ln.startswith("gpuws: trace clipped")]
    assert len(clipped) == 1 and "5 malformed" in clipped[0] and "1 name(s) cut" in clipped[0]
    kept = json.loads(out.read_text())["traceEvents"]
    assert [len(e["name"]) for e in kept] == [tracefile.MAX_NAME, len("overlap")]


def test_too_many_tracks_or_events_are_refused() -> None:
    many = {"traceEvents": [{"ph": "X", "name": "k", "ts": 0, "dur": 1, "pid": 0, "tid": i}
                            for i in range(tracefile.MAX_TRACKS + 1)]}
    with pytest.raises(tracefile.TraceError, match="tracks"):
        tracefile.validate(many)
    with pytest.raises(tracefile.TraceError, match="events"):
        tracefile.validate({"traceEvents": [{}] * 11}, max_events=10)
    with pytest.raises(tracefile.TraceError, match="decompresses past"):
        tracefile.read_json(gzip.compress(b" " * 2048), max_json=1024)


def test_an_unknown_run_points_to_history() -> None:
    assert "`gpuws history` lists the stored runs" in one_clean_line(gpuws("trace", "nope"), 2)
