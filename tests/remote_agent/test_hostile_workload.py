"""The pod side stays live whatever a workload leaves behind (issue 11, item 3).

A real worker runs a real ``cmd:`` workload that leaves FIFOs, links to devices, linked
directories, names with escape sequences and newlines in its artifacts, prints an 18 MB
``\\r`` progress line and a 20 MB line without a newline, and tampers with its own run
directory. The run must finish in bounded time and memory, and every event it wrote must
decode strictly under the laptop's line limit. (No GPU here: a ``cmd:`` workload with
tiers [] runs without one.)
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from gpuws import protocol
from gpuws.client import AgentClient
from gpuws.remote_agent import procs, runs, serve, wire
from gpuws.remote_agent.__main__ import cat, cat64
from gpuws.remote_agent.procs import EventLines, OutputSplitter
from gpuws.remote_agent.safefiles import NotRegular, sha256_regular
from gpuws.remote_agent.worker import RunContext
from gpuws.transport.local import LocalTransport

HOSTILE = r'''
import os, sys
art = os.environ["GPUWS_ARTIFACT_DIR"]
os.mkfifo(os.path.join(art, "pipe"))
os.symlink("/dev/zero", os.path.join(art, "zero"))
os.symlink("/dev/urandom", os.path.join(art, "random"))
os.symlink("/", os.path.join(art, "rootdir"))
os.symlink("/etc/passwd", os.path.join(art, "passwd"))
for name in ("evil\x1b]0;pwned\x07\x1b[2J.txt", "line\nartifact forged.txt", "tab\there"):
    with open(os.path.join(art, name), "w") as f:
        f.write("x")
os.mkdir(os.path.join(art, "sub"))
os.mkfifo(os.path.join(art, "sub", "pipe2"))
with open(os.path.join(art, "sub", "honest.txt"), "w") as f:
    f.write("honest")
out = sys.stdout.buffer
# An 18 MB tqdm-style line: \r updates, the final state ended by a newline.
n = 18 * 1024 * 1024 // 20
for i in range(n):
    out.write(b"\rprogress %10d/%d" % (i, n))
out.write(b"\rprogress done\n")
out.flush()
# A 20 MB line with no newline at all, on stderr, then the process ends.
sys.stderr.buffer.write(b"0123456789abcdef" * (20 * 1024 * 1024 // 16))
sys.stderr.flush()
'''


def _vm_hwm_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def test_hostile_workload_finishes_with_bounded_events_and_memory(tmp_path: Path) -> None:
    script = tmp_path / "hostile.py"
    script.write_text(HOSTILE)
    peak = {"kib": 0}

    async def go() -> tuple[list, AgentClient, float]:
        client = await AgentClient.connect(LocalTransport())
        events: list = []
        client.add_listener(events.append)
        t0 = time.monotonic()
        info = await client.start_run(protocol.RunSpec(
            workload=f"cmd:{sys.executable} {script}", tiers=[]))
        assert info.pid
        while not any(isinstance(e, protocol.RunFinished) for e in events):
            assert time.monotonic() - t0 < 90, "run_finished never came"
            hwm = _vm_hwm_kib(info.pid)
            if hwm:
                peak["kib"] = max(peak["kib"], hwm)
            await asyncio.sleep(0.05)
        wall = time.monotonic() - t0
        await client.close()
        return events, client, wall

    events, client, wall = asyncio.run(go())
    assert client.bad_lines == []
    fin = events[-1]
    assert isinstance(fin, protocol.RunFinished) and fin.status == "ok", fin
    assert wall < 90
    # The worker's memory stays bounded: the old one held each whole line (and its
    # JSON) in memory; the bound is far under the 38 MB the workload printed.
    print("worker peak RSS KiB", peak["kib"], "wall", wall)
    assert 0 < peak["kib"] < 64 * 1024, peak

    run_dir = Path(runs.run_dir(events[0].run_id))
    lines = (run_dir / "events.ndjson").read_bytes().splitlines(keepends=True)
    assert len(lines) == len(events)
    for line in lines:
        assert len(line) <= protocol.MAX_LINE
        assert not isinstance(protocol.decode_event(line), protocol.BadLine)

    out = [e for e in events if isinstance(e, protocol.Output)]
    stdout = [e.text for e in out if e.stream == "stdout"]
    assert stdout[-1] == "progress done"  # the final state of the bar is never lost
    assert all(t.startswith("progress") for t in stdout)
    # Updates are coalesced (at most one per UPDATE_INTERVAL_S) but do arrive.
    assert len(stdout) <= wall / procs.UPDATE_INTERVAL_S + 5
    stderr = "".join(e.text for e in out if e.stream == "stderr")
    assert stderr == "0123456789abcdef" * (20 * 1024 * 1024 // 16)  # nothing lost
    assert max(len(e.text) for e in out) <= procs.CHUNK_BYTES

    arts = {e.name for e in events if isinstance(e, protocol.Artifact)}
    assert arts == {"sub/honest.txt"}
    warnings = [e.message for e in events if isinstance(e, protocol.Log)
                and e.level == "warning" and "artifact" in e.message]
    for what in ("'pipe'", "'zero'", "'random'", "'rootdir'", "'passwd'", "'sub/pipe2'"):
        assert sum(what in w for w in warnings) == 1, (what, warnings)
    assert sum("control characters" in w for w in warnings) == 3
    for w in warnings:  # the names are shown escaped, never raw
        assert "\x1b" not in w and "\n" not in w and "\x07" not in w


def test_updates_that_stand_long_enough_all_arrive() -> None:
    """A bar updated at tqdm's pace arrives update for update."""
    got: list[dict] = []
    code = ("import sys, time\n"
            "for i in range(5):\n"
            "    sys.stdout.write('\\rstep %d' % i); sys.stdout.flush(); time.sleep(0.25)\n"
            "sys.stdout.write('\\n')\n")
    res = procs.run_streaming([sys.executable, "-c", code], emit=got.append, tier=0,
                              cwd=".", env=dict(os.environ))
    assert res.returncode == 0
    assert [e["text"] for e in got] == [f"step {i}" for i in range(5)]


def test_splitter_rules() -> None:
    sp = OutputSplitter(chunk_bytes=8, interval_s=10.0)
    assert sp.feed(b"ab\r\ncd\n", 0.0) == [("ab", False), ("cd", False)]
    pieces = sp.feed(("\u00e9" * 10 + "\n").encode(), 0.0)
    assert "".join(t for t, _ in pieces) == "\u00e9" * 10
    assert [c for _, c in pieces] == [True, True, False]
    assert all(len(t.encode()) <= 8 for t, _ in pieces)
    # First update shown at once; later ones within the interval wait, the newest wins.
    assert sp.feed(b"\r1\r2\r3", 1.0) == [("1", False)]
    assert sp.tick(5.0) == []
    assert sp.tick(11.0) == [("2", False)]
    # A line end overwrites an update that has not stood: dropped; the line never is.
    assert sp.feed(b"\r4\r5\n", 12.0) == [("5", False)]
    # The stream's last word is kept, whether an unended line or an update.
    sp2 = OutputSplitter(chunk_bytes=8, interval_s=10.0)
    sp2.feed(b"\ra\rb\r", 0.0)
    assert sp2.close() == [("b", False)]
    sp3 = OutputSplitter(chunk_bytes=8, interval_s=10.0)
    assert sp3.feed(b"tail", 0.0) == []
    assert sp3.close() == [("tail", False)]


def test_event_pipe_drops_an_oversized_line_once_and_goes_on() -> None:
    lines = EventLines(limit=100)
    warned: list[str] = []
    assert lines.feed(b'{"type":"log"}\n' + b"x" * 150, warned.append) == [b'{"type":"log"}']
    assert lines.feed(b"y" * 1000, warned.append) == []
    assert lines.feed(b'zz\n{"type":"pong"}\n', warned.append) == [b'{"type":"pong"}']
    assert len(warned) == 1


def test_event_pipe_of_a_real_child(tmp_path: Path) -> None:
    code = ("import os\nfd = int(os.environ['GPUWS_EVENT_FD'])\n"
            "os.write(fd, b'x' * (9 * 1024 * 1024))\n"
            "os.write(fd, b'\\n{\"type\": \"log\", \"message\": \"after\"}\\n')\n")
    got: list[dict] = []
    res = procs.run_streaming([sys.executable, "-c", code], emit=got.append, tier=1,
                              cwd=str(tmp_path), env=dict(os.environ), child_events=True)
    assert res.returncode == 0
    assert [e.get("message") for e in got][-1] == "after"
    assert sum("over" in str(e.get("message")) for e in got) == 1


def test_event_log_never_writes_a_line_over_the_limit(tmp_path: Path) -> None:
    log = runs.EventLog("r1", str(tmp_path / "events.ndjson"))
    log.append(wire.make("output", stream="stdout", text="x" * (wire.MAX_LINE + 10)))
    log.close()
    line = (tmp_path / "events.ndjson").read_bytes()
    ev = protocol.decode_event(line)
    assert isinstance(ev, protocol.Log) and ev.seq == 0 and "over" in ev.message


# ----------------------------------------------------------------------------- serve side
def _run_dir_with_events(tmp_path: Path) -> tuple[str, Path]:
    run_id = "20250101-000000-abcdef"
    rdir = Path(runs.run_dir(run_id))
    (rdir / "artifacts").mkdir(parents=True)
    (rdir / "spec.json").write_text(json.dumps({"workload": "cmd:true"}))
    return run_id, rdir


def _follow(run_id: str, timeout: float = 10.0) -> list[bytes]:
    sent: list[bytes] = []
    stop = threading.Event()
    t = threading.Thread(target=runs.follow, args=(run_id, 0, sent.append, stop),
                         daemon=True)
    t.start()
    t.join(timeout)
    stop.set()
    t.join(2)
    assert not t.is_alive(), "follow blocked"
    return sent


@pytest.mark.parametrize("plant", ["fifo", "zero", "urandom"])
def test_follow_refuses_a_log_that_is_not_a_regular_file(tmp_path: Path, plant: str) -> None:
    run_id, rdir = _run_dir_with_events(tmp_path)
    log = rdir / "events.ndjson"
    if plant == "fifo":
        os.mkfifo(log)
    else:
        log.symlink_to("/dev/" + plant)
    sent = _follow(run_id)
    ev = protocol.decode_event(b"".join(sent).splitlines()[-1])
    assert isinstance(ev, protocol.Error) and ev.code == "run_log_unreadable"
    # Listing the runs does not block on it either.
    t0 = time.monotonic()
    assert [r["run_id"] for r in runs.list_runs()] == [run_id]
    assert time.monotonic() - t0 < 5


def test_follow_drops_an_endless_line_and_keeps_counting(tmp_path: Path) -> None:
    run_id, rdir = _run_dir_with_events(tmp_path)
    honest = runs.EventLog(run_id, str(rdir / "events.ndjson"))
    honest.append(wire.make("log", message="first"))
    honest.close()
    with open(rdir / "events.ndjson", "ab") as f:
        f.write(b"g" * (wire.MAX_LINE + (3 << 20)) + b"\n")
    honest = runs.EventLog(run_id, str(rdir / "events.ndjson"))
    assert honest.seq == 2
    honest.append(wire.make("run_finished", status="ok", wall_s=1.0))
    honest.close()
    sent = b"".join(_follow(run_id)).splitlines()
    decoded = [protocol.decode_event(line) for line in sent]
    assert [type(e).__name__ for e in decoded] == ["Log", "Error", "RunFinished"]
    assert decoded[-1].seq == 2  # type: ignore[union-attr]


def test_stat_file_and_cat_refuse_fifos_devices_and_links(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    _run_id, rdir = _run_dir_with_events(tmp_path)
    art = rdir / "artifacts"
    os.mkfifo(art / "pipe")
    (art / "zero").symlink_to("/dev/zero")
    (art / "ok").write_bytes(b"abc")
    with pytest.raises(NotRegular):
        sha256_regular(str(art / "pipe"))
    assert sha256_regular(str(art / "ok"))[0] == 3

    sent: list[dict] = []

    class Writer:
        def send(self, event: dict) -> None:
            sent.append(event)

    srv = serve.Server(Writer())  # type: ignore[arg-type]
    for i, name in enumerate(("pipe", "zero", "ok")):
        srv.handle(json.dumps({"type": "stat_file", "req": i,
                               "path": str(art / name)}).encode())
    deadline = time.monotonic() + 10
    while len(sent) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    by_req = {e["req"]: e for e in sent}
    assert by_req[0]["type"] == "error" and by_req[0]["code"] == "not_a_file"
    assert by_req[1]["type"] == "error"  # /dev/zero is outside the run directories
    assert by_req[2]["type"] == "stat_result" and by_req[2]["size"] == 3
    for e in sent:
        assert not isinstance(protocol.decode_event(wire.dumps(e)), protocol.BadLine)

    assert cat(str(art / "pipe"), 0) == 1
    assert cat(str(art / "zero"), 0) == 1
    assert cat64(str(art / "pipe"), 0, 1024) == 1
    err = capfd.readouterr()
    assert "not a regular file" in err.err or "FIFO" in err.err


def test_artifact_hashing_is_bounded_in_time_and_skips_a_shrinking_file(
        tmp_path: Path) -> None:
    run_id, rdir = _run_dir_with_events(tmp_path)
    (rdir / "artifacts" / "a.bin").write_bytes(b"a" * 1000)
    (rdir / "artifacts" / "b.bin").write_bytes(b"b" * 1000)
    got: list[dict] = []
    ctx = RunContext(run_id, {"workload": "cmd:true"}, got.append)
    ctx.hash_budget_bytes = 1500  # a.bin fits, b.bin is over what is left
    ctx.announce_artifacts()
    assert [e["name"] for e in got if e["type"] == "artifact"] == ["a.bin"]
    assert any("b.bin" in str(e.get("message")) and "budget" in str(e.get("message"))
               for e in got)
    got.clear()
    ctx.announce_artifacts()  # reported once: nothing new the second time
    assert got == []


def test_worker_reaches_run_finished_when_the_artifact_dir_is_a_link(tmp_path: Path) -> None:
    """The whole artifacts/ directory replaced by a link to / is refused, not walked."""
    run_id, rdir = _run_dir_with_events(tmp_path)
    os.rmdir(rdir / "artifacts")
    (rdir / "artifacts").symlink_to("/")
    got: list[dict] = []
    ctx = RunContext(run_id, {"workload": "cmd:true"}, got.append)
    t0 = time.monotonic()
    ctx.announce_artifacts()
    assert time.monotonic() - t0 < 2
    assert [e["type"] for e in got] == ["log"] and "directory" in got[0]["message"]
