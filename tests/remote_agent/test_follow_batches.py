"""``runs.follow`` forwards whole lines, many per write, from exactly ``from_seq``."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from gpuws import protocol
from gpuws.remote_agent import runs, wire

RUN = "follow-batches"
EVENTS = 12_000  # ~1.6 MB: several of follow's 1 MiB reads, lines torn across them


def write_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, finished: bool) -> Path:
    """A run's log written by the agent's own EventLog (ended by run_finished, or not)."""
    monkeypatch.setenv("GPUWS_POD_CACHE", str(tmp_path / "pod"))
    rdir = Path(runs.run_dir(RUN))
    rdir.mkdir(parents=True, mode=0o700)
    (rdir / "spec.json").write_text(json.dumps({"workload": "builtin:saxpy"}))
    events = runs.EventLog(RUN, str(rdir / "events.ndjson"))
    for i in range(EVENTS):
        events.append(wire.make("output", stream="stdout", text=f"line {i} " + "x" * 90))
    if finished:
        events.append(wire.make("run_finished", status="ok", wall_s=1.0, exit_code=0))
    events.close()
    return rdir / "events.ndjson"


@pytest.fixture
def log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return write_log(tmp_path, monkeypatch, finished=True)


def follow(from_seq: int, live: bool) -> tuple[list[bytes], int]:
    writes: list[bytes] = []
    nxt = runs.follow(RUN, from_seq, writes.append, threading.Event(), follow_live=live)
    return writes, nxt


@pytest.mark.parametrize("from_seq", [0, 1, 5_000, 7_777, EVENTS])
def test_replay_from_any_seq_is_exactly_the_rest_of_the_log(log: Path, from_seq: int) -> None:
    lines = log.read_bytes().splitlines(keepends=True)
    writes, nxt = follow(from_seq, live=True)
    assert nxt == EVENTS + 1  # stopped at run_finished
    assert b"".join(writes) == b"".join(lines[from_seq:])
    assert all(w.endswith(b"\n") for w in writes)  # never a torn line
    if from_seq == 0:
        assert 1 < len(writes) <= 3  # a write per 1 MiB read, not one per event
    first = protocol.decode_event(writes[0].split(b"\n", 1)[0])
    assert first.seq == from_seq  # type: ignore[union-attr]


def test_a_line_still_being_written_is_held_back(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    log = write_log(tmp_path, monkeypatch, finished=False)
    whole = log.read_bytes()
    with open(log, "ab") as f:  # the worker is in the middle of its next line
        f.write(b'{"type":"output","run_id":"follow-batches","seq":12000,"te')
    writes, nxt = follow(EVENTS - 2, live=False)
    assert b"".join(writes) == b"".join(whole.splitlines(keepends=True)[EVENTS - 2:])
    assert nxt == EVENTS


def test_from_seq_past_the_end_sends_nothing(log: Path) -> None:
    writes, nxt = follow(EVENTS + 5, live=False)
    assert writes == [] and nxt == EVENTS + 1
    assert os.path.getsize(log) > 1 << 20


def test_an_event_appended_to_a_line_left_open_is_rescued(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race ``EventLog.append`` cannot close: the workload writes into the run's log
    between the worker's check for an open line and its write, so the worker's event ends
    a 12 MB line of garbage (dropped while it is read) or a 9 MB one (whose end comes in
    the read that crosses the limit). ``follow`` drops each line but forwards the event at
    its end (the pod's follower reads the real file; nothing here is a stand-in)."""
    monkeypatch.setenv("GPUWS_POD_CACHE", str(tmp_path / "pod"))
    rdir = Path(runs.run_dir(RUN))
    rdir.mkdir(parents=True, mode=0o700)
    path = rdir / "events.ndjson"
    events = runs.EventLog(RUN, str(path))
    events.append(wire.make("output", stream="stdout", text="before"))
    with open(path, "ab") as f:
        f.write(b"x" * 12_000_000)  # left open: no line end (dropped as it is read)
    honest = wire.dumps({"type": "output", "run_id": RUN, "seq": 1, "ts": 1.7e9,
                         "stream": "stdout", "text": "swallowed, then rescued"})
    with open(path, "ab") as f:  # as if written in the instant after the worker's check
        f.write(honest)
    events.seq = 2
    events.append(wire.make("output", stream="stdout", text="after"))
    with open(path, "ab") as f:  # a line that only looks like one: not this run's event
        f.write(b"y" * 9_000_000 + b'{"type":"output","run_id":"other","seq":3}\n')
    with open(path, "ab") as f:
        f.write(b"z" * 9_000_000 + honest.replace(b'"seq":1', b'"seq":3').replace(
            b"swallowed, then rescued", b"rescued again"))
    events.seq = 4
    events.append(wire.make("run_finished", status="ok", wall_s=1.0))
    events.close()
    writes, _ = follow(0, live=True)
    sent = [protocol.decode_event(line) for line in b"".join(writes).splitlines()]
    assert not [e for e in sent if isinstance(e, protocol.BadLine)], sent[:3]
    got = [(e.seq, getattr(e, "text", None)) for e in sent  # type: ignore[union-attr]
           if not isinstance(e, protocol.Error)]
    assert got == [(0, "before"), (1, "swallowed, then rescued"), (2, "after"),
                   (3, "rescued again"), (4, None)]
    assert any(isinstance(e, protocol.Error) and "was dropped" in e.message for e in sent)
