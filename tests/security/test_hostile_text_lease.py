"""`gpuws stop` and `gpuws start` print what the pod says through the terminal-safe filter
(issue 31, review finding 4): the agent's Error answer to the lease release is checked at
the boundary like every answer, and printed with its escape sequences made visible.

The pod is a real OpenSSH sshd on 127.0.0.1 (it answers, and the laptop's `stop` script
stops it); the agent that answers the lease request is the lying agent (a stand-in that
speaks the protocol: a real agent cannot be made to lie), handed to the real
``AgentClient`` and the real ``gpuws stop`` through ``main()``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuws import protocol
from gpuws.cli import main
from gpuws.client import AgentClient
from gpuws.commands import lease as lease_cmd
from gpuws.deploy import DeployResult
from lease.leasekit import script  # type: ignore[import-not-found]
from security.hostile_text import HOSTILE, unsafe_chars  # type: ignore[import-not-found]
from security.test_untrusted_lying_agent import (  # type: ignore[import-not-found]
    LyingAgent,
    _NoTransport,
)
from sshd import SshServer  # type: ignore[import-not-found]


@pytest.fixture
def pod(tmp_path: Path, need_sshd: None) -> Iterator[SshServer]:
    server = SshServer(tmp_path / "pod", "default").start()
    try:
        yield server
    finally:
        server.stop()


def _stop_with_a_lying_lease(pod: SshServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                             answer: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> str:
    """`gpuws stop pod` where the agent answers the lease release with ``answer``; the
    laptop's `stop` kills the sshd. Returns stderr."""
    stop = script(tmp_path / "laptop_stop.sh", f"kill $(cat {pod.root / 'sshd.pid'})\n")
    cfg = tmp_path / "config.toml"
    cfg.write_text(f"[hosts.pod]\nstop = [\"{stop}\"]\n")
    monkeypatch.setenv("GPUWS_CONFIG", str(cfg))

    def lie(agent: LyingAgent, req: dict[str, Any]) -> None:
        assert req["type"] == "lease" and req["release"] is True, req
        agent.send({"ts": time.time(), **answer, "req": req["req"]})

    async def liar(args: Any) -> AgentClient:
        hello = protocol.Hello(agent_version="0", agent_sha256="0" * 64, protocol_version=1)
        return AgentClient(_NoTransport(), LyingAgent(lie),
                           DeployResult("0" * 64, 0, "cached", 0, 0.0, hello), b"", "python3")

    monkeypatch.setattr(lease_cmd, "connect", liar)
    ssh = str(pod.client_files(tmp_path / "ssh"))
    assert main(["stop", "pod", "-F", ssh, "--wait", "60"]) == 0
    return capsys.readouterr().err

def test_stop_prints_the_pods_refusal_with_no_escape_sequence(
        pod: SshServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    err = _stop_with_a_lying_lease(pod, tmp_path, monkeypatch, {
        "type": "error", "code": "refused", "title": f"Refused {HOSTILE}",
        "message": f"no lease {HOSTILE}", "remedy": f"try {HOSTILE}"}, capsys)
    assert "its lease could not be released (Refused " in err and ": no lease " in err, err
    assert unsafe_chars(err.replace("\n", "")) == [], err
    # Shown, not obeyed: the window-title escape is there as visible text.
    assert "\\e]0;pwned" in err, err
    assert "pod no longer answers" in err


def test_an_oversize_refusal_is_refused_at_the_boundary(
        pod: SshServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The Error answer is bounded like every answer: a megabyte of the pod's words is
    one line saying it was refused, not a megabyte on the terminal."""
    err = _stop_with_a_lying_lease(pod, tmp_path, monkeypatch, {
        "type": "error", "code": "refused", "title": "t",
        "message": "\x1b[2J" + "x" * 1_000_000, "remedy": ""}, capsys)
    assert "its lease could not be released (Refused answer: the pod's answer was refused" \
        in err, err
    assert len(err) < 5000 and unsafe_chars(err.replace("\n", "")) == [], err
