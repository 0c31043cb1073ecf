"""The events and the report recorded on a real H200 (tests/gpu, docs/gpu-validation.md).

They are the truth the laptop side is tested against: the stream decodes strictly, the
store ingests it, the export shows its numbers, and the pulled .ncu-rep reads back through
the `ncu-report` wheel with the same metrics the agent streamed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuws import protocol
from gpuws.cli import main
from gpuws.sessions.export import export_session
from gpuws.sessions.store import Store

REC = Path(__file__).parent / "fixtures" / "recorded"
LINES = (REC / "saxpy_h200.ndjson").read_bytes().splitlines()


def test_recording_decodes_strictly_and_is_gap_free() -> None:
    evs = [protocol.decode_event(line) for line in LINES]
    assert not [e for e in evs if isinstance(e, protocol.BadLine)]
    assert [e.seq for e in evs] == list(range(len(evs)))  # type: ignore[union-attr]
    assert isinstance(evs[-1], protocol.RunFinished) and evs[-1].status == "ok"


def test_recording_ingests_and_exports(tmp_path: Path) -> None:
    with Store(tmp_path / "s.db") as store:
        sid = store.open_session("h200", "ssh+sftp", None, 3.5)
        assert store.ingest_many(sid, LINES) == len(LINES)
        assert store.ingest_many(sid, LINES) == 0  # a resent stream is not stored twice
        run_id = json.loads(LINES[0])["run_id"]
        t1 = store.tier1(run_id)
        assert t1 is not None and abs(t1.stats.median_ms - 0.18726) < 1e-4
        md = export_session(store, sid)
    assert "187.26 µs" in md and "182.34 µs" in md and "DRAM" in md
    assert "--kernel-name-base" in md  # the exact ncu command is in the report


def test_pulled_report_reads_back_like_the_stream(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("ncu_report", reason="the optional ncu-report wheel reads .ncu-rep")
    assert main(["report", str(REC / "saxpy_h200.ncu-rep"), "--json"]) == 0
    kernels = json.loads(capsys.readouterr().out)
    streamed = next(json.loads(x) for x in LINES if b'"kernel_metrics"' in x)
    assert kernels[0]["kernel"].startswith("saxpy")
    for key in ("duration_ns", "dram_throughput_pct", "achieved_occupancy_pct"):
        assert kernels[0]["metrics"][key] == pytest.approx(streamed["metrics"][key], rel=1e-6)
