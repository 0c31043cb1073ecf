"""The connection to one pod, step by step, and what the TUI asks of it (no Textual here).

:func:`open_link` does what ``AgentClient.connect`` does, one visible step at a time
(resolve, connect, host key, deploy, probe), reporting each with its timing, then opens
the session in the store. Every failure is a :class:`~gpuws.errors.GpuwsError` with a
cause and a remedy; an unknown host key is :class:`UnknownHostKey`, which carries the
fingerprint so the person can be asked.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .. import protocol
from ..client import AgentClient
from ..config import load_config
from ..deploy import start_agent
from ..errors import GpuwsError, HostKeyError
from ..sessions.artifacts import Progress, PullResult, pull_run
from ..sessions.cost import resolve_budget, resolve_rate
from ..sessions.store import Store
from ..transport import Transport, make_transport
from . import fmt
from .storeio import StoreHandle

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
    """

    host: str
    ssh_config: str | None = None
    port: int | None = None
    user: str | None = None
    python: str = "python3"
    rate: float | None = None
    accept_new: bool = False
    pty: bool | None = None

    def accepting_new_key(self) -> Target:
        """The same target, allowed to record an unknown host key."""
        return dataclasses.replace(self, accept_new=True)


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
        """``ssh+sftp``, ``ssh`` or ``local``."""
        info = self.client.transport.info
        return info.kind + ("+sftp" if info.sftp else "")


async def open_link(target: Target, store: StoreHandle, on_step: OnStep,
                    clock: Callable[[], float] = time.monotonic) -> Link:
    """Connect, deploy, probe and open a session, reporting each step.

    Raises:
        UnknownHostKey: the host key is unknown (ask, then retry with ``accept_new``).
        GpuwsError: any other failure, with its remedy; nothing is left open.
    """
    started_wall = time.time()
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
               else f"sent {fmt.size(result.transferred)}")
        on_step("deploy", "ok", clock() - t0,
                f"agent {result.sha256[:12]} {how} · python {result.hello.python or '?'}")
        t0 = clock()
        on_step("probe", "running", None, "")
        try:
            probe = await client.probe()
        except GpuwsError as exc:
            on_step("probe", "failed", clock() - t0, exc.title)
            raise
        on_step("probe", "ok", clock() - t0, probe_summary(probe))
        return await _open_session(target, client, probe, store, started_wall)
    except BaseException:
        if client is not None:
            await client.close()
        else:
            await transport.close()
        raise


async def _resolve(target: Target, on_step: OnStep, clock: Callable[[], float]) -> Transport:
    t0 = clock()
    on_step("resolve", "running", None, "")
    try:
        transport = make_transport(target.host, config_file=target.ssh_config, port=target.port,
                                   user=target.user, accept_new=target.accept_new,
                                   pty=target.pty)
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
    from ..transport.ssh import SSHTransport, map_error  # asyncssh: only for remote pods

    assert isinstance(transport, SSHTransport)
    t = transport.target
    where = f"{t.user}@{t.hostname}:{t.port}"
    if t.proxy_jump:
        return f"{where} via {t.proxy_jump}"  # the jump host resolves the name
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(t.hostname, t.port)
    except OSError as exc:
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
            "local subprocess" if info.kind == "local"
            else "SFTP available" if info.sftp else "no SFTP: files move over exec")
    verdict = getattr(transport, "verdict", None)
    if verdict is None:
        on_step("host key", "skipped", None, "no SSH on this machine")
    else:
        note = "recorded in " + verdict.known_hosts if verdict.status == "accepted" else "known"
        on_step("host key", "ok", None, f"{verdict.key_type} {verdict.fingerprint} · {note}")


async def _open_session(target: Target, client: AgentClient, probe: protocol.Probe,
                        store: StoreHandle, started_wall: float) -> Link:
    cfg = load_config()
    rate = resolve_rate(target.rate, target.host, cfg)
    budget = resolve_budget(None, target.host, cfg)
    kind = client.transport.info.kind + ("+sftp" if client.transport.info.sftp else "")

    def record(s: Store) -> str:
        sid = s.open_session(target.host, kind, probe, rate, budget, started=started_wall)
        s.add_phase(sid, None, "connect", started_wall, time.time())
        return sid

    session_id = await store.call(record)
    return Link(target, client, probe, session_id, rate, budget)


def probe_summary(probe: protocol.Probe) -> str:
    """One line: the GPUs, driver and CUDA, or why there is no GPU."""
    if not probe.gpus:
        return f"no GPU: {probe.gpu_error or 'none found'}"
    names: dict[str, int] = {}
    for gpu in probe.gpus:
        names[gpu.name] = names.get(gpu.name, 0) + 1
    gpus = ", ".join(f"{n}× {name}" if n > 1 else name for name, n in names.items())
    return f"{gpus} · driver {probe.driver or '?'} · CUDA {probe.cuda_driver or '?'}"


async def pull_artifacts(link: Link, store: StoreHandle, run_id: str,
                         progress: Progress) -> list[PullResult]:
    """Pull a run's artifacts home (resumable, verified by sha256).

    ``sessions.artifacts`` works with a store on the calling thread, so the pull gets
    its own short-lived connection to the same database file (SQLite serialises the
    writers); everything else keeps using the store's own thread.
    """
    with Store(store.path) as local:
        return await pull_run(link.client, local, link.session_id, run_id, progress)


async def close_link(link: Link, store: StoreHandle) -> None:
    """End the session (its cost stops here) and close the connection; runs go on."""
    try:
        await store.call(lambda s: s.end_session(link.session_id))
    finally:
        await link.client.close()
