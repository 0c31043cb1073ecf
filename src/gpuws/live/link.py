"""The connection to one pod, step by step (no Textual here).

:func:`dial` does what ``AgentClient.connect`` does, one visible step at a time
(resolve, connect, host key, deploy, probe), reporting each with its timing. The engine
(:mod:`gpuws.live.engine`) opens the session and keeps the link. Every failure is a
:class:`~gpuws.errors.GpuwsError` with a cause and a remedy; an unknown host key is
:class:`UnknownHostKey`, which carries the fingerprint so the person can be asked.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .. import protocol
from ..client import AgentClient
from ..deploy import start_agent
from ..errors import GpuwsError, HostKeyError
from ..text.textsafe import visible
from ..transport import Transport, make_transport

#: The steps of a connection, in order.
STEPS = ("resolve", "connect", "host key", "deploy", "probe")
#: step, state (``running``/``ok``/``failed``/``skipped``), seconds (or None), detail.
OnStep = Callable[[str, str, float | None, str], None]


@dataclass(frozen=True)
class Target:
    """Where to connect and how, as given on the command line or typed on Home.

    Attributes:
        host: an ssh alias, ``user@host[:port]``, or ``local``.
        ssh_config: ``-F FILE``.
        port: ``-p PORT``.
        user: ``-l USER``.
        python: the pod's python.
        rate: the pod's price in USD per hour (else the config's).
        accept_new: record an unknown host key.
        pty: reach the pod through a terminal only (``--pty``); ``None`` detects it.
        persist: use (or leave) a kept connection when the host's config sets ``persist``;
            False for ``--no-persist``.
    """

    host: str
    ssh_config: str | None = None
    port: int | None = None
    user: str | None = None
    python: str = "python3"
    rate: float | None = None
    accept_new: bool = False
    pty: bool | None = None
    persist: bool = True

    def accepting_new_key(self) -> Target:
        """The same target, allowed to record an unknown host key."""
        return dataclasses.replace(self, accept_new=True)

    def command(self, verb: str, *args: str) -> str:
        """``gpuws VERB HOST ARGS`` with this target's ``-F``/``-p``/``-l``, shell-quoted:
        a hint a person can paste (``gpuws attach pod RUN`` without the ``-F`` it was
        reached with fails to resolve the host)."""
        words = ["gpuws", verb]
        if self.ssh_config:
            words += ["-F", self.ssh_config]
        if self.port:
            words += ["-p", str(self.port)]
        if self.user:
            words += ["-l", self.user]
        return shlex.join([*words, self.host, *args])


class UnknownHostKey(HostKeyError):
    """The pod's host key is in no known_hosts file; the person must decide."""

    def __init__(self, error: HostKeyError, *, fingerprint: str, key_type: str,
                 known_hosts: str) -> None:
        super().__init__(error.message, error.title, error.remedy)
        self.fingerprint = fingerprint
        self.key_type = key_type
        self.known_hosts = known_hosts


@dataclass
class Link:
    """A connected pod: the agent client, its probe, and the session it records into."""

    target: Target
    client: AgentClient
    probe: protocol.Probe
    session_id: str
    rate: float | None
    budget: float | None
    #: Runs whose events this client already receives (no attach needed).
    following: set[str] = field(default_factory=set)

    @property
    def transport_label(self) -> str:
        """``ssh+sftp``, ``ssh``, ``pty`` or ``local``."""
        return transport_label(self.client)


def transport_label(client: AgentClient) -> str:
    """How the pod is reached, as sessions record it (``ssh+sftp``, ``ssh``, ``local``)."""
    info = client.transport.info
    return info.kind + ("+sftp" if info.sftp else "")


def _no_step(step: str, state: str, seconds: float | None, detail: str) -> None:
    """Headless callers need no step-by-step report."""


async def dial(target: Target, on_step: OnStep = _no_step,
               clock: Callable[[], float] = time.monotonic) -> tuple[AgentClient,
                                                                      protocol.Probe]:
    """Connect, deploy and probe, reporting each step; no session is opened here.

    A kept connection's master that goes away while this runs (killed, its link lost) is
    said in one line and the whole dial is made once more (a new master).

    Raises:
        UnknownHostKey: the host key is unknown (ask, then retry with ``accept_new``).
        GpuwsError: any other failure, with its remedy; nothing is left open.
    """
    try:
        return await _dial(target, on_step, clock)
    except _MasterGone as gone:
        gone.say(f"{gone.reason}; connecting again")
        return await _dial(target, on_step, clock)


class _MasterGone(Exception):
    def __init__(self, reason: str, say: Callable[[str], None]) -> None:
        super().__init__(reason)
        self.reason = reason
        self.say = say


async def _dial(target: Target, on_step: OnStep,
                clock: Callable[[], float]) -> tuple[AgentClient, protocol.Probe]:
    transport = await _resolve(target, on_step, clock)
    client: AgentClient | None = None
    try:
        await _connect(transport, on_step, clock)
        t0 = clock()
        on_step("deploy", "running", None, "")
        try:
            proc, result, rest = await start_agent(transport, python=target.python)
        except GpuwsError as exc:
            on_step("deploy", "failed", clock() - t0, exc.title)
            raise
        client = AgentClient(transport, proc, result, rest, target.python)
        how = ("cached on the pod" if result.cache_state == "cached"
               else f"sent {result.transferred / 1024:.1f} KiB")
        on_step("deploy", "ok", clock() - t0,
                f"agent {result.sha256[:12]} {how} · python {result.hello.python or '?'} · "
                f"{transport_label(client)}")
        t0 = clock()
        on_step("probe", "running", None, "")
        try:
            probe = await client.probe()
        except GpuwsError as exc:
            on_step("probe", "failed", clock() - t0, exc.title)
            raise
        on_step("probe", "ok", clock() - t0, probe_summary(probe))
        return client, probe
    except BaseException as exc:
        if client is not None:
            await client.close()
        else:
            await transport.close()
        if isinstance(exc, GpuwsError) and transport.info.kind != "local":
            from ..transport.persist.client import PersistTransport, went_away

            reason = went_away(transport)
            if reason is not None and isinstance(transport, PersistTransport):
                raise _MasterGone(reason, transport.say) from exc
        raise


async def _resolve(target: Target, on_step: OnStep, clock: Callable[[], float]) -> Transport:
    t0 = clock()
    on_step("resolve", "running", None, "")
    try:
        from ..transport.persist import idle_for

        transport = make_transport(target.host, config_file=target.ssh_config, port=target.port,
                                   user=target.user, accept_new=target.accept_new,
                                   pty=target.pty,
                                   persist_s=idle_for(target.host, enabled=target.persist))
        if transport.info.kind == "local":
            detail = "this machine: the agent runs as a local subprocess"
        else:
            detail = await _resolve_ssh(transport)
    except GpuwsError as exc:
        on_step("resolve", "failed", clock() - t0, exc.title)
        raise
    on_step("resolve", "ok", clock() - t0, detail)
    return transport


async def _resolve_ssh(transport: Transport) -> str:
    from ..transport.persist.client import PersistTransport

    if isinstance(transport, PersistTransport):
        t = transport.target  # resolved the same way, without importing asyncssh
    else:
        from ..transport.ssh import SSHTransport  # asyncssh: only for remote pods

        assert isinstance(transport, SSHTransport)
        t = transport.target
    where = f"{t.user}@{t.hostname}:{t.port}"
    if t.proxy_jump:
        return f"{where} via {t.proxy_jump}"  # the jump host resolves the name
    if t.proxy_command:
        # The command reaches the pod its own way; the name may not resolve here at all.
        return f"{where} via ProxyCommand"
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(t.hostname, t.port)
    except OSError as exc:
        from ..transport.ssh import map_error

        raise map_error(exc, t) from exc
    addr = str(infos[0][4][0]) if infos else t.hostname
    return where if addr == t.hostname else f"{where} ({addr})"


async def _connect(transport: Transport, on_step: OnStep, clock: Callable[[], float]) -> None:
    t0 = clock()
    on_step("connect", "running", None, "")
    try:
        await transport.connect()
    except HostKeyError as exc:
        on_step("connect", "ok", clock() - t0, "the pod answered")
        verdict = getattr(transport, "verdict", None)
        detail = f"{verdict.key_type} {verdict.fingerprint}" if verdict else exc.title
        on_step("host key", "failed", None, detail)
        if verdict is not None and verdict.status == "unknown":
            raise UnknownHostKey(exc, fingerprint=verdict.fingerprint,
                                 key_type=verdict.key_type,
                                 known_hosts=verdict.known_hosts) from exc
        raise
    except GpuwsError as exc:
        on_step("connect", "failed", clock() - t0, exc.title)
        raise
    info = transport.info
    on_step("connect", "ok", clock() - t0,
            # SFTP is probed while the agent starts: the deploy step says what was found.
            "local subprocess" if info.kind == "local" else "SSH link up")
    verdict = getattr(transport, "verdict", None)
    if verdict is None:
        on_step("host key", "skipped", None, "no SSH on this machine")
    else:
        note = "recorded in " + verdict.known_hosts if verdict.status == "accepted" else "known"
        on_step("host key", "ok", None, f"{verdict.key_type} {verdict.fingerprint} · {note}")


def probe_summary(probe: protocol.Probe) -> str:
    """One line: the GPUs, driver and CUDA, or why there is no GPU; then the workloads'
    Python when it is not simply the login PATH's python3 (found, named, or a fallback
    without CuPy and torch)."""
    py = probe.python_choice
    python = "" if py is None or py.how == "login" else (
        f" · python {visible(py.path, 160)} ({visible(py.how, 20)})")
    if not probe.gpus:
        return f"no GPU: {probe.gpu_error or 'none found'}{python}"
    names: dict[str, int] = {}
    for gpu in probe.gpus:
        names[gpu.name] = names.get(gpu.name, 0) + 1
    gpus = ", ".join(f"{n}× {name}" if n > 1 else name for name, n in names.items())
    return f"{gpus} · driver {probe.driver or '?'} · CUDA {probe.cuda_driver or '?'}{python}"
