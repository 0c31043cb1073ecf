"""A hostile agent: a stand-in that speaks the protocol and lies, against the laptop engine.

A real gpuws agent never sends these lines, and no real pod can be made to run a
malicious agent on our machines, so this is the one place a fake is the right tool: a
``RemoteProcess`` whose stdout is whatever the attacker writes, fed to the real
``AgentClient``, the real :class:`~gpuws.live.engine.Engine`, the real SQLite store and
the real headless printer. Every attack class from issue 11 that needs a lying agent is
here: forged run ids (a run of an earlier session), seq 2**63 and -1, a repeated seq with
other contents, ts 1e300, non-finite numbers, oversize strings, traversal and escape
sequences in artifact names, an artifact whose pod path is /dev/zero, a wrong answer to
``start_run``, and a 2-million-line garbage flood (memory measured).
"""

from __future__ import annotations

import asyncio
import json
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from faults.figures import record  # type: ignore[import-not-found]
from gpuws import protocol
from gpuws.client import AgentClient
from gpuws.commands.run import Printer
from gpuws.deploy import DeployResult
from gpuws.errors import ProtocolError
from gpuws.live.engine import Engine, Notice
from gpuws.live.link import Target
from gpuws.live.storeio import StoreHandle
from gpuws.sessions.export import export_session
from gpuws.sessions.store import Store
from gpuws.transport.base import RemoteProcess, Transport, TransportInfo

OLD_RUN = "20240101-000000-aaaaaa"
RUN_DIR = "/home/pod/.cache/gpuws/runs/{run_id}"
NOW = time.time()


class _Stdin:
    """The agent's stdin: requests are handed to the liar, which answers on stdout."""

    def __init__(self, answer: Callable[[dict[str, Any]], None]) -> None:
        self.answer = answer

    def write(self, data: bytes) -> None:
        for line in data.splitlines():
            self.answer(json.loads(line))

    async def drain(self) -> None:
        await asyncio.sleep(0)

    def write_eof(self) -> None:
        pass


class LyingAgent(RemoteProcess):
    """Answers requests with whatever ``script`` decides, and streams its lines."""

    def __init__(self, script: Callable[[LyingAgent, dict[str, Any]], None]) -> None:
        self.stdout = asyncio.StreamReader(limit=1 << 30)
        self.stderr = asyncio.StreamReader()
        self.stderr.feed_eof()
        self.script = script
        self.stdin = _Stdin(lambda req: script(self, req))

    def send(self, *events: dict[str, Any]) -> None:
        self.stdout.feed_data(b"".join(json.dumps(e).encode() + b"\n" for e in events))

    def send_raw(self, data: bytes) -> None:
        self.stdout.feed_data(data)

    async def wait(self) -> int | None:
        return 0

    def close(self) -> None:
        if not self.stdout.at_eof():
            self.stdout.feed_eof()


class _NoTransport(Transport):
    info = TransportInfo(kind="ssh", target="liar", sftp=False)

    async def connect(self) -> None:
        pass

    async def start(self, argv: Any) -> RemoteProcess:
        raise AssertionError("the liar has no side channels")

    async def close(self) -> None:
        pass

    async def read_file(self, path: str, offset: int, agent_argv: Any,  # type: ignore[override]
                        chunk: int = 1 << 20) -> Any:
        raise AssertionError("nothing may be pulled from the liar")


PROBE = protocol.Probe(hostname="liar", os="linux", kernel="6", arch="x86_64", container=[],
                       virtualization=[], python_path="/usr/bin/python3",
                       python_version="3.12", uid=0, user="root", home="/root")


def ev(run_id: str, seq: Any, type_: str, **fields: Any) -> dict[str, Any]:
    return {"type": type_, "run_id": run_id, "seq": seq, "ts": fields.pop("ts", NOW), **fields}


def _seed_earlier_run(store: Store) -> None:
    """A finished run of an earlier session, with metrics and a pulled artifact."""
    sid = store.open_session("other-pod", "ssh", None, 1.0, started=NOW - 3600)
    spec = protocol.RunSpec(workload="builtin:saxpy")
    store.ingest_many(sid, [
        protocol.RunStarted(run_id=OLD_RUN, seq=0, ts=NOW - 3500, spec=spec,
                            run_dir=RUN_DIR.format(run_id=OLD_RUN), pid=1),
        protocol.KernelMetrics(run_id=OLD_RUN, seq=1, ts=NOW - 3400, kernel="saxpy", launch=0,
                               metrics={"duration_ns": 180000.0}),
        protocol.RunFinished(run_id=OLD_RUN, seq=2, ts=NOW - 3300, status="ok", wall_s=200.0),
    ])
    store.end_session(sid, ended=NOW - 3200)


def _snapshot(store: Store) -> Any:
    row = store.run(OLD_RUN)
    return (row.status, row.finished, store.events(OLD_RUN), store.metrics(OLD_RUN),
            store.artifacts(OLD_RUN), store.session(row.session_id))


async def _drive(script: Callable[[LyingAgent, dict[str, Any]], None], printer: Printer,
                 notices: list[Notice]) -> tuple[str, Engine]:
    liar = LyingAgent(script)  # its streams belong to the running loop
    hello = protocol.Hello(agent_version="0", agent_sha256="0" * 64, protocol_version=1)
    client = AgentClient(_NoTransport(), liar, DeployResult("0" * 64, 0, "cached", 0, 0.0, hello),
                         b"", "python3")
    engine = Engine(StoreHandle(), on_batch=printer.batch, on_notice=notices.append,
                    auto_pull=False)
    await engine.adopt(Target("liar"), client, PROBE)
    info = await engine.start_run(protocol.RunSpec(workload="cmd:true", tiers=[]))
    return info.run_id, engine


def test_lies_are_refused_and_honest_events_kept(capsys: pytest.CaptureFixture[str]) -> None:
    with Store() as store:
        _seed_earlier_run(store)
        before = _snapshot(store)
    notices: list[Notice] = []
    honest: list[dict[str, Any]] = []

    def script(agent: LyingAgent, req: dict[str, Any]) -> None:
        if req["type"] != "start_run":
            return
        run_id = req["run_id"]
        rdir = RUN_DIR.format(run_id=run_id)
        agent.send({"type": "run_list", "req": req["req"], "ts": NOW, "runs": [
            {"run_id": run_id, "workload": "cmd:true", "status": "running", "started": NOW,
             "last_seq": -1}]})
        seq = iter(range(100))

        def honest_event(type_: str, **fields: Any) -> dict[str, Any]:
            e = ev(run_id, next(seq), type_, **fields)
            honest.append(e)
            return e

        agent.send(
            honest_event("run_started", spec={"workload": "cmd:true", "tiers": []},
                         run_dir=rdir, pid=7, hostname="pod[/]"),
            # Another run (an earlier session's) rewritten: refused, nothing changes.
            ev(OLD_RUN, 3, "run_finished", status="failed", wall_s=1.0),
            ev(OLD_RUN, 1, "kernel_metrics", kernel="saxpy", launch=0,
               metrics={"duration_ns": 1.0}),
            ev(OLD_RUN, 4, "artifact", name="x.ncu-rep", path="/etc/passwd", size=1,
               sha256="0" * 64),
            # Impossible seqs: far ahead, negative.
            ev(run_id, 2**63, "output", stream="stdout", text="seq 2^63"),
            ev(run_id, -1, "output", stream="stdout", text="seq -1"),
            honest_event("output", stream="stdout", text="[/] [bold]not markup\x1b]0;pwned\x07"),
        )
        # In sequence but poisoned: each is replaced by a logged refusal, in its place.
        agent.send(ev(run_id, next(seq), "output", stream="stdout", text="x", ts=1e300))
        # JSON has no infinity: msgspec refuses 1e999, so this is a bad line, counted.
        agent.send_raw(b'{"type":"samples","run_id":"%s","seq":0,"ts":%f,"tier":1,'
                       b'"values_ms":[1.0,1e999]}\n' % (run_id.encode(), NOW))
        agent.send(ev(run_id, next(seq), "output", stream="stdout", text="y" * 300_000))
        for name in ("../../../../tmp/gpuws-escape", "/home/me/.bashrc", "a/../../b",
                     "evil\nartifact ok.ncu-rep", "\x1b[2Jclear", "x.part"):
            agent.send(ev(run_id, next(seq), "artifact", name=name,
                          path=f"{rdir}/artifacts/{name}", size=16, sha256="0" * 64))
        agent.send(ev(run_id, next(seq), "artifact", name="zero.bin", path="/dev/zero",
                      size=16, sha256="0" * 64))
        report = honest_event("artifact", name="report.ncu-rep",
                              path=f"{rdir}/artifacts/report.ncu-rep", size=3, sha256="a" * 64)
        agent.send(report,
                   # A repeat of a used seq with other contents: reported, first copy kept.
                   ev(run_id, report["seq"], "artifact", name="swapped.ncu-rep",
                      path=f"{rdir}/artifacts/swapped.ncu-rep", size=3, sha256="b" * 64),
                   honest_event("run_finished", status="ok", wall_s=1.0))

    printer = Printer(as_json=False)

    async def go() -> tuple[str, list[protocol.Events]]:
        run_id, engine = await _drive(script, printer, notices)
        try:
            await asyncio.wait_for(engine.wait_finished(run_id), 10)
            await engine.drained()
            export = await engine.store.call(
                lambda s: export_session(s, engine.session_id or ""))
            assert "report.ncu-rep" in export
            events = await engine.store.call(lambda s: s.events(run_id))
        finally:
            await engine.close()
            await engine.store.close()
        return run_id, events

    run_id, stored = asyncio.run(go())
    out = capsys.readouterr()
    with Store() as store:
        assert _snapshot(store) == before  # the earlier run: not one field changed
        art_names = [a.name for a in store.artifacts(run_id)]
    assert art_names == ["report.ncu-rep"]
    # Honest events: all stored, byte for byte what was sent.
    by_seq = {e.seq: e for e in stored}
    for h in honest:
        assert protocol.to_builtins(by_seq[h["seq"]])["type"] == h["type"]
    assert stored[-1].seq == len(stored) - 1  # gap-free: a re-attach resumes at the end
    refused_logs = [e for e in stored if isinstance(e, protocol.Log)]
    assert len(refused_logs) == 2 + 6 + 1  # ts, long string; six names; /dev/zero
    said = " | ".join(n.message for n in notices if n.kind == "refused")
    for words in ("which this connection did not start or attach", "seq 9223372036854775808",
                  "not a time near now", "characters (limit", "the name has a '..' component",
                  "not a protocol event"):
        assert words in said, words  # each class said once, with its cause
    assert any(n.kind == "conflict" for n in notices)
    # Later refusals of a kind are counted, not said again; each is logged in its run.
    assert any("/dev/zero is not /home/pod" in e.message for e in refused_logs)
    # Shown, never interpreted: no escape byte and no crash on [/].
    assert "\x1b" not in out.out + out.err and "\x07" not in out.out + out.err
    assert "[/] [bold]not markup\\e]0;pwned\\x07" in out.out
    assert not list(Path("/tmp").glob("gpuws-escape*"))


def test_a_wrong_answer_to_start_run_is_refused() -> None:
    def script(agent: LyingAgent, req: dict[str, Any]) -> None:
        if req["type"] == "start_run":  # answers with an earlier run's id
            agent.send({"type": "run_list", "req": req["req"], "ts": NOW, "runs": [
                {"run_id": OLD_RUN, "workload": "x", "status": "running", "started": NOW,
                 "last_seq": -1}]})

    async def go() -> None:
        engine = Engine(StoreHandle(), auto_pull=False)
        hello = protocol.Hello(agent_version="0", agent_sha256="0" * 64, protocol_version=1)
        client = AgentClient(_NoTransport(), LyingAgent(script),
                             DeployResult("0" * 64, 0, "cached", 0, 0.0, hello), b"", "py")
        await engine.adopt(Target("liar"), client, PROBE)
        try:
            with pytest.raises(ProtocolError, match="when asked for"):
                await engine.start_run(protocol.RunSpec(workload="cmd:true"))
            assert not engine.boundary.expects(OLD_RUN)
        finally:
            await engine.close()
            await engine.store.close()

    asyncio.run(go())


def test_a_garbage_flood_keeps_memory_flat(capsys: pytest.CaptureFixture[str]) -> None:
    """Half a million undecodable lines: counted, a few kept, memory bounded, nothing
    printed each. (Held as BadLines they would take ~175 MB, past the bound below by far;
    2 million took 300 s under tracemalloc on a loaded machine, to show the same.)"""
    lines = 500_000
    notices: list[Notice] = []
    flood = b"garbage that is not json {]\n" * 10_000

    def script(agent: LyingAgent, req: dict[str, Any]) -> None:
        if req["type"] != "start_run":
            return
        run_id = req["run_id"]
        agent.send({"type": "run_list", "req": req["req"], "ts": NOW, "runs": [
            {"run_id": run_id, "workload": "cmd:true", "status": "running", "started": NOW,
             "last_seq": -1}]})
        agent.send(ev(run_id, 0, "run_started", spec={"workload": "cmd:true", "tiers": []},
                      run_dir=RUN_DIR.format(run_id=run_id), pid=7))

        async def pour() -> None:
            for _ in range(lines // 10_000):
                agent.send_raw(flood)
                await asyncio.sleep(0)  # let the reader keep up, as a socket would
            agent.send(ev(run_id, 1, "run_finished", status="ok", wall_s=1.0))

        asyncio.get_running_loop().create_task(pour())

    async def go() -> tuple[float, int, int]:
        tracemalloc.start()
        t0 = time.monotonic()
        run_id, engine = await _drive(script, Printer(False), notices)
        try:
            await asyncio.wait_for(engine.wait_finished(run_id), 300)
            seconds = time.monotonic() - t0
            _, peak = tracemalloc.get_traced_memory()
            counted = engine.boundary.refusals["bad_line"].count
        finally:
            tracemalloc.stop()
            await engine.close()
            await engine.store.close()
        return seconds, peak, counted

    seconds, peak, counted = asyncio.run(go())
    assert counted == lines
    # Python-level allocations at the peak: the 280 KB chunks in flight, the line buffer and
    # the samples, not the flood (2 M lines held as BadLines were ~700 MB; these 500,000, ~175 MB).
    assert peak < 64 * 1024 * 1024, f"peak {peak / 2**20:.0f} MiB"
    bad = [n for n in notices if n.kind == "refused" and "not a protocol event" in n.message]
    assert 1 <= len(bad) <= 8  # 1, 10, 100, … 100,000: a count, not a flood
    assert len(capsys.readouterr().err.splitlines()) <= 10
    # Appended with every other test's figures (it overwrote the file, which left one
    # line of a whole run of the recipe).
    record("test_a_garbage_flood_keeps_memory_flat", flood_lines=lines, refused=counted,
           refusal_lines=len(bad), seconds=round(seconds, 1),
           peak_python_mib=round(peak / 2**20, 1))


def test_every_answer_is_checked_before_any_face_sees_it() -> None:
    """A request's answer (the probe, a run list, the ncu and nsys plans, a stat) goes past
    the engine's stream straight to the caller: ``AgentClient`` checks each one at the
    boundary, so the TUI and every headless command get the same refusal. Before, only the
    nsys plan was checked, by the two callers that remembered to."""
    huge = "x" * (300 * 1024)  # over the 256 KiB string bound; each lie decodes as its type
    probe = dict(msgspec.to_builtins(PROBE), kernel=huge)
    lies: dict[str, dict[str, Any]] = {
        "probe": {"type": "probe_result", "probe": probe},
        "ncu_plan": {"type": "ncu_plan", "driver": None, "cuda_driver": None, "arch": None,
                     "choices": [], "selected": None, "selected_version": None,
                     "reason": huge},
        "nsys_plan": {"type": "nsys_plan", "installs": [], "ts": 1e300},
        "list_runs": {"type": "run_list", "runs": [
            {"run_id": OLD_RUN, "workload": huge, "status": "running", "started": NOW,
             "last_seq": -1}]},
        "stat_file": {"type": "stat_result", "path": "/x", "size": 1, "sha256": "0" * 64,
                      "ts": 0.0},
    }

    def script(agent: LyingAgent, req: dict[str, Any]) -> None:
        agent.send({"ts": NOW, **lies[req["type"]], "req": req["req"]})

    async def go() -> list[str]:
        hello = protocol.Hello(agent_version="0", agent_sha256="0" * 64, protocol_version=1)
        client = AgentClient(_NoTransport(), LyingAgent(script),
                             DeployResult("0" * 64, 0, "cached", 0, 0.0, hello), b"", "py")
        refused = []
        for call in (client.probe, client.ncu_plan, client.nsys_plan, client.list_runs,
                     lambda: client.stat_file("/x")):
            with pytest.raises(ProtocolError, match="the pod's answer was refused") as info:
                await asyncio.wait_for(call(), 10)  # refused at once, never a timeout
            refused.append(str(info.value))
        await client.close()
        return refused

    refused = asyncio.run(go())
    assert len(refused) == 5
    assert sum("a string of 307200 characters" in r for r in refused) == 3
    assert sum("is not a time near now" in r for r in refused) == 2
