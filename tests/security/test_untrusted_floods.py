"""Floods from the pod: memory and disk stay bounded, and no honest event goes unaccounted.

Issue 26: telemetry for ever-new GPU indexes grew the laptop from 64 MB to 9.4 GB in a
minute; a workload running ``yes`` for 15 s made 1.39 M events that the laptop read far
faster than it stored (479 MB held, 226 s to store); a workload appending a 1 GiB line to
its own ``events.ndjson`` swallowed honest events without a word.

Where the attack needs a pod that lies (telemetry with impossible indexes, a stream far
faster than any store, garbage in the middle of a run's sequence), the pod is the lying
agent of ``test_untrusted_lying_agent.py``: a stand-in that writes whatever the attacker
chooses into the real ``AgentClient``, engine and SQLite store, because no real agent
sends those lines. Where a real workload can do it (``yes``, the 1 GiB line), it runs on
the real agent behind the real OpenSSH sshd, under the real ``gpuws run`` CLI.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from faults.figures import record  # type: ignore[import-not-found]
from gpuws import protocol
from gpuws.client import AgentClient
from gpuws.commands.run import Printer
from gpuws.deploy import DeployResult
from gpuws.live import feed
from gpuws.live.account import TRUNCATED_PREFIX
from gpuws.live.engine import Engine, Notice
from gpuws.live.link import Target
from gpuws.live.storeio import StoreHandle
from gpuws.live.telemetry import MAX_GPUS, TelemetryHistory
from gpuws.sessions.store import Store
from security.test_untrusted_lying_agent import (  # type: ignore[import-not-found]
    NOW,
    PROBE,
    RUN_DIR,
    LyingAgent,
    _NoTransport,
    ev,
)
from sshd import SshServer  # type: ignore[import-not-found]


async def _engine(script: Any, notices: list[Notice], **kwargs: Any) -> tuple[Engine, LyingAgent]:
    liar = LyingAgent(script)
    hello = protocol.Hello(agent_version="0", agent_sha256="0" * 64, protocol_version=1)
    client = AgentClient(_NoTransport(), liar, DeployResult("0" * 64, 0, "cached", 0, 0.0, hello),
                         b"", "python3")
    engine = Engine(StoreHandle(), on_notice=notices.append, auto_pull=False, **kwargs)
    await engine.adopt(Target("liar"), client, PROBE)
    return engine, liar


def _answer_start(agent: LyingAgent, req: dict[str, Any]) -> str | None:
    if req["type"] != "start_run":
        return None
    run_id: str = req["run_id"]
    agent.send({"type": "run_list", "req": req["req"], "ts": NOW, "runs": [
        {"run_id": run_id, "workload": "cmd:true", "status": "running", "started": NOW,
         "last_seq": -1}]})
    agent.send(ev(run_id, 0, "run_started", spec={"workload": "cmd:true", "tiers": []},
                  run_dir=RUN_DIR.format(run_id=run_id), pid=7))
    return run_id


# ---------------------------------------------------------------------------- telemetry
def test_telemetry_for_ever_new_gpu_indexes_stays_bounded() -> None:
    """20,000 telemetry samples, each naming four GPUs never seen before (indexes up to
    80,000; every tenth sample a negative one): the boundary refuses indexes outside 0..63,
    the history keeps at most 64 GPUs, and memory stays flat (the old history kept a
    history for every index it was sent)."""
    samples = 20_000
    notices: list[Notice] = []
    history = TelemetryHistory()

    def on_side(e: protocol.Events) -> None:
        if isinstance(e, protocol.Telemetry):
            history.add(e)

    def script(agent: LyingAgent, req: dict[str, Any]) -> None:
        pass

    async def go() -> tuple[int, float]:
        tracemalloc.start()
        engine, liar = await _engine(script, notices, on_side=on_side)
        t0 = time.monotonic()
        try:
            for start in range(0, samples, 1000):
                chunk = b"".join(json.dumps({
                    "type": "telemetry", "ts": NOW, "gpus": [
                        {"index": i * 4 + k if i % 10 else -(i + k), "util_pct": 50.0,
                         "power_w": 300.0, "temp_c": 60.0, "sm_clock_mhz": 1980.0,
                         "mem_used_mib": 1000.0} for k in range(4)]}).encode() + b"\n"
                    for i in range(start, start + 1000))
                liar.send_raw(chunk)
                await asyncio.sleep(0)
            liar.send({"type": "telemetry", "ts": NOW, "gpus": [{"index": 3, "util_pct": 1.0}]})
            deadline = time.monotonic() + 60
            while history.latest.get(3) is None or history.latest[3].util_pct != 1.0:
                assert time.monotonic() < deadline, "the last sample never arrived"
                await asyncio.sleep(0.01)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
            await engine.close()
            await engine.store.close()
        return peak, time.monotonic() - t0

    peak, seconds = asyncio.run(go())
    assert 0 < len(history.gpus) <= MAX_GPUS
    assert all(0 <= i < MAX_GPUS for i in history.gpus)
    assert len(history.series) <= MAX_GPUS * 5
    said = [n.message for n in notices if n.kind == "refused"]
    assert any("GPU index" in m for m in said)
    assert len(said) <= 8  # 1, 10, 100, …: a count, not a flood of lines
    assert peak < 32 * 2**20, f"peak {peak / 2**20:.1f} MiB"
    record("test_telemetry_for_ever_new_gpu_indexes_stays_bounded", samples=samples,
           gpus_kept=len(history.gpus), peak_python_mib=round(peak / 2**20, 1),
           seconds=round(seconds, 1))


def test_telemetry_history_drops_the_gpu_seen_least_recently() -> None:
    history = TelemetryHistory(size=10, max_gpus=4)
    for i in range(1000):
        history.add(protocol.Telemetry(ts=NOW, gpus=[
            protocol.GpuSample(index=i % 64, util_pct=float(i)),
            protocol.GpuSample(index=0, util_pct=float(i))]))  # GPU 0 stays fresh
    assert len(history.latest) == 4 and 0 in history.latest
    assert set(history.gpus) == {0, 37, 38, 39}  # the three seen last (999 % 64 = 39), and 0
    assert {gpu for gpu, _ in history.series} == set(history.gpus)
    assert history.values(0, "util_pct")[-1] == 999.0
    assert history.evicted > 0


# ---------------------------------------------------------------------------- backpressure
def test_the_reader_waits_while_the_store_lags() -> None:
    """A pod sending 200,000 events as fast as memory can hand them over: the reader stops
    reading whenever the backlog passes its bound (what it has not read waits outside, as
    it waits in the pod's events.ndjson and the SSH window), and every event is stored."""
    events = 200_000
    notices: list[Notice] = []
    started: list[str] = []

    def script(agent: LyingAgent, req: dict[str, Any]) -> None:
        run_id = _answer_start(agent, req)
        if run_id is not None:
            started.append(run_id)

    async def go() -> tuple[feed.EventFeed, int, int, float, int]:
        engine, liar = await _engine(script, notices)
        try:
            info = await engine.start_run(protocol.RunSpec(workload="cmd:true", tiers=[]))
            run_id = info.run_id
            t0 = time.monotonic()
            waiting_outside = 0
            line = ev(run_id, 0, "output", stream="stdout", text="y", tier=0)
            for start in range(1, events + 1, 500):
                liar.send_raw(b"".join(
                    json.dumps({**line, "seq": s}).encode() + b"\n"
                    for s in range(start, min(start + 500, events + 1))))
                # What the reader has not taken yet (the pod's disk, the SSH window).
                waiting_outside = max(waiting_outside, len(liar.stdout._buffer))
                await asyncio.sleep(0)
            liar.send(ev(run_id, events + 1, "run_finished", status="ok", wall_s=1.0))
            await asyncio.wait_for(engine.wait_finished(run_id), 120)
            await engine.drained()
            seconds = time.monotonic() - t0
            stored = await engine.store.call(lambda s: len(s.events(run_id)))
        finally:
            await engine.close()
            await engine.store.close()
        return engine.feed, stored, waiting_outside, seconds, events

    fed, stored, waiting_outside, seconds, sent = asyncio.run(go())
    assert stored == sent + 2  # run_started, every output, run_finished
    assert fed.pauses > 0  # the reader did wait for the store
    assert waiting_outside > 1 << 20  # … while the rest waited unread, outside
    # The backlog never passed its bound by more than one read's worth (64 KiB of wire,
    # a few hundred of these events).
    assert fed.peak_backlog <= feed.MAX_BACKLOG_EVENTS + 1000, fed.peak_backlog
    assert fed.peak_backlog_bytes <= feed.MAX_BACKLOG_BYTES + (1 << 16)
    assert not [n for n in notices if n.kind in ("missing", "truncated", "store_failed")]
    record("test_the_reader_waits_while_the_store_lags", events=sent, stored=stored,
           pauses=fed.pauses, peak_backlog_events=fed.peak_backlog,
           peak_backlog_kib=fed.peak_backlog_bytes // 1024,
           waiting_unread_mib=round(waiting_outside / 2**20, 1), seconds=round(seconds, 1))


# ---------------------------------------------------------------------------- output cap
def test_output_past_the_cap_is_counted_and_the_rest_still_stored(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run's output past ``max_output_mib`` (here 0.01 MiB) is counted, not stored; the
    event that crossed it is stored as a notice naming where the rest is, shown once;
    tier results, artifacts and ``run_finished`` after it are stored; a resend of the run
    (a re-attach) stores nothing twice and counts nothing twice."""
    Path(os.environ["GPUWS_CONFIG"]).write_text("[defaults]\nmax_output_mib = 0.01\n")
    notices: list[Notice] = []
    printer = Printer(as_json=False)
    lines = 1000

    def script(agent: LyingAgent, req: dict[str, Any]) -> None:
        run_id = _answer_start(agent, req)
        if run_id is None:
            return
        body = [ev(run_id, seq, "output", stream="stdout", text=f"line {seq}", tier=0)
                for seq in range(1, lines + 1)]
        body += [ev(run_id, lines + 1, "tier_finished", tier=0, status="ok", wall_s=1.0),
                 ev(run_id, lines + 2, "artifact", name="r.txt",
                    path=f"{RUN_DIR.format(run_id=run_id)}/artifacts/r.txt", size=1,
                    sha256="a" * 64),
                 ev(run_id, lines + 3, "output", stream="stdout", text="after the tier"),
                 ev(run_id, lines + 4, "run_finished", status="ok", wall_s=1.0)]
        agent.send(*body)
        agent.send(*body)  # the same events again, as after a re-attach

    async def go() -> tuple[str, list[protocol.Events]]:
        engine, _liar = await _engine(script, notices, on_batch=printer.batch)
        try:
            info = await engine.start_run(protocol.RunSpec(workload="cmd:true", tiers=[]))
            await asyncio.wait_for(engine.wait_finished(info.run_id), 30)
            await asyncio.sleep(0)
            await engine.drained()
            stored = await engine.store.call(lambda s: s.events(info.run_id))
        finally:
            await engine.close()
            await engine.store.close()
        return info.run_id, stored

    run_id, stored = asyncio.run(go())
    out = capsys.readouterr().out
    outputs = [e for e in stored if isinstance(e, protocol.Output)]
    cut = [e for e in stored if isinstance(e, protocol.Log)
           and e.message.startswith(TRUNCATED_PREFIX)]
    assert len(cut) == 1 and "10.2 KiB" in cut[0].message
    assert f"{RUN_DIR.format(run_id=run_id)}/events.ndjson" in cut[0].message
    assert cut[0].seq == len(outputs) + 1  # right after the last output stored
    stored_bytes = sum(len(protocol.encode(e)) - 1 for e in outputs)
    assert stored_bytes <= 0.01 * 2**20 < stored_bytes + 200
    assert {type(e).__name__ for e in stored if e.seq is not None and e.seq > lines} == {
        "TierFinished", "Artifact", "RunFinished"}  # the late output counted, the rest kept
    counted = lines - len(outputs) + 1  # the one the notice took the place of, and later
    (told,) = [n.message for n in notices if n.kind == "truncated"]
    assert f"{counted:,} output event(s)" in told and "counted, not stored" in told
    assert out.count(TRUNCATED_PREFIX) == 1  # shown once
    assert not [n for n in notices if n.kind == "missing"]


def test_seqs_that_never_came_are_named() -> None:
    """A run's sequence with a hole (the line that held seq 3 and 4 was garbage): the
    person is told which seqs never arrived and why, once; later resends change nothing."""
    notices: list[Notice] = []

    def script(agent: LyingAgent, req: dict[str, Any]) -> None:
        run_id = _answer_start(agent, req)
        if run_id is None:
            return
        out = [ev(run_id, seq, "output", stream="stdout", text=f"{seq}") for seq in range(1, 8)]
        agent.send(*out[:2])
        agent.send_raw(b"x" * 1000 + b"\n" + b'{"type":"output","run_id":"' + run_id.encode()
                       + b'","seq":4,\n')
        agent.send(*out[4:], ev(run_id, 8, "run_finished", status="ok", wall_s=1.0))
        agent.send(*out)  # resent

    async def go() -> str:
        engine, _liar = await _engine(script, notices)
        try:
            info = await engine.start_run(protocol.RunSpec(workload="cmd:true", tiers=[]))
            await asyncio.wait_for(engine.wait_finished(info.run_id), 30)
            await engine.drained()
        finally:
            await engine.close()
            await engine.store.close()
        return info.run_id

    run_id = asyncio.run(go())
    (missing,) = [n for n in notices if n.kind == "missing"]
    assert missing.run_id == run_id
    assert "events 3–4 never arrived" in missing.message
    assert f"{RUN_DIR.format(run_id=run_id)}/events.ndjson" in missing.message


# ---------------------------------------------------------------------------- real floods
#: Runs a command and reports its peak RSS (the largest waited-for child's, in KiB).
_MAXRSS = ("import resource, subprocess, sys; rc = subprocess.call(sys.argv[1:]); "
           "print('maxrss_kib', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, "
           "file=sys.stderr); sys.exit(rc)")


@pytest.mark.ssh
def test_a_yes_flood_through_gpuws_run_stays_bounded_and_accounted(
        ssh_config: Path, sshd: SshServer, tmp_path: Path) -> None:
    """A workload printing ``y`` 300,000 times as fast as it can, under the real ``gpuws
    run`` over the real sshd, with ``max_output_mib = 2``: the laptop's peak RSS stays
    under 256 MiB, the run ends, and every event of the pod's log is stored or counted by
    the truncation notice (stored once, printed once).

    ``GPUWS_FLOOD_LINES`` and ``GPUWS_FLOOD_CAP_MIB`` make it the issue's size (1,390,000
    lines, the default 64 MiB cap) for docs/reliability.md; the suite keeps it short."""
    lines = int(os.environ.get("GPUWS_FLOOD_LINES", "300000"))
    cap_mib = float(os.environ.get("GPUWS_FLOOD_CAP_MIB", "2"))
    Path(os.environ["GPUWS_CONFIG"]).write_text(f"[defaults]\nmax_output_mib = {cap_mib}\n")
    argv = [sys.executable, "-c", _MAXRSS, sys.executable, "-m", "gpuws.cli", "run", "pod",
            "-F", str(ssh_config), "-w", f"cmd:yes | head -n {lines}", "--no-pull"]
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "COLUMNS": "200"})
    seconds = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-2000:]
    rss_kib = int(proc.stderr.rsplit("maxrss_kib", 1)[1].split()[0])
    with Store() as store:
        (run,) = [r for s in store.sessions() for r in store.runs(s.id)]
        stored = store.events(run.run_id)
    pod = [json.loads(line) for line in
           (sshd.pod_cache / "runs" / run.run_id / "events.ndjson").read_bytes().splitlines()]
    assert len(pod) >= lines + 2
    cut = [e for e in stored if isinstance(e, protocol.Log)
           and e.message.startswith(TRUNCATED_PREFIX)]
    assert len(cut) == 1 and cut[0].seq is not None
    # Every event of the pod's log: stored, or an output event at or past the notice.
    by_seq = {e.seq: e for e in stored}
    unaccounted = [p["seq"] for p in pod if p["seq"] not in by_seq
                   and not (p["type"] == "output" and p["seq"] >= cut[0].seq)]
    assert unaccounted == []
    assert all(type(by_seq[p["seq"]]).__name__ == type(protocol.decode_event(
        json.dumps(p).encode())).__name__ for p in pod if p["seq"] < cut[0].seq)
    assert isinstance(stored[-1], protocol.RunFinished) and stored[-1].status == "ok"
    counted = sum(1 for p in pod if p["type"] == "output" and p["seq"] >= cut[0].seq)
    assert f"{counted:,} output event(s)" in proc.stderr
    assert proc.stdout.count(TRUNCATED_PREFIX) == 1
    assert rss_kib < 256 * 1024, f"peak RSS {rss_kib / 1024:.0f} MiB"
    record("test_a_yes_flood_through_gpuws_run_stays_bounded_and_accounted",
           events=len(pod), cap_mib=cap_mib, stored=len(stored), counted=counted,
           peak_rss_mib=round(rss_kib / 1024), seconds=round(seconds, 1))


@pytest.mark.ssh
def test_a_line_left_open_in_the_run_log_swallows_no_honest_event(
        ssh_config: Path, sshd: SshServer, tmp_path: Path) -> None:
    """A workload appends 10 MB without a line end to its own ``events.ndjson``, prints,
    appends 10 MB more, prints again. The worker's events used to land inside that line,
    over the size limit, and vanish with it; now each starts on a line of its own and is
    stored, and the garbage is dropped on the pod as a line of its own."""
    script = tmp_path / "open-line.sh"
    script.write_text("""#!/bin/sh
log="$GPUWS_RUN_DIR/events.ndjson"
echo honest-1; sleep 0.3
head -c 10000000 /dev/zero | tr '\\0' x >> "$log"
echo honest-2; sleep 0.3
head -c 10000000 /dev/zero | tr '\\0' x >> "$log"
echo honest-3; sleep 0.3
echo honest-4
""")
    script.chmod(0o755)
    proc = subprocess.run(
        [sys.executable, "-m", "gpuws.cli", "run", "pod", "-F", str(ssh_config), "-w",
         f"cmd:sh {script}", "--no-pull"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    with Store() as store:
        (run,) = [r for s in store.sessions() for r in store.runs(s.id)]
        stored = store.events(run.run_id)
    texts = [e.text for e in stored if isinstance(e, protocol.Output)]
    assert [t for t in texts if t.startswith("honest-")] == [f"honest-{i}" for i in range(1, 5)]
    assert [e.seq for e in stored] == list(range(len(stored)))  # nothing missing
    raw = (sshd.pod_cache / "runs" / run.run_id / "events.ndjson").read_bytes()
    assert max(len(line) for line in raw.splitlines()) >= 10_000_000  # the garbage is there
    pod_lines = [line for line in raw.splitlines() if line.startswith(b'{"type":')]
    assert "never arrived" not in proc.stderr
    assert "a line over 8388608 bytes was dropped" in proc.stderr  # the pod's word, shown
    record("test_a_line_left_open_in_the_run_log_swallows_no_honest_event",
           garbage_mb=20, honest_lines=4, honest_stored=len(
               [t for t in texts if t.startswith("honest-")]),
           seqs_missing=len(set(range(len(pod_lines))) - {e.seq for e in stored}))


def test_large_events_are_bounded_by_their_bytes() -> None:
    """30 Tier-1 sample batches of 100,000 values each (about 1 MB of wire apiece, 30 MB
    in all), faster than the store takes them: the backlog is bounded in bytes, not only in
    events (8,192 of these would be 8 GB), and Python's peak memory stays small."""
    batches, values = 30, 100_000
    notices: list[Notice] = []
    sample = [1.0 + i * 1e-6 for i in range(values)]

    def script(agent: LyingAgent, req: dict[str, Any]) -> None:
        _answer_start(agent, req)

    async def go() -> tuple[feed.EventFeed, int, int]:
        engine, liar = await _engine(script, notices)
        try:
            info = await engine.start_run(protocol.RunSpec(workload="cmd:true", tiers=[]))
            run_id = info.run_id
            tracemalloc.start()
            for seq in range(1, batches + 1):
                liar.send(ev(run_id, seq, "samples", values_ms=sample))
                # The pod's disk holds what the reader has not taken; here, at most 4 MB.
                while len(liar.stdout._buffer) > 4 << 20:
                    await asyncio.sleep(0.001)
            liar.send(ev(run_id, batches + 1, "run_finished", status="ok", wall_s=1.0))
            await asyncio.wait_for(engine.wait_finished(run_id), 120)
            await engine.drained()
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            stored = await engine.store.call(lambda s: len(s.samples(run_id)))
        finally:
            tracemalloc.stop()
            await engine.close()
            await engine.store.close()
        return engine.feed, stored, peak

    fed, stored, peak = asyncio.run(go())
    assert stored == batches * values
    assert fed.pauses > 0
    wire = len(json.dumps(ev("x", 1, "samples", values_ms=sample)))
    assert fed.peak_backlog_bytes <= feed.MAX_BACKLOG_BYTES + wire + (1 << 16)
    assert peak < 96 * 2**20, f"peak {peak / 2**20:.0f} MiB"
    record("test_large_events_are_bounded_by_their_bytes", batches=batches,
           event_kib=wire // 1024, pauses=fed.pauses,
           peak_backlog_kib=fed.peak_backlog_bytes // 1024,
           peak_python_mib=round(peak / 2**20, 1))


def test_a_truncated_run_attached_again_stores_nothing_twice() -> None:
    """A run cut at its output cap, then attached from a new process with another cap (a
    new engine on the same store), asking for every event again: the pod resends them;
    nothing is stored twice, no conflict is reported, and the end counts each output past
    the cap once."""
    config = Path(os.environ["GPUWS_CONFIG"])
    config.write_text("[defaults]\nmax_output_mib = 0.01\n")
    run_dir: dict[str, str] = {}
    lines = 400

    def body(run_id: str) -> list[dict[str, Any]]:
        return [ev(run_id, 0, "run_started", spec={"workload": "cmd:true", "tiers": []},
                   run_dir=RUN_DIR.format(run_id=run_id), pid=7),
                *(ev(run_id, seq, "output", stream="stdout", text=f"line {seq}", ts=NOW + seq)
                  for seq in range(1, lines + 1))]

    def first(agent: LyingAgent, req: dict[str, Any]) -> None:
        if req["type"] == "start_run":
            run_id = run_dir["id"] = req["run_id"]
            agent.send({"type": "run_list", "req": req["req"], "ts": NOW, "runs": [
                {"run_id": run_id, "workload": "cmd:true", "status": "running",
                 "started": NOW, "last_seq": -1}]})
            agent.send(*body(run_id))

    def again(agent: LyingAgent, req: dict[str, Any]) -> None:
        if req["type"] == "attach":
            run_id = req["run_id"]
            agent.send({"type": "run_list", "req": req["req"], "ts": NOW, "runs": [
                {"run_id": run_id, "workload": "cmd:true", "status": "running",
                 "started": NOW, "last_seq": lines}]})
            agent.send(*[e for e in body(run_id) if e["seq"] >= req["from_seq"]],
                       ev(run_id, lines + 1, "output", stream="stdout", text="new"),
                       ev(run_id, lines + 2, "run_finished", status="ok", wall_s=1.0))

    async def go() -> tuple[list[Notice], list[protocol.Events], list[protocol.Events]]:
        notices: list[Notice] = []
        engine, _ = await _engine(first, notices)
        try:
            info = await engine.start_run(protocol.RunSpec(workload="cmd:true", tiers=[]))
            deadline = time.monotonic() + 30
            while engine.account._runs[info.run_id].last_seq < lines:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            await engine.drained()
            before = await engine.store.call(lambda s: s.events(info.run_id))
        finally:
            await engine.close()
            await engine.store.close()
        config.write_text("[defaults]\nmax_output_mib = 0.02\n")
        engine, _ = await _engine(again, notices)
        try:
            await engine.attach(info.run_id, from_seq=0)  # as `gpuws attach --from-seq 0`
            await asyncio.wait_for(engine.wait_finished(info.run_id), 30)
            await engine.drained()
            after = await engine.store.call(lambda s: s.events(info.run_id))
        finally:
            await engine.close()
            await engine.store.close()
        return notices, before, after

    notices, before, after = asyncio.run(go())
    cut = [e for e in before if isinstance(e, protocol.Log)]
    assert len(cut) == 1 and cut[0].message.startswith(TRUNCATED_PREFIX)
    assert after[:len(before)] == before  # nothing stored before changed
    assert [type(e).__name__ for e in after[len(before):]] == ["RunFinished"]
    assert not [n for n in notices if n.kind in ("conflict", "missing")], notices
    (told,) = [n.message for n in notices if n.kind == "truncated"]
    # Every output past the cap, each once: the one the notice took the place of, those
    # after it (counted now: the store kept none of them), and the new one.
    assert f"{lines + 2 - (cut[0].seq or 0):,} output event(s)" in told
