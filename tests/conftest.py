"""Shared fixtures: a hermetic GPUWS_HOME and real OpenSSH servers on loopback."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


# ---------------------------------------------------------------------- the skip budget
# The README says what skips under scripts/test: the tests/gpu files, without a GPU. With
# GPUWS_EXPECTED_SKIPS=gpu (scripts/test sets it) any other skip fails the run, named with
# its reason: a new silent skip cannot hide in the last line's count (issue 31).

#: What each GPUWS_EXPECTED_SKIPS word allows to skip (paths under the repository root).
EXPECTED_SKIPS = {"gpu": ("tests/gpu/",)}

_unexpected_skips: list[str] = []


def _allowed_skip_prefixes() -> tuple[str, ...] | None:
    words = os.environ.get("GPUWS_EXPECTED_SKIPS")
    if words is None:
        return None
    return tuple(p for w in words.replace(",", " ").split() for p in EXPECTED_SKIPS.get(w, ()))


def _note_skip(report: pytest.CollectReport | pytest.TestReport) -> None:
    allowed = _allowed_skip_prefixes()
    if allowed is None or not report.skipped:
        return
    path = report.nodeid.split("::", 1)[0]
    if path.startswith(allowed):
        return
    reason = ""
    if isinstance(report.longrepr, tuple):  # (file, line, "Skipped: why")
        reason = str(report.longrepr[2]).removeprefix("Skipped: ")
    _unexpected_skips.append(f"{report.nodeid}: {reason or 'skipped'}")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when in ("setup", "call"):
        _note_skip(report)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    _note_skip(report)  # a module-level skip or importorskip


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _unexpected_skips and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _unexpected_skips:
        return
    allowed = ", ".join(_allowed_skip_prefixes() or ()) or "nothing"
    terminalreporter.section("skips the README does not list", sep="=", red=True, bold=True)
    terminalreporter.line(f"GPUWS_EXPECTED_SKIPS={os.environ.get('GPUWS_EXPECTED_SKIPS')}: "
                          f"only {allowed} may skip; these did (the run fails):", red=True)
    for line in _unexpected_skips:
        terminalreporter.line(f"  unexpected skip: {line}", red=True)
