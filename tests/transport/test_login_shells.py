"""Deploy and every remote command work whatever the pod user's login shell is.

sshd runs an exec request's command line with the user's login shell; sh, dash, bash,
zsh, fish and tcsh quote differently (tcsh expands ``!`` and refuses newlines inside
quotes, fish has its own escapes). One real sshd; one user per shell (``useradd -s``,
so the test needs root, as in CI), each logging in with the same client key.

The PTY transport (``--pty``) meets the same shells interactively: it types its first
line into the login shell on a terminal, behind whatever that shell prints and reads
first (zsh with no startup files runs its new-user menu, which reads a key).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuws import deploy
from gpuws.cli import main
from gpuws.client import AgentClient
from gpuws.transport.pty import PTYTransport
from gpuws.transport.ssh import SSHTransport
from sshd import SshServer, sshd_missing_may_skip  # type: ignore[import-not-found]

SHELLS = ["sh", "dash", "bash", "zsh", "fish", "tcsh"]
#: Arguments every shell would mangle if it parsed them itself.
NASTY = ["a b", "$HOME", "!1", "it's", 'say "hi"', "x\ny", "*", "~", "%s", "\\n", "é", "`id`",
         "$(id)", "a;b", "{a,b}", "!!"]

pytestmark = [
    pytest.mark.skipif(sshd_missing_may_skip(), reason="OpenSSH sshd is not installed"),
    pytest.mark.skipif(os.geteuid() != 0, reason="creating users with a login shell needs "
                                                 "root (CI runs the suite as root)"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    s = SshServer(tmp_path_factory.mktemp("sshd-shells"), "shells").start()
    try:
        yield s
    finally:
        s.stop()


@pytest.mark.parametrize("shell", SHELLS)
def test_deploy_and_commands_under_each_login_shell(server: SshServer, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str],
                                                    shell: str) -> None:
    path = shutil.which(shell)
    if path is None:
        pytest.skip(f"{shell} is not installed (scripts/test installs zsh, fish and tcsh)")
    user = server.login_user(path)
    cfg = server.client_files(tmp_path / "c")
    code = main(["doctor", "pod", "-F", str(cfg), "-l", user, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out)
    assert report["system"]["user"] == user
    assert report["agent"]["cache_state"] == "need"
    assert report["agent"]["sha256"] == deploy.build_bundle().sha256

    async def commands() -> tuple[bytes, bytes, int | None]:
        t = SSHTransport("pod", config_file=str(cfg), user=user)
        await t.connect()
        try:
            login = await t.conn.run("echo $SHELL", check=False)
            echoed = await t.run(["printf", "%s|", *NASTY])
            missing = await t.run(["gpuws-no-such-command"])
            return (str(login.stdout).encode(), echoed.stdout, missing.returncode)
        finally:
            await t.close()

    login, echoed, missing = asyncio.run(commands())
    assert login.strip() == path.encode()  # the session really ran under that shell
    assert echoed == ("|".join(NASTY) + "|").encode()
    assert missing == 127


@pytest.fixture(scope="module")
def pty_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    """Another sshd, so that its users are new accounts too (names carry the port)."""
    s = SshServer(tmp_path_factory.mktemp("sshd-pty-shells"), "shells").start()
    try:
        yield s
    finally:
        s.stop()


@pytest.mark.parametrize("shell", SHELLS)
def test_pty_deploy_commands_and_a_run_under_each_login_shell(
        pty_server: SshServer, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        shell: str) -> None:
    server = pty_server
    path = shutil.which(shell)
    if path is None:
        pytest.skip(f"{shell} is not installed (scripts/test installs zsh, fish and tcsh)")
    user = server.login_user(path)  # a fresh account: no startup files of its own
    cfg = server.client_files(tmp_path / "c")
    code = main(["doctor", "pod", "-F", str(cfg), "-l", user, "--pty", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out)
    assert report["transport"]["kind"] == "pty" and report["system"]["user"] == user
    assert report["agent"]["cache_state"] == "need"  # the bundle went up as text lines
    assert report["agent"]["sha256"] == deploy.build_bundle().sha256

    async def commands() -> tuple[bytes, bytes, bytes, int | None]:
        client = await AgentClient.connect(PTYTransport("pod", config_file=str(cfg),
                                                        user=user, pty=True))
        t = client.transport
        try:
            assert client.deploy.cache_state == "cached"
            login = await t.run(["sh", "-c", 'echo "$SHELL"'])
            echoed = await t.run(["printf", "%s|", *NASTY])
            fed = await t.run(["cat"], input=b"".join(a.encode() + b"\0" for a in NASTY))
            missing = await t.run(["gpuws-no-such-command"])
            return login.stdout, echoed.stdout, fed.stdout, missing.returncode
        finally:
            await client.close()

    login, echoed, fed, missing = asyncio.run(commands())
    assert login.strip() == path.encode()  # that account, whose login shell it is
    assert echoed == ("|".join(NASTY) + "|").encode()
    assert fed.split(b"\0")[:-1] == [a.encode() for a in NASTY]
    assert missing == 127

    # A whole run through the terminal: start, events streamed, finished.
    code = main(["run", "pod", "-F", str(cfg), "-l", user, "--pty", "--no-pull",
                 "-w", "cmd:echo line-one; echo line-two"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "line-one" in out and "line-two" in out and "run ok" in out
