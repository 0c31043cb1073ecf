"""The transport seam: how bytes reach the pod.

Implementations: ``local`` (the agent as a subprocess here), ``ssh`` (asyncssh exec
channels, SFTP when offered). A PTY-only transport plugs in behind the same interface.
All remote commands are argv lists; a transport that needs a command *string* builds
it with :func:`shell_command` — there is no string-concatenated shell anywhere.
"""

from __future__ import annotations

import abc
import asyncio
import shlex
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

T = TypeVar("T")

#: Seconds a file transfer may go without a byte (or an answer) before it is stopped.
#: An honest pod answers an SFTP read or sends the next chunk in well under a second even
#: on a slow link; a FIFO swapped in for a file, or a pod's file server that stopped
#: answering, never does. The config's ``[pull] stall_s`` overrides it.
TRANSFER_STALL_S = 60.0


async def within_stall(aw: Awaitable[T], stall_s: float, path: str) -> T:
    """``aw``'s result, or a :class:`TransferError` once ``stall_s`` pass without one.

    Every wait of a transfer goes through here, so no read can block for ever: the pull
    then fails with one line, the run stays recorded, and Ctrl+C is never stuck behind it.
    """
    try:
        return await asyncio.wait_for(aw, stall_s)
    except TimeoutError:
        from ..errors import TransferError

        raise TransferError(
            f"reading {path}: no bytes for {stall_s:g} s; the transfer was stopped",
            title="Transfer stalled",
            remedy="pull again (`gpuws pull`) once the pod answers; a file that is not a "
                   "regular file on the pod never arrives") from None


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
    #: A silent link is declared dead at most this many seconds after the pod's last
    #: packet (SSH keepalives); None where there is no link to lose (``local``).
    dead_link_bound_s: float | None = None


class Transport(abc.ABC):
    """How gpuws reaches one pod.

    Attributes:
        info: what ``doctor`` reports about the link.
        lost_reason: why the link ended without gpuws closing it (unanswered keepalives,
            with the bound in words; the server closing it; a jump host lost); None while
            it is up or when gpuws closed it, cleared by the next :meth:`connect`. It is
            set in the same event-loop step that ends the link's channels, so a reader
            that finds the agent's stdout at its end (or failing) finds the reason here.
    """

    info: TransportInfo
    lost_reason: str | None = None

    @abc.abstractmethod
    async def connect(self) -> None:
        """Open the link (raises a ConnectError subclass with a remedy)."""

    @abc.abstractmethod
    async def start(self, argv: Sequence[str]) -> RemoteProcess:
        """Start ``argv`` on the pod."""

    async def settled(self) -> None:
        """Wait for the checks :meth:`connect` left running; :attr:`info` is final after.

        (SSH probes for SFTP while the agent starts, rather than before: the probe's
        round trips are then off the connect's critical path.)
        """
        return None  # nothing is left running unless a transport says otherwise

    async def switch_to_terminal(self) -> bool:
        """The first command failed: is this a pod that offers only a terminal?

        If the server refuses exec the way PTY-only proxies do, the transport uses
        terminal sessions from now on (``info.kind`` becomes ``pty``) and says True; the
        caller then starts its command again. False: the failure stands as it is.
        """
        return False

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
                  chunk: int = 1 << 20, *, stall_s: float = TRANSFER_STALL_S
                  ) -> AsyncIterator[bytes]:
        """Yield the bytes of a regular pod file from ``offset`` (SFTP, or the agent's ``cat``).

        Anything but a regular file (a FIFO, a device, a symbolic link) is refused with a
        :class:`~gpuws.errors.TransferError` before a byte is read, and a transfer that goes
        ``stall_s`` seconds without a byte ends with one (:func:`within_stall`).
        """

    @abc.abstractmethod
    async def close(self) -> None:
        """Close the link; runs on the pod go on."""


def shell_command(argv: Sequence[str]) -> str:
    """``argv`` as a command line that every login shell hands to ``/bin/sh`` unchanged.

    sshd runs an exec request's command with the user's login shell, which may be sh,
    dash, bash, zsh, fish or tcsh: their quoting rules differ (fish and csh treat ``\\``,
    ``$``, ``!`` and newlines inside quotes their own way), so ``shlex.join(argv)`` alone
    is only right for POSIX shells. The POSIX command line goes as one single-quoted
    word of ``printf`` escapes: every byte outside ``[A-Za-z0-9 ,._/:=+@-]`` is written
    as ``\\NNN`` (octal). Such a word means the same in all of these shells (no quote,
    ``$``, ``!``, ``%`` or newline inside; a backslash is followed by a digit, which
    fish and csh keep as it is), and ``sh`` turns it back into the command with
    ``printf`` and runs it with ``eval``. Tested with real sshd sessions under each shell.
    """
    if any("\0" in arg for arg in argv):
        # No argv can hold a NUL (and sshd drops an exec request with one): refuse it
        # here, clearly, rather than let printf's octal escape cut the argument short.
        from ..errors import UsageError

        raise UsageError("an argument of a remote command holds a NUL byte, which no "
                         "command line can carry", remedy="remove the NUL from the argument")
    script = shlex.join(argv)
    encoded = "".join(c if c in _PLAIN else "".join(f"\\{b:03o}" for b in c.encode())
                      for c in script)
    return f"exec /bin/sh -c 'eval \"$(printf \"$0\")\"' '{encoded}'"


_PLAIN = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789 ,._/:=+@-")
