"""Long output lines: cut in 16 KiB pieces on the pod, stored as they came, shown whole.

The pod cuts a line longer than ``procs.CHUNK_BYTES`` into several ``output`` events and
marks every piece but the last ``cont``; the laptop keeps the events as they are and
joins them only to show them (``live.model.LineJoiner``), at most
``MAX_JOINED_CHARS`` characters of a line, the rest counted. No GPU is needed: a
``cmd:`` workload runs on the local pod (the agent as a subprocess of this machine).
"""

from __future__ import annotations

import json
import os
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from gpuws import protocol
from gpuws.cli import main
from gpuws.live.boundary import Boundary
from gpuws.live.model import MAX_JOINED_CHARS, LineJoiner, RunModel
from gpuws.remote_agent import procs
from gpuws.sessions.store import Store

#: 100 KiB of text with two-byte characters in it, so a cut that split a UTF-8 character
#: would show as a replacement character.
LONG = "BEGIN" + "é0123456789abcdef" * 6000 + "END"
SCRIPT = f"""
import sys
sys.stdout.write("before\\n")
sys.stdout.write({LONG!r} + "\\n")
sys.stdout.write("after\\n")
sys.stdout.flush()
sys.stderr.write("E" * 40000)  # no newline: the stream ends inside the line
"""


def _run_local(tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    script = tmp_path / "long_line.py"
    script.write_text(SCRIPT)
    assert main(["run", "local", "-w", f"cmd:{sys.executable} {script}", "--tiers", "1",
                 *extra]) == 0
    return capsys.readouterr().out


def test_a_100_kib_line_is_cut_on_the_pod_stored_as_cut_and_shown_as_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _run_local(tmp_path, capsys)
    shown = [ln for ln in out.splitlines() if "stdout│ " in ln]
    texts = [ln.split("stdout│ ", 1)[1] for ln in shown]
    assert texts == ["before", LONG, "after"]  # one printed line, whole, in order
    err = [ln.split("stderr│ ", 1)[1] for ln in out.splitlines() if "stderr│ " in ln]
    assert err == ["E" * 40000]

    with Store() as store:
        run_id = store.runs(store.sessions()[0].id)[0].run_id
        events = store.events(run_id)
    pieces = [e for e in events if isinstance(e, protocol.Output) and e.stream == "stdout"]
    # Stored as the pod sent them: the long line in pieces of at most 16 KiB, each but
    # its last marked cont.
    assert len(pieces) > 3
    assert [p.cont for p in pieces] == [False] + [True] * (len(pieces) - 3) + [False, False]
    assert "".join(p.text for p in pieces[1:-1]) == LONG
    assert all(len(p.text.encode()) <= procs.CHUNK_BYTES for p in pieces)
    assert "\ufffd" not in "".join(p.text for p in pieces)

    # The run panes (live or replayed from the store) show the same lines.
    model = RunModel(run_id)
    _changed, lines = model.apply(events)
    assert [(ln.stream, ln.text) for ln in lines if ln.stream in ("stdout", "stderr")] == [
        ("stdout", "before"), ("stdout", LONG), ("stdout", "after"), ("stderr", "E" * 40000)]


def test_json_output_keeps_the_pieces_as_they_came(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _run_local(tmp_path, capsys, "--json")
    events = [protocol.decode_event(ln.encode()) for ln in out.splitlines()]
    pieces = [e for e in events if isinstance(e, protocol.Output) and e.stream == "stdout"]
    assert sum(p.cont for p in pieces) == len(pieces) - 3
    assert "".join(p.text for p in pieces) == "before" + LONG + "after"


def test_the_agent_marks_every_piece_but_the_last_and_filters_whole_lines() -> None:
    got: list[dict[str, object]] = []
    code = ("import sys\n"
            "sys.stdout.write('==PROF== Profiling ' + 'x' * 40000 + '\\n')\n"
            "sys.stdout.write('y' * 40000 + '\\n')\n")
    res = procs.run_streaming([sys.executable, "-c", code], emit=got.append, tier=3,
                              cwd=".", env=dict(os.environ),
                              line_filter=lambda s: not s.startswith("==PROF== Profiling"))
    assert res.returncode == 0
    out = [protocol.decode_event(json.dumps(e).encode()) for e in got]
    # The filtered line is dropped whole (its later pieces do not start with the prefix),
    # so no piece marked cont is left without the rest of its line.
    assert all(isinstance(e, protocol.Output) for e in out)
    assert "".join(e.text for e in out) == "y" * 40000  # type: ignore[union-attr]
    assert [e.cont for e in out] == [True, True, False]  # type: ignore[union-attr]


def test_the_boundary_accepts_cont() -> None:
    b = Boundary()
    b.expect("r1", 0)
    now = time.time()
    ev = protocol.decode_event(
        b'{"type":"output","run_id":"r1","seq":0,"ts":%f,"stream":"stdout",'
        b'"text":"piece","tier":0,"cont":true}' % now)
    assert isinstance(ev, protocol.Output) and ev.cont
    assert b.check(ev) is ev and b.refused_total() == 0


def test_an_endless_cut_line_keeps_memory_bounded() -> None:
    """A hostile pod sends 16 KiB pieces marked cont forever (160 MB here): the joiner
    keeps at most MAX_JOINED_CHARS of it and counts the rest."""
    joiner = LineJoiner()
    piece = "z" * (16 * 1024)
    n = 10_000
    tracemalloc.start()
    try:
        for i in range(n):
            assert joiner.feed(protocol.Output(run_id="r", seq=i, stream="stdout", text=piece,
                                               cont=True)) is None
            assert joiner.pending <= MAX_JOINED_CHARS
        _size, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * MAX_JOINED_CHARS, peak  # about one capped line, not 160 MB
    # Another stream is not held up by the endless one.
    other = joiner.feed(protocol.Output(stream="stderr", text="still here"))
    assert other is not None and other.text == "still here"
    [line] = joiner.flush()  # the run ended inside the line
    assert line.text.startswith("z" * MAX_JOINED_CHARS)
    dropped = n * len(piece) - MAX_JOINED_CHARS
    assert line.text.endswith(f"… ({dropped:,} more characters of this line not shown)")
    assert joiner.pending == 0 and joiner.flush() == []


def test_the_run_panes_show_a_cut_line_the_run_never_ended() -> None:
    model = RunModel("r")
    events: list[protocol.Events] = [
        protocol.Output(run_id="r", seq=0, ts=1e9, stream="stdout", text="half", cont=True),
        protocol.RunFinished(run_id="r", seq=1, ts=1e9, status="failed", wall_s=1.0)]
    _changed, lines = model.apply(events)
    assert [ln.text for ln in lines] == ["half"]
