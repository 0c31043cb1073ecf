"""The merged Chrome trace of a Tier 2 run (timeline_trace), from the real H200 traces
in tests/fixtures/real-programs-h200 and from hostile ones."""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path
from typing import Any

from gpuws.remote_agent.measure import timeline_trace as tt
from gpuws.remote_agent.measure.torch_profile import read_results

REAL = Path(__file__).parents[2] / "fixtures" / "real-programs-h200"


def _two_ranks(out: Path) -> None:
    for rank, pid in ((0, 100), (1, 101)):
        with gzip.open(REAL / f"ddp-rank{rank}.trace.json.gz", "rb") as src, \
                open(out / f"torch-trace-{pid}-r{rank}.json", "wb") as dst:
            shutil.copyfileobj(src, dst)


def _read(path: str) -> dict[str, Any]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        doc: dict[str, Any] = json.load(f)
    return doc


def test_two_real_ranks_give_one_trace_with_a_track_each_and_the_window(tmp_path: Path) -> None:
    out, art = tmp_path / "out", tmp_path / "art"
    out.mkdir()
    art.mkdir()
    _two_ranks(out)
    merger = tt.Merger()
    got = read_results(str(out), merger=merger)
    path = merger.write(str(art))
    assert path == str(art / tt.FILE_NAME)
    doc = _read(path)
    events = doc["traceEvents"]
    names = {e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {"rank 0", "rank 1"}
    kernels = [e for e in events if e.get("cat") == "kernel"]
    assert {e["pid"] for e in kernels} == {0, 1}
    assert any(e["name"].startswith("nvjet_sm90") for e in kernels)
    # The judged window, on each rank, spans the steps the verdict counted.
    windows = [e for e in events if e["name"].startswith("judged window")]
    assert {e["pid"] for e in windows} == {0, 1}
    for w in windows:
        rank = next(r for r in got["ranks"] if r["rank"] == w["pid"])
        step = rank["window"]
        assert f"{step['first_step']}-{step['last_step']}" in w["name"]
        assert abs(w["dur"] - step["step_ns"] * step["steps"] / 1000.0) < 0.01 * w["dur"]
    # No host runtime calls unless asked; every event has the fields a viewer needs.
    assert not [e for e in events if e.get("cat") == "runtime"]
    for e in events:
        assert {"ph", "ts", "pid", "tid", "name"} <= set(e)
    assert not os.path.exists(path + ".tmp")


def test_hf_generate_marks_the_left_out_phases(tmp_path: Path) -> None:
    with gzip.open(REAL / "hf-generate-2layers-last8steps.trace.json.gz", "rt") as f:
        trace = json.load(f)
    from gpuws.remote_agent.measure.trace_analysis import analyse
    found = analyse(trace)
    merger = tt.Merger(host=True)
    merger.add(trace, found["rank"], found)
    doc = merger.document()
    left = [e for e in doc["traceEvents"] if e["name"].startswith("left out:")]
    assert len(left) == len(found["window"]["left_out"]) >= 1
    assert all(e["ph"] == "i" for e in left)
    assert [e for e in doc["traceEvents"] if e.get("cat") == "runtime"]
    assert any("decode steps" in e["name"] for e in doc["traceEvents"])


def test_hostile_events_are_bounded_or_skipped() -> None:
    trace = {"traceEvents": [
        {"ph": "X", "cat": "kernel", "name": "k" * 100000, "ts": 1, "dur": 2},
        {"ph": "X", "cat": "kernel", "name": "neg", "ts": -5, "dur": 2},
        {"ph": "X", "cat": "kernel", "name": "nan", "ts": float("nan"), "dur": 2},
        {"ph": "X", "cat": "kernel", "name": "inf", "ts": 1, "dur": float("inf")},
        {"ph": "X", "cat": "kernel", "name": "str", "ts": "x", "dur": 2},
        "not an event", None, {"ph": "X"},
    ] + [{"ph": "X", "cat": "gpu_memcpy", "name": "c", "ts": i, "dur": 1} for i in range(50)]}
    merger = tt.Merger(limit=10)
    merger.add(trace, None, None)
    doc = merger.document()
    evs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(evs) == 10
    assert len(evs[0]["name"]) == tt.MAX_NAME
    assert {e["name"] for e in evs} & {"neg", "nan", "inf", "str"} == set()
    assert doc["otherData"]["dropped_events"] == 41


def test_no_gpu_event_writes_no_file_and_a_planted_link_is_not_followed(tmp_path: Path) -> None:
    merger = tt.Merger()
    merger.add({"traceEvents": []}, 0, None)
    assert merger.write(str(tmp_path)) is None
    assert not (tmp_path / tt.FILE_NAME).exists()
    victim = tmp_path / "victim"
    victim.write_text("keep")
    os.symlink(victim, tmp_path / (tt.FILE_NAME + ".tmp"))
    merger.add({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1}]},
               0, None)
    path = merger.write(str(tmp_path))
    assert path is not None and victim.read_text() == "keep"
    assert {e["pid"] for e in _read(path)["traceEvents"] if e["ph"] == "X"} == {1}


def test_nsys_exports_are_bounded_like_torch_traces() -> None:
    """An nsys export's rows count against the same cap (the rest dropped and counted)."""
    fix = Path(__file__).parents[2] / "fixtures" / "nsys-2023.4.4-h100" / "nsys_cupy.sqlite"
    merger = tt.Merger(limit=10)
    merger.add_nsys(str(fix))
    assert len(merger.events) == 10 and merger.dropped > 40
    assert merger.document()["otherData"]["dropped_events"] == merger.dropped
