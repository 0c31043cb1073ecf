"""The embedded default: the agent runs as a subprocess of this machine."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Sequence

from ..errors import ConnectError
from .base import RemoteProcess, Transport, TransportInfo


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
                        chunk: int = 1 << 20) -> AsyncIterator[bytes]:
        t0 = time.monotonic()
        with open(os.path.expanduser(path), "rb") as f:
            f.seek(offset)
            while True:
                data = f.read(chunk)
                if not data:
                    break
                yield data
                if time.monotonic() - t0 > 0.05:
                    t0 = time.monotonic()
                    await asyncio.sleep(0)  # let the UI breathe on big files

    async def close(self) -> None:
        return None
