"""The running pod the lease tests arm leases on: a real OpenSSH sshd on 127.0.0.1 of its
own, with its own pod-side cache (its ``stop_on_pod`` may stop it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sshd import SshServer  # type: ignore[import-not-found]


@pytest.fixture
def pod(tmp_path: Path, need_sshd: None) -> Iterator[SshServer]:
    # need_sshd (tests/conftest.py): a missing sshd fails under GPUWS_REQUIRE_SSHD, as in
    # every other SSH test, instead of skipping silently (issue 31).
    server = SshServer(tmp_path / "pod", "default").start()
    try:
        yield server
    finally:
        # No lease process may outlive its test: settings gone, it exits at its next look.
        (server.pod_cache / "lease" / "settings.json").unlink(missing_ok=True)
        server.stop()
