"""What the lease and start/stop tests share: the "provider's tool" as a script, and the
marker a pod's ``stop_on_pod`` script leaves."""

from __future__ import annotations

import os
import signal
import stat
import time
from collections.abc import Callable
from pathlib import Path


def script(path: Path, body: str) -> str:
    """An executable ``/bin/sh`` script at ``path``; returns its path."""
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def stop_on_pod(where: Path, pod_root: Path) -> tuple[str, Path]:
    """The pod's ``stop_on_pod``: writes the time into a marker, then stops the pod's sshd
    (its pid in ``pod_root/sshd.pid``), as ``sudo shutdown`` would stop a pod. Returns the
    script and the marker."""
    marker = where / "stopped"
    return script(where / "stop_on_pod.sh",
                  f"date +%s.%N > {marker}.tmp && mv {marker}.tmp {marker}\n"
                  f"kill $(cat {pod_root / 'sshd.pid'})\n"), marker


def wait_marker(path: Path, timeout: float = 120.0) -> float:
    """The time a ``stop_on_pod`` script wrote into ``path`` once it ran (``date +%s.%N``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return float(path.read_text().strip())
        time.sleep(0.1)
    raise AssertionError(f"the lease never stopped the pod ({path} missing)")


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group ``pgid``, from ``/proc``."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue  # gone while we looked
        if fields[0] != b"Z" and int(fields[2]) == pgid:
            out.append(int(name))
    return out


def wait_until(cond: Callable[[], object], what: str, timeout: float = 60.0) -> None:
    """Wait for ``cond()`` to hold (a generous bound, not a measure of speed)."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.05)


def kill_group(pgid: int) -> None:
    """Clean-up: SIGKILL what is left of a test's process group."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
