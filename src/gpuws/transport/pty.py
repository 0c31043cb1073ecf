"""The PTY-only transport: everything through interactive shells on a terminal.

Some pods are reachable only through a proxy that offers an interactive shell and
nothing else (RunPod's basic SSH proxy: "requires a PTY and does not support SCP, SFTP,
or rsync"; an exec request gets "Your SSH client doesn't support PTY"). Here every
"command" is a terminal session of its own: a session channel with a PTY and a shell,
into which gpuws types two lines.

1. ``exec /bin/sh -c '…'`` — the only line the person's login shell (bash, zsh, fish…)
   reads, so its syntax does not matter. The POSIX ``sh`` it starts switches the
   terminal to raw with no echo (``stty raw -echo``: no line editing, no CR/LF
   translation, no signals from bytes), prints a marker and reads one more line.
2. ``printf MARKER; exec COMMAND`` — read by that ``sh`` and evaluated. Everything the
   terminal shows after the marker's line is the command's output.

Markers are random tokens written as ``printf`` octal escapes, so the text of the
command lines (echoed while the terminal still echoes) can never look like the marker:
banners, MOTDs, prompts of any shape and bracketed-paste escapes before it are skipped.
When the command line is short, both lines go at once (one round trip less); a long
one waits for the first marker, because a terminal in canonical mode keeps at most
4 KiB of a line typed ahead.

What a terminal cannot do, and how this transport answers:

- stderr is merged into stdout (the process's ``stderr`` reads empty);
- there is no end-of-file on a terminal: ``stdin.write_eof()`` hangs up, so the far
  side gets SIGHUP (what a closing agent needs; durable runs live in their own session);
- bytes must be text: every line gpuws writes is JSON or base64 (none starts with
  ``~``, which an ssh client inside a proxy could take as an escape), and the writer
  refuses control characters; files come home as checksummed base64 (or zlib+base64)
  frames from the agent's ``cat64`` mode on a terminal of their own, resumed from the
  last good offset after noise, a garbled frame or a broken link (on a fresh
  connection if need be).

The agent bundle is uploaded as checksummed text lines by ``deploy`` (it checks
``info.kind == "pty"``); the NDJSON event stream needs nothing special: ``\\r`` is
stripped and lines that are not JSON (noise) are reported and skipped.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import re
import secrets
import shlex
import zlib
from collections.abc import AsyncIterator, Sequence

import asyncssh

from ..errors import ConnectError, TransferError
from .base import (
    TRANSFER_STALL_S,
    ByteReader,
    CommandResult,
    RemoteProcess,
    TransportInfo,
    within_stall,
)
from .ssh import SSHTransport, map_error

#: The terminal gpuws asks for: wide, so shells rarely wrap what they echo.
TERM_TYPE = "xterm"
TERM_SIZE = (250, 50)
#: A command line no longer than this is typed ahead with the setup line (see above).
PIPELINE_MAX = 2000
#: Raw bytes per ``cat64`` frame: big enough that per-frame costs vanish, small enough
#: that a garbled frame costs little to send again.
FRAME = 1 << 18
#: Sessions in a row that may end without progress before a file read gives up.
RETRIES = 4

REMEDY = ("for full SSH (exec channels and SFTP) expose TCP port 22 on the pod and connect "
          "to its public IP and port (RunPod: the pod's 'SSH over exposed TCP' command)")
LIMITS = ("this pod offers only an interactive shell on a terminal (no exec, SFTP or SCP), "
          "like RunPod's basic SSH proxy: gpuws types its commands into terminal sessions, "
          "files move as checksummed base64 text (slower than SFTP) and a command's stderr "
          "is merged into its output")

# Bytes allowed down a terminal: printable text, tab and newline (UTF-8 above 0x7f is
# fine). Control characters could be taken as line editing or flow control by a
# terminal somewhere along the way, so they are refused, never sent.
_TEXT = bytes(range(0x20, 0x100)) + b"\t\n"
# Bytes a command line may hold as typed: no newline (it would end the line), no tab.
_LINE = bytes(range(0x20, 0x7f)) + bytes(range(0x80, 0x100))
_ANSI = re.compile(rb"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b.|[\x00-\x08"
                   rb"\x0b-\x1f\x7f]")


def _octal(text: str) -> str:
    """``text`` as printf octal escapes: prints ``text``, but never contains it."""
    return "".join(f"\\{b:03o}" for b in text.encode())


def readable(raw: bytes, limit: int = 300) -> str:
    """The last ``limit`` characters of terminal output, without escapes or controls."""
    text = _ANSI.sub(b"", raw.replace(b"\r\n", b"\n")).decode("utf-8", "replace")
    return " | ".join(line.strip() for line in text.strip().splitlines() if line.strip())[-limit:]


class _Stdout:
    """The command's output: what followed the marker, then the channel's data.

    A broken link reads as end of file (the caller sees a short stream and resumes).
    """

    def __init__(self, source: asyncssh.SSHReader[bytes], initial: bytes) -> None:
        self._source = source
        self._initial = initial
        self.error: BaseException | None = None

    async def read(self, n: int = -1) -> bytes:
        if self._initial:
            if n < 0:
                data, self._initial = self._initial + await self._read(-1), b""
            else:
                data, self._initial = self._initial[:n], self._initial[n:]
            return data
        return await self._read(n)

    async def _read(self, n: int) -> bytes:
        try:
            return await self._source.read(n)
        except (asyncssh.Error, OSError) as exc:
            self.error = exc
            return b""


class _Nothing:
    """stderr on a terminal: merged into stdout, so always at its end."""

    async def read(self, n: int = -1) -> bytes:
        return b""


class _Stdin:
    """Text down the terminal; ``write_eof`` hangs up (a terminal has no end-of-file)."""

    def __init__(self, proc: asyncssh.SSHClientProcess[bytes]) -> None:
        self._proc = proc

    def write(self, data: bytes) -> None:
        bad = data.translate(None, _TEXT)
        if bad:
            raise TransferError(f"refusing to type control byte {bad[:1]!r} into a terminal",
                                remedy="send binary data base64-encoded over a PTY link")
        self._proc.stdin.write(data)

    async def drain(self) -> None:
        await self._proc.stdin.drain()

    def write_eof(self) -> None:
        self._proc.close()


class PTYProcess(RemoteProcess):
    """A command running in a terminal session (see the module notes for its limits)."""

    def __init__(self, proc: asyncssh.SSHClientProcess[bytes], initial: bytes) -> None:
        self._proc = proc
        self._stdout = _Stdout(proc.stdout, initial)
        self.stdout = self._stdout
        self.stderr = _Nothing()
        self.stdin = _Stdin(proc)

    async def wait(self) -> int | None:
        """The exit status, when the far side reports one (a proxy may not)."""
        try:
            result = await self._proc.wait()
        except (asyncssh.Error, OSError):
            return None
        return result.exit_status

    def close(self) -> None:
        self._proc.close()


class PTYTransport(SSHTransport):
    """SSH that falls back to (or, with ``pty=True``, always uses) terminal sessions.

    With ``pty=None`` (the default) the link is plain SSH unless the server refuses exec
    the way PTY-only proxies do. That is checked only when the first command (the agent's
    bootstrap) fails and the server has no SFTP subsystem (a proxy never has one), through
    :meth:`switch_to_terminal`; so a normal pod pays nothing for the check, and the SFTP
    probe need not finish before the bootstrap starts.

    Args:
        destination: an ssh alias or ``user@host[:port]``.
        pty: True to use terminal sessions, None to detect, False never to.
        shell_timeout: seconds a terminal session may take to reach its first marker
            (a login shell that activates conda can take several).
    """

    def __init__(self, destination: str, *, config_file: str | None = None,
                 port: int | None = None, user: str | None = None, accept_new: bool = False,
                 pty: bool | None = None, shell_timeout: float = 30.0,
                 probe_timeout: float = 10.0) -> None:
        super().__init__(destination, config_file=config_file, port=port, user=user,
                         accept_new=accept_new)
        self.destination = destination
        self.pty_mode = pty
        self.shell_timeout = shell_timeout
        self.probe_timeout = probe_timeout
        self.pty = False
        self.pty_reason = ""
        #: File reads resumed after a lost frame or a broken link (for tests and bench).
        self.resumes = 0
        self._extra: list[SSHTransport] = []

    # -- connecting and detecting
    async def connect(self) -> None:
        await super().connect()
        if self.pty_mode or self.pty:  # asked for, or found before this reconnect
            self._use_terminal(self.pty_reason or "asked for with --pty")

    async def switch_to_terminal(self) -> bool:
        """After the first command failed: terminal sessions, if exec is refused here."""
        if self.pty or self.pty_mode is not None:
            return False
        await self.settled()
        if self.info.sftp:
            return False  # a PTY-only proxy never has SFTP: the failure is a real one
        found = await self._exec_refused()
        if found is None:
            return False
        self._use_terminal(found)
        return True

    def _use_terminal(self, reason: str) -> None:
        self.pty = True
        self.pty_reason = reason
        self.info = TransportInfo(
            kind="pty", target=self.info.target, sftp=False,
            notes=[*self.target.notes, f"{LIMITS}; detected: {reason}", REMEDY],
            connect_s=self.info.connect_s, dead_link_bound_s=self.keepalive.bound_s)

    async def _detect_sftp(self) -> None:
        if self.pty_mode:  # a terminal link moves files without SFTP: do not ask for it
            self.info.sftp = False
            return
        await super()._detect_sftp()

    async def _exec_refused(self) -> str | None:
        """Why exec does not work here, or None when it does."""
        token = "gpuws-exec-" + secrets.token_hex(6)
        try:
            proc = await self.conn.create_process(f"echo {token}", encoding=None)
        except (asyncssh.Error, OSError) as exc:
            return f"the server refused an exec channel ({getattr(exc, 'reason', exc)})"
        try:
            async with asyncio.timeout(self.probe_timeout):
                out = await proc.stdout.read()
                err = await proc.stderr.read()
                status = (await proc.wait()).exit_status
        except TimeoutError:
            return f"an exec request got no answer within {self.probe_timeout:.0f} s"
        except (asyncssh.Error, OSError) as exc:
            return f"an exec request failed ({exc})"
        finally:
            proc.close()
        if token.encode() in out and status == 0:
            return None
        said = readable(out + b"\n" + err, 160)
        return f"exec refused: {said!r}" if said else f"exec refused (exit status {status})"

    # -- terminal sessions
    async def start(self, argv: Sequence[str]) -> RemoteProcess:
        if not self.pty:
            return await super().start(argv)
        return await self.start_pty(argv)

    async def start_pty(self, argv: Sequence[str]) -> PTYProcess:
        """Start ``argv`` in a terminal session of its own; its output follows the marker."""
        command = shlex.join(argv)
        if command.encode().translate(None, _LINE):
            # A newline or control character would end or edit the line it is typed on:
            # such a command travels base64-encoded and sh decodes it.
            encoded = base64.b64encode(f"exec {command}".encode()).decode()
            command = shlex.join(["sh", "-c", 'eval "$(printf %s "$0" | base64 -d)"', encoded])
        token = secrets.token_hex(8)
        ready, noraw, go = (f"GPWS-{token}-{w}" for w in ("READY", "NORAW", "GO"))
        # The leading space is typed for the login shell to lose: zsh with no startup
        # files first runs zsh-newuser-install, whose menu reads one key from what was
        # typed ahead ("zsh: command not found: xec" without it); every shell ignores
        # leading blanks, and bash's ignorespace keeps the line out of the history.
        setup = (" exec /bin/sh -c '"
                 f'stty raw -echo 2>/dev/null || {{ printf "{_octal(noraw)}\\n"; exit 1; }}; '
                 f'mesg n 2>/dev/null; printf "{_octal(ready)}\\n"; '
                 "IFS= read -r l; eval \"$l\"' || exit 126\n")
        launch = f"printf '{_octal(go)}\\n'; exec {command} || exit 127\n"
        proc = await self._open_terminal()
        seen = bytearray()
        try:
            async with asyncio.timeout(self.shell_timeout):
                proc.stdin.write(setup.encode())
                if len(launch) <= PIPELINE_MAX:
                    proc.stdin.write(launch.encode())
                else:
                    await _until(proc, seen, (ready, noraw))
                    proc.stdin.write(launch.encode())
                found, rest = await _until(proc, seen, (go, noraw))
        except TimeoutError as exc:
            proc.close()
            raise ConnectError(
                f"the pod's shell did not answer within {self.shell_timeout:.0f} s "
                f"(it showed: {readable(bytes(seen)) or 'nothing'})",
                title="No shell prompt",
                remedy="check that the pod's login shell starts (a slow .bashrc?)") from exc
        except BaseException:
            proc.close()
            raise
        if found == noraw:
            proc.close()
            raise ConnectError("the pod's terminal could not be switched to raw mode (stty "
                               "failed)", title="Terminal not usable",
                               remedy="install coreutils on the pod, or " + REMEDY)
        return PTYProcess(proc, rest)

    async def _open_terminal(self) -> asyncssh.SSHClientProcess[bytes]:
        """A session with a PTY and a shell: on this connection, else on another one.

        A proxy may allow one session per connection, and after a broken link the main
        connection is gone; a side channel then gets a connection of its own.
        """
        conns = [self._conn] + [t._conn for t in reversed(self._extra)]
        for conn in conns:
            if conn is None or conn.is_closed():
                continue
            try:
                return await self._terminal_on(conn)
            except (asyncssh.Error, OSError):
                continue
        extra = _SideConnection(self.destination, config_file=self.config_file,
                                port=self.target.port, user=self.target.user,
                                accept_new=self.accept_new)
        await extra.connect()
        self._extra.append(extra)
        refused: asyncssh.ChannelOpenError | None = None
        for attempt in range(3):
            try:
                return await self._terminal_on(extra.conn)
            except asyncssh.ChannelOpenError as exc:
                # A server that has just closed a session may not have counted it out yet.
                refused = exc
                await asyncio.sleep(0.1 * (attempt + 1))
            except (asyncssh.Error, OSError) as exc:
                raise map_error(exc, self.target) from exc
        raise map_error(refused or OSError("no session"), self.target) from refused

    @staticmethod
    async def _terminal_on(conn: asyncssh.SSHClientConnection
                           ) -> asyncssh.SSHClientProcess[bytes]:
        return await conn.create_process(term_type=TERM_TYPE, term_size=TERM_SIZE,
                                         request_pty="force", encoding=None)

    async def run(self, argv: Sequence[str], input: bytes | None = None) -> CommandResult:
        """Run ``argv`` to completion; over a terminal its stdin is ``input`` then EOF.

        A terminal has no end-of-file, so the command reads exactly ``input``: it is
        sent base64-encoded and ``head -c`` stops after that many characters. Without
        input the command's stdin is /dev/null. Its stderr is merged into ``stdout``.
        """
        if not self.pty:
            return await super().run(argv, input)
        if input:
            text = base64.b64encode(input)
            wrapped = ["sh", "-c", 'n=$1; shift; head -c "$n" | base64 -d | "$@"', "sh",
                       str(len(text)), *argv]
        else:
            wrapped = ["sh", "-c", '"$@" </dev/null', "sh", *argv]
        proc = await self.start_pty(wrapped)
        try:
            if input:
                proc.stdin.write(text)
                await proc.stdin.drain()
            out = await proc.stdout.read()
            return CommandResult(await proc.wait(), out, b"")
        finally:
            proc.close()

    # -- files
    async def read_file(self, path: str, offset: int, agent_argv: Sequence[str],
                        chunk: int = 1 << 20, *, stall_s: float = TRANSFER_STALL_S
                        ) -> AsyncIterator[bytes]:
        """Over a terminal: the agent's ``cat64`` frames, verified, resumed after a break.

        Every frame's sha256 is checked before its bytes are yielded; a frame that is
        garbled, lost to noise or cut off by a broken link ends that session, and a new
        one (on a new connection if the old one is gone) starts at the first byte not
        yet yielded. Each session ends with the sha256 of all it sent, checked too.
        """
        if not self.pty:
            async for piece in super().read_file(path, offset, agent_argv, chunk,
                                                 stall_s=stall_s):
                yield piece
            return
        pos = offset
        stalled = 0
        problem = ""
        frame = max(4096, min(chunk, FRAME))
        while True:
            start = pos
            whole = hashlib.sha256()
            proc = await within_stall(
                self.start_pty([*agent_argv, "cat64", path, str(pos), str(frame)]),
                stall_s, path)
            done = False
            try:
                lines = _lines(proc.stdout)
                while True:
                    try:
                        line = await within_stall(anext(lines), stall_s, path)
                    except StopAsyncIteration:
                        break
                    at = line.find(b"GPWS-")
                    kind = line[at:at + 9] if at >= 0 else b""
                    if kind == b"GPWS-CAT ":
                        data = _frame(line[at + 9:], pos)
                        if data is None:
                            problem = f"a garbled or missing frame at byte {pos}"
                            break
                        whole.update(data)
                        pos += len(data)
                        yield data
                    elif kind == b"GPWS-END ":
                        end, _, digest = line[at + 9:].strip().partition(b" ")
                        if int(end) != pos or digest.decode() != whole.hexdigest():
                            raise TransferError(
                                f"reading {path}: bytes {start}..{pos} do not match the "
                                f"pod's sha256 (it sent up to {int(end)})",
                                remedy="pull again; the transfer resumes")
                        done = True
                        break
                    elif kind == b"GPWS-ERR ":
                        raise TransferError(f"reading {path} on the pod failed: "
                                            f"{line[at + 9:].decode('utf-8', 'replace')}")
                    elif line.strip():
                        problem = readable(line)
            finally:
                proc.close()
            if done:
                return
            self.resumes += 1
            stalled = 0 if pos > start else stalled + 1
            if stalled >= RETRIES:
                raise TransferError(f"reading {path} over the terminal stopped at byte {pos}"
                                    + (f": {problem}" if problem else ""),
                                    remedy="check the link, then pull again: it resumes")
            await asyncio.sleep(0.2 * stalled)

    async def close(self) -> None:
        for extra in self._extra:
            await extra.close()
        self._extra.clear()
        await super().close()


class _SideConnection(SSHTransport):
    """One more connection for a terminal session; it needs no SFTP (the pod has none)."""

    async def _detect_sftp(self) -> None:
        self.info.sftp = False


async def _until(proc: asyncssh.SSHClientProcess[bytes], seen: bytearray,
                 markers: Sequence[str]) -> tuple[str, bytes]:
    """Read until one of ``markers`` has been printed on a line; return it and what follows."""
    wanted = [m.encode() for m in markers]
    searched = len(seen)
    hit: tuple[bytes, int] | None = None
    while True:
        if hit is None:
            for mark in wanted:
                at = seen.find(mark, max(0, searched - len(mark)))
                if at >= 0:
                    hit = mark, at
                    break
        if hit is not None:
            nl = seen.find(b"\n", hit[1])
            if nl >= 0:
                rest = bytes(seen[nl + 1:])
                del seen[:]
                return hit[0].decode(), rest
        searched = len(seen)
        chunk = await proc.stdout.read(1 << 16)
        if not chunk:
            raise ConnectError(f"the pod closed the terminal session: "
                               f"{readable(bytes(seen)) or 'no output'}",
                               title="Terminal session refused", remedy=REMEDY)
        seen += chunk
        if hit is None and len(seen) > 1 << 20:  # a chatty MOTD: keep its tail only
            del seen[:-4096]
            searched = len(seen)


async def _lines(reader: ByteReader) -> AsyncIterator[bytes]:
    """Whole lines (without ``\\n``) until end of file; a last partial line is dropped."""
    buf = bytearray()
    searched = 0
    while True:
        chunk = await reader.read(1 << 18)
        if not chunk:
            return
        buf += chunk
        start = 0
        while True:
            nl = buf.find(b"\n", max(start, searched))
            if nl < 0:
                break
            yield bytes(buf[start:nl])
            start = nl + 1
        del buf[:start]
        searched = len(buf)


def _frame(body: bytes, pos: int) -> bytes | None:
    """The data of ``OFFSET LENGTH SHA256 ENC DATA`` if it is intact and starts at ``pos``."""
    fields = body.split(b" ", 4)
    if len(fields) != 5 or fields[0] != b"%d" % pos or fields[3] not in (b"b64", b"z64"):
        return None
    try:
        data = binascii.a2b_base64(fields[4])
        if fields[3] == b"z64":
            data = zlib.decompress(data)
    except (binascii.Error, ValueError, zlib.error):
        return None
    if b"%d" % len(data) != fields[1] or hashlib.sha256(data).hexdigest().encode() != fields[2]:
        return None
    return data
