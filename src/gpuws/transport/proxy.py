"""``ProxyCommand``: the pod is reached through a command's stdin and stdout.

As ``ssh`` runs it: through the person's shell (``$SHELL -c "exec …"``), tokens already
expanded by :mod:`sshconfig`. Unlike asyncssh's own ``proxy_command`` option, the
command's stdin and stdout are one end of a socket pair (the other end is handed to
asyncssh as its socket) and its stderr is kept: what it says goes into the error
message instead of onto the terminal, where it would tear through the TUI.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections import deque


class ProxyCommand:
    """A ``ProxyCommand`` with its stdin/stdout on a socket pair, as ``ssh`` runs it."""

    def __init__(self, command: str) -> None:
        self.command = command
        self.proc: asyncio.subprocess.Process | None = None
        self._stderr: deque[str] = deque(maxlen=5)
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> socket.socket:
        ours, theirs = socket.socketpair()
        shell = os.environ.get("SHELL") or "/bin/sh"
        try:
            self.proc = await asyncio.create_subprocess_exec(
                shell, "-c", f"exec {self.command}", stdin=theirs.fileno(),
                stdout=theirs.fileno(),
                stderr=asyncio.subprocess.PIPE, start_new_session=True)
        except OSError:
            ours.close()
            raise
        finally:
            theirs.close()  # the command holds its own copy; EOF reaches us when it exits
        self._reader = asyncio.create_task(self._read_stderr())
        return ours

    async def _read_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        with contextlib.suppress(OSError):
            async for line in self.proc.stderr:
                text = line.decode("utf-8", "replace").strip()
                if text:
                    self._stderr.append(text)

    async def why(self) -> str:
        """What the command said, and its exit status if it has ended."""
        status = None
        if self.proc is not None:
            with contextlib.suppress(TimeoutError):
                status = await asyncio.wait_for(self.proc.wait(), 0.5)
        if self._reader is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._reader), 0.5)
        said = " / ".join(self._stderr)
        ended = f"exited with status {status}" if status is not None else "is running"
        return f"{ended}{': ' + said if said else ''}"

    async def close(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.terminate()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.proc.wait(), 5)
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
