"""Fleet runs (``gpuws run POD POD ... -w W``) against real OpenSSH pods on 127.0.0.1.

Each "pod" is its own real sshd (tests/sshd.py) with its own pod-side cache, reached
through one ssh config that names them pod0, pod1, pod2. The workloads are ``cmd:``
commands: this machine has no GPU, so Tier 1 (which times a Python workload's run() on
a GPU) is skipped by the agent and the comparison must say "—" where nothing was
measured. "Killed" is what a pod dying looks like from the laptop: its sshd and every
process under it SIGKILLed, its run's process group too.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from rich.console import Console

from faults.helpers import alive, child_pids  # type: ignore[import-not-found]
from gpuws import protocol
from gpuws.cli import EXIT_CODES, main, make_parser
from gpuws.commands import fleet as fleet_cmd
from gpuws.errors import UsageError
from gpuws.live.engine import Engine, ReconnectPolicy
from gpuws.live.storeio import StoreHandle
from gpuws.sessions import store as store_mod
from gpuws.sessions.export import export_fleet
from gpuws.sessions.fleet import fleet_comparison
from gpuws.sessions.store import Store
from sshd import SshServer, free_port, sshd_missing_may_skip  # type: ignore[import-not-found]

pytestmark = pytest.mark.skipif(sshd_missing_may_skip(), reason="OpenSSH sshd is not installed")


class Pods:
    """Real sshd pods and one ssh config naming them ``pod0``… (and ``deadpod``, a port
    where nothing listens)."""

    def __init__(self, root: Path, count: int) -> None:
        self.servers = [SshServer(root / f"sshd{i}").start() for i in range(count)]
        self.config = root / "ssh_config"
        text = "".join(s.client_files(root / f"client{i}", alias=f"pod{i}").read_text()
                       for i, s in enumerate(self.servers))
        text += (f"Host deadpod\n  HostName 127.0.0.1\n  Port {free_port()}\n"
                 f"  IdentityFile {self.servers[0].client_key}\n  IdentitiesOnly yes\n"
                 "  StrictHostKeyChecking yes\n")
        self.config.write_text(text)

    def stop(self) -> None:
        for s in self.servers:
            s.stop()

    def pod_log(self, i: int, run_id: str) -> list[bytes]:
        """The run's events.ndjson as pod ``i`` holds it (lines must be whole)."""
        data = (self.servers[i].pod_cache / "runs" / run_id / "events.ndjson").read_bytes()
        assert data == b"" or data.endswith(b"\n")
        return data.splitlines()

    def printed(self, i: int, text: bytes) -> bool:
        """Whether any run on pod ``i`` has logged ``text`` (read on the pod's side)."""
        runs = self.servers[i].pod_cache / "runs"
        return runs.is_dir() and any(
            text in (d / "events.ndjson").read_bytes() for d in runs.iterdir()
            if (d / "events.ndjson").is_file())

    def kill(self, i: int) -> None:
        """Pod ``i`` dies: its run's process group, its sshd and everything under it."""
        server = self.servers[i]
        for d in (server.pod_cache / "runs").iterdir():
            first = (d / "events.ndjson").read_bytes().splitlines()[0]
            pid = int(json.loads(first)["pid"])
            os.killpg(pid, signal.SIGKILL)
        assert server.proc is not None
        doomed = [server.proc.pid]
        queue = [server.proc.pid]
        while queue:
            kids = child_pids(queue.pop())
            doomed += kids
            queue += kids
        for pid in doomed:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        server.proc.wait(10)


@pytest.fixture(scope="module")
def pods(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pods]:
    """Three pods for the tests that leave them standing."""
    p = Pods(tmp_path_factory.mktemp("fleet"), 3)
    try:
        yield p
    finally:
        p.stop()


def fleet_argv(config: Path, pods: list[str], workload: str, *extra: str) -> list[str]:
    return ["run", *pods, "-F", str(config), "-w", workload, *extra]


def gated(gate: Path, lines: int = 30) -> str:
    """Print ``first-*`` lines, wait for ``gate``, then ``last-1`` … ``last-N``: the test
    decides when the second half comes, so "mid-run" holds however slow the machine is."""
    return (f"cmd:for i in 1 2 3; do echo first-$i; done; "
            f"while [ ! -e {gate} ]; do sleep 0.02; done; "
            f"for i in $(seq 1 {lines}); do echo last-$i; sleep 0.01; done")


async def until(ready: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def stored_whole(store: Store, pods: Pods, i: int, run_id: str) -> list[protocol.Events]:
    """Pod ``i``'s run is in the store exactly as the pod logged it: every event once."""
    events = store.events(run_id)
    log = pods.pod_log(i, run_id)
    assert [e.seq for e in events] == list(range(len(log)))
    assert [protocol.decode_event(line) for line in log] == events
    return events


# ----------------------------------------------------------------------------- fleets
def test_three_pods_run_at_once_each_stored_once(pods: Pods, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    # An artifact each: three pulls at once, each on its own store connection.
    workload = ("cmd:echo hello-from-pod; printf 'evil\\033[2J[/]bold\\n'; "
                "head -c 300000 /dev/urandom > $GPUWS_ARTIFACT_DIR/blob.bin; sleep 0.3")
    code = main(fleet_argv(pods.config, ["pod0", "pod1", "pod2"], workload))
    captured = capsys.readouterr()
    assert code == 0, captured.out + captured.err
    assert captured.err == ""
    with Store() as store:
        (fleet,) = store.fleets()
        assert [p.pod for p in fleet.pods] == ["pod0", "pod1", "pod2"]
        assert [p.status for p in fleet.pods] == ["ok"] * 3
        assert fleet.ended is not None and fleet.spec is not None
        sessions = {s.id: s for s in store.sessions()}
        assert set(sessions) == {p.session_id for p in fleet.pods}  # one session per pod
        for i, p in enumerate(fleet.pods):
            assert p.session_id is not None and p.run_id is not None
            session = sessions[p.session_id]
            assert session.host == f"pod{i}" and session.ended is not None
            (run,) = store.runs(session.id)  # every run stored once, in its own session
            assert run.run_id == p.run_id and run.status == "ok"
            events = stored_whole(store, pods, i, run.run_id)
            assert sum(isinstance(e, protocol.Output) and e.text == "hello-from-pod"
                       for e in events) == 1
            (art,) = store.artifacts(run.run_id)
            assert art.status == "pulled" and art.size == 300000 and art.local_path
            assert hashlib.sha256(Path(art.local_path).read_bytes()).hexdigest() == art.sha256
        comparison = fleet_comparison(store, fleet.id)
    # No GPU here and a cmd: workload: nothing Tier 1 measures exists, so nothing is shown.
    for line in comparison.lines:
        assert line.median_ms is None and line.rate is None and line.speedup is None
        assert line.wall_s is not None and line.wall_s >= 0.3  # measured on the pod
    out = captured.out
    assert f"fleet {fleet.id}" in out and "No pod has a Tier-1 median" in out
    rows = [r for r in out.splitlines() if r.startswith("│ pod")]
    assert len(rows) == 3
    for row in rows:
        cells = [c.strip() for c in row.strip("│").split("│")]
        assert cells[1] == "ok" and cells[4:8] == ["—"] * 4, row
    # Pod text is shown, never obeyed: the escape and the markup come out as characters.
    assert out.count("evil\\e[2J[/]bold") == 3 and "\x1b[2J" not in out
    assert out.count("pod1│ ok run ok in") == 1  # progress lines, one pod per line


def test_json_progress_names_each_pod(pods: Pods, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(fleet_argv(pods.config, ["pod2", "pod0"], "cmd:echo one; echo two",
                           "--json", "--tiers", "2"))
    out = capsys.readouterr().out
    assert code == 0
    objects = [json.loads(line) for line in out.splitlines()]  # every line is JSON
    *progress, result = objects
    assert result["type"] == "fleet_result" and result["failed"] == []
    assert [line["pod"] for line in result["lines"]] == ["pod2", "pod0"]
    assert all(o["pod"] in ("pod2", "pod0") for o in progress)
    with Store() as store:
        fleet = store.fleet(result["fleet_id"])
        for p in fleet.pods:
            assert p.run_id is not None
            printed = [o for o in progress if o.get("run_id") == p.run_id and "seq" in o]
            assert all(o["pod"] == p.pod for o in printed)
            assert [o["seq"] for o in printed] == [e.seq for e in store.events(p.run_id)]


def test_an_unreachable_pod_fails_fast_and_the_others_go_on(
        pods: Pods, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gate = tmp_path / "go"
    args = make_parser().parse_args(fleet_argv(pods.config, ["pod0", "deadpod"], gated(gate)))

    def dead_recorded() -> bool:
        with Store() as s:
            fleets = s.fleets()
            return bool(fleets) and fleets[0].pods[1].status == "unreachable"

    async def scenario() -> int:
        task = asyncio.create_task(fleet_cmd.run(args))
        # deadpod's failure is recorded while pod0's run still waits for the gate.
        await until(dead_recorded, "deadpod to be recorded unreachable")
        assert not task.done()
        gate.touch()
        return await task

    code = asyncio.run(scenario())
    err = capsys.readouterr().err
    assert code == fleet_cmd.FLEET_FAILED_EXIT == 12
    (line,) = err.strip().splitlines()  # one line: the pod, cause — remedy
    assert line.startswith("gpuws: deadpod unreachable: Connection refused: ")
    assert " — " in line
    with Store() as store:
        fleet = store.fleets()[0]
        assert [p.status for p in fleet.pods] == ["ok", "unreachable"]
        assert fleet.pods[1].session_id is None and fleet.pods[1].run_id is None
        assert fleet.pods[0].run_id is not None
        stored_whole(store, pods, 0, fleet.pods[0].run_id)


def test_a_pod_killed_mid_run_leaves_the_others_whole(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pods = Pods(tmp_path / "pods", 3)
    gate = tmp_path / "go"
    try:
        args = make_parser().parse_args(fleet_argv(pods.config, ["pod0", "pod1", "pod2"],
                                                   gated(gate)))
        policy = ReconnectPolicy(first_s=0.2, max_s=0.5, give_up_s=2.0)

        async def scenario() -> int:
            task = asyncio.create_task(fleet_cmd.run(args, reconnect=policy))
            await until(lambda: all(pods.printed(i, b"first-3") for i in range(3)),
                        "every pod to be running")
            pods.kill(1)  # mid-run: pod1 dies while all three wait at the gate
            gate.touch()
            return await task

        code = asyncio.run(scenario())
        err = capsys.readouterr().err
        assert code == 12
        (line,) = err.strip().splitlines()
        with Store() as store:
            fleet = store.fleets()[0]
            assert [p.status for p in fleet.pods] == ["ok", "lost", "ok"]
            lost = fleet.pods[1]
            assert lost.run_id is not None
            assert line.startswith("gpuws: pod1 lost: Connection lost: ")
            assert f"gpuws attach pod1 {lost.run_id}" in line
            for i in (0, 2):
                run_id = fleet.pods[i].run_id
                assert run_id is not None
                events = stored_whole(store, pods, i, run_id)
                texts = [e.text for e in events if isinstance(e, protocol.Output)]
                assert texts == [f"first-{n}" for n in (1, 2, 3)] + [
                    f"last-{n}" for n in range(1, 31)]
                assert isinstance(events[-1], protocol.RunFinished)
            # What the dead pod sent before it died is kept, gap-free, nothing invented.
            kept = store.events(lost.run_id)
            log = pods.pod_log(1, lost.run_id)
            assert kept and [e.seq for e in kept] == list(range(len(kept)))
            assert kept == [protocol.decode_event(x) for x in log[:len(kept)]]
            assert store.run(lost.run_id).status == "running"
            assert all(s.ended is not None for s in store.sessions())  # costs stopped
    finally:
        pods.stop()


def test_ctrl_c_records_each_pod_and_leaves_the_runs_going(
        pods: Pods, tmp_path: Path) -> None:
    """Ctrl-C on the whole ``gpuws`` process: exit 130, the table, each pod named with
    how to follow its run, every session ended; the runs go on on the pods."""
    gate = tmp_path / "go"
    argv = [sys.executable, "-m", "gpuws.cli", *fleet_argv(pods.config, ["pod0", "pod1"],
                                                           gated(gate))]
    # A pytest started with SIGINT ignored (nohup, `cmd &`, some CI runners) passes the
    # "ignore" on to its children: give gpuws the default, as a terminal would.
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        asyncio.run(until(lambda: all(pods.printed(i, b"first-3") for i in range(2)),
                          "both pods to be running"))
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        gate.touch()  # let the runs on the pods end
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out + err
    with Store() as store:
        fleet = store.fleets()[0]
        assert [p.status for p in fleet.pods] == ["interrupted"] * 2
        assert all(s.ended is not None for s in store.sessions())
    lines = err.strip().splitlines()
    assert len(lines) == 2, err
    for p, line in zip(fleet.pods, lines, strict=True):
        assert line == (f"gpuws: {p.pod} interrupted: interrupted; the run goes on on the "
                        f"pod: gpuws attach {p.pod} {p.run_id}")
    assert f"fleet {fleet.id}" in out


def test_the_live_lines_show_pod_text_literally() -> None:
    """On a terminal each pod is one updating line; what the pod sent is shown, not obeyed."""
    view = fleet_cmd.FleetView(as_json=False, live=False)
    pod = fleet_cmd.PodRun(0, "pod[bold]0", Engine(StoreHandle()))
    view.pods = [pod]
    view.state(pod, "running")
    view.event(pod, protocol.Output(run_id="r", seq=3, ts=1.0, stream="stdout",
                                    text="\x1b[2J[/]\x07tick"))
    out = io.StringIO()
    Console(file=out, width=100, force_terminal=True, color_system=None).print(view.render())
    text = out.getvalue()
    assert "pod[bold]0" in text and "stdout│ \\e[2J[/]\\x07tick" in text
    assert "\x1b[2J" not in text and "\x07" not in text


# ----------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("extra,expected", [
    (["--detach"], "--detach does not apply to a fleet of 2 pods"),
    (["--rate", "2"], "--rate does not apply to a fleet"),
    (["-p", "2222"], "-p does not apply to a fleet"),
    (["-W", "."], "-W does not apply to a fleet"),
    (["--baseline", "x"], "--baseline does not apply to a fleet"),
    (["--baseline", "x", "--fail-if-slower", "3"], "--baseline does not apply"),
    (["-w", "builtin:nosuch"], "unknown builtin workload 'nosuch'"),
])
def test_fleet_mistakes_are_refused_before_connecting(
        extra: list[str], expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["run", "no-such-pod.invalid", "other.invalid", "-w", "cmd:true", *extra]
    assert main(argv) == UsageError.exit_code
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.strip().splitlines()
    assert line.startswith("gpuws: Usage error: ") and expected in line
    with Store() as store:
        assert store.fleets() == []  # nothing recorded, nothing connected


def test_a_pod_named_twice_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "a.invalid", "b.invalid", "a.invalid", "-w", "cmd:true"]) == 2
    assert "a.invalid is named twice" in capsys.readouterr().err


def test_the_exit_status_is_documented() -> None:
    assert dict(EXIT_CODES)[fleet_cmd.FLEET_FAILED_EXIT].startswith("run POD POD ...")
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert "| 12 | `run POD POD ...`" in readme


# ----------------------------------------------------------------------------- store
def test_fleet_export_and_listing(pods: Pods, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(fleet_argv(pods.config, ["pod1", "deadpod"], "cmd:echo x")) == 12
    capsys.readouterr()
    assert main(["fleets", "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert [p["status"] for p in listed["pods"]] == ["ok", "unreachable"]
    report = tmp_path / "fleet.md"
    assert main(["export", "--fleet", listed["id"][:5], "-o", str(report)]) == 0
    md = report.read_text()
    assert md.startswith(f"# gpuws fleet `{listed['id']}`")
    assert "| pod | status | GPU | driver |" in md and "| `pod1` | ok |" in md
    assert "## Pods that gave no result" in md and "- deadpod unreachable: Connection refused" in md
    with Store() as store:  # exporting twice gives the same bytes
        assert export_fleet(store, listed["id"]) == md
    assert main(["export", "--fleet", "nope"]) == 2
    assert "`gpuws fleets` lists" in capsys.readouterr().err
    assert main(["export", "--fleet", "x", "abc"]) == 2  # a session and a fleet: which?


def test_a_v1_store_gains_fleets_and_keeps_its_data(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "s.db"
    with monkeypatch.context() as m:
        m.setattr(store_mod, "_MIGRATIONS", store_mod._MIGRATIONS[:1])
        m.setattr(store_mod, "SCHEMA_VERSION", 1)
        with Store(path) as s:
            sid = s.open_session("pod", "local", None, 1.0)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
    conn.close()
    with Store(path) as s:
        assert s.session(sid).host == "pod"
        fid = s.open_fleet(protocol.RunSpec(workload="cmd:true"), ["a", "b"])
        s.set_fleet_pod(fid, 0, status="connected", session_id=sid)
        s.set_fleet_pod(fid, 0, status="running", run_id="r1")  # the session id is kept
        s.set_fleet_pod(fid, 1, status="unreachable", error="Cannot connect: x — y")
        f = s.fleet(fid[:4])
        assert [(p.pod, p.status, p.session_id, p.run_id) for p in f.pods] == [
            ("a", "running", sid, "r1"), ("b", "unreachable", None, None)]
        assert s.fleet_of_session(sid) == fid and f.ended is None
        s.end_fleet(fid)
        assert s.fleet(fid).ended is not None
        line = fleet_comparison(s, fid).lines[0]
        assert line.status == "running" and line.median_ms is None  # no events: no figures
