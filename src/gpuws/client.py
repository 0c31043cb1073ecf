"""The laptop's side of the agent link: requests out, events in, over any transport."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TypeVar

from . import protocol
from .deploy import DeployResult, agent_argv, build_bundle, start_agent
from .errors import AgentError, ConnectError, ProtocolError
from .framing import read_event_batches
from .live.boundary import AnswerT, check_answer
from .transport.base import ByteReader, RemoteProcess, Transport

T = TypeVar("T")
#: Bad lines kept as samples per link.
MAX_BAD_SAMPLES = 100
Listener = Callable[[protocol.Events | protocol.BadLine], None]
#: Told how many bytes of the wire the reader just handed to the listeners; the reader
#: reads no more until it returns (backpressure: :meth:`gpuws.live.feed.EventFeed.room`).
Pace = Callable[[int], Awaitable[None]]


class _CountingReader:
    """The agent's stdout, counting the bytes read (what each chunk of events cost)."""

    def __init__(self, reader: ByteReader) -> None:
        self.reader = reader
        self.count = 0

    async def read(self, n: int = -1) -> bytes:
        chunk = await self.reader.read(n)
        self.count += len(chunk)
        return chunk


class AgentClient:
    """One running agent (``serve``) on one pod.

    Answers to requests are matched by ``req``; everything else (run events, telemetry,
    logs, bad lines) goes to the listeners in arrival order.
    """

    def __init__(self, transport: Transport, proc: RemoteProcess, deploy: DeployResult,
                 initial: bytes, python: str) -> None:
        self.transport = transport
        self.proc = proc
        self.deploy = deploy
        self.hello = deploy.hello
        self.python = python
        #: The first bad lines (samples; the engine's boundary counts and reports them all).
        self.bad_lines: list[protocol.BadLine] = []
        #: Every bad line seen on this link.
        self.bad_line_count = 0
        self.stderr_tail: deque[str] = deque(maxlen=50)
        self._listeners: list[Listener] = []
        #: Set by whoever stores the events (the engine): awaited after each chunk.
        self.pace: Pace | None = None
        self._pending: dict[int, asyncio.Future[protocol.Events]] = {}
        self._ids = itertools.count(1)
        self._closed = asyncio.Event()
        self._reader = asyncio.create_task(self._read(initial))
        self._err_reader = asyncio.create_task(self._read_stderr())

    @classmethod
    async def connect(cls, transport: Transport, *, python: str = "python3") -> AgentClient:
        """Connect the transport, deploy and start the agent, wait for its Hello."""
        await transport.connect()
        proc, result, rest = await start_agent(transport, python=python)
        return cls(transport, proc, result, rest, python)

    # -- events
    # The list is replaced, never mutated, so dispatch can iterate it without a copy
    # per event and a listener may still add or remove listeners while called.
    def add_listener(self, fn: Listener) -> None:
        self._listeners = [*self._listeners, fn]

    def remove_listener(self, fn: Listener) -> None:
        listeners = list(self._listeners)
        with contextlib.suppress(ValueError):
            listeners.remove(fn)
        self._listeners = listeners

    async def _read(self, initial: bytes) -> None:
        try:
            # A chunk at a time: replaying a long run is hundreds of thousands of events,
            # and per-event async iteration was most of the laptop's cost.
            stdout = _CountingReader(self.proc.stdout)
            handed = -len(initial)  # what came with the Hello counts for the first chunk
            async for batch in read_event_batches(stdout, initial):
                for ev in batch:
                    if isinstance(ev, protocol.BadLine):
                        # Samples only: keeping every one grew without bound under a flood.
                        self.bad_line_count += 1
                        if len(self.bad_lines) < MAX_BAD_SAMPLES:
                            self.bad_lines.append(ev)
                    elif (ev.req is not None and ev.req in self._pending
                            and ev.run_id is None):
                        fut = self._pending.pop(ev.req)
                        if not fut.done():
                            fut.set_result(ev)
                        continue
                    for fn in self._listeners:
                        fn(ev)
                if self.pace is not None:
                    # Not one byte more is read while the store is behind: the pod keeps
                    # the rest in its events.ndjson, and the SSH window holds it back.
                    await self.pace(max(0, stdout.count - handed))
                handed = stdout.count
        finally:
            self._closed.set()
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(ConnectError(
                        "the link to the agent closed" + self._stderr_hint(),
                        title="Connection lost",
                        remedy="reconnect; runs on the pod go on and can be re-attached"))
            self._pending.clear()

    async def _read_stderr(self) -> None:
        with contextlib.suppress(Exception):
            while True:
                chunk = await self.proc.stderr.read(65536)
                if not chunk:
                    return
                for line in chunk.decode("utf-8", "replace").splitlines():
                    self.stderr_tail.append(line)

    def _stderr_hint(self) -> str:
        return f" (agent said: {self.stderr_tail[-1]})" if self.stderr_tail else ""

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    async def wait_closed(self) -> None:
        await self._closed.wait()

    # -- requests
    async def request(self, msg: protocol.Request, timeout: float | None = 60.0) -> protocol.Events:
        """Send a request and wait for its answer; an Error answer raises AgentError."""
        return await self.submit(msg, timeout)

    def submit(self, msg: protocol.Request,
               timeout: float | None = 60.0) -> asyncio.Task[protocol.Events]:
        """Write a request now; the task returned waits for its answer (an Error answer
        raises AgentError). Requests submitted one after another reach the agent in that
        order without waiting for each other's answers: a pipeline, one round trip for
        all of them.
        """
        if self.closed:
            raise ConnectError("the link to the agent is closed", title="Connection lost",
                               remedy="reconnect")
        fut: asyncio.Future[protocol.Events] = asyncio.get_running_loop().create_future()
        self._pending[msg.req] = fut
        self.proc.stdin.write(protocol.encode(msg))
        return asyncio.create_task(self._answer_to(msg, fut, timeout))

    async def _answer_to(self, msg: protocol.Request, fut: asyncio.Future[protocol.Events],
                         timeout: float | None) -> protocol.Events:
        try:
            await self.proc.stdin.drain()
            ev = await asyncio.wait_for(fut, timeout)
        except TimeoutError as exc:
            raise ProtocolError(f"no answer to {msg.__class__.__name__} within {timeout} s",
                                remedy="the pod may be overloaded; try again") from exc
        finally:
            self._pending.pop(msg.req, None)
        if isinstance(ev, protocol.Error):
            # Checked at the boundary like every other answer (issue 31): its texts are
            # the pod's, and whoever prints them must get them bounded.
            ev = check_answer(ev)
            raise AgentError(ev.message, ev.title, ev.remedy, code=ev.code)
        return ev

    def next_req(self) -> int:
        return next(self._ids)

    async def ping(self) -> float:
        t0 = time.monotonic()
        await self.request(protocol.Ping(req=self.next_req()))
        return time.monotonic() - t0

    async def probe(self) -> protocol.Probe:
        ev = await self.request(protocol.ProbeReq(req=self.next_req()), timeout=120)
        return _answer(ev, protocol.ProbeResult).probe

    async def start_run(self, spec: protocol.RunSpec,
                        run_id: str | None = None) -> protocol.RunInfo:
        ev = await self.request(protocol.StartRun(req=self.next_req(), spec=spec, run_id=run_id))
        return _first_run(ev)

    async def attach(self, run_id: str, from_seq: int = 0, follow: bool = True) -> protocol.RunInfo:
        ev = await self.request(protocol.Attach(req=self.next_req(), run_id=run_id,
                                                from_seq=from_seq, follow=follow))
        return _first_run(ev)

    async def cancel(self, run_id: str) -> protocol.RunInfo:
        ev = await self.request(protocol.Cancel(req=self.next_req(), run_id=run_id), timeout=30)
        return _first_run(ev)

    async def list_runs(self) -> list[protocol.RunInfo]:
        ev = await self.request(protocol.ListRuns(req=self.next_req()))
        return _answer(ev, protocol.RunList).runs

    async def telemetry(self, interval_s: float) -> None:
        await self.request(protocol.TelemetryReq(req=self.next_req(), interval_s=interval_s))

    async def ncu_plan(self, install: bool = False) -> protocol.NcuPlan:
        ev = await self.request(protocol.NcuPlanReq(req=self.next_req(), install=install),
                                timeout=None if install else 120)
        return _answer(ev, protocol.NcuPlan)

    async def nsys_plan(self, install: bool = False) -> protocol.NsysPlan:
        """Which nsys works on the pod, or how one would be installed.

        With ``install`` the pod runs its plan (only after the person confirmed it),
        streaming each step as a ``log`` event, then verifies the nsys with a smoke
        profile; no time limit, as an apt install takes what it takes.
        """
        ev = await self.request(protocol.NsysPlanReq(req=self.next_req(), install=install),
                                timeout=None if install else 120)
        return _answer(ev, protocol.NsysPlan)

    async def lease(self, idle_s: float | None = None, stop_argv: list[str] | None = None,
                    stop_running: bool = False, release: bool = False
                    ) -> protocol.LeaseStatus:
        """Arm, release or read the pod's lease (``remote_agent/lease.py``)."""
        ev = await self.request(protocol.LeaseReq(req=self.next_req(), idle_s=idle_s,
                                                  stop_argv=stop_argv,
                                                  stop_running=stop_running, release=release))
        return _answer(ev, protocol.LeaseStatus)

    async def stat_file(self, path: str) -> protocol.StatResult:
        ev = await self.request(protocol.StatFile(req=self.next_req(), path=path))
        return _answer(ev, protocol.StatResult)

    async def workspace_put(self, pieces: list[protocol.WsPiece], data: str,
                            compressed: bool) -> protocol.WorkspaceStored:
        """Blobs for the pod's content store (:mod:`gpuws.workspace.sync` makes the batches)."""
        return await self.workspace_put_submitted(pieces, data, compressed)

    def workspace_put_submitted(self, pieces: list[protocol.WsPiece], data: str,
                                compressed: bool) -> asyncio.Task[protocol.WorkspaceStored]:
        """:meth:`workspace_put` with its line written before this returns (see
        :meth:`submit`): an apply asked for next reaches the pod after it."""
        sent = self.submit(protocol.WorkspacePut(req=self.next_req(), pieces=pieces,
                                                 data=data, zlib=compressed), timeout=300)
        return asyncio.create_task(_checked(sent, protocol.WorkspaceStored))

    async def workspace_apply(self, name: str, entries: list[protocol.WsEntry],
                              tree_sha256: str) -> protocol.WorkspaceState:
        """Make the pod's workspace ``name`` this tree, or learn which blobs it lacks."""
        ev = await self.request(protocol.WorkspaceApply(req=self.next_req(), name=name,
                                                        entries=entries,
                                                        tree_sha256=tree_sha256), timeout=600)
        return _answer(ev, protocol.WorkspaceState)

    def agent_argv(self) -> list[str]:
        """argv that starts the cached agent on the pod (for side channels)."""
        return agent_argv(build_bundle(), self.python)

    async def close(self) -> None:
        """Close the agent's channel and the transport; runs on the pod go on."""
        with contextlib.suppress(Exception):
            self.proc.stdin.write_eof()
        # serve exits on EOF; waiting reaps it (a local subprocess must not outlive its loop).
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.proc.wait(), 5)
        self.proc.close()
        for task in (self._reader, self._err_reader):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.transport.close()


def _expect(ev: protocol.Events, cls: type[T]) -> T:
    if not isinstance(ev, cls):
        raise ProtocolError(f"expected {cls.__name__}, got {type(ev).__name__}")
    return ev


def _answer(ev: protocol.Events, cls: type[AnswerT]) -> AnswerT:
    """The answer a request asked for, checked at the trust boundary like every event from
    the pod (``ts`` near now, every string, list and map bounded): here, once, so that no
    face (the TUI, a headless command, the engine) can show one unchecked."""
    return check_answer(_expect(ev, cls))


async def _checked(sent: Awaitable[protocol.Events], cls: type[AnswerT]) -> AnswerT:
    return _answer(await sent, cls)


def _first_run(ev: protocol.Events) -> protocol.RunInfo:
    runs = _answer(ev, protocol.RunList).runs
    if not runs:
        raise ProtocolError("the agent answered with an empty run list")
    return runs[0]

