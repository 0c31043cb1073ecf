"""Nothing secret is written anywhere, and what gpuws writes is private to the user.

A client key protected by a passphrase is loaded into an ssh-agent started here; a real
sshd accepts only that key. A full authenticated ``gpuws run`` (with an artifact pulled
home), ``gpuws sessions`` and ``gpuws export`` follow. Then everything gpuws wrote is
searched for the passphrase and for every piece of the private key: GPUWS_HOME (store,
WAL, artifacts), the pod's cache (agent, run directories, logs), the export, and what
the commands printed. Every file gpuws created on either side must be 0600 and every
directory 0700.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from faults.figures import record  # type: ignore[import-not-found]
from gpuws.cli import main
from gpuws.errors import AuthError
from sshd import REQUIRE_SSHD, SshServer  # type: ignore[import-not-found]

PASSPHRASE = "correct horse battery staple 7f3a"


@pytest.fixture
def agent_and_server(tmp_path: Path, need_sshd: None
                     ) -> Iterator[tuple[SshServer, Path, Path]]:
    """A fresh sshd that accepts only a passphrase-protected key held by an ssh-agent."""
    if shutil.which("ssh-agent") is None:
        # openssh-client brings it; scripts/test installs that (and then it must be here).
        if REQUIRE_SSHD:
            pytest.fail("ssh-agent is not installed (scripts/test installs "
                        "openssh-client)", pytrace=False)
        pytest.skip("needs OpenSSH's ssh-agent and ssh-add")
    server = SshServer(tmp_path / "srv").start()
    key = tmp_path / "keys" / "id_locked"
    key.parent.mkdir(mode=0o700)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", PASSPHRASE, "-C", "locked",
                    "-f", str(key)], check=True)
    (server.root / "authorized_keys").write_text(key.with_suffix(".pub").read_text())
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not sock.exists():
            assert time.monotonic() < deadline, "ssh-agent did not start"
            time.sleep(0.02)
        askpass = tmp_path / "askpass.sh"
        askpass.write_text(f"#!/bin/sh\necho '{PASSPHRASE}'\n")
        askpass.chmod(0o700)
        env = {**os.environ, "SSH_AUTH_SOCK": str(sock), "SSH_ASKPASS": str(askpass),
               "SSH_ASKPASS_REQUIRE": "force", "DISPLAY": "none"}
        added = subprocess.run(["ssh-add", str(key)], env=env, stdin=subprocess.DEVNULL,
                               capture_output=True, text=True)
        assert added.returncode == 0, added.stderr
        askpass.unlink()  # the passphrase now lives only in this test and in the agent
        yield server, key, sock
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(5)
        server.stop()


def config(server: SshServer, where: Path, extra: str) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    (where / "known_hosts").write_text(server.known_hosts_line())
    cfg = where / "ssh_config"
    cfg.write_text(f"Host pod\n  HostName 127.0.0.1\n  Port {server.port}\n  User root\n"
                   f"  UserKnownHostsFile {where / 'known_hosts'}\n"
                   f"  StrictHostKeyChecking yes\n{extra}")
    return cfg


def secrets_of(key: Path) -> list[bytes]:
    """The passphrase and every 16-byte run of the private key file's body."""
    body = [ln for ln in key.read_text().splitlines() if ln and not ln.startswith("-----")]
    pieces = [PASSPHRASE.encode(), b"PRIVATE KEY"]
    for line in body:
        pieces += [line[i:i + 16].encode() for i in range(0, max(1, len(line) - 15), 8)]
    return pieces


def test_nothing_secret_is_written_and_everything_is_private(
        agent_and_server: tuple[SshServer, Path, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    server, key, sock = agent_and_server
    home = Path(os.environ["GPUWS_HOME"])
    t0 = time.monotonic()

    # Through the agent: a whole authenticated session.
    cfg = config(server, tmp_path / "c2", f"  IdentityAgent {sock}\n")
    workload = ("cmd:echo authenticated-run; printf 'result' > $GPUWS_ARTIFACT_DIR/out.txt; "
                "env | sort > $GPUWS_ARTIFACT_DIR/env.txt")
    assert main(["run", "pod", "-F", str(cfg), "-w", workload,
                 "--rate", "3.5"]) == 0
    assert main(["sessions", "--json"]) == 0
    printed = capsys.readouterr()
    import json

    sid = json.loads(printed.out[printed.out.index("["):])[0]["id"]
    report = tmp_path / "report.md"
    assert main(["export", sid, "-o", str(report)]) == 0
    printed2 = capsys.readouterr()
    assert "authenticated-run" in report.read_text()
    pulled = list((home / "artifacts").rglob("out.txt"))
    assert len(pulled) == 1 and pulled[0].read_text() == "result"

    # 1. Nothing secret anywhere gpuws wrote or printed.
    secrets = secrets_of(key)
    written = [p for root in (home, server.pod_cache) for p in root.rglob("*") if p.is_file()]
    written.append(report)
    assert len(written) >= 8
    outputs = [printed.out, printed.err, printed2.out, printed2.err]
    leaks = [(str(p), s) for p in written for s in secrets if s in p.read_bytes()]
    leaks += [("output", s) for o in outputs for s in secrets if s in o.encode()]
    assert leaks == []

    # 2. Private files, private directories, on both sides (the export is the person's
    # own file, written where they asked).
    loose = []
    checked = 0
    for root in (home, server.pod_cache):
        for p in [root, *root.rglob("*")]:
            checked += 1
            mode = stat.S_IMODE(p.lstat().st_mode)
            want = 0o700 if p.is_dir() else 0o600
            if mode != want:
                loose.append(f"{p.relative_to(root.parent)} {oct(mode)}")
    assert loose == []
    record("secrets_and_modes", files_searched=len(written), secret_patterns=len(secrets),
           leaks=len(leaks), paths_mode_checked=checked, loose_modes=len(loose),
           seconds=round(time.monotonic() - t0, 1))


def test_a_locked_key_file_is_one_clear_line(
        agent_and_server: tuple[SshServer, Path, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    server, key, _ = agent_and_server
    locked = config(server, tmp_path / "c1", f"  IdentityFile {key}\n  IdentitiesOnly yes\n")
    assert main(["doctor", "pod", "-F", str(locked)]) == AuthError.exit_code
    err = capsys.readouterr().err
    assert "passphrase" in err and "ssh-add" in err and PASSPHRASE not in err
