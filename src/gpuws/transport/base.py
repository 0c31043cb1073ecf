"""The transport seam: how bytes reach the pod.

Implementations: ``local`` (the agent as a subprocess here), ``ssh`` (asyncssh exec
channels, SFTP when offered). A PTY-only transport plugs in behind the same interface.
All remote commands are argv lists; a transport that needs a command *string* quotes
them with ``shlex.join`` — there is no string-concatenated shell anywhere.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol


class ByteReader(Protocol):
    async def read(self, n: int = -1) -> bytes: ...


class ByteWriter(Protocol):
    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...

    def write_eof(self) -> None: ...


class RemoteProcess(abc.ABC):
    """A running command on the pod with binary stdin/stdout/stderr."""

    stdin: ByteWriter
    stdout: ByteReader
    stderr: ByteReader

    @abc.abstractmethod
    async def wait(self) -> int | None:
        """Wait for exit; the exit status (None when the far side gave none)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop the process / close its channel."""


@dataclass
class CommandResult:
    returncode: int | None
    stdout: bytes
    stderr: bytes


@dataclass
class TransportInfo:
    """What ``doctor`` reports about the link."""

    kind: str
    target: str
    sftp: bool = False
    notes: list[str] = field(default_factory=list)
    connect_s: float | None = None


class Transport(abc.ABC):
    """How gpuws reaches one pod."""

    info: TransportInfo

    @abc.abstractmethod
    async def connect(self) -> None:
        """Open the link (raises a ConnectError subclass with a remedy)."""

    @abc.abstractmethod
    async def start(self, argv: Sequence[str]) -> RemoteProcess:
        """Start ``argv`` on the pod."""

    async def run(self, argv: Sequence[str], input: bytes | None = None) -> CommandResult:
        """Run ``argv`` to completion and collect its output."""
        proc = await self.start(argv)
        try:
            if input:
                proc.stdin.write(input)
                await proc.stdin.drain()
            proc.stdin.write_eof()
            out = await proc.stdout.read()
            err = await proc.stderr.read()
            return CommandResult(await proc.wait(), out, err)
        finally:
            proc.close()

    @abc.abstractmethod
    def read_file(self, path: str, offset: int, agent_argv: Sequence[str],
                  chunk: int = 1 << 20) -> AsyncIterator[bytes]:
        """Yield the bytes of a pod file from ``offset`` (SFTP, or the agent's ``cat``)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Close the link; runs on the pod go on."""
