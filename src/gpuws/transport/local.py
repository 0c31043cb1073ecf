"""The embedded default: the agent runs as a subprocess of this machine."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Sequence

from ..errors import ConnectError, TransferError
from ..remote_agent.safefiles import NotRegular, open_regular
from .base import TRANSFER_STALL_S, RemoteProcess, Transport, TransportInfo


class LocalProcess(RemoteProcess):
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc
        assert proc.stdin and proc.stdout and proc.stderr
        self.stdin = proc.stdin
        self.stdout = proc.stdout
        self.stderr = proc.stderr

    async def wait(self) -> int | None:
        return await self._proc.wait()

    def close(self) -> None:
        if self._proc.returncode is None:
            try:
                self._proc.stdin and self._proc.stdin.close()  # type: ignore[func-returns-value]
            except (OSError, RuntimeError):
                pass


class LocalTransport(Transport):
    """Runs pod commands here. ``env`` overrides (tests point the pod cache elsewhere)."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.env = dict(os.environ)
        self.env.update(env or {})
        self.info = TransportInfo(kind="local", target="local", sftp=False,
                                  notes=["the agent runs as a subprocess of this machine"])

    async def connect(self) -> None:
        self.info.connect_s = 0.0

    async def start(self, argv: Sequence[str]) -> RemoteProcess:
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=self.env, cwd=self.env.get("HOME"),
                limit=1 << 24)
        except FileNotFoundError as exc:
            raise ConnectError(f"{argv[0]} not found on this machine",
                               title="Command not found", remedy="install it or fix PATH") from exc
        return LocalProcess(proc)

    async def read_file(self, path: str, offset: int, agent_argv: Sequence[str],
                        chunk: int = 1 << 20, *, stall_s: float = TRANSFER_STALL_S
                        ) -> AsyncIterator[bytes]:
        # Read here, in this process: a FIFO, a device or a link the workload left must
        # neither block the event loop nor stream for ever, so the file is opened as the
        # agent opens run files (no link followed, never blocking, regular files only) and
        # read up to the size it had when opened. A local read cannot stall: stall_s is
        # the interface's, unused here.
        del stall_s
        try:
            fd, st = open_regular(os.path.expanduser(path))
        except NotRegular as exc:
            raise TransferError(f"{path} is not a regular file ({exc.strerror}); refused, "
                                "nothing was read", title="Artifact refused",
                                remedy="only regular files are pulled") from exc
        except OSError as exc:
            raise TransferError(f"reading {path} failed: {exc.strerror or exc}") from exc
        t0 = time.monotonic()
        try:
            pos = offset
            while pos < st.st_size:
                data = os.pread(fd, min(chunk, st.st_size - pos), pos)
                if not data:
                    break
                pos += len(data)
                yield data
                if time.monotonic() - t0 > 0.05:
                    t0 = time.monotonic()
                    await asyncio.sleep(0)  # let the UI breathe on big files
        finally:
            os.close(fd)

    async def close(self) -> None:
        return None
