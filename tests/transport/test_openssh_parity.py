"""`gpuws doctor` succeeds exactly when `ssh` does, and reaches the same server.

Three real sshd servers on 127.0.0.1 (``hop1``, ``hop2``, ``pod``), each with its own
host key, client key and pod cache directory; each session learns its server's cache
directory through sshd's ``SetEnv GPUWS_POD_CACHE``, so ``echo $GPUWS_POD_CACHE`` says
which server a connection reached. For every config both OpenSSH's ``ssh`` and gpuws
connect; they must agree on success and on the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuws.cli import main
from gpuws.errors import AuthError, ConnectError
from gpuws.transport.ssh import SSHTransport
from sshd import SshServer, free_port, sshd_missing_may_skip  # type: ignore[import-not-found]

pytestmark = pytest.mark.skipif(shutil.which("ssh") is None or sshd_missing_may_skip(),
                                reason="needs OpenSSH's ssh and sshd (scripts/test installs "
                                       "openssh-client and openssh-server)")


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, SshServer]]:
    started: dict[str, SshServer] = {}
    try:
        for name in ("hop1", "hop2", "pod"):
            started[name] = SshServer(tmp_path_factory.mktemp(f"sshd-{name}")).start()
        yield started
    finally:
        for server in started.values():
            server.stop()


def block(alias: str, server: SshServer, kh: Path, extra: str = "", *,
          port: int | None = None) -> str:
    return (f"Host {alias}\n  HostName 127.0.0.1\n  Port {port or server.port}\n"
            f"  User {getpass.getuser()}\n  IdentityFile {server.client_key}\n"
            f"  IdentitiesOnly yes\n  UserKnownHostsFile {kh}\n"
            f"  StrictHostKeyChecking yes\n{extra}")


def write_config(tmp_path: Path, servers: dict[str, SshServer], text: str) -> str:
    kh = tmp_path / "known_hosts"
    kh.write_text("".join(s.known_hosts_line() for s in servers.values()))
    cfg = tmp_path / "ssh_config"
    cfg.write_text(text.format(kh=kh, d=tmp_path))
    return str(cfg)


def ssh_reaches(cfg: str, env: dict[str, str] | None = None) -> str | None:
    """The pod cache dir of the server OpenSSH's ssh reaches, None when ssh fails."""
    r = subprocess.run(["ssh", "-F", cfg, "-o", "BatchMode=yes", "pod",
                        "echo $GPUWS_POD_CACHE"], capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})
    return r.stdout.strip() if r.returncode == 0 else None


def gpuws_reaches(cfg: str, capsys: pytest.CaptureFixture[str]) -> tuple[str | None, str]:
    """(the server gpuws reaches or None, doctor's error line)."""
    code = main(["doctor", "pod", "-F", cfg, "--json"])
    err = capsys.readouterr().err
    if code != 0:
        assert len(err.strip().splitlines()) == 1, err  # one line, never a traceback
        return None, err

    async def which() -> str:
        t = SSHTransport("pod", config_file=cfg)
        await t.connect()
        try:
            return (await t.run(["sh", "-c", "echo $GPUWS_POD_CACHE"])).stdout.decode().strip()
        finally:
            await t.close()

    return asyncio.run(which()), err


def same_as_ssh(cfg: str, capsys: pytest.CaptureFixture[str],
                env: dict[str, str] | None = None) -> tuple[str | None, str]:
    theirs = ssh_reaches(cfg, env)
    ours, err = gpuws_reaches(cfg, capsys)
    assert ours == theirs, f"ssh reached {theirs}, gpuws {ours}: {err}"
    return ours, err


def test_two_hop_proxy_jump(servers: dict[str, SshServer], tmp_path: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_config(tmp_path, servers, block("hop1", servers["hop1"], tmp_path / "known_hosts")
                       + block("hop2", servers["hop2"], tmp_path / "known_hosts")
                       + block("pod", servers["pod"], tmp_path / "known_hosts",
                               "  ProxyJump hop1,hop2\n"))
    reached, _ = same_as_ssh(cfg, capsys)
    assert reached == str(servers["pod"].pod_cache)
    target = SSHTransport("pod", config_file=cfg).target
    assert target.proxy_jump == "hop1,hop2" and target.jump_hosts == ["hop1", "hop2"]


@pytest.mark.parametrize("down", ["hop1", "hop2"])
def test_a_jump_host_that_is_down_fails_naming_it(servers: dict[str, SshServer], tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str],
                                                  down: str) -> None:
    kh = tmp_path / "known_hosts"
    dead = free_port()
    cfg = write_config(tmp_path, servers,
                       block("hop1", servers["hop1"], kh, port=dead if down == "hop1" else None)
                       + block("hop2", servers["hop2"], kh, port=dead if down == "hop2" else None)
                       + block("pod", servers["pod"], kh, "  ProxyJump hop1,hop2\n"))
    reached, err = same_as_ssh(cfg, capsys)
    assert reached is None
    hop = "hop 1 of 2" if down == "hop1" else "hop 2 of 2"
    assert f"jump host {down} ({hop})" in err
    if down == "hop1":
        assert "Connection refused" in err
    else:  # hop1 is asked to reach hop2's port, and cannot
        assert "could not reach 127.0.0.1" in err


def test_a_hop_with_an_unknown_host_key_is_refused(servers: dict[str, SshServer], tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    kh = tmp_path / "known_hosts"
    cfg = write_config(tmp_path, servers, block("hop1", servers["hop1"], kh)
                       + block("pod", servers["pod"], kh, "  ProxyJump hop1\n"))
    kh.write_text(servers["pod"].known_hosts_line())  # hop1's key is not known
    reached, err = same_as_ssh(cfg, capsys)
    assert reached is None and "jump host hop1: " in err and "Unknown host key" in err


def test_include_in_a_block_that_does_not_match_is_not_applied(
        servers: dict[str, SshServer], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "inc.conf").write_text(f"Port {servers['hop1'].port}\n"
                                       f"IdentityFile {servers['hop1'].client_key}\n")
    cfg = write_config(tmp_path, servers, "Host other\n  Include {d}/inc.conf\n"
                       + block("pod", servers["pod"], tmp_path / "known_hosts"))
    reached, _ = same_as_ssh(cfg, capsys)
    assert reached == str(servers["pod"].pod_cache)


def test_match_blocks_as_ssh_evaluates_them(servers: dict[str, SshServer], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    pod = servers["pod"]
    cfg = write_config(tmp_path, servers,
                       "Host pod\n  HostName 127.0.0.1\n"
                       f"Match originalhost pod\n  Port {pod.port}\n"
                       f"  IdentityFile {pod.client_key}\n"
                       f"Match all\n  User {getpass.getuser()}\n  IdentitiesOnly yes\n"
                       "  UserKnownHostsFile {kh}\n  StrictHostKeyChecking yes\n")
    reached, _ = same_as_ssh(cfg, capsys)
    assert reached == str(pod.pod_cache)


def test_quoted_host_name(servers: dict[str, SshServer], tmp_path: Path,
                          capsys: pytest.CaptureFixture[str]) -> None:
    text = block("pod", servers["pod"], tmp_path / "known_hosts").replace(
        "HostName 127.0.0.1", 'HostName "127.0.0.1"')
    reached, _ = same_as_ssh(write_config(tmp_path, servers, text), capsys)
    assert reached == str(servers["pod"].pod_cache)


def test_proxy_command(servers: dict[str, SshServer], tmp_path: Path,
                       capsys: pytest.CaptureFixture[str]) -> None:
    kh = tmp_path / "known_hosts"
    cfg_path = tmp_path / "ssh_config"
    cfg = write_config(tmp_path, servers, block("hop1", servers["hop1"], kh) + block(
        "pod", servers["pod"], kh, f"  ProxyCommand ssh -F {cfg_path} -W %h:%p hop1\n"))
    reached, _ = same_as_ssh(cfg, capsys)
    assert reached == str(servers["pod"].pod_cache)


def test_a_failing_proxy_command_says_what_it_said(servers: dict[str, SshServer],
                                                   tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_config(tmp_path, servers, block(
        "pod", servers["pod"], tmp_path / "known_hosts",
        "  ProxyCommand sh -c 'echo no route to %h >&2; exit 3'\n"))
    reached, err = same_as_ssh(cfg, capsys)
    assert reached is None
    assert "ProxyCommand failed" in err and "no route to 127.0.0.1" in err and "status 3" in err


def test_a_host_name_only_the_jump_host_could_resolve(servers: dict[str, SshServer],
                                                      tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    kh = tmp_path / "known_hosts"
    text = block("hop1", servers["hop1"], kh) + block(
        "pod", servers["pod"], kh, "  ProxyJump hop1\n").replace(
        "HostName 127.0.0.1", "HostName pod-only-the-jump-host-knows.invalid")
    reached, err = same_as_ssh(write_config(tmp_path, servers, text), capsys)
    assert reached is None
    assert "Jump host cannot reach the pod" in err
    assert "jump host hop1 could not reach pod-only-the-jump-host-knows.invalid" in err


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[str]:
    """A real ssh-agent on a socket of its own; stopped by its pid after the test."""
    sock = str(tmp_path / "agent.sock")
    out = subprocess.run(["ssh-agent", "-s", "-a", sock], capture_output=True, text=True,
                         check=True).stdout
    pid = int(out.split("SSH_AGENT_PID=")[1].split(";")[0])
    try:
        yield sock
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)


def _agent_holds(sock: str, key: Path) -> None:
    subprocess.run(["ssh-add", "-q", str(key)], env={**os.environ, "SSH_AUTH_SOCK": sock},
                   check=True, capture_output=True)


def test_identities_only_with_a_public_key_file_selects_the_agent_key(
        servers: dict[str, SshServer], tmp_path: Path, agent: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    pod = servers["pod"]
    _agent_holds(agent, pod.client_key)
    _agent_holds(agent, servers["hop1"].client_key)  # another key, not to be offered first
    pub = tmp_path / "pod_key.pub"  # only the public half on disk, as with 1Password
    shutil.copy(f"{pod.client_key}.pub", pub)
    text = block("pod", pod, tmp_path / "known_hosts").replace(
        f"IdentityFile {pod.client_key}", f"IdentityFile {pub}\n  IdentityAgent {agent}")
    reached, _ = same_as_ssh(write_config(tmp_path, servers, text), capsys)
    assert reached == str(pod.pod_cache)


def test_an_identity_file_missing_on_disk_while_the_agent_holds_the_key(
        servers: dict[str, SshServer], tmp_path: Path, agent: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    pod = servers["pod"]
    _agent_holds(agent, pod.client_key)
    text = block("pod", pod, tmp_path / "known_hosts").replace(
        f"IdentityFile {pod.client_key}\n  IdentitiesOnly yes",
        f"IdentityFile {tmp_path}/gone_key\n  IdentityAgent {agent}")
    reached, _ = same_as_ssh(write_config(tmp_path, servers, text), capsys)
    assert reached == str(pod.pod_cache)


def test_identities_only_refuses_agent_keys_not_named(servers: dict[str, SshServer],
                                                     tmp_path: Path, agent: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    pod = servers["pod"]
    _agent_holds(agent, pod.client_key)
    pub = tmp_path / "other.pub"
    shutil.copy(f"{servers['hop1'].client_key}.pub", pub)
    text = block("pod", pod, tmp_path / "known_hosts").replace(
        f"IdentityFile {pod.client_key}", f"IdentityFile {pub}\n  IdentityAgent {agent}")
    cfg = write_config(tmp_path, servers, text)
    reached, err = same_as_ssh(cfg, capsys)
    assert reached is None and "refused our keys" in err
    with pytest.raises(AuthError):
        asyncio.run(SSHTransport("pod", config_file=cfg).connect())


@contextlib.contextmanager
def tcp_server(reply: bytes | None) -> Iterator[int]:
    """A TCP port that answers with ``reply`` and closes, or (None) says nothing."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    stop = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            if reply is None:
                held.append(conn)
                continue
            with conn:
                conn.recv(1024)
                conn.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(2)
        for conn in held:
            conn.close()
        listener.close()


def test_a_port_that_is_not_ssh(servers: dict[str, SshServer], tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    with tcp_server(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n") as port:
        cfg = write_config(tmp_path, servers, block("pod", servers["pod"],
                                                    tmp_path / "known_hosts", port=port))
        reached, err = same_as_ssh(cfg, capsys)
    assert reached is None
    assert "Not an SSH server" in err and f"127.0.0.1:{port} answered" in err and "-p" in err


def test_a_port_that_never_sends_a_banner(servers: dict[str, SshServer], tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    with tcp_server(None) as port:
        cfg = write_config(tmp_path, servers, block("pod", servers["pod"],
                                                    tmp_path / "known_hosts",
                                                    "  ConnectTimeout 1\n", port=port))
        reached, err = same_as_ssh(cfg, capsys)
    assert reached is None
    assert "No SSH banner" in err and "within 1 s" in err


def test_errors_keep_their_class(servers: dict[str, SshServer], tmp_path: Path) -> None:
    kh = tmp_path / "known_hosts"
    cfg = write_config(tmp_path, servers, block("hop1", servers["hop1"], kh, port=free_port())
                       + block("pod", servers["pod"], kh, "  ProxyJump hop1\n"))
    with pytest.raises(ConnectError, match=r"jump host hop1: connection to .* refused") as info:
        asyncio.run(SSHTransport("pod", config_file=cfg).connect())
    assert info.value.title == "Connection refused"


def test_without_the_ssh_client_asyncssh_config_reaches_the_same_server(
        servers: dict[str, SshServer], tmp_path: Path) -> None:
    kh = tmp_path / "known_hosts"
    (tmp_path / "inc.conf").write_text(f"Port {servers['hop1'].port}\n")
    cfg = write_config(tmp_path, servers, "Host other\n  Include {d}/inc.conf\n"
                       + block("hop1", servers["hop1"], kh) + block("hop2", servers["hop2"], kh)
                       + block("pod", servers["pod"], kh, "  ProxyJump hop1,hop2\n"))

    async def which() -> tuple[str, str]:
        t = SSHTransport("pod", config_file=cfg, ssh_binary="")  # as if ssh were missing
        await t.connect()
        try:
            out = await t.run(["sh", "-c", "echo $GPUWS_POD_CACHE"])
            return out.stdout.decode().strip(), t.target.source
        finally:
            await t.close()

    reached, source = asyncio.run(which())
    assert source == "asyncssh config"
    assert reached == ssh_reaches(cfg) == str(servers["pod"].pod_cache)
