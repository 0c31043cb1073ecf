"""Shared fixtures: a hermetic GPUWS_HOME and real OpenSSH servers on loopback."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from sshd import REQUIRE_SSHD, SshServer, find_sshd, sshd_missing_may_skip  # type: ignore[import-not-found]

NEEDS_SSHD = pytest.mark.skipif(sshd_missing_may_skip(),
                                reason="OpenSSH sshd is not installed")


@pytest.fixture(autouse=True)
def _hermetic_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test gets its own gpuws data dir and config; nothing touches the real ones."""
    monkeypatch.setenv("GPUWS_HOME", str(tmp_path / "gpuws-home"))
    monkeypatch.setenv("GPUWS_CONFIG", str(tmp_path / "gpuws-config.toml"))
    monkeypatch.setenv("GPUWS_POD_CACHE", str(tmp_path / "local-pod-cache"))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)


def _need_sshd() -> None:
    if find_sshd() is None:
        # In CI (and under scripts/test, which installs sshd) a missing sshd is a broken
        # set-up, not a reason for hundreds of green skips.
        if REQUIRE_SSHD:
            pytest.fail("OpenSSH sshd is not installed: the SSH tests cannot run "
                        "(scripts/test installs it)", pytrace=False)
        pytest.skip("OpenSSH sshd is not installed (the README's test command installs it)")


@pytest.fixture(scope="session")
def need_sshd() -> None:
    """For a test that starts its own sshd: skip where it is missing, but fail instead
    under ``GPUWS_REQUIRE_SSHD`` (CI, ``scripts/test``)."""
    _need_sshd()


def _server(tmp_path_factory: pytest.TempPathFactory, variant: str) -> Iterator[SshServer]:
    _need_sshd()
    server = SshServer(tmp_path_factory.mktemp(f"sshd-{variant}"), variant).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def stopped_pod(tmp_path: Path) -> Iterator[SshServer]:
    """A pod that is stopped: an sshd whose keys and config exist but which is not running;
    a test's "provider's tool" starts it with ``boot_command()``. Whatever it started is
    stopped at the end, and a lease armed on its cache released."""
    _need_sshd()
    server = SshServer(tmp_path / "pod", "default").start()
    server.stop()
    try:
        yield server
    finally:
        # The lease process exits at its next look once its settings are gone.
        (server.pod_cache / "lease" / "settings.json").unlink(missing_ok=True)
        pid = server.daemon_pid()
        if pid is not None:
            os.kill(pid, signal.SIGTERM)


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    """A real sshd with an SFTP subsystem."""
    yield from _server(tmp_path_factory, "default")


@pytest.fixture(scope="session")
def sshd_nosftp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    """A real sshd without an SFTP subsystem (files must move through exec)."""
    yield from _server(tmp_path_factory, "nosftp")


@pytest.fixture(scope="session")
def sshd_nopython(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    """A real sshd whose sessions get a PATH without python3."""
    yield from _server(tmp_path_factory, "nopython")


@pytest.fixture(scope="session")
def sshd_pty(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    """A real sshd configured like RunPod's basic SSH proxy: a PTY shell and nothing else."""
    yield from _server(tmp_path_factory, "ptyproxy")


@pytest.fixture
def ssh_config(sshd: SshServer, tmp_path: Path) -> Path:
    """Client files for ``sshd`` (alias ``pod``), with a fresh pod cache."""
    sshd.reset_pod()
    return sshd.client_files(tmp_path / "client")
