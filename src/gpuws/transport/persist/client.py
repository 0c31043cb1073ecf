"""A command's side of a kept connection: find the master, check it, or make one.

:class:`PersistTransport` is a :class:`~gpuws.transport.base.Transport` like the others:
``connect`` finds the host identity's socket (:mod:`.place`), checks the peer is this
user (``SO_PEERCRED``) and that it answers a hello naming the same identity, version and
a live link; a socket nobody answers (a master killed with SIGKILL), a hung master or
one whose link died is not trusted: under the identity's lock it is removed and a new
master is started (:mod:`.master`), whose own connect errors (host key, auth, an
unreachable pod) come back as the same errors a direct connect raises. ``start`` opens
a new socket connection per remote process, so two commands at once (or one command's
agent and its side channels) each get their own exec channel on the one SSH connection.

When the kept connection itself cannot be used (a runtime directory that is not
private, a socket owned by someone else, a path too long, a master that died before it
was ready), the command says so in one ``gpuws:`` line and connects by itself, as it did
before persistence: never a silent downgrade, never a blind trust.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import ConnectError, GpuwsError
from ..base import TRANSFER_STALL_S, RemoteProcess, Transport, TransportInfo, within_stall
from ..sshconfig import resolve
from . import wire
from .peer import peer_uid
from .place import PERSIST_VERSION, Place, PlaceError, identity, place_for, private_dir

#: Seconds a master may take to answer a hello before it is taken for hung.
HELLO_S = 5.0
#: Bytes of a process's stdout held here before the socket is read no further (the
#: master's drain then waits, the SSH window fills: the engine's backpressure holds).
PIPE_LIMIT = 1 << 20


#: Seconds to reach the pod when the config sets no ``ConnectTimeout`` (as ssh.py's).
CONNECT_TIMEOUT = 15.0


@dataclass
class Verdict:
    """The master's host-key decision, as :class:`gpuws.transport.ssh.HostKeyVerdict`
    says it (the same fields: the link reads either). Its own class, so that a command
    using a kept connection never imports asyncssh (0.68 s of a start measured
    here under load, docs/performance.md §16)."""

    status: str = "unchecked"
    fingerprint: str = ""
    key_type: str = ""
    known_hosts: str = ""

    @classmethod
    def of(cls, doc: object) -> Verdict | None:
        if not isinstance(doc, dict):
            return None
        return cls(**{k: str(v) for k, v in doc.items() if k in cls.__dataclass_fields__})


class Unkept(Exception):
    """The kept connection cannot be used here; the message says why."""


def _say(line: str) -> None:
    sys.stderr.write(f"gpuws: {line}\n")
    sys.stderr.flush()


class PersistTransport(Transport):
    """The pod reached through a master that outlives this command (see the module notes).

    Args:
        destination: an ssh alias or ``[user@]host[:port]``.
        config_file: ``-F FILE``.
        port: ``-p PORT``.
        user: ``-l USER``.
        accept_new: record an unknown host key (passed to a new master).
        pty: ``--pty`` (True) or detection (None).
        idle_s: seconds a master waits with no command before it closes.
        say: where the one line about a connection not kept goes (stderr by default).
        runtime_base: the runtime directory (tests; else ``$XDG_RUNTIME_DIR``...).

    Attributes:
        target: where and how, as OpenSSH's rules resolve it (``ssh -G``).
        reused: whether ``connect`` found a live master (False: it made one).
        master: the master's last hello (pid, counters), None before ``connect``.
    """

    def __init__(self, destination: str, *, config_file: str | None = None,
                 port: int | None = None, user: str | None = None, accept_new: bool = False,
                 pty: bool | None = None, idle_s: float,
                 say: Callable[[str], None] = _say, runtime_base: Path | None = None) -> None:
        self.target = resolve(destination, config_file, port=port, user=user)
        self.destination = destination
        self.config_file = config_file
        self.port = port
        self.user = user
        self.accept_new = accept_new
        self.pty = pty
        self.idle_s = idle_s
        self.say = say
        self.runtime_base = runtime_base
        self.info = TransportInfo(kind="ssh", target=destination,
                                  notes=list(self.target.notes))
        self.reused = False
        self.master: dict[str, Any] | None = None
        self.place: Place | None = None
        self._verdict = Verdict()
        self._fallback: Transport | None = None
        self._lost: str | None = None

    def direct(self) -> Transport:
        """The transport this command uses by itself when the kept connection cannot be
        used (asyncssh is imported only then)."""
        from ..pty import PTYTransport

        return PTYTransport(self.destination, config_file=self.config_file, port=self.port,
                            user=self.user, accept_new=self.accept_new, pty=self.pty)

    # -- what the link layer reads
    @property
    def verdict(self) -> object:
        """The host-key decision of the connection in use (``status``, ``fingerprint``,
        ``key_type``, ``known_hosts``)."""
        if self._fallback is not None:
            return getattr(self._fallback, "verdict", None)
        return self._verdict

    @property
    def lost_reason(self) -> str | None:
        if self._fallback is not None:
            return self._fallback.lost_reason
        return self._lost

    @lost_reason.setter
    def lost_reason(self, value: str | None) -> None:
        self._lost = value

    @property
    def kept(self) -> bool:
        """Whether the kept connection is in use (False: this command connected itself)."""
        return self._fallback is None and self.master is not None

    # -- connecting
    async def connect(self) -> None:
        t0 = time.monotonic()
        self._lost = None
        try:
            hello = await self._reach()
        except (Unkept, OSError) as exc:
            # OSError: the lock or the log could not be opened, the master not started.
            why = str(exc) if isinstance(exc, Unkept) else f"{exc.strerror or exc}"
            self.say(f"the connection to {self.destination} is not kept: {why}; this "
                     "command connects by itself")
            self._fallback = direct = self.direct()
            await direct.connect()
            self.info = direct.info
            return
        self._adopt(hello)
        self.info.connect_s = time.monotonic() - t0

    async def settled(self) -> None:
        if self._fallback is not None:
            await self._fallback.settled()

    def _adopt(self, hello: dict[str, Any]) -> None:
        self.master = hello
        raw = hello.get("info") or {}
        fields = {k: raw[k] for k in ("kind", "target", "sftp", "notes", "dead_link_bound_s")
                  if k in raw}
        info = TransportInfo(**fields)
        idle = hello.get("idle_s")
        idle_s = float(idle) if isinstance(idle, (int, float)) else self.idle_s
        info.notes = [*info.notes, f"connection kept by gpuws (master pid {hello.get('pid')}, "
                      f"closes after {idle_s:g} s unused; --no-persist to go without)"]
        self.info = info
        self._verdict = Verdict.of(hello.get("verdict")) or self._verdict

    async def _reach(self) -> dict[str, Any]:
        try:
            directory = private_dir(self.runtime_base)
            ident = identity(self.target, destination=self.destination,
                             config_file=self.config_file, pty=self.pty)
            self.place = place = place_for(ident, directory)
        except PlaceError as exc:
            raise Unkept(str(exc)) from exc
        hello = await self._hello(place)
        if hello is not None:
            self.reused = True
            return hello
        fd = os.open(place.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            # Another command may be making the master right now: wait for it, then use
            # what it made (one master per identity, whatever runs at once).
            await asyncio.get_running_loop().run_in_executor(None, fcntl.flock, fd,
                                                             fcntl.LOCK_EX)
            hello = await self._hello(place)
            if hello is not None:
                self.reused = True
                return hello
            with contextlib.suppress(FileNotFoundError):
                os.unlink(place.socket)  # stale: nobody answers there, or not as a master should
            await self._spawn(place)
            hello = await self._hello(place)
            if hello is None:
                raise Unkept("the new master does not answer")
            return hello
        finally:
            os.close(fd)

    async def _open(self, place: Place) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to the socket, its peer checked to be this user.

        Raises:
            OSError: nothing listens there (FileNotFoundError, ConnectionRefusedError...).
            Unkept: someone else does.
        """
        reader, writer = await asyncio.wait_for(
            asyncio.open_unix_connection(str(place.socket)),
            HELLO_S)
        uid = peer_uid(writer.get_extra_info("socket"))
        if uid != os.geteuid():
            writer.close()
            who = "this system cannot tell who owns it" if uid is None else f"owned by uid {uid}"
            raise Unkept(f"{place.socket} is {who}, not by you (uid {os.geteuid()})")
        return reader, writer

    def _hello_doc(self, place: Place, op: str, **args: Any) -> bytes:
        return wire.control({"hello": "gpuws-persist", "version": PERSIST_VERSION,
                             "identity": place.identity, "op": op, **args})

    async def _hello(self, place: Place) -> dict[str, Any] | None:
        """The master's hello, or None where there is none to trust (see the module notes)."""
        try:
            reader, writer = await self._open(place)
        except (OSError, TimeoutError):
            return None
        try:
            writer.write(self._hello_doc(place, "info"))
            got = await asyncio.wait_for(wire.read_frame(reader), HELLO_S)
        except (OSError, TimeoutError, wire.WireError):
            return None  # hung or gone mid-hello: replaced, never waited on for ever
        finally:
            writer.close()
        if got is None or got[0] != b"J":
            return None
        try:
            doc = wire.decode(got[1])
        except wire.WireError:
            return None
        if (doc.get("hello") != "gpuws-persist" or doc.get("version") != PERSIST_VERSION
                or doc.get("identity") != place.identity or doc.get("link") != "up"):
            return None
        return doc

    async def _spawn(self, place: Place) -> None:
        """Start a master and wait for its one line (ready, or the pod's error)."""
        spec = {"destination": self.destination,
                "config_file": os.path.abspath(self.config_file) if self.config_file else None,
                "port": self.port, "user": self.user, "accept_new": self.accept_new,
                "pty": self.pty, "idle_s": self.idle_s, "socket": str(place.socket),
                "lock": str(place.lock), "identity": place.identity}
        log = os.open(place.log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                      | os.O_CLOEXEC, 0o600)
        try:
            # Popen, not asyncio's subprocess: closing asyncio's transport kills a child
            # still running, and this one must outlive the command. Its own session: no
            # SIGHUP or Ctrl+C of this terminal reaches it.
            # The socket's path in its argv says in `ps` whose master it is.
            proc = subprocess.Popen([sys.executable, "-m", "gpuws.transport.persist.master",
                                     str(place.socket)],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                    start_new_session=True, cwd="/")
        finally:
            os.close(log)
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps(spec).encode())
        proc.stdin.close()
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        pipe, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                               proc.stdout)
        hops = 1 + len(self.target.jump_hosts)
        try:
            line = await asyncio.wait_for(reader.readline(),
                                          (self.target.connect_timeout or CONNECT_TIMEOUT)
                                          * hops + 30)
        except TimeoutError:
            proc.kill()
            raise Unkept("a new master did not say it was ready in time") from None
        finally:
            pipe.close()
            # The spawned process forks the master and exits at once (the master is then
            # no child of this command, nothing to reap later): reap that one now.
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
        if not line:
            raise Unkept(f"a new master exited before it was ready ({_last_line(place.log)})")
        try:
            doc = json.loads(line)
        except ValueError:
            raise Unkept("a new master said something unreadable") from None
        if doc.get("ok"):
            return
        self._verdict = Verdict.of(doc.get("verdict")) or self._verdict
        # The pod's own answer (unknown host key, auth refused, unreachable): the same
        # error a direct connect raises, with the same remedy; nothing is retried.
        raise wire.error_of(doc)

    # -- using it
    async def _conversation(self, op: str, **args: Any
                            ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        place = self.place
        if place is None:
            raise ConnectError("not connected")
        try:
            reader, writer = await self._open(place)
        except (OSError, TimeoutError, Unkept) as exc:
            self._lost = f"the master keeping the connection went away ({exc})"
            raise ConnectError(self._lost, title="Connection lost",
                               remedy="run the command again; a new connection is made") from exc
        writer.write(self._hello_doc(place, op, **args))
        return reader, writer

    async def start(self, argv: Sequence[str]) -> RemoteProcess:
        if self._fallback is not None:
            return await self._fallback.start(argv)
        reader, writer = await self._conversation("start", argv=list(argv))
        try:
            got = await wire.read_frame(reader)
            if got is not None and got[0] == b"R":
                raise wire.error_of(wire.decode(got[1]))
            if got is None or got[0] != b"J":
                raise wire.WireError("no answer to start")
        except (OSError, wire.WireError) as exc:
            writer.close()
            self._lost = f"the master keeping the connection went away ({exc})"
            raise ConnectError(self._lost, title="Connection lost",
                               remedy="run the command again; a new connection is made") from exc
        except GpuwsError:
            writer.close()
            raise
        return PersistProcess(reader, writer, self)

    async def switch_to_terminal(self) -> bool:
        if self._fallback is not None:
            return await self._fallback.switch_to_terminal()
        reader, writer = await self._conversation("switch")
        try:
            got = await wire.read_frame(reader)
        except (OSError, wire.WireError):
            return False
        finally:
            writer.close()
        if got is None or got[0] != b"J":
            return False
        doc = wire.decode(got[1])
        raw = doc.get("info") or {}
        for key in ("kind", "sftp"):
            if key in raw:
                setattr(self.info, key, raw[key])
        return bool(doc.get("switched"))

    async def read_file(self, path: str, offset: int, agent_argv: Sequence[str],
                        chunk: int = 1 << 20, *, stall_s: float = TRANSFER_STALL_S
                        ) -> AsyncIterator[bytes]:
        if self._fallback is not None:
            async for data in self._fallback.read_file(path, offset, agent_argv, chunk,
                                                       stall_s=stall_s):
                yield data
            return
        reader, writer = await self._conversation(
            "read_file", path=path, offset=offset, agent_argv=list(agent_argv), chunk=chunk,
            stall_s=stall_s)
        try:
            while True:
                # The master bounds each wait by stall_s itself; the margin is its answer's.
                got = await within_stall(wire.read_frame(reader), stall_s + HELLO_S, path)
                if got is None:
                    raise ConnectError(f"reading {path}: the master keeping the connection "
                                       "went away", title="Connection lost",
                                       remedy="pull again; the transfer resumes")
                kind, payload = got
                if kind == b"O":
                    yield payload
                elif kind == b"X":
                    return
                elif kind == b"R":
                    raise wire.error_of(wire.decode(payload))
                else:
                    raise ConnectError(f"reading {path}: frame {kind!r} out of place")
        except wire.WireError as exc:
            raise ConnectError(f"reading {path}: {exc}", title="Connection lost") from exc
        finally:
            writer.close()

    async def close(self) -> None:
        """This command is done; the master (and its connection) stays for the next one."""
        if self._fallback is not None:
            await self._fallback.close()


def went_away(transport: Transport) -> str | None:
    """Why the master ``transport`` was using went away mid-command, or None (not a kept
    connection, or it is fine): a caller that can start over (a connect) does so once."""
    if isinstance(transport, PersistTransport) and transport.kept:
        reason = transport.lost_reason
        if reason and "the master keeping the connection" in reason:
            return reason
    return None


class _Pipe:
    """One relayed output stream (a :class:`~gpuws.transport.base.ByteReader`)."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._eof = False
        self._data = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()

    def feed(self, data: bytes) -> None:
        self._buf += data
        self._data.set()
        if len(self._buf) >= PIPE_LIMIT:
            self._room.clear()

    def feed_eof(self) -> None:
        self._eof = True
        self._data.set()
        self._room.set()

    async def room(self) -> None:
        await self._room.wait()

    async def read(self, n: int = -1) -> bytes:
        while not self._eof and (n < 0 or not self._buf):
            self._data.clear()
            await self._data.wait()
        if n < 0 or n >= len(self._buf):
            out = bytes(self._buf)
            self._buf.clear()
        else:
            out = bytes(self._buf[:n])
            del self._buf[:n]
        if len(self._buf) < PIPE_LIMIT:
            self._room.set()
        return out


class _Stdin:
    """The remote process's stdin, as frames to the master."""

    def __init__(self, writer: asyncio.StreamWriter, owner: PersistTransport) -> None:
        self._writer = writer
        self._owner = owner

    def write(self, data: bytes) -> None:
        if data and not self._writer.is_closing():
            self._writer.write(wire.frames(b"I", data))

    async def drain(self) -> None:
        try:
            await self._writer.drain()
        except (OSError, ConnectionError) as exc:
            raise ConnectError(self._owner.lost_reason or "the master keeping the connection "
                               "went away", title="Connection lost",
                               remedy="reconnect; runs on the pod go on") from exc

    def write_eof(self) -> None:
        if not self._writer.is_closing():
            self._writer.write(wire.frame(b"N"))


class PersistProcess(RemoteProcess):
    """A remote process whose channel the master holds; its bytes come through the socket."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 owner: PersistTransport) -> None:
        self._reader = reader
        self._writer = writer
        self._owner = owner
        self.stdin = _Stdin(writer, owner)
        self.stdout: _Pipe = _Pipe()
        self.stderr: _Pipe = _Pipe()
        self.status: int | None = None
        self._closed = False
        self._task = asyncio.create_task(self._demux())

    async def _demux(self) -> None:
        pid = (self._owner.master or {}).get("pid")
        gone = f"the master keeping the connection (pid {pid}) went away"
        try:
            while True:
                await self.stdout.room()
                got = await wire.read_frame(self._reader)
                if got is None:
                    if not self._closed:  # our own close is no lost link
                        self._owner.lost_reason = self._owner.lost_reason or gone
                    return
                kind, payload = got
                if kind == b"O":
                    self.stdout.feed(payload)
                elif kind == b"E":
                    self.stderr.feed(payload)
                elif kind == b"X":
                    end = wire.decode(payload)
                    status = end.get("status")
                    self.status = status if isinstance(status, int) else None
                    if end.get("lost"):
                        self._owner.lost_reason = str(end["lost"])
                    return
                else:
                    raise wire.WireError(f"frame {kind!r} on a process stream")
        except (OSError, wire.WireError) as exc:
            if not self._closed:
                self._owner.lost_reason = self._owner.lost_reason or f"{gone}: {exc}"
        finally:
            self.stdout.feed_eof()
            self.stderr.feed_eof()

    async def wait(self) -> int | None:
        await asyncio.shield(self._task)
        return self.status

    def close(self) -> None:
        self._closed = True
        self._writer.close()


def _last_line(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no log"
    return lines[-1][:300] if lines else "it said nothing"
