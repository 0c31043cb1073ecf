"""Which open sessions still have a process behind them.

A session's cost runs until it is ended. The engine ends it on every way out it can see
(a finished run, Ctrl-C, SIGTERM, a TUI quit), but ``kill -9`` or a power cut gives it no
chance. So each live session holds an exclusive ``flock`` on a lease file under
``GPUWS_HOME/leases``; the kernel drops the lock when the process dies, however it dies.
The next engine to start ends every open session whose lease nobody holds, at that
session's last recorded activity: cost stops where the work stopped.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from ..locations import ensure_private_dir, gpuws_home
from ..sessions.store import Store


def _lease_dir() -> Path:
    path = gpuws_home() / "leases"
    ensure_private_dir(path)
    return path


class SessionLease:
    """Holds the lease of one session for as long as this process lives (or until released)."""

    def __init__(self, session_id: str) -> None:
        self.path = _lease_dir() / f"{session_id}.lock"
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def release(self) -> None:
        """Drop the lease (the session was ended); idempotent."""
        if self._fd is None:
            return
        self.path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = None


def _held(session_id: str) -> bool:
    path = _lease_dir() / f"{session_id}.lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    path.unlink(missing_ok=True)
    return False


def close_orphans(store: Store) -> list[str]:
    """End every open session that no living process holds; returns their ids."""
    ended = []
    for session_id in store.open_sessions():
        if not _held(session_id):
            store.end_session(session_id, ended=store.last_activity(session_id))
            ended.append(session_id)
    return ended
