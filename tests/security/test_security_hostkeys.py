"""Host keys: strict by default, a changed key refused before anything is sent.

"Before anything is sent" is checked on the pod's side: after a refused connect, the
pod's gpuws cache is still empty (the bootstrap never ran, no bundle was uploaded) and
sshd saw no session. accept-new records an unknown key only when the person says so
(``--accept-new`` or ``StrictHostKeyChecking accept-new``); a changed key is refused even
then, and even with ``StrictHostKeyChecking no``.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from faults.figures import record  # type: ignore[import-not-found]
from faults.helpers import child_pids  # type: ignore[import-not-found]
from gpuws.cli import main
from gpuws.client import AgentClient
from gpuws.errors import HostKeyError
from gpuws.transport.ssh import SSHTransport
from sshd import SshServer, keygen  # type: ignore[import-not-found]

#: Counted as each test sees it; ``test_figures`` (last in the file) records them.
FIGS = {"connects": 0, "changed_key_refused": 0, "unknown_key_refused": 0,
        "sent_before_refusal": 0}


def pod_is_untouched(server: SshServer) -> None:
    """After a refusal: nothing reached the pod's cache, and sshd ends the refused
    connection (waited for: sshd reaps it in its own time, later on a loaded machine)."""
    assert server.proc is not None
    deadline = time.monotonic() + 30
    while child_pids(server.proc.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    reached = list(server.pod_cache.iterdir())
    FIGS["sent_before_refusal"] += len(reached)
    assert reached == [], "something reached the pod"
    assert child_pids(server.proc.pid) == [], "an sshd session is still open"


def other_key_line(server: SshServer, tmp_path: Path) -> str:
    other = tmp_path / "impostor_host_key"
    keygen(other)
    kind, key = (tmp_path / "impostor_host_key.pub").read_text().split()[:2]
    return f"[127.0.0.1]:{server.port} {kind} {key}\n"


def connect(cfg: Path, accept_new: bool = False) -> None:
    FIGS["connects"] += 1

    async def go() -> None:
        client = await AgentClient.connect(SSHTransport("pod", config_file=str(cfg),
                                                        accept_new=accept_new))
        await client.close()
    asyncio.run(go())


def test_default_policy_is_strict(sshd: SshServer, tmp_path: Path) -> None:
    sshd.reset_pod()
    cfg = sshd.client_files(tmp_path / "c", known=False)
    # No StrictHostKeyChecking line at all: gpuws's default must be "refuse unknown".
    cfg.write_text("\n".join(ln for ln in cfg.read_text().splitlines()
                             if "StrictHostKeyChecking" not in ln) + "\n")
    with pytest.raises(HostKeyError, match="not in known_hosts") as info:
        connect(cfg)
    assert "SHA256:" in info.value.message and "--accept-new" in info.value.remedy
    assert (tmp_path / "c" / "known_hosts").read_text() == ""
    pod_is_untouched(sshd)
    FIGS["unknown_key_refused"] += 1


@pytest.mark.parametrize("policy", ["yes", "ask", "accept-new", "no"])
def test_changed_key_is_refused_before_anything_is_sent(sshd: SshServer, tmp_path: Path,
                                                        policy: str,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    sshd.reset_pod()
    cfg = sshd.client_files(tmp_path / "c")
    cfg.write_text(cfg.read_text().replace("StrictHostKeyChecking yes",
                                           f"StrictHostKeyChecking {policy}"))
    known = tmp_path / "c" / "known_hosts"
    known.write_text(other_key_line(sshd, tmp_path))
    before = known.read_bytes()
    FIGS["connects"] += 1
    code = main(["doctor", "pod", "-F", str(cfg), "--accept-new"])
    err = capsys.readouterr().err
    assert code == HostKeyError.exit_code
    assert len(err.strip().splitlines()) == 1 and "CHANGED" in err and "ssh-keygen -R" in err
    assert known.read_bytes() == before  # the trusted key is never replaced silently
    pod_is_untouched(sshd)
    FIGS["changed_key_refused"] += 1


def test_accept_new_only_when_asked(sshd: SshServer, tmp_path: Path) -> None:
    for how in ("flag", "config"):
        sshd.reset_pod()
        cfg = sshd.client_files(tmp_path / how, known=False)
        known = tmp_path / how / "known_hosts"
        known.unlink()  # gpuws creates it, so its mode is gpuws's doing
        with pytest.raises(HostKeyError):
            connect(cfg)
        assert not known.exists()
        pod_is_untouched(sshd)
        FIGS["unknown_key_refused"] += 1
        if how == "config":
            cfg.write_text(cfg.read_text().replace("StrictHostKeyChecking yes",
                                                   "StrictHostKeyChecking accept-new"))
        connect(cfg, accept_new=how == "flag")
        assert known.read_text().startswith(f"[127.0.0.1]:{sshd.port} ssh-ed25519 ")
        assert oct(known.stat().st_mode & 0o777) == "0o600"
        connect(cfg)  # known now: no flag needed


def test_figures() -> None:
    # What the tests above saw (each refusal counted after its checks passed; a pod that
    # received anything counted before its assert).
    assert FIGS["sent_before_refusal"] == 0
    record("host_keys", **FIGS)
