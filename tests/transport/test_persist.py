"""A kept connection (``persist``) against a real OpenSSH sshd on 127.0.0.1.

The commands are the CLI's own ``main()`` (or whole ``python -m gpuws`` processes where
a master must be killed under a running command); the master is the real detached
process, the socket a real unix socket, the pod a real sshd. Reuse is shown by the
master's own counters and pid (one SSH connection: ``dials`` 1, ``streams`` growing).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuws import deploy
from gpuws.cli import main
from gpuws.client import AgentClient
from gpuws.errors import ConfigError
from gpuws.remote_agent import lease
from gpuws.transport.persist import parse_persist, wire
from gpuws.transport.persist.client import PersistTransport
from gpuws.transport.persist.place import identity, place_for, private_dir
from sshd import SshServer  # type: ignore[import-not-found]

WAIT_S = 60.0


def wait_for(cond: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    """Poll ``cond`` until true (a generous bound: 2 shared cores)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (the master's parent is this test process until it is reaped) is dead.
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
            return False
    return True


def masters_under(base: Path) -> list[int]:
    """The pids of the masters whose socket is under ``base`` (their argv names it)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if (b"gpuws.transport.persist.master" in argv
                    and any(a.startswith(os.fsencode(base)) for a in argv)
                    and alive(int(entry.name))):
                pids.append(int(entry.name))
    return pids


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private runtime dir, short enough for a socket path; every master made under it
    is ended afterwards."""
    base = Path(tempfile.mkdtemp(prefix="gp", dir="/tmp"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(base))
    yield base
    for pid in masters_under(base):
        stop_master(pid)
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def kept(ssh_config: Path, tmp_path: Path, runtime: Path) -> Path:
    """The host ``pod`` with ``persist = "10m"`` in the config."""
    cfg = Path(os.environ["GPUWS_CONFIG"])
    cfg.write_text('[hosts.pod]\npersist = "10m"\n')
    return ssh_config


def master_hello(ssh_config: Path) -> tuple[dict, bool]:
    """The live master's hello for ``pod`` (one is made when none answers) and whether
    one was already there."""

    async def ask() -> tuple[dict, bool]:
        t = PersistTransport("pod", config_file=str(ssh_config), idle_s=600)
        await t.connect()
        assert t.master is not None
        return t.master, t.reused

    return asyncio.run(ask())


def socket_of(ssh_config: Path) -> Path:
    t = PersistTransport("pod", config_file=str(ssh_config), idle_s=600)
    ident = identity(t.target, destination="pod", config_file=str(ssh_config), pty=None)
    return place_for(ident, private_dir()).socket


def doctor(capsys: pytest.CaptureFixture[str], ssh_config: Path, *extra: str
           ) -> tuple[int, dict, str]:
    code = main(["doctor", "pod", "-F", str(ssh_config), "--json", *extra])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else {}), err


def stop_master(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    wait_for(lambda: not alive(pid), "the master to end")


# ------------------------------------------------------------------------- reuse
def test_second_command_reuses_the_kept_connection(kept: Path, runtime: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code, first, err = doctor(capsys, kept)
    assert code == 0, err
    assert any("connection kept by gpuws" in n for n in first["transport"]["notes"])
    hello1, found = master_hello(kept)
    assert found  # the first command left it
    code, second, err = doctor(capsys, kept)
    assert code == 0, err
    assert second["agent"]["cache_state"] == "cached"
    hello2, found = master_hello(kept)
    try:
        # One master, one SSH connection, a channel per command's agent.
        assert found and hello2["pid"] == hello1["pid"]
        assert hello2["dials"] == 1
        assert hello2["streams"] > hello1["streams"] >= 1
        sock = socket_of(kept)
        assert stat.S_IMODE(os.lstat(sock).st_mode) == 0o600
        assert stat.S_IMODE(os.lstat(sock.parent).st_mode) == 0o700
    finally:
        stop_master(hello2["pid"])
    wait_for(lambda: not socket_of(kept).exists(), "the ended master's socket to go")


def test_a_kept_master_holds_no_agent_so_the_lease_counts_no_one(
        kept: Path, sshd: SshServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUWS_POD_CACHE", str(sshd.pod_cache))

    async def session() -> tuple[int, int]:
        t = PersistTransport("pod", config_file=str(kept), idle_s=600)
        await t.connect()
        proc, result, rest = await deploy.start_agent(t)
        client = AgentClient(t, proc, result, rest, "python3")
        await client.ping()
        pid = t.master["pid"] if t.master else -1
        during = lease.connections()
        await client.close()
        return during, pid

    during, pid = asyncio.run(session())
    try:
        assert during == 1  # the command's serve, through the master
        assert alive(pid)
        wait_for(lambda: lease.connections() == 0, "the pod to count no one connected")
        assert alive(pid)  # the master is still there, and counts as no one
    finally:
        stop_master(pid)


def test_two_commands_at_once_share_one_master(kept: Path) -> None:
    async def both() -> list[tuple[int, bool, float]]:
        async def one() -> tuple[int, bool, float]:
            t = PersistTransport("pod", config_file=str(kept), idle_s=600)
            await t.connect()
            proc, result, rest = await deploy.start_agent(t)
            client = AgentClient(t, proc, result, rest, "python3")
            try:
                rtt = await client.ping()
                assert (await client.probe()).hostname
            finally:
                await client.close()
            assert t.master is not None
            return t.master["pid"], t.reused, rtt

        return list(await asyncio.gather(one(), one()))

    got = asyncio.run(both())
    pids = {pid for pid, _, _ in got}
    try:
        assert len(pids) == 1  # the identity's lock: one made it, the other waited and used it
        assert sorted(reused for _, reused, _ in got) == [False, True]
    finally:
        for pid in pids:
            stop_master(pid)


def test_read_file_through_the_master(kept: Path, sshd: SshServer,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert doctor(capsys, kept)[0] == 0
    cached = sshd.pod_cache / "agent" / f"{deploy.build_bundle().sha256}.pyz"

    async def read() -> tuple[bytes, int]:
        t = PersistTransport("pod", config_file=str(kept), idle_s=600)
        await t.connect()
        assert t.info.sftp
        data = b"".join([c async for c in t.read_file(str(cached), 10, [], 4096)])
        return data, t.master["pid"] if t.master else -1

    data, pid = asyncio.run(read())
    try:
        assert data == cached.read_bytes()[10:]
    finally:
        stop_master(pid)


# ------------------------------------------------------------------------- ending
def test_the_master_ends_after_its_idle_time(ssh_config: Path, runtime: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    Path(os.environ["GPUWS_CONFIG"]).write_text('[hosts.pod]\npersist = "1s"\n')
    code, r, err = doctor(capsys, ssh_config)
    assert code == 0, err
    # It went through a master (which may be gone already: a second is short here).
    assert any("closes after 1 s unused" in n for n in r["transport"]["notes"])
    sock = socket_of(ssh_config)
    log = sock.with_suffix(".log")
    wait_for(lambda: not sock.exists(), "the idle master to remove its socket")
    wait_for(lambda: "idle for 1 s" in log.read_text(), "the master to say why it ended")


def test_a_stale_socket_is_removed_and_a_new_master_made(
        kept: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert doctor(capsys, kept)[0] == 0
    first, _ = master_hello(kept)
    os.kill(first["pid"], signal.SIGKILL)
    wait_for(lambda: not alive(first["pid"]), "the master to die")
    sock = socket_of(kept)
    assert sock.exists()  # SIGKILL left it: nobody answers there now
    code, _, err = doctor(capsys, kept)
    assert code == 0, err
    second, found = master_hello(kept)
    try:
        assert found and second["pid"] != first["pid"]
        assert "not kept" not in err  # a dead master is replaced, not a reason to give up
    finally:
        stop_master(second["pid"])


def test_a_socket_that_answers_nonsense_is_replaced(kept: Path, runtime: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    sock = socket_of(kept)
    impostor = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    impostor.bind(str(sock))
    impostor.listen(4)
    try:
        # It accepts (the kernel's backlog) but never says hello: the command waits
        # HELLO_S, takes it for hung, removes it and makes a real master.
        code, _, err = doctor(capsys, kept)
        assert code == 0, err
        hello, found = master_hello(kept)
        assert found
        stop_master(hello["pid"])
    finally:
        impostor.close()


def test_killing_the_master_under_a_run_redials_with_one_line(
        kept: Path, runtime: Path, sshd: SshServer) -> None:
    cmd = [sys.executable, "-m", "gpuws", "run", "pod", "-F", str(kept),
           "-w", "cmd:sleep 4; echo finished-ok"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        sock = socket_of(kept)
        wait_for(sock.exists, "the run's master")
        first, _ = master_hello(kept)
        # Once the run is going on the pod (its events file is there), kill the master.
        wait_for(lambda: any((sshd.pod_cache / "runs").glob("*/events.ndjson")),
                 "the run to start on the pod")
        os.kill(first["pid"], signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "finished-ok" in out
    lost = [line for line in err.splitlines() if "dropped" in line]
    assert len(lost) == 1, err
    assert "the master keeping the connection" in lost[0]
    second, found = master_hello(kept)
    try:
        assert found and second["pid"] != first["pid"]  # the redial made a new master
    finally:
        stop_master(second["pid"])


# ------------------------------------------------------------------------- refusals
def test_a_runtime_dir_with_a_wrong_mode_is_refused(kept: Path, runtime: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    where = runtime / "gpuws"
    where.mkdir(mode=0o700)
    where.chmod(0o755)
    code, r, err = doctor(capsys, kept)
    assert code == 0, err  # the command still works, connecting by itself
    lines = [line for line in err.splitlines() if "not kept" in line]
    assert len(lines) == 1 and lines[0].startswith("gpuws: ")
    assert "mode 0755, not 0700" in lines[0]
    assert list(where.iterdir()) == []  # no socket, no master
    assert stat.S_IMODE(where.stat().st_mode) == 0o755  # a sign, not repaired behind one's back
    assert not any("kept by gpuws" in n for n in r["transport"]["notes"])


def test_a_symlinked_runtime_dir_is_refused(kept: Path, runtime: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (runtime / "gpuws").symlink_to(elsewhere)
    code, _, err = doctor(capsys, kept)
    assert code == 0, err
    assert "is a symbolic link" in err
    assert list(elsewhere.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to be another uid (setuid)")
def test_a_socket_of_another_uid_is_refused(kept: Path, runtime: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    sock = socket_of(kept)
    # A listener that is really uid 65534: bound as root, then the uid dropped before
    # listen() (SO_PEERCRED reports the listener's credentials at listen time).
    child = subprocess.Popen([sys.executable, "-c", (
        "import os, socket, sys\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        f"s.bind({str(sock)!r})\n"
        "os.setresgid(65534, 65534, 65534); os.setresuid(65534, 65534, 65534)\n"
        "s.listen(4); print('ready', flush=True)\n"
        "while True:\n    c, _ = s.accept(); c.sendall(b'x' * 5)\n")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        code, _, err = doctor(capsys, kept)
        assert code == 0, err
        assert "owned by uid 65534, not by you" in err
        assert sock.exists()  # someone else's socket is refused, never removed or used
    finally:
        child.kill()
        child.wait()


def test_no_persist_neither_uses_nor_leaves_a_master(kept: Path, runtime: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, r, err = doctor(capsys, kept, "--no-persist")
    assert code == 0, err
    assert not (runtime / "gpuws").exists()
    assert not any("kept" in n for n in r["transport"]["notes"])


def test_persist_no_in_the_config_keeps_nothing(ssh_config: Path, runtime: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    Path(os.environ["GPUWS_CONFIG"]).write_text('[hosts.pod]\npersist = "no"\n')
    assert doctor(capsys, ssh_config)[0] == 0
    assert not (runtime / "gpuws").exists()


def test_an_unknown_host_key_comes_back_through_a_new_master_as_itself(
        sshd: SshServer, tmp_path: Path, runtime: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    cfg = sshd.client_files(tmp_path / "client", known=False)
    Path(os.environ["GPUWS_CONFIG"]).write_text('[hosts.pod]\npersist = "10m"\n')
    code = main(["doctor", "pod", "-F", str(cfg)])
    err = capsys.readouterr().err
    assert code != 0
    assert "host key" in err.lower() and "not kept" not in err
    assert not socket_of(cfg).exists()  # a master that could not connect leaves nothing


# ------------------------------------------------------------------------- the setting
@pytest.mark.parametrize(("value", "seconds"), [
    ("10m", 600.0), ("90s", 90.0), ("1h", 3600.0), ("45", 45.0), ("1.5m", 90.0),
    ("yes", 600.0), (True, 600.0), ("no", None), ("off", None), (False, None), (None, None),
])
def test_persist_values(value: str | bool | None, seconds: float | None) -> None:
    assert parse_persist(value) == seconds


@pytest.mark.parametrize("value", ["0", "0s", "8d", "169h", "10x", "", "-5m", "1e9", "10 m"])
def test_persist_worst_values_are_refused(value: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_persist(value)
    assert "persist" in exc.value.message and exc.value.remedy


def test_a_bad_persist_in_the_config_is_one_line(ssh_config: Path, runtime: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    Path(os.environ["GPUWS_CONFIG"]).write_text('[hosts.pod]\npersist = "ten minutes"\n')
    code = main(["doctor", "pod", "-F", str(ssh_config)])
    err = capsys.readouterr().err
    assert code != 0
    assert err.count("\n") == 1 and "persist" in err


def test_a_master_killed_during_the_connect_is_redialled_once(kept: Path, runtime: Path,
                                                              capsys: pytest.CaptureFixture[str]
                                                              ) -> None:
    from gpuws.live.link import Target, dial

    first, _ = master_hello(kept)
    said: list[str] = []

    def on_step(step: str, state: str, seconds: float | None, detail: str) -> None:
        # Between the kept connection's hello and the agent's start: the worst moment.
        if step == "deploy" and state == "running" and not said:
            said.append("killed")
            os.kill(first["pid"], signal.SIGKILL)
            wait_for(lambda: not alive(first["pid"]), "the master to die")

    async def go() -> str:
        client, probe = await dial(Target("pod", ssh_config=str(kept)), on_step)
        await client.close()
        return probe.hostname

    assert asyncio.run(go())
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "connecting again" in line]
    assert len(lines) == 1 and lines[0].startswith("gpuws: the master keeping the connection")
    second, found = master_hello(kept)
    assert found and second["pid"] != first["pid"]
    stop_master(second["pid"])


def test_a_kept_command_never_imports_asyncssh(kept: Path, runtime: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    # asyncssh's import was 0.2-0.7 s of every command's start; the master holds it.
    assert doctor(capsys, kept)[0] == 0  # leaves the master
    probe = ("import sys, runpy; sys.argv = ['gpuws', *sys.argv[1:]]; code = None\n"
             "try:\n    runpy.run_module('gpuws', run_name='__main__')\n"
             "except SystemExit as e:\n    code = e.code\n"
             "sys.stderr.write(f'\\nexit={code} asyncssh={\"asyncssh\" in sys.modules}\\n')")
    done = subprocess.run([sys.executable, "-c", probe, "doctor", "pod", "-F", str(kept)],
                          capture_output=True, text=True, timeout=120)
    assert done.stderr.strip().splitlines()[-1] == "exit=0 asyncssh=False", done.stderr
    hello, found = master_hello(kept)
    assert found
    stop_master(hello["pid"])


# ------------------------------------------------------------------------- the socket's wire
def _frames_of(data: bytes) -> list[tuple[bytes, bytes]]:
    async def read() -> list[tuple[bytes, bytes]]:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        got = []
        while (f := await wire.read_frame(reader)) is not None:
            got.append(f)
        return got

    return asyncio.run(read())


def test_wire_frames_round_trip() -> None:
    big = os.urandom(wire.MAX_FRAME * 2 + 7)
    data = wire.control({"op": "info"}) + wire.frames(b"O", big) + wire.frame(b"N")
    got = _frames_of(data)
    assert got[0] == (b"J", b'{"op": "info"}')
    assert b"".join(p for k, p in got if k == b"O") == big
    assert [len(p) for k, p in got if k == b"O"] == [wire.MAX_FRAME, wire.MAX_FRAME, 7]
    assert got[-1] == (b"N", b"")


@pytest.mark.parametrize(("data", "why"), [
    (b"Z\x00\x00\x00\x00", "unknown frame kind"),
    (b"O\xff\xff\xff\xff", "a frame of 4294967295 bytes"),
    (b"O\x00\x10\x00\x01", "a frame of"),
    (b"O\x00\x00\x00\x09abc", "inside a frame"),
    (b"J\x00", "inside a frame"),
])
def test_wire_worst_frames_are_refused(data: bytes, why: str) -> None:
    with pytest.raises(wire.WireError, match=why):
        _frames_of(data)


@pytest.mark.parametrize("payload", [b"not json", b"[1, 2]", b'"text"', b"\xff\xfe"])
def test_wire_control_frames_must_be_objects(payload: bytes) -> None:
    with pytest.raises(wire.WireError):
        wire.decode(payload)


def test_an_error_crosses_as_its_own_class() -> None:
    from gpuws.errors import AuthError, GpuwsError

    exc = wire.error_of(wire.decode(wire.error_frame(AuthError("no key", remedy="ssh-add"))[5:]))
    assert isinstance(exc, AuthError) and exc.message == "no key" and exc.remedy == "ssh-add"
    odd = wire.error_of({"error": "SystemExit", "message": "x"})
    assert type(odd) is GpuwsError  # a name outside the list is never instantiated


def test_the_master_survives_clients_that_speak_nonsense(kept: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    assert doctor(capsys, kept)[0] == 0
    first, _ = master_hello(kept)
    sock = socket_of(kept)
    for junk in (b"", b"Z" * 64, b"J\xff\xff\xff\xff", wire.control({"op": "info"}),
                 wire.control({"hello": "gpuws-persist", "version": 1, "identity": "0" * 64,
                               "op": "info"}),
                 wire.control({"hello": "gpuws-persist", "version": 1,
                               "identity": first["identity"], "op": "start", "argv": "sh"}),
                 wire.control({"hello": "gpuws-persist", "version": 1,
                               "identity": first["identity"], "op": "format-disk"})):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(str(sock))
            s.sendall(junk)
            s.shutdown(socket.SHUT_WR)
            s.settimeout(30)
            answer = s.recv(65536)
            assert b"started" not in answer and b'"pid"' not in answer  # nothing served
    second, found = master_hello(kept)
    assert found and second["pid"] == first["pid"] and second["streams"] == first["streams"]
    stop_master(second["pid"])


def test_a_terminal_only_pod_is_kept_too(sshd_pty: SshServer, tmp_path: Path, runtime: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    sshd_pty.reset_pod()
    cfg = sshd_pty.client_files(tmp_path / "client")
    Path(os.environ["GPUWS_CONFIG"]).write_text('[hosts.pod]\npersist = "10m"\n')
    code, first, err = doctor(capsys, cfg)
    assert code == 0, err
    assert first["transport"]["kind"] == "pty"  # detected through the master ("switch")
    code, second, err = doctor(capsys, cfg)
    assert code == 0, err
    assert second["transport"]["kind"] == "pty" and second["agent"]["cache_state"] == "cached"
    hello, found = master_hello(cfg)
    assert found and hello["dials"] == 1 and hello["streams"] >= 2
    stop_master(hello["pid"])


@pytest.mark.parametrize("command", ["doctor", "run", "sync", "pull", "attach", "runs",
                                     "watch", "cancel"])
def test_every_pod_command_takes_no_persist(command: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    assert "--no-persist" in capsys.readouterr().out


def test_a_master_whose_link_dies_ends_and_the_next_command_makes_a_new_one(
        tmp_path: Path, runtime: Path, capsys: pytest.CaptureFixture[str]) -> None:
    server = SshServer(tmp_path / "own-sshd", "default").start()  # this test kills its sessions
    try:
        cfg = server.client_files(tmp_path / "client")
        Path(os.environ["GPUWS_CONFIG"]).write_text('[hosts.pod]\npersist = "10m"\n')
        assert doctor(capsys, cfg)[0] == 0
        first, _ = master_hello(cfg)
        sock = socket_of(cfg)
        # The connection's own sshd process (a child of the listening daemon) dies, as a
        # pod's sshd does when the pod goes away: the master's link is lost.
        daemon = server.proc.pid
        children = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
                    and _ppid(p) == daemon]
        assert children
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not alive(first["pid"]), "the master to end with its link")
        assert not sock.exists()  # it removed its own socket
        assert "link lost" in sock.with_suffix(".log").read_text()
        code, _, err = doctor(capsys, cfg)
        assert code == 0, err
        second, found = master_hello(cfg)
        assert found and second["pid"] != first["pid"]
        stop_master(second["pid"])
    finally:
        server.stop()


def _ppid(proc_dir: Path) -> int | None:
    try:
        return int((proc_dir / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def test_sync_of_big_files_through_the_master(kept: Path, sshd: SshServer, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from gpuws.workspace.sync import workspace_name

    # Puts of several MiB per line cross the socket as many 1 MiB frames each way.
    root = tmp_path / "proj"
    root.mkdir()
    blobs = {"big.bin": os.urandom(9 << 20), "small.py": b"print('hi')\n",
             "sub/mid.bin": os.urandom(3 << 20)}
    for rel, data in blobs.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    assert main(["sync", "pod", "-F", str(kept), "-W", str(root), "--json"]) == 0
    capsys.readouterr()
    where = sshd.pod_cache / "workspaces" / workspace_name(root.resolve())
    for rel, data in blobs.items():
        assert (where / rel).read_bytes() == data
    (root / "small.py").write_bytes(b"print('edited')\n")
    assert main(["sync", "pod", "-F", str(kept), "-W", str(root), "--json"]) == 0
    capsys.readouterr()
    assert (where / "small.py").read_bytes() == b"print('edited')\n"
    hello, found = master_hello(kept)
    assert found and hello["dials"] == 1 and hello["streams"] >= 2
    stop_master(hello["pid"])
