"""The PTY-only transport against a real sshd configured like RunPod's basic SSH proxy.

The server (tests/transport/pty_proxy.sh as ForceCommand, no SFTP subsystem) refuses
exec and every session without a terminal, and greets a terminal with a banner, a MOTD
and a login shell with a coloured prompt and bracketed paste: gpuws must do everything
through that, by itself.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuws import deploy, protocol
from gpuws.cli import main
from gpuws.client import AgentClient
from gpuws.errors import NoPythonError, TransferError
from gpuws.transport import make_transport
from gpuws.transport.pty import PTYTransport, _frame, _octal, readable
from sshd import SshServer  # type: ignore[import-not-found]

SHA_ABC = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


@pytest.fixture
def pty_config(sshd_pty: SshServer, tmp_path: Path) -> Path:
    """Client files for the PTY proxy (alias ``pod``), with a fresh pod cache."""
    sshd_pty.reset_pod()
    return sshd_pty.client_files(tmp_path / "client")


@contextlib.contextmanager
def _server(tmp_path: Path, **kw: object) -> Iterator[SshServer]:
    """A PTY proxy of its own, for a variant (another shell, noise, one session...)."""
    server = SshServer(tmp_path / "sshd", "ptyproxy", **kw).start()
    try:
        yield server
    finally:
        server.stop()


def doctor_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict, str]:
    code = main(["doctor", *args, "--json"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else {}), err


async def wait_finished(events: list, timeout: float = 30) -> protocol.RunFinished:
    for _ in range(int(timeout / 0.02)):
        for e in events:
            if isinstance(e, protocol.RunFinished):
                return e
        await asyncio.sleep(0.02)
    raise AssertionError(f"run did not finish; got {[type(e).__name__ for e in events]}")


def put_run_file(server: SshServer, name: str, data: bytes) -> Path:
    """A file where the agent serves files from: a run directory in the pod's cache."""
    run_dir = server.pod_cache / "runs" / "r-files"
    run_dir.mkdir(parents=True, mode=0o700, exist_ok=True)
    path = run_dir / name
    path.write_bytes(data)
    return path


# ----------------------------------------------------------------------------- the proxy
@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the OpenSSH client")
def test_the_proxy_really_refuses_exec(pty_config: Path) -> None:
    plain = subprocess.run(["ssh", "-F", str(pty_config), "pod", "true"], capture_output=True,
                           text=True, timeout=20, stdin=subprocess.DEVNULL)
    assert plain.returncode == 1
    assert "Your SSH client doesn't support PTY" in plain.stdout + plain.stderr
    forced = subprocess.run(["ssh", "-tt", "-F", str(pty_config), "pod", "true"],
                            capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
    assert forced.returncode == 1 and "commands are not supported" in forced.stdout
    # (No SFTP either: the doctor test sees the subsystem refused, ``sftp: false``.)


# ----------------------------------------------------------------------------- doctor
def test_doctor_detects_the_pty_proxy_and_reuses_the_cache(
        pty_config: Path, sshd_pty: SshServer, capsys: pytest.CaptureFixture[str]) -> None:
    bundle = deploy.build_bundle()
    code, first, err = doctor_json(capsys, "pod", "-F", str(pty_config))
    assert code == 0, err
    tr = first["transport"]
    assert tr["kind"] == "pty" and tr["sftp"] is False
    notes = " ".join(tr["notes"])
    assert "Your SSH client doesn't support PTY" in notes  # why it was detected
    assert "no exec, SFTP or SCP" in notes and "expose TCP port 22" in notes  # limits, remedy
    assert first["agent"]["cache_state"] == "need"
    assert first["agent"]["transferred_bytes"] == bundle.size
    assert first["agent"]["sha256"] == bundle.sha256
    assert first["python"]["version"].startswith("3.")
    # The cached bundle is reused exactly as over exec: the second connect sends nothing
    # (checked below, in the human rendering).
    cached = sshd_pty.pod_cache / "agent" / f"{bundle.sha256}.pyz"
    assert cached.read_bytes() == bundle.data
    assert oct(cached.stat().st_mode & 0o777) == "0o600"
    assert not list((sshd_pty.pod_cache / "agent").glob("*.part"))
    # The human rendering names the transport and its remedy too.
    assert main(["doctor", "pod", "-F", str(pty_config)]) == 0
    out = capsys.readouterr().out
    assert "pty, no SFTP" in out and "TCP port 22" in out and "cached, sent 0 B" in out


def test_pty_flag_uses_a_terminal_even_on_full_ssh(
        ssh_config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, r, err = doctor_json(capsys, "pod", "-F", str(ssh_config), "--pty")
    assert code == 0, err
    assert r["transport"]["kind"] == "pty"
    assert "asked for with --pty" in " ".join(r["transport"]["notes"])
    assert r["agent"]["cache_state"] == "need"


def test_full_ssh_is_not_probed_and_stays_ssh(ssh_config: Path) -> None:
    t = make_transport("pod", config_file=str(ssh_config))
    assert isinstance(t, PTYTransport)

    async def go() -> None:
        await t.connect()
        try:
            await t.settled()  # the SFTP probe runs while the agent would start
            assert t.info.kind == "ssh" and t.info.sftp and not t.pty
        finally:
            await t.close()

    asyncio.run(go())


def test_upload_resumes_from_a_partial_bundle(pty_config: Path, sshd_pty: SshServer,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    bundle = deploy.build_bundle()
    agent_dir = sshd_pty.pod_cache / "agent"
    agent_dir.mkdir(mode=0o700)
    have = 7 * deploy.TEXT_CHUNK  # what a broken first attempt left behind
    (agent_dir / f"{bundle.sha256}.pyz.part").write_bytes(bundle.data[:have])
    code, r, err = doctor_json(capsys, "pod", "-F", str(pty_config))
    assert code == 0, err
    assert r["agent"]["cache_state"] == "need"
    assert r["agent"]["transferred_bytes"] == bundle.size - have
    assert (agent_dir / f"{bundle.sha256}.pyz").read_bytes() == bundle.data


def test_dash_login_shell_and_one_session_per_connection(tmp_path: Path) -> None:
    """``sh -i`` (dash: no line editor, canonical mode until stty) behind a proxy that
    allows one session per connection: the pull gets a connection of its own."""
    with _server(tmp_path, pty_shell="sh", max_sessions=1) as server:
        cfg = server.client_files(tmp_path / "c")
        data = os.urandom(300_000)
        path = put_run_file(server, "blob.bin", data)

        async def go() -> tuple[bytes, int]:
            client = await AgentClient.connect(PTYTransport("pod", config_file=str(cfg)))
            try:
                assert client.transport.info.kind == "pty"
                await client.ping()
                got = b"".join([c async for c in client.transport.read_file(
                    str(path), 0, client.agent_argv())])
                await client.ping()  # the agent's own terminal is still fine
                assert isinstance(client.transport, PTYTransport)
                return got, len(client.transport._extra)
            finally:
                await client.close()

        got, extra = asyncio.run(go())
        assert got == data
        assert extra == 1


def test_no_python_on_a_pty_pod_is_one_clear_line(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stty = shutil.which("stty")
    assert stty is not None
    (bin_dir / "stty").symlink_to(stty)
    with _server(tmp_path, pty_path=str(bin_dir)) as server:
        cfg = server.client_files(tmp_path / "c")
        code = main(["doctor", "pod", "-F", str(cfg)])
        err = capsys.readouterr().err
        assert code == NoPythonError.exit_code
        assert "No usable python3" in err and "python3: not found" in err
        assert len(err.strip().splitlines()) == 1


# ----------------------------------------------------------------------------- runs
def test_cmd_run_streams_pulls_and_exports_through_the_terminal(
        pty_config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cmd = ("for i in 1 2 3; do echo step-$i; sleep 0.05; done; echo oops >&2; "
           "printf abc > $GPUWS_ARTIFACT_DIR/out.txt")
    code = main(["run", "pod", "-F", str(pty_config), "-w", f"cmd:{cmd}", "--tiers", "1",
                 "--rate", "2.5"])
    out, err = capsys.readouterr()
    assert code == 0, err
    for text in ("step-1", "step-2", "step-3", "oops", "pulled out.txt"):
        assert text in out
    assert main(["sessions", "--json"]) == 0
    sessions = json.loads(capsys.readouterr().out)
    assert len(sessions) == 1 and sessions[0]["runs"] == 1
    report = tmp_path / "report.md"
    assert main(["export", sessions[0]["id"], "-o", str(report)]) == 0
    text = report.read_text()
    assert "via pty" in text and SHA_ABC in text and "out.txt" in text
    pulled = list((Path(os.environ["GPUWS_HOME"])).rglob("out.txt"))
    assert [p.read_bytes() for p in pulled] == [b"abc"]


def test_detach_then_attach_through_the_terminal(
        pty_config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["pod", "-F", str(pty_config)]
    code = main(["run", *args, "-w", "cmd:echo early-line; sleep 0.3; echo late-line",
                 "--tiers", "1", "--detach"])
    out, err = capsys.readouterr()
    assert code == 0, err
    run_id = out.strip().splitlines()[-1]
    code = main(["attach", *args, run_id])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "late-line" in out and "run ok" in out


def test_dropped_link_loses_nothing_cancel_and_telemetry(pty_config: Path) -> None:
    count = "for i in $(seq 1 30); do echo line-$i; sleep 0.02; done"

    async def go() -> tuple[list, list, list, protocol.RunInfo, list]:
        first = await AgentClient.connect(PTYTransport("pod", config_file=str(pty_config)))
        seen: list = []
        first.add_listener(seen.append)
        await first.telemetry(0.05)
        info = await first.start_run(protocol.RunSpec(workload=f"cmd:{count}", tiers=[]))
        while not any(isinstance(e, protocol.Output) for e in seen):
            await asyncio.sleep(0.02)
        assert isinstance(first.transport, PTYTransport)
        first.transport.conn.abort()  # the link drops mid-run
        await first.wait_closed()
        before = [e for e in seen if getattr(e, "run_id", None)]
        telemetry = [e for e in seen if isinstance(e, protocol.Telemetry)]
        second = await AgentClient.connect(PTYTransport("pod", config_file=str(pty_config)))
        try:
            rest: list = []
            second.add_listener(rest.append)
            await second.attach(info.run_id, from_seq=before[-1].seq + 1)
            await wait_finished(rest)
            sleeper = await second.start_run(protocol.RunSpec(workload="cmd:sleep 60",
                                                              tiers=[]))
            cancelled = await second.cancel(sleeper.run_id)
            runs = await second.list_runs()
        finally:
            await second.close()
        return before, rest, telemetry, cancelled, runs

    before, rest, telemetry, cancelled, runs = asyncio.run(go())
    events = before + [e for e in rest if getattr(e, "run_id", None) == before[0].run_id]
    assert [e.seq for e in events] == list(range(len(events)))  # gap-free, exactly once
    assert [e.text for e in events if isinstance(e, protocol.Output)] == [
        f"line-{i}" for i in range(1, 31)]
    assert 0 < len([e for e in before if isinstance(e, protocol.Output)]) < 30
    assert isinstance(events[-1], protocol.RunFinished) and events[-1].status == "ok"
    assert telemetry  # telemetry frames came through the terminal too
    assert cancelled.status == "cancelled"
    assert {r.run_id: r.status for r in runs}[cancelled.run_id] == "cancelled"


# ----------------------------------------------------------------------------- files
def test_pull_resumes_after_a_broken_link_and_verifies(pty_config: Path,
                                                       sshd_pty: SshServer) -> None:
    data = os.urandom(3 << 20)
    path = put_run_file(sshd_pty, "big.bin", data)

    async def go() -> tuple[bytes, int]:
        t = PTYTransport("pod", config_file=str(pty_config))
        client = await AgentClient.connect(t)
        try:
            parts = []
            async for chunk in t.read_file(str(path), 1000, client.agent_argv(), 1 << 16):
                parts.append(chunk)
                if len(parts) == 2:
                    t.conn.abort()  # the link breaks mid-transfer
            return b"".join(parts), t.resumes
        finally:
            await client.close()

    got, resumes = asyncio.run(go())
    assert hashlib.sha256(got).hexdigest() == hashlib.sha256(data[1000:]).hexdigest()
    assert resumes >= 1


def test_read_errors_and_commands_over_the_terminal(pty_config: Path) -> None:
    async def go() -> None:
        t = PTYTransport("pod", config_file=str(pty_config))
        client = await AgentClient.connect(t)
        try:
            with pytest.raises(TransferError, match="only files under"):
                async for _ in t.read_file("/etc/passwd", 0, client.agent_argv()):
                    pass
            text = b"".join(b"line %d\n" % i for i in range(3000))
            res = await t.run(["sh", "-c", "cat; echo to-stderr >&2; exit 3"], input=text)
            assert res.returncode == 3 and res.stdout == text + b"to-stderr\n"
            res = await t.run(["sh", "-c", "read x; echo got:$x"])  # stdin is /dev/null
            assert res.returncode == 0 and res.stdout == b"got:\n"
            long_arg = "x" * 5000  # longer than a line typed ahead may be
            res = await t.run(["echo", long_arg])
            assert res.stdout == long_arg.encode() + b"\n"
            res = await t.run(["sh", "-c", "echo 'a b'\necho \"$HOME\" >/dev/null; echo c"])
            assert res.returncode == 0 and res.stdout == b"a b\nc\n"
            proc = await t.start(["cat"])
            with pytest.raises(TransferError, match="control byte"):
                proc.stdin.write(b"\x03")
            proc.close()
        finally:
            await client.close()

    asyncio.run(go())


def test_noise_on_the_terminal_is_skipped_never_fatal(tmp_path: Path) -> None:
    """A background job writes to the terminal all along: frames still get through."""
    with _server(tmp_path, pty_noise=0.03) as server:
        cfg = server.client_files(tmp_path / "c")
        data = os.urandom(1 << 20)
        path = put_run_file(server, "noisy.bin", data)

        async def go() -> tuple[list, AgentClient, bytes]:
            client = await AgentClient.connect(PTYTransport("pod", config_file=str(cfg)))
            try:
                events: list = []
                client.add_listener(events.append)
                await client.start_run(protocol.RunSpec(
                    workload="cmd:for i in $(seq 1 20); do echo n-$i; sleep 0.02; done",
                    tiers=[]))
                await wait_finished(events)
                got = b"".join([c async for c in client.transport.read_file(
                    str(path), 0, client.agent_argv(), 1 << 14)])
                return events, client, got
            finally:
                await client.close()

        seen, client, got = asyncio.run(go())
        events = [e for e in seen if not isinstance(e, protocol.BadLine)]
        assert [e.text for e in events if isinstance(e, protocol.Output)] == [
            f"n-{i}" for i in range(1, 21)]
        assert [e.seq for e in events] == list(range(len(events)))
        assert any("Broadcast message" in b.preview for b in client.bad_lines)
        assert got == data


# ----------------------------------------------------------------------------- pieces
def test_text_bootstrap_skips_noise_and_asks_again_for_a_garbled_chunk(
        tmp_path: Path) -> None:
    """Stage 1 for terminals, run here: noise, a corrupt chunk and a gap are survived."""
    bundle = deploy.build_bundle()
    cache = tmp_path / "pod"
    cache.mkdir(mode=0o700)
    argv = deploy.text_bootstrap_argv(bundle, ["cat64", "/etc/hostname", "0"], sys.executable)
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env={**os.environ, "GPUWS_POD_CACHE": str(cache)})
    assert proc.stdin is not None and proc.stdout is not None
    assert proc.stdout.readline() == f"GPUWS-BOOT need {bundle.sha256} 0\n".encode()
    lines = deploy.text_chunks(bundle, 0)
    bad = lines[3].replace(b" ", b" x", 1)  # a chunk line with a mangled checksum field
    first = [b"\x1b[?2004l\r noise from the terminal\n", *lines[:3], bad, *lines[4:]]
    proc.stdin.write(b"".join(first) + b"GPUWS-SENT\n")
    proc.stdin.flush()
    again = proc.stdout.readline().split()
    assert again == [b"GPUWS-BOOT", b"need", bundle.sha256.encode(),
                     str(3 * deploy.TEXT_CHUNK).encode()]
    proc.stdin.write(b"".join(deploy.text_chunks(bundle, 3 * deploy.TEXT_CHUNK))
                     + b"GPUWS-SENT\n")
    proc.stdin.flush()
    assert proc.stdout.readline() == b"GPUWS-BOOT start need\n"
    rest = proc.stdout.read()
    assert proc.wait(10) == 1 and rest.startswith(b"GPWS-ERR refusing to read /etc/hostname")
    assert (cache / "agent" / f"{bundle.sha256}.pyz").read_bytes() == bundle.data
    loader = argv[argv.index("-c") + 1]
    assert len(" ".join(argv[:argv.index(loader) + 1])) < 2000  # one short line
    assert "'" not in loader.split("'")[1] and "\n" not in loader  # shell-safe characters


def test_agent_cat64_frames_verify(tmp_path: Path) -> None:
    cache = tmp_path / "pod"
    run_dir = cache / "runs" / "r1"
    run_dir.mkdir(parents=True, mode=0o700)
    report = (Path(__file__).parent.parent / "fixtures" / "recorded" / "saxpy_h200.ncu-rep")
    data = os.urandom(5_000) + report.read_bytes()[:60_000]  # packed, then compressible
    (run_dir / "f.bin").write_bytes(data)
    env = {**os.environ, "GPUWS_POD_CACHE": str(cache)}
    out = subprocess.run([sys.executable, "-m", "gpuws.remote_agent", "cat64",
                          str(run_dir / "f.bin"), "100", "4096"], env=env,
                         capture_output=True, check=True).stdout.splitlines()
    pos, got, encodings = 100, b"", []
    for line in out[:-1]:
        assert line.startswith(b"GPWS-CAT ")
        piece = _frame(line[9:], pos)
        assert piece is not None
        encodings.append(line.split(b" ")[4])
        got += piece
        pos += len(piece)
    assert got == data[100:]
    assert out[-1] == b"GPWS-END 65000 " + hashlib.sha256(data[100:]).hexdigest().encode()
    # Random bytes go as plain base64; once the report starts, chunks go compressed.
    assert encodings[0] == b"b64" and encodings[-1] == b"z64"
    assert sum(len(x) for x in out) < len(base64.b64encode(data[100:]))
    # A frame is refused when it does not start where we are, or its data is not intact.
    assert _frame(out[0][9:], 99) is None
    fields = out[0][9:].split(b" ")
    tampered = base64.b64encode(b"Y" + base64.b64decode(fields[4])[1:])
    assert _frame(b" ".join([*fields[:4], tampered]), 100) is None
    assert _frame(b" ".join([*fields[:3], b"z64", fields[4]]), 100) is None
    assert _frame(b"100 3 abc b64", 100) is None


def test_markers_and_readable_output() -> None:
    token = "GPWS-0123abcd-GO"
    escaped = _octal(token)
    assert token not in escaped and set(escaped) <= set("\\01234567")
    printed = subprocess.run(["sh", "-c", f"printf '{escaped}\\n'"], capture_output=True,
                             check=True).stdout
    assert printed == token.encode() + b"\n"
    raw = (b"\x1b[?2004h\x1b[01;32mroot@pod-7f3a\x1b[00m:~# \x1b[?2004l\r\n"
           b"bash: exec: python3: not found\r\n")
    assert readable(raw) == "root@pod-7f3a:~# | bash: exec: python3: not found"
