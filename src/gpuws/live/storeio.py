"""The session store, kept off the UI thread.

SQLite connections belong to the thread that opened them, so the store lives on one
dedicated thread and every use of it is a function sent there: the event loop awaits
the answer and keeps painting meanwhile. One thread also means the store sees the
calls in the order they were made (a batch is stored before the next is read back).
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from ..sessions.store import Store

T = TypeVar("T")

#: How a throwaway store's directory is named, in the system's temporary directory.
SCRATCH_PREFIX = "gpuws-replay-"
_LOCK = "held.lock"


def _hold(scratch: Path) -> int:
    """Lock ``scratch`` for as long as this process lives (the kernel drops it at death)."""
    fd = os.open(scratch / _LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def remove_stale_scratch(root: Path | None = None) -> list[Path]:
    """Remove the throwaway stores of replays that were killed (SIGKILL, a power cut).

    Only this user's directories are looked at, and only those whose lock nobody holds (a
    replay running now holds its own). Returns what was removed.
    """
    root = root or Path(tempfile.gettempdir())
    removed = []
    for path in root.glob(SCRATCH_PREFIX + "*"):
        try:
            if path.is_symlink() or not path.is_dir() or path.stat().st_uid != os.getuid():
                continue
            fd = os.open(path / _LOCK, os.O_RDWR | os.O_NOFOLLOW)
        except FileNotFoundError:
            # Made by an older gpuws, or killed between mkdtemp and the lock; a minute's
            # grace spares one that another replay is locking right now.
            try:
                if time.time() - path.stat().st_mtime < 60:
                    continue
            except OSError:
                continue
            fd = None
        except OSError:
            continue
        try:
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # a replay running now
        finally:
            if fd is not None:
                os.close(fd)
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


class StoreHandle:
    """Owns a :class:`Store` on its own thread.

    Args:
        path: the SQLite file; ``None`` is the user's store under ``GPUWS_HOME``.
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._scratch: Path | None = None
        self._scratch_lock: int | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpuws-store")
        self._store: Store | None = None
        self._closed = False

    @classmethod
    def throwaway(cls) -> StoreHandle:
        """A store in a private temporary directory, removed on close (file replays).

        The directory holds a ``flock`` for as long as this process lives; a replay killed
        before it could remove its store leaves one nobody holds, and the next throwaway
        store removes it (:func:`remove_stale_scratch`).
        """
        remove_stale_scratch()
        scratch = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX))
        handle = cls(scratch / "sessions.db")
        handle._scratch = scratch
        handle._scratch_lock = _hold(scratch)
        return handle

    @property
    def is_throwaway(self) -> bool:
        """Whether the store vanishes when the app exits."""
        return self._scratch is not None

    async def call(self, fn: Callable[[Store], T]) -> T:
        """Run ``fn(store)`` on the store's thread and return what it returns."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._run, fn)

    def call_blocking(self, fn: Callable[[Store], T]) -> T:
        """Run ``fn(store)`` and wait for it here (only outside the event loop: tests, bench)."""
        return self._pool.submit(self._run, fn).result()

    def _run(self, fn: Callable[[Store], T]) -> T:
        if self._store is None:
            self._store = Store(self.path)
        return fn(self._store)

    async def close(self) -> None:
        """Close the store and stop its thread (idempotent)."""
        if self._closed:
            return
        self._closed = True
        await asyncio.get_running_loop().run_in_executor(self._pool, self._close_store)
        self._pool.shutdown(wait=False)

    def close_blocking(self) -> None:
        """:meth:`close`, from outside the event loop."""
        if self._closed:
            return
        self._closed = True
        self._pool.submit(self._close_store).result()
        self._pool.shutdown(wait=False)

    def _close_store(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
        if self._scratch_lock is not None:
            os.close(self._scratch_lock)
            self._scratch_lock = None
