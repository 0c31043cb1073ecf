"""The SSH transport: asyncssh exec channels, SFTP when the pod offers it.

Where to connect and how comes from OpenSSH's own rules (``sshconfig.resolve``: ``ssh
-G``, or asyncssh's config support where there is no ``ssh``). This module applies the
answer the way ``ssh`` does:

- ``ProxyJump`` chains of any length: the first hop is reached as ``ssh`` would reach
  it (its own config, its own ``ProxyJump``), each later hop through the one before it
  (its own config, but no proxy of its own, as ``ssh -J`` does), every hop with its own
  host-key check; a hop that fails is named in the error.
- ``ProxyCommand`` runs through the person's shell (``$SHELL -c "exec …"``, as ``ssh``
  runs it) with its stdin/stdout on one end of a socket pair; its stderr is kept for
  the error message instead of landing on the terminal.
- Keys as ``ssh`` offers them: the agent's (``IdentityAgent``; with ``IdentitiesOnly``
  only those named by an ``IdentityFile``, whose ``.pub`` or public-key file is enough),
  then the ``IdentityFile`` keys on disk, with ``CertificateFile`` certificates.
- Keepalives follow ``ServerAliveInterval``/``ServerAliveCountMax``; unset (OpenSSH's
  ``0``), gpuws sends them every ``DEFAULT_ALIVE_INTERVAL`` s anyway, because a run
  watched from a laptop must learn that a silent link is dead. When they go unanswered
  the connection is closed and :attr:`SSHTransport.lost_reason` says why.

Host keys are checked here, before anything is sent: a known key passes, an unknown
host is refused with its fingerprint unless the person asked for accept-new, and a
changed key is always refused. ``OSError`` and ``asyncssh.Error`` become gpuws errors
at this boundary and nowhere else.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import stat
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, fields
from typing import Any

import asyncssh

from ..errors import AuthError, ConnectError, GpuwsError, HostKeyError, TransferError
from ..remote_agent.safefiles import kind_of
from ..text.textsafe import visible
from .base import (
    TRANSFER_STALL_S,
    RemoteProcess,
    Transport,
    TransportInfo,
    shell_command,
    within_stall,
)
from .keys import OfferedKeys, offered_keys
from .proxy import ProxyCommand
from .sshconfig import SSHTarget, resolve

#: Seconds between keepalives when the config sets no ``ServerAliveInterval``. With
#: OpenSSH's default ``ServerAliveCountMax 3`` a dead link is declared within 45 s.
DEFAULT_ALIVE_INTERVAL = 15.0
#: Seconds to reach the pod when the config sets no ``ConnectTimeout``.
DEFAULT_CONNECT_TIMEOUT = 15.0


@dataclass
class HostKeyVerdict:
    status: str = "unchecked"  # known | accepted | unknown | changed | revoked
    fingerprint: str = ""
    key_type: str = ""
    known_hosts: str = ""


@dataclass(frozen=True)
class Keepalive:
    """How a silent link is noticed.

    Attributes:
        interval_s: seconds of silence before a keepalive is sent.
        count_max: ``ServerAliveCountMax``.
        bound_s: the link is declared dead at most this long after the server's last
            packet.
    """

    interval_s: float
    count_max: int
    bound_s: float

    @property
    def asyncssh_count_max(self) -> int:
        # asyncssh gives up when its timer fires count_max + 1 times with nothing from the
        # server; OpenSSH gives up after about interval x count (ssh 9.2 with 1 s x 2 quit
        # 2.1 s after the server froze), so one less here. At least one keepalive is
        # always sent first: with 0, an idle but healthy link would be declared dead.
        return max(1, self.count_max - 1)

    def describe(self) -> str:
        """The bound in words, for notes and for :attr:`SSHTransport.lost_reason`."""
        return (f"keepalive every {self.interval_s:g} s, dead after {self.bound_s:g} s "
                f"without an answer (ServerAliveInterval {self.interval_s:g} x "
                f"ServerAliveCountMax {self.count_max})")


def keepalive_for(target: SSHTarget) -> Keepalive:
    """The keepalive policy for ``target`` (``ServerAlive*``, or gpuws's default)."""
    interval = target.server_alive_interval or DEFAULT_ALIVE_INTERVAL
    count = max(1, target.server_alive_count_max)
    return Keepalive(interval, count, interval * (max(1, count - 1) + 1))


def _known_keys(target: SSHTarget) -> tuple[list[asyncssh.SSHKey], list[asyncssh.SSHKey],
                                            list[str]]:
    """Trusted and revoked keys for the target's name, and the files that name it.

    Matched by name (``HostKeyAlias`` or ``HostName``) and port only, as OpenSSH does with
    its default ``CheckHostIP no``: through a jump host or a ProxyCommand there is no
    address to check, and a name only the jump host can resolve must not be looked up.
    """
    keys: list[asyncssh.SSHKey] = []
    revoked: list[asyncssh.SSHKey] = []
    where: list[str] = []
    host = target.host_key_alias or target.hostname
    for path in target.known_hosts_files:
        if not os.path.exists(path):
            continue
        try:
            kh = asyncssh.read_known_hosts(path)
        except (OSError, ValueError) as exc:
            raise HostKeyError(f"cannot read known_hosts file {path}: {exc}",
                               remedy="fix or remove the malformed line") from exc
        result = kh.match(host, "", target.port if target.port != 22 else None)
        if result[0] or result[2]:
            where.append(path)
        keys.extend(result[0])
        revoked.extend(result[2])
    return keys, revoked, where


def _record_host_key(target: SSHTarget, key: asyncssh.SSHKey) -> str:
    if not target.user_known_hosts:  # UserKnownHostsFile none: trusted for this link only
        return "nowhere (UserKnownHostsFile none)"
    path = target.known_hosts_files[0]
    os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
    line = f"{target.known_hosts_name} {key.export_public_key().decode().strip()}\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    return path


class _Client(asyncssh.SSHClient):
    """Decides about the host key with the person's policy; reports how far it got."""

    def __init__(self, owner: SSHTransport) -> None:
        self._owner = owner

    def connection_made(self, conn: asyncssh.SSHClientConnection) -> None:
        self._owner._answered(conn)

    def connection_lost(self, exc: Exception | None) -> None:
        self._owner._lost(exc)

    def validate_host_public_key(self, host: str, addr: str, port: int,
                                 key: asyncssh.SSHKey) -> bool:
        owner = self._owner
        target, v = owner.target, owner.verdict
        v.fingerprint = key.get_fingerprint("sha256")
        v.key_type = key.get_algorithm()
        keys, revoked, where = _known_keys(target)
        v.known_hosts = ", ".join(where or target.known_hosts_files[:1])
        if key in revoked:
            v.status = "revoked"
            return False
        if key in keys:
            v.status = "known"
            return True
        if keys:
            v.status = "changed"
            return False
        if owner.accept_new or target.strict_host_key_checking in ("accept-new", "no"):
            v.known_hosts = _record_host_key(target, key)
            v.status = "accepted"
            return True
        v.status = "unknown"
        return False


class _LinkReader:
    """A channel's output, where a link that dies reads as the end of the stream.

    asyncssh raises ``ConnectionLost`` (or an ``OSError``) from a read when the connection
    ends badly, e.g. unanswered keepalives; above the transport that is an end of file,
    and why is :attr:`SSHTransport.lost_reason` (set in the same loop step). An error
    escaping here left the agent client's reader task failing with a raw asyncssh
    exception ("Task exception was never retrieved" on the CLI's stderr).
    """

    def __init__(self, source: asyncssh.SSHReader[bytes],
                 window: _ConsumedWindow | None = None) -> None:
        self._source = source
        self._window = window
        #: What ended the stream, when it was not a clean end of file.
        self.error: BaseException | None = None

    async def read(self, n: int = -1) -> bytes:
        if self.error is not None:
            return b""
        try:
            data = await self._source.read(n)
        except (asyncssh.Error, OSError) as exc:
            self.error = exc
            return b""
        if data and self._window is not None:
            self._window.consumed()
        return data


class _ConsumedWindow:
    """An exec channel's receive window opened by what the laptop has read, not by what
    arrived (issue 31: 436 MB after 60 s of ``yes``).

    asyncssh (2.24) sends a window adjust back to the full window each time it hands a
    piece of data to the stream session, also when the session is paused with a full
    buffer and only took that piece on a resume: every resume granted the pod another
    full window while the last one still sat in the channel's buffer, so a pod writing
    faster than the laptop stores grew that buffer by ~5 MB/s without bound (the flaw
    Apache MINA sshd fixed in its PR 292). Here the channel's own adjust is switched
    off, and the window is reopened after each read from the channel by what was read:
    at most ``window`` bytes are ever received and not yet read.

    Private asyncssh attributes are used; where a version lacks one, asyncssh's own
    window logic stays (the flood test in tests/transport says whether it is bounded).
    """

    def __init__(self, proc: asyncssh.SSHClientProcess[bytes]) -> None:
        self._proc = proc
        chan: Any = getattr(proc, "_chan", None)
        self._chan: Any = chan if all(hasattr(chan, a) for a in (
            "_deliver_data", "_recv_buf", "_recv_window", "_init_recv_window",
            "send_packet")) and hasattr(proc, "_recv_buf_len") else None
        if self._chan is None:
            return
        deliver = chan._deliver_data

        def deliver_without_adjust(data: bytes, datatype: Any) -> None:
            # asyncssh adjusts when the window is under half of the initial one: shown a
            # full one, it leaves that to consumed().
            window, chan._recv_window = chan._recv_window, chan._init_recv_window
            try:
                deliver(data, datatype)
            finally:
                chan._recv_window = window

        chan._deliver_data = deliver_without_adjust

    def consumed(self) -> None:
        """After a read: reopen the window by what is no longer held (in the channel's
        buffer or the session's), once that is half the window or more."""
        chan = self._chan
        if chan is None:
            return
        held = sum(len(data) for data, _ in chan._recv_buf) + self._proc._recv_buf_len
        room = chan._init_recv_window - held - chan._recv_window
        if room >= chan._init_recv_window // 2:
            try:
                chan.send_packet(_MSG_CHANNEL_WINDOW_ADJUST, asyncssh.packet.UInt32(room))
            except (asyncssh.Error, OSError):
                return  # the link is going: the next read says so
            chan._recv_window += room


#: SSH's window adjust message number (RFC 4254 section 5.2).
_MSG_CHANNEL_WINDOW_ADJUST = 93


class _LinkWriter:
    """A channel's input; writing to a link that died is one :class:`ConnectError`."""

    def __init__(self, sink: asyncssh.SSHWriter[bytes], owner: SSHTransport) -> None:
        self._sink = sink
        self._owner = owner

    def write(self, data: bytes) -> None:
        try:
            self._sink.write(data)
        except (asyncssh.Error, OSError) as exc:
            raise self._lost(exc) from exc

    async def drain(self) -> None:
        try:
            await self._sink.drain()
        except (asyncssh.Error, OSError) as exc:
            raise self._lost(exc) from exc

    def write_eof(self) -> None:
        try:
            self._sink.write_eof()
        except (asyncssh.Error, OSError) as exc:
            raise self._lost(exc) from exc

    def _lost(self, exc: BaseException) -> ConnectError:
        why = self._owner.lost_reason or getattr(exc, "reason", None) or str(exc) or \
            type(exc).__name__
        return ConnectError(f"the link to the pod is gone ({why})", title="Connection lost",
                            remedy="reconnect; runs on the pod go on and can be re-attached")


class SSHProcess(RemoteProcess):
    """A command on an exec channel; a dead link ends its output (see :class:`_LinkReader`)."""

    def __init__(self, proc: asyncssh.SSHClientProcess[bytes], owner: SSHTransport) -> None:
        self._proc = proc
        window = _ConsumedWindow(proc)
        self._out = _LinkReader(proc.stdout, window)
        self._err = _LinkReader(proc.stderr, window)
        self.stdin = _LinkWriter(proc.stdin, owner)
        self.stdout = self._out
        self.stderr = self._err

    @property
    def broken(self) -> BaseException | None:
        """The error that cut its output short, if the link died under it."""
        return self._out.error or self._err.error

    async def wait(self) -> int | None:
        try:
            result = await self._proc.wait()
        except (asyncssh.Error, OSError):
            return None  # the link died: no exit status came
        return result.exit_status

    def close(self) -> None:
        self._proc.close()


class SSHTransport(Transport):
    """Reaches a pod the way OpenSSH's ``ssh`` would, through asyncssh.

    Args:
        destination: an ssh alias or ``[user@]host[:port]``.
        config_file: ``-F FILE``.
        port: ``-p PORT``.
        user: ``-l USER``.
        accept_new: record an unknown host key (every hop's) instead of refusing it.
        connect_timeout: seconds when the config sets no ``ConnectTimeout``.
        ssh_binary: the ``ssh`` whose ``-G`` decides (None: from ``PATH``; ``""``:
            asyncssh's config support, as on a machine without ``ssh``).
        ignore_proxy: this is a later hop of a ``ProxyJump`` chain (see the module notes).

    Attributes:
        target: where and how, as resolved (``user``, ``hostname``, ``port``,
            ``proxy_jump``...).
        verdict: the host-key decision of the last connect (of the hop that failed, if
            a jump host's key was refused).
        keepalive: how a silent link is noticed, and the bound on it.
    """

    def __init__(self, destination: str, *, config_file: str | None = None,
                 port: int | None = None, user: str | None = None, accept_new: bool = False,
                 connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
                 ssh_binary: str | None = None, ignore_proxy: bool = False) -> None:
        self.target = resolve(destination, config_file, port=port, user=user,
                              ssh_binary=ssh_binary, ignore_proxy=ignore_proxy)
        self.destination = destination
        self.config_file = config_file
        self.accept_new = accept_new
        self.ssh_binary = ssh_binary
        self.connect_timeout = self.target.connect_timeout or connect_timeout
        self.keepalive = keepalive_for(self.target)
        self.verdict = HostKeyVerdict()
        self.info = TransportInfo(kind="ssh", target=destination, notes=list(self.target.notes),
                                  dead_link_bound_s=self.keepalive.bound_s)
        self.lost_reason: str | None = None
        self._conn: asyncssh.SSHClientConnection | None = None
        self._hops: list[SSHTransport] = []
        self._proxy: ProxyCommand | None = None
        self._sftp: asyncssh.SFTPClient | None = None
        self._sftp_probe: asyncio.Task[None] | None = None
        #: The SFTP session was dropped after a stall: the next read opens a new one.
        self._sftp_dropped = False
        self._handshake: asyncssh.SSHClientConnection | None = None
        self._closing = False
        self._offered = OfferedKeys()

    @property
    def conn(self) -> asyncssh.SSHClientConnection:
        if self._conn is None:
            raise ConnectError("not connected")
        return self._conn

    async def connect(self) -> None:
        """Open the link; the SFTP probe goes on in the background (see :meth:`settled`).

        The probe is about four round trips (channel, subsystem, version, limits: 47 ms
        on loopback, 89 ms at a 20 ms RTT) that nothing needs before the agent has
        started, so it overlaps the bootstrap instead of delaying it.
        """
        t0 = time.monotonic()
        await self.open_link()
        self.info.connect_s = time.monotonic() - t0
        self._sftp_probe = asyncio.create_task(self._detect_sftp(), name="gpuws-sftp-probe")

    async def settled(self) -> None:
        """Wait for the SFTP probe; ``info.sftp`` (and its note) is final after it."""
        probe = self._sftp_probe
        if probe is not None and not probe.cancelled():
            await asyncio.shield(probe)

    async def _stop_sftp_probe(self) -> None:
        probe, self._sftp_probe = self._sftp_probe, None
        if probe is not None and not probe.done():
            probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await probe

    async def open_link(self, tunnel: asyncssh.SSHClientConnection | None = None) -> None:
        """Open the SSH connection (through its jump hosts or ProxyCommand), no SFTP yet.

        Args:
            tunnel: reach the host through this connection (a later ``ProxyJump`` hop).
        """
        if self._conn is not None or self._hops or self._proxy is not None:
            await self._stop_sftp_probe()
            await self._close_chain()  # a reconnect: drop what is left of the last link
        self._closing = False
        self.lost_reason = None
        self._handshake = None
        t = self.target
        check_host_name(t.hostname)
        try:
            if tunnel is None and t.jump_hosts:
                tunnel = await self._open_hops()
            await self._open(tunnel)
        except BaseException:
            await self._close_chain()
            raise

    async def _open_hops(self) -> asyncssh.SSHClientConnection:
        hops = self.target.jump_hosts
        previous: asyncssh.SSHClientConnection | None = None
        for i, spec in enumerate(hops):
            where = f"jump host {spec}" + (f" (hop {i + 1} of {len(hops)})" if len(hops) > 1
                                           else "")
            hop: SSHTransport | None = None
            try:
                hop = SSHTransport(spec, config_file=self.config_file,
                                   accept_new=self.accept_new, ssh_binary=self.ssh_binary,
                                   ignore_proxy=i > 0)
                self._hops.append(hop)
                await hop.open_link(previous)
            except GpuwsError as exc:
                if isinstance(exc, HostKeyError) and hop is not None:
                    for f in fields(HostKeyVerdict):  # what the TUI shows: the hop's key
                        setattr(self.verdict, f.name, getattr(hop.verdict, f.name))
                raise type(exc)(f"{where}: {exc.message}", title=exc.title,
                                remedy=exc.remedy) from exc
            for note in hop.info.notes:
                if not any(note in known for known in self.info.notes):  # named once
                    self.info.notes.append(f"{spec}: {note}")
            previous = hop.conn
        assert previous is not None
        return previous

    async def _open(self, tunnel: asyncssh.SSHClientConnection | None) -> None:
        t = self.target
        offered = await offered_keys(t)
        self._offered = offered
        opts: dict[str, Any] = {
            "port": t.port, "username": t.user, "config": [], "known_hosts": ([], [], []),
            "connect_timeout": self.connect_timeout,
            "client_factory": lambda: _Client(self),
            # Keys are chosen above, as ssh chooses them; asyncssh must not add its own.
            "client_keys": offered.keys or None, "agent_path": None,
            "keepalive_interval": self.keepalive.interval_s,
            "keepalive_count_max": self.keepalive.asyncssh_count_max,
            # An 8 MiB receive window: asyncssh's 2 MiB default made the pod wait a round
            # trip for window updates (SFTP pull 0.60x scp at 20 ms RTT; 2.35x with this).
            "window": 8 << 20,
            # AES-GCM first (AES-NI, one C call per packet), where asyncssh's default puts
            # chacha20-poly1305 first, whose Poly1305 it runs per packet through Python:
            # 256 MiB over SFTP cost ~0.8 s more CPU with it (docs/performance.md §4).
            "encryption_algs": PREFERRED_CIPHERS,
        }
        if tunnel is not None:
            opts["tunnel"] = tunnel
        elif t.proxy_command:
            self._proxy = ProxyCommand(t.proxy_command)
            try:
                opts["sock"] = await self._proxy.start()
            except OSError as exc:
                raise ConnectError(f"cannot start ProxyCommand `{t.proxy_command}`: "
                                   f"{exc.strerror or exc}", title="ProxyCommand failed",
                                   remedy="check the ProxyCommand in your ssh config") from exc
        known, _, _ = _known_keys(t)
        if known:
            # Ask for the key type we already trust, as OpenSSH does; otherwise a
            # server with several keys could present another type and look "changed".
            opts["server_host_key_algs"] = sorted({k.get_algorithm() for k in known})
        try:
            self._conn = await asyncssh.connect(t.hostname, **opts)
        except asyncssh.HostKeyNotVerifiable as exc:
            raise self._host_key_error() from exc
        # KeyImportError (a locked key file) is a ValueError, not an asyncssh.Error.
        except (TimeoutError, OSError, asyncssh.Error, asyncssh.KeyImportError) as exc:
            raise await self._connect_error(exc, tunnel is not None) from exc
        except (UnicodeError, ValueError) as exc:
            # asyncssh refuses a user or host name it cannot encode (SASLprep, IDNA).
            raise ConnectError(f"{t.user}@{t.hostname}: not a usable user/host name ({exc})",
                               title="Bad destination",
                               remedy="check the user and host you typed or configured") from exc
        finally:
            await offered.close()

    def _answered(self, conn: asyncssh.SSHClientConnection) -> None:
        self._handshake = conn

    def _lost(self, exc: Exception | None) -> None:
        """The connection ended: say why, unless gpuws closed it."""
        if self._closing or self._conn is None:
            return
        t = self.target
        where = f"{t.user}@{t.hostname}:{t.port}"
        hop_reason = next((f"jump host {h.destination}: {h.lost_reason}"
                           for h in self._hops if h.lost_reason), None)
        reason = getattr(exc, "reason", None) or (str(exc) if exc else "")
        if hop_reason:
            self.lost_reason = hop_reason
        elif "keepalive" in reason:
            k = self.keepalive
            self.lost_reason = (f"{where} stopped answering: no reply to keepalives for "
                                f"{k.bound_s:g} s (ServerAliveInterval {k.interval_s:g} x "
                                f"ServerAliveCountMax {k.count_max})")
        elif exc is None:
            self.lost_reason = f"{where} closed the connection"
        else:
            self.lost_reason = f"the connection to {where} was lost: {reason}"

    async def _connect_error(self, exc: BaseException, tunnelled: bool) -> GpuwsError:
        t = self.target
        if self._proxy is not None and not isinstance(exc, asyncssh.PermissionDenied):
            why = await self._proxy.why()
            if not self._server_version():
                return ConnectError(
                    f"ProxyCommand `{t.proxy_command}` {why}, and no SSH server answered "
                    "through it", title="ProxyCommand failed",
                    remedy="run the ProxyCommand by hand: it must connect its stdin and "
                           "stdout to the pod's SSH port")
        if tunnelled and isinstance(exc, asyncssh.ChannelOpenError):
            jump = self.target.jump_hosts[-1] if self.target.jump_hosts else "the jump host"
            return ConnectError(
                f"jump host {jump} could not reach {t.hostname}:{t.port}: {exc.reason}",
                title="Jump host cannot reach the pod",
                remedy="HostName and Port are resolved and reached from the jump host: "
                       "check them there")
        if isinstance(exc, asyncssh.PermissionDenied):
            tried = ", ".join(t.identity_files) or "no IdentityFile"
            o = self._offered
            agent = f"; {o.from_agent} key(s) from ssh-agent" if o.from_agent else ""
            skipped = f"; not usable: {', '.join(o.skipped)}" if o.skipped else ""
            return AuthError(f"{t.user}@{t.hostname}:{t.port} refused our keys "
                             f"({tried}{agent}{skipped})",
                             remedy="check User and IdentityFile, that the public key is in "
                                    "the pod's authorized_keys, and add a key with a "
                                    "passphrase to ssh-agent (ssh-add)")
        return map_error(exc, t, answered=self._handshake is not None and not tunnelled,
                         server_version=self._server_version(),
                         timeout=self.connect_timeout)

    def _server_version(self) -> str | None:
        conn = self._handshake
        return None if conn is None else conn.get_extra_info("server_version")

    def _host_key_error(self) -> HostKeyError:
        t, v = self.target, self.verdict
        where = f"{t.hostname}:{t.port}"
        if v.status == "changed":
            return HostKeyError(
                f"the host key of {where} has CHANGED (now {v.key_type} {v.fingerprint}); "
                "this could be an attack, or the pod was replaced",
                title="Host key changed",
                remedy=f"if the pod was replaced, remove the old key: "
                       f"ssh-keygen -R '{t.known_hosts_name}' -f {v.known_hosts}")
        if v.status == "revoked":
            return HostKeyError(f"the host key of {where} ({v.fingerprint}) is revoked",
                                title="Host key revoked")
        return HostKeyError(
            f"{where} is not in known_hosts; its {v.key_type} key fingerprint is {v.fingerprint}",
            title="Unknown host key",
            remedy="check the fingerprint with your provider, then connect again with "
                   "--accept-new to record it")

    async def _detect_sftp(self) -> None:
        conn = self._conn
        if conn is None:
            return
        try:
            self._sftp = await conn.start_sftp_client()
            self.info.sftp = True
        except (asyncssh.Error, OSError):
            self._sftp = None
            self.info.sftp = False
            if not conn.is_closed():  # a link that died meanwhile says nothing about SFTP
                self.info.notes.append("no SFTP subsystem: files move through the exec "
                                       "channel")

    async def start(self, argv: Sequence[str]) -> RemoteProcess:
        try:
            proc = await self.conn.create_process(shell_command(argv), encoding=None)
        except (OSError, asyncssh.Error) as exc:
            raise map_error(exc, self.target) from exc
        return SSHProcess(proc, self)

    async def read_file(self, path: str, offset: int, agent_argv: Sequence[str],
                        chunk: int = 1 << 20, *, stall_s: float = TRANSFER_STALL_S
                        ) -> AsyncIterator[bytes]:
        await self.settled()
        sftp = await self._usable_sftp(stall_s, path)
        if sftp is not None:
            reads = _read_ahead(sftp, path, offset, chunk, stall_s)
            try:
                async for data in reads:
                    yield data
                return
            except TransferError as exc:
                if exc.title == "Transfer stalled":
                    # sftp-server serves one request at a time: one that never answers
                    # (an open blocked on a FIFO swapped in after the check) blocks every
                    # later one, so this session is dropped and the next read opens a new.
                    self._drop_sftp(sftp)
                raise
            except (OSError, asyncssh.Error) as exc:
                raise TransferError(f"reading {path} over SFTP failed: {exc}") from exc
            finally:
                # A reader that stops early (a pull at its announced size) closes this
                # generator; the reads' own must close now, while the link is up, not when
                # the loop finalises it after the link closed ("Task exception was never
                # retrieved: SFTPConnectionLost" on stderr).
                with contextlib.suppress(OSError, asyncssh.Error, TransferError):
                    await within_stall(reads.aclose(), stall_s, path)
        # No SFTP: the agent streams the file on an exec channel of its own, opened with a
        # wider window than the connection's default: with 2 MiB the pod waited for our
        # window updates, a round trip each (41 MB/s at a 20 ms RTT; 112 with 8 MiB). The
        # agent's ``cat`` opens only regular files inside its run directories, without
        # following a link or blocking (remote_agent/safefiles.py).
        try:
            channel = await within_stall(self.conn.create_process(
                shell_command([*agent_argv, "cat", path, str(offset)]), encoding=None,
                window=TRANSFER_WINDOW), stall_s, path)
        except (OSError, asyncssh.Error) as exc:
            raise map_error(exc, self.target) from exc
        proc = SSHProcess(channel, self)
        try:
            while True:
                raw = await within_stall(proc.stdout.read(chunk), stall_s, path)
                if not raw:
                    break
                yield bytes(raw)  # encoding=None: the channel carries bytes
            if proc.broken is not None:
                raise TransferError(f"reading {path}: the link to the pod broke "
                                    f"({self.lost_reason or proc.broken})",
                                    remedy="pull again; the transfer resumes")
            # stderr before wait(): asyncssh's wait() collects (and so consumes) it.
            err = (await within_stall(proc.stderr.read(1 << 16), stall_s, path)
                   ).decode("utf-8", "replace").strip()
            status = await within_stall(proc.wait(), stall_s, path)
            if status not in (0, None):
                why = visible(err, 300) or f"exit {status}"
                raise TransferError(f"reading {path} failed: {why}",
                                    title="Artifact refused" if "regular file" in err
                                    else TransferError.title)
        finally:
            proc.close()

    async def _usable_sftp(self, stall_s: float, path: str) -> asyncssh.SFTPClient | None:
        """The SFTP session, a new one if the last was dropped after a stall, or ``None``
        where the server has no SFTP."""
        if self._sftp is None and self._sftp_dropped and self._conn is not None:
            try:
                self._sftp = await within_stall(self._conn.start_sftp_client(), stall_s, path)
            except (OSError, asyncssh.Error) as exc:
                raise TransferError(f"reading {path}: a new SFTP session failed: {exc}",
                                    remedy="pull again") from exc
            self._sftp_dropped = False
        return self._sftp

    def _drop_sftp(self, sftp: asyncssh.SFTPClient) -> None:
        if self._sftp is sftp:
            self._sftp = None
            self._sftp_dropped = True
        sftp.exit()

    async def close(self) -> None:
        self._closing = True
        await self._stop_sftp_probe()
        if self._sftp is not None:
            self._sftp.exit()
            self._sftp = None
        await self._close_chain()

    async def _close_chain(self) -> None:
        """Close the connection, then its hops (last first) and its ProxyCommand."""
        self._closing = True
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
            try:
                await asyncio.wait_for(conn.wait_closed(), 5)
            except (TimeoutError, OSError, asyncssh.Error):
                pass
        for hop in reversed(self._hops):
            await hop.close()
        self._hops = []
        if self._proxy is not None:
            await self._proxy.close()
            self._proxy = None


#: Ciphers offered, in order: OpenSSH's own set (the server picks the first it shares).
PREFERRED_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com",
                     "chacha20-poly1305@openssh.com", "aes128-ctr", "aes192-ctr", "aes256-ctr")
#: Bytes of SFTP reads kept in flight. One read at a time left the link idle for a round
#: trip per chunk (30 MB/s at a 20 ms RTT where scp made 56); several in flight fill the
#: SSH channel's window instead.
READ_AHEAD = 8 << 20
#: Receive window of the exec channel that carries a file when there is no SFTP.
TRANSFER_WINDOW = 8 << 20


async def _read_ahead(sftp: asyncssh.SFTPClient, path: str, offset: int,
                      chunk: int, stall_s: float) -> AsyncGenerator[bytes, None]:
    """The file's bytes from ``offset`` in order, with ``READ_AHEAD`` bytes of reads in flight.

    Each read is one SFTP request (``block_size=0``: no asyncssh helper tasks behind it,
    so cancelling one, or losing the link, leaves nothing unawaited), at most the
    server's largest read and ``chunk``. Reads are issued up to the size the file had
    when opened; a short answer is completed before anything after it, and whatever the
    file holds beyond that size is then read one request at a time to its end, as a
    plain sequential reader would.

    Only a regular file is read: the path is ``lstat``-ed first (a FIFO, device or link
    is refused before any open: sftp-server would block for ever opening a FIFO, and
    read ``/dev/zero`` without end), and what was opened is ``fstat``-ed again (a file
    swapped for a link to a device after the check). Every wait is bounded by ``stall_s``.
    """
    attrs = await within_stall(sftp.lstat(path), stall_s, path)
    _check_regular(attrs, path)
    step = max(1, min(chunk, sftp.limits.max_read_len or (32 << 10)))
    depth = max(2, READ_AHEAD // step)
    f = await within_stall(sftp.open(path, "rb", block_size=0), stall_s, path)
    try:
        opened = await within_stall(f.stat(), stall_s, path)
        _check_regular(opened, path)
        size = opened.size or 0
        pending: deque[tuple[asyncio.Task[bytes], int]] = deque()
        pos = done = offset
        try:
            while True:
                while len(pending) < depth and pos < size:
                    n = min(step, size - pos)
                    pending.append((asyncio.ensure_future(f.read(n, pos)), n))
                    pos += n
                if not pending:
                    break
                task, want = pending.popleft()
                data: bytes = await within_stall(task, stall_s, path)
                while data:
                    done += len(data)
                    yield data
                    want -= len(data)
                    # The server may answer with less than asked: fetch the rest first.
                    data = await within_stall(f.read(want, done), stall_s, path) if want else b""
                if want:
                    break  # the file ended early (it shrank): stop reading ahead
            while True:
                data = await within_stall(f.read(step, done), stall_s, path)
                if not data:
                    return
                done += len(data)
                yield data
        finally:
            for task, _ in pending:
                task.cancel()
            await asyncio.gather(*(task for task, _ in pending), return_exceptions=True)
    finally:
        with contextlib.suppress(OSError, asyncssh.Error, TransferError):
            await within_stall(f.close(), stall_s, path)


def _check_regular(attrs: asyncssh.SFTPAttrs, path: str) -> None:
    """Refuse anything an SFTP stat says is not a regular file."""
    mode = attrs.permissions
    if mode is not None and stat.S_IFMT(mode):
        regular = stat.S_ISREG(mode)
    else:
        regular = attrs.type == asyncssh.FILEXFER_TYPE_REGULAR
    if not regular:
        what = kind_of(mode) if mode is not None and stat.S_IFMT(mode) else "not a regular file"
        raise TransferError(f"{path} on the pod is {what}, not a regular file; refused, "
                            "nothing was read", title="Artifact refused",
                            remedy="the workload left something other than a file in its "
                                   "artifacts; only regular files are pulled")


def check_host_name(name: str) -> None:
    """Refuse a host name no resolver would take, with one clear line (not a traceback)."""
    bad = not name or any(ord(c) < 32 or c in "\u202a\u202b\u202c\u202d\u202e\u2066\u2067"
                                              "\u2068\u2069\x7f" for c in name)
    if not bad and not name.startswith("["):
        try:
            labels = name.encode("idna").split(b".")
        except UnicodeError:
            bad = True
        else:
            bad = any(len(label) > 63 for label in labels) or b"" in labels[:-1] or \
                name in (".", "..")
    if bad:
        raise ConnectError(f"{name!r} is not a valid host name", title="Unknown host",
                           remedy="use an ssh alias or user@host[:port]")


def map_error(exc: BaseException, t: SSHTarget, *, answered: bool = False,
              server_version: str | None = None, timeout: float | None = None) -> GpuwsError:
    """One clear line for each way an SSH connection fails.

    Args:
        answered: the TCP connection was made (something listens on that port).
        server_version: the SSH version line the server sent, if any.
        timeout: the connect timeout that ran out, for the message.
    """
    where = f"{t.user}@{t.hostname}:{t.port}"
    port = f"{t.hostname}:{t.port}"
    if isinstance(exc, socket.gaierror):
        return ConnectError(f"cannot resolve host {t.hostname!r} ({exc.strerror})",
                            title="Unknown host",
                            remedy="check the name, or the HostName in your ssh config")
    if isinstance(exc, ConnectionRefusedError):
        return ConnectError(f"connection to {port} refused",
                            title="Connection refused",
                            remedy="is sshd running there, and is the port right (-p / Port)?")
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        within = f" within {timeout:g} s" if timeout else ""
        if server_version:
            return ConnectError(f"{port} ({server_version}) did not finish the SSH login"
                                f"{within}", title="SSH login timed out",
                                remedy="the pod may be overloaded; try again, or raise "
                                       "ConnectTimeout in your ssh config")
        if answered:
            return ConnectError(f"{port} accepted the connection but sent no SSH banner"
                                f"{within}", title="No SSH banner",
                                remedy="check the port (-p / Port) is the pod's SSH port; an "
                                       "overloaded sshd (MaxStartups) also looks like this")
        return ConnectError(f"no answer from {port}{within}", title="Connection timed out",
                            remedy="check the address, firewall and that the pod is running")
    if isinstance(exc, asyncssh.PermissionDenied):
        keys = ", ".join(t.identity_files) or "ssh-agent and ~/.ssh/id_*"
        return AuthError(f"{where} refused our keys ({keys})",
                         remedy="check User and IdentityFile, and that the public key is in "
                                "the pod's authorized_keys")
    if isinstance(exc, asyncssh.KeyImportError):
        return AuthError(f"cannot load a private key: {exc}",
                         remedy="if it has a passphrase, add it to ssh-agent with ssh-add")
    if isinstance(exc, asyncssh.ChannelOpenError):
        return ConnectError(f"{where} refused to open a session channel: {exc.reason}",
                            title="Channel refused",
                            remedy="the server may allow only an interactive shell (PTY)")
    if answered and not server_version and isinstance(
            exc, (asyncssh.ConnectionLost, asyncssh.ProtocolError,
                  asyncssh.ProtocolNotSupported, ConnectionResetError)):
        return ConnectError(f"{port} answered but is not an SSH server (no SSH version line; "
                            f"{getattr(exc, 'reason', None) or exc})",
                            title="Not an SSH server",
                            remedy="check the port (-p / Port): it reaches another service")
    if isinstance(exc, asyncssh.Error):
        return ConnectError(f"{where}: {exc.reason}", title="SSH error")
    if isinstance(exc, OSError):
        return ConnectError(f"{where}: {exc.strerror or exc}", title="Network error")
    return ConnectError(f"{where}: {exc}")
