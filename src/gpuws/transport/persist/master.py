"""The master: one laptop process that keeps one SSH connection for later commands.

Started by the first command to a host (:mod:`.client`) as ``python -m
gpuws.transport.persist.master``, in its own session (no terminal's SIGHUP reaches it),
its stdin the spec (JSON), its stdout the one line saying it is ready (or the error that
kept it from being), its stderr a 0600 log beside the socket. It connects the way a
command would (the same transport, host-key and auth rules), binds the socket (0600, in
the checked 0700 directory) and serves, each client connection one conversation
(:mod:`.wire`): ``info`` (the hello), ``start`` (a new exec channel on the kept
connection, its stdin/stdout/stderr relayed: a new session per client, as OpenSSH's
ControlMaster opens one per ``ssh``), ``read_file`` (SFTP, or the agent's ``cat``),
and ``switch`` (to a terminal-only pod's sessions).

It holds no agent of its own: every agent it carries belongs to a command and ends
with it, so with no command connected there is no ``serve`` on the pod, and the pod's
lease counts no one connected (``remote_agent/lease.py``: a connection is a live
serve's flock) and its idle stop goes on. Sessions and their cost are the commands'.

It ends when no client has been connected for the idle time, when its SSH link is
lost (never redialled here: the next command makes a new master and sees the failure
itself), when its socket is no longer the one it bound (another command found it hung
and replaced it), or on SIGTERM/SIGINT; it removes its socket only while it is still
its own, under the same lock the commands take.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from ...errors import GpuwsError
from ..base import ByteReader, RemoteProcess, Transport
from . import wire
from .peer import peer_uid
from .place import PERSIST_VERSION

#: Seconds a client may take to say what it wants.
HELLO_S = 10.0
#: How often the master looks whether its socket is still its own.
CHECK_S = 5.0
#: The least a new master waits for its first client: the command that started it
#: connects right after the ready line, but on a loaded machine that can take longer
#: than a short ``persist`` ("1s"), and a master gone before that command used it would
#: make it connect by itself.
FIRST_CLIENT_S = 30.0


class Master:
    """One kept connection and the socket that reaches it.

    Args:
        spec: from the spawning command: ``destination``, ``config_file``, ``port``,
            ``user``, ``accept_new``, ``pty``, ``idle_s``, ``socket``, ``lock``,
            ``identity``.
    """

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.idle_s = float(spec["idle_s"])
        self.socket_path = Path(spec["socket"])
        self.lock_path = Path(spec["lock"])
        self.identity = str(spec["identity"])
        self.transport: Transport | None = None
        self.active = 0
        self.streams = 0
        self.idle_since = time.monotonic()
        self.started = time.time()
        self.changed = asyncio.Event()
        self.stopping: str | None = None
        self._inode: int | None = None

    def make_transport(self) -> Transport:
        from .. import make_transport

        s = self.spec
        return make_transport(s["destination"], config_file=s["config_file"], port=s["port"],
                              user=s["user"], accept_new=bool(s["accept_new"]), pty=s["pty"])

    async def run(self) -> int:
        """Connect, tell the spawner, serve until done; the exit status."""
        try:
            transport = self.make_transport()
            self.transport = transport
            await transport.connect()
            await transport.settled()
        except GpuwsError as exc:
            verdict = getattr(self.transport, "verdict", None)
            _ready({"error": type(exc).__name__, "message": exc.message, "title": exc.title,
                    "remedy": exc.remedy,
                    "verdict": dataclasses.asdict(verdict) if verdict is not None else None})
            return 1
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop, f"signal {sig.name}")
        sock = _bind(self.socket_path)
        self._inode = os.stat(self.socket_path).st_ino
        server = await asyncio.start_unix_server(self._client, sock=sock)
        _ready({"ok": True, "pid": os.getpid()})
        why = await self._until_done(transport)
        print(f"gpuws persist master {os.getpid()}: ending ({why})", file=sys.stderr)
        server.close()
        self._remove_socket()
        await transport.close()
        return 0

    def _stop(self, why: str) -> None:
        self.stopping = why
        self.changed.set()

    async def _until_done(self, transport: Transport) -> str:
        conn = getattr(transport, "conn", None)
        lost = asyncio.ensure_future(conn.wait_closed()) if conn is not None else None
        try:
            while True:
                if self.stopping:
                    return self.stopping
                if transport.lost_reason or (lost is not None and lost.done()):
                    return f"link lost: {transport.lost_reason or 'closed'}"
                if not self._socket_is_ours():
                    return "its socket was replaced or removed"
                wait = CHECK_S
                if self.active == 0:
                    idle_s = self.idle_s if self.streams else max(self.idle_s,
                                                                  FIRST_CLIENT_S)
                    left = idle_s - (time.monotonic() - self.idle_since)
                    if left <= 0:
                        return f"idle for {self.idle_s:g} s"
                    wait = min(wait, left)
                self.changed.clear()
                waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(self.changed.wait())]
                if lost is not None:
                    waits.append(lost)
                await asyncio.wait(waits, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
                waits[0].cancel()
        finally:
            if lost is not None:
                lost.cancel()

    def _socket_is_ours(self) -> bool:
        try:
            return os.lstat(self.socket_path).st_ino == self._inode
        except OSError:
            return False

    def _remove_socket(self) -> None:
        # Under the commands' lock: a command that found this master dead may be binding a
        # new one at the same path right now, and that one must not be removed.
        try:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                         0o600)
        except OSError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if self._socket_is_ours():
                with contextlib.suppress(OSError):
                    os.unlink(self.socket_path)
        finally:
            os.close(fd)

    def hello(self) -> dict[str, Any]:
        """What ``info`` answers: who this is, how the link stands, what it has carried."""
        t = self.transport
        assert t is not None
        verdict = getattr(t, "verdict", None)
        return {"hello": "gpuws-persist", "version": PERSIST_VERSION, "identity": self.identity,
                "pid": os.getpid(), "link": "down" if t.lost_reason else "up",
                "info": dataclasses.asdict(t.info),
                "verdict": dataclasses.asdict(verdict) if verdict is not None else None,
                "dials": 1, "streams": self.streams, "active": self.active,
                "idle_s": self.idle_s, "started": self.started}

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.active += 1
        self.changed.set()
        try:
            if peer_uid(writer.get_extra_info("socket")) != os.geteuid():
                return  # only this user: the directory's mode should make this impossible
            got = await asyncio.wait_for(wire.read_frame(reader), HELLO_S)
            if got is None or got[0] != b"J":
                return
            doc = wire.decode(got[1])
            if doc.get("version") != PERSIST_VERSION or doc.get("identity") != self.identity:
                writer.write(wire.error_frame(GpuwsError(
                    "this master serves another host identity or version")))
                return
            await self._serve(doc, reader, writer)
        except (wire.WireError, OSError, TimeoutError, asyncio.IncompleteReadError):
            pass  # the client went away or spoke nonsense: its conversation alone ends
        finally:
            self.active -= 1
            if self.active == 0:
                self.idle_since = time.monotonic()
            self.changed.set()
            writer.close()
            with contextlib.suppress(OSError, ConnectionError):
                await writer.wait_closed()

    async def _serve(self, doc: dict[str, Any], reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        t = self.transport
        assert t is not None
        op = doc.get("op")
        if op == "info":
            writer.write(wire.control(self.hello()))
        elif op == "switch":
            switched = await t.switch_to_terminal()
            writer.write(wire.control({"switched": switched, "info": dataclasses.asdict(t.info)}))
        elif op == "start":
            argv = doc.get("argv")
            if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
                raise wire.WireError("start without an argv")
            try:
                proc = await t.start(argv)
            except GpuwsError as exc:
                writer.write(wire.error_frame(exc))
                return
            self.streams += 1
            writer.write(wire.control({"started": True}))
            await _relay(proc, t, reader, writer)
        elif op == "read_file":
            await _read_file(t, doc, writer)
        else:
            raise wire.WireError(f"unknown op {op!r}")
        await writer.drain()


async def _relay(proc: RemoteProcess, t: Transport, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
    """One remote process's streams both ways until it ends or the client goes."""

    async def pump(src: ByteReader, kind: bytes) -> None:
        # A link that breaks ends the stream like EOF; the X frame then says why.
        with contextlib.suppress(GpuwsError, OSError):
            while True:
                data = await src.read(1 << 16)
                if not data:
                    return
                writer.write(wire.frames(kind, data))
                await writer.drain()  # the client's pace is the channel's: no hoarding here

    async def inbound() -> None:
        with contextlib.suppress(GpuwsError, OSError, wire.WireError):
            while True:
                got = await wire.read_frame(reader)
                if got is None:
                    break  # the command went away (or was killed): its channel goes too
                kind, payload = got
                if kind == b"I":
                    proc.stdin.write(payload)
                    await proc.stdin.drain()
                elif kind == b"N":
                    proc.stdin.write_eof()
                else:
                    raise wire.WireError(f"frame {kind!r} on a process stream")
        proc.close()

    feeding = asyncio.create_task(inbound())
    try:
        await asyncio.gather(pump(proc.stdout, b"O"), pump(proc.stderr, b"E"))
        try:
            status = await proc.wait()
        except (GpuwsError, OSError):
            status = None
        end = {"status": status, "lost": t.lost_reason}
        writer.write(wire.frame(b"X", json.dumps(end).encode()))
        await writer.drain()
    finally:
        feeding.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await feeding
        proc.close()


async def _read_file(t: Transport, doc: dict[str, Any], writer: asyncio.StreamWriter) -> None:
    path, offset, agent_argv = doc.get("path"), doc.get("offset"), doc.get("agent_argv")
    chunk, stall_s = doc.get("chunk"), doc.get("stall_s")
    if not (isinstance(path, str) and isinstance(offset, int) and isinstance(agent_argv, list)
            and all(isinstance(a, str) for a in agent_argv) and isinstance(chunk, int)
            and isinstance(stall_s, (int, float))):
        raise wire.WireError("read_file with bad arguments")
    try:
        async for data in t.read_file(path, offset, agent_argv, min(max(chunk, 1), 8 << 20),
                                      stall_s=float(stall_s)):
            writer.write(wire.frames(b"O", data))
            await writer.drain()
    except GpuwsError as exc:
        writer.write(wire.error_frame(exc))
        return
    writer.write(wire.frame(b"X", b'{"status": 0}'))


def _bind(path: Path) -> socket.socket:
    """A listening unix socket at ``path``, 0600 from the start (umask around bind)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(64)
    sock.setblocking(False)
    return sock


def _ready(doc: dict[str, Any]) -> None:
    """The one line the spawning command waits for; stdout is closed after it."""
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()
    # Nothing more goes to the spawner (it may be gone: a write would be SIGPIPE).
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)


def main() -> int:
    """Read the spec from stdin, serve, return the exit status."""
    # Fork once and let the first process exit: the master is then no child of the
    # command that spawned it (a long-lived TUI would otherwise keep it as a zombie).
    if os.fork() > 0:
        os._exit(0)
    spec = json.loads(sys.stdin.buffer.read())
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    return asyncio.run(Master(spec).run())


if __name__ == "__main__":
    sys.exit(main())
