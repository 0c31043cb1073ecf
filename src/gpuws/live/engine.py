"""The one laptop engine: what the TUI and every headless command use to drive a pod.

One event's way from the pod to a pane or a printed line::

    events.ndjson on the pod ─ serve tails it ─ SSH ─ AgentClient (frames, decodes)
      ─ Engine._on_wire ─ Boundary.check (the trust boundary: run asked for? seq, ts,
        bounds, artifact names) ─ EventFeed.push ─ Store.ingest_many (SQLite, first)
      ─ Engine._delivered (finished → pull rule) ─ the face's ``on_batch``
        (RunModel → panes in the TUI, Printer → stdout headless)

The engine owns everything on that path that is not drawing: connecting (step by
step), the session and its lease, starting runs under laptop-chosen ids, attaching
with a backfill of what the store already holds, reconnecting by itself when the link
dies and re-attaching where each run left off, pulling artifacts when a followed run
finishes, and ending the session on the way out.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Literal

from .. import protocol
from ..client import AgentClient
from ..config import host_config, load_config, withheld_defaults, withheld_note
from ..errors import (
    AuthError,
    ConnectError,
    GpuwsError,
    HostKeyError,
    ProtocolError,
    StoreError,
    UsageError,
)
from ..sessions.artifacts import Progress, PullResult, pull_run
from ..sessions.cost import (
    BUDGET_WARN_FRACTION,
    BudgetWindow,
    budget_window,
    resolve_budget,
    resolve_rate,
)
from ..sessions.store import Store
from ..text import humanfmt
from ..text.textsafe import visible
from ..workspace.code import CodeRecord
from .account import DEFAULT_MAX_OUTPUT_MIB, RunAccount
from .boundary import RUN_ID_PATTERN as _RUN_ID
from .boundary import Boundary
from .feed import Batch, EventFeed
from .lease import SessionLease, close_orphans
from .link import Link, OnStep, Target, _no_step, dial, transport_label
from .storeio import StoreHandle

Severity = Literal["information", "warning", "error"]


@dataclass(frozen=True)
class Notice:
    """Something the person should see, decided by the engine and shown by a face.

    Attributes:
        kind: ``refused``, ``conflict``, ``link_lost``, ``reconnecting``,
            ``reconnected``, ``gave_up``, ``store_failed``, ``pulled``, ``pull_failed``,
            ``budget``, ``missing`` (seqs of a run that never arrived), ``truncated``
            (output counted past the run's output cap), ``pod_error`` (an error the pod
            sent unasked).
        message: one line, already made safe to show (:func:`gpuws.text.textsafe.visible`).
        severity: how loudly to show it.
        run_id: the run it concerns, if one.
    """

    kind: str
    message: str
    severity: Severity = "warning"
    run_id: str | None = None


@dataclass(frozen=True)
class ReconnectPolicy:
    """How a dead link is retried: waits double from ``first_s`` up to ``max_s``.

    Attributes:
        enabled: reconnect by itself at all.
        first_s: the first wait.
        max_s: the longest wait between two attempts.
        give_up_s: stop trying after this long without a link (then the person decides).
    """

    enabled: bool = True
    first_s: float = 1.0
    max_s: float = 30.0
    give_up_s: float = 600.0


@dataclass(frozen=True)
class PullOutcome:
    """What the automatic pull after a run did: files, or why it failed."""

    results: list[PullResult]
    error: GpuwsError | None = None


OnBatch = Callable[[Batch], None]
OnSide = Callable[[protocol.Events], None]
OnNotice = Callable[[Notice], None]


def _ignore(_value: object) -> None:
    """A face that does not care about this kind of callback."""


def new_run_id(now: float | None = None) -> str:
    """A run id chosen by the laptop (the pod's answer must echo it)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now))
    return f"{stamp}-{secrets.token_hex(4)}"


class Engine:
    """Drives one pod for one face.

    Args:
        store: the session store (on its own thread).
        on_batch: called on the loop with each batch of run events after it is stored.
        on_side: called with events that belong to no run (telemetry, agent logs).
        on_notice: called with refusals, link changes, pull results.
        auto_pull: pull a followed run's artifacts when it finishes.
        pull_progress: progress of those pulls (name, done, total).
        reconnect: what to do when the link dies.
        clock: arrival times (for latency figures).
        now: the wall clock.
    """

    def __init__(self, store: StoreHandle, *, on_batch: OnBatch = _ignore,
                 on_side: OnSide = _ignore, on_notice: OnNotice = _ignore,
                 auto_pull: bool = True, pull_progress: Progress | None = None,
                 reconnect: ReconnectPolicy | None = None,
                 clock: Callable[[], float] = time.perf_counter,
                 now: Callable[[], float] = time.time) -> None:
        self.store = store
        self.on_batch = on_batch
        self.on_side = on_side
        self.on_notice = on_notice
        self.auto_pull = auto_pull
        self.pull_progress = pull_progress
        self.reconnect_policy = reconnect or ReconnectPolicy()
        self.now = now
        self.feed = EventFeed(store, self._delivered, self._store_failed, clock,
                              on_conflict=self._conflicts)
        self.boundary = self._new_boundary()
        #: Caps each run's stored output, names seqs that never came (live/account.py).
        self.account = RunAccount(int(DEFAULT_MAX_OUTPUT_MIB * 2**20), self._accounted)
        self.link: Link | None = None
        self.target: Target | None = None
        self.lost: GpuwsError | None = None
        self.reconnecting = False
        self._lease: SessionLease | None = None
        #: The pod's own lease (the idle auto-stop), as the agent last said it stands.
        self.pod_lease: protocol.LeaseStatus | None = None
        #: The pod is the laptop itself (its probe's machine id): [defaults] stops nothing.
        self.this_machine = False
        self._finished: dict[str, protocol.RunFinished] = {}
        #: Runs followed before a reconnect that the pod would not resume (gone, refused).
        self._unresumable: dict[str, GpuwsError] = {}
        self._pulls: dict[str, asyncio.Task[PullOutcome]] = {}
        self._changed = asyncio.Condition()
        self._tasks: set[asyncio.Task[None]] = set()
        self._feed_task: asyncio.Task[None] | None = None
        self._closing = False
        self._orphans_closed = False

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start storing and delivering (idempotent; needs a running loop)."""
        if self._feed_task is None:
            self._feed_task = asyncio.create_task(self.feed.run(), name="gpuws-feed")

    @property
    def session_id(self) -> str | None:
        """The session events are stored in, once there is one."""
        return self.feed.session_id

    @property
    def connected(self) -> bool:
        """Whether a link is up."""
        return self.link is not None and not self.link.client.closed

    async def connect(self, target: Target, on_step: OnStep = _no_step,
                      clock: Callable[[], float] = time.monotonic) -> Link:
        """Connect step by step, open the session, and watch the link.

        Raises:
            UnknownHostKey: ask the person, then connect again with ``accept_new``.
            GpuwsError: anything else, with its remedy; nothing is left open.
        """
        started_wall = self.now()
        self.start()
        await self._close_orphans()
        try:
            client, probe = await dial(target, on_step, clock)
        except (HostKeyError, AuthError):
            raise  # it answered: no silence to learn from
        except ConnectError as exc:
            said = await self._heard_nothing(target.host)
            if said is None:
                raise
            # One line still: what the silence means first, then the transport's words.
            raise ConnectError(f"{said}; {exc.message}", title=exc.title,
                               remedy=exc.remedy) from exc
        return await self.adopt(target, client, probe, started_wall)

    async def _heard_nothing(self, host: str) -> str | None:
        """The host does not answer: if its lease was due, that is the stop it made
        (recorded); returns the sentence that says so."""
        from .uptime.observed import host_silent

        now = self.now()
        return await self.store.call(lambda s: host_silent(s, host, now))

    async def _last_contact(self, host: str) -> None:
        """The laptop leaves ``host`` now: its lease's idle time counts from here."""
        from .uptime.observed import contact

        now = self.now()
        await self.store.call(lambda s: contact(s, host, now))

    async def adopt(self, target: Target, client: AgentClient, probe: protocol.Probe,
                    started_wall: float | None = None) -> Link:
        """Take over a connected agent client: open the session and watch the link.

        :meth:`connect` ends here; tests and benchmarks hand in a client of their own.
        """
        self.start()
        await self._close_orphans()
        try:
            link = await self._open_session(target, client, probe,
                                            self.now() if started_wall is None else started_wall)
        except BaseException:
            await client.close()
            raise
        reconnect = self.link is not None
        self.target = target
        self.lost = None
        self._attach_client(link)
        if reconnect:  # the person reconnected after the engine gave up: resume the runs
            await self._reattach(link)
        return link

    async def _close_orphans(self) -> None:
        if self._orphans_closed:
            return
        self._orphans_closed = True
        ended = await self.store.call(close_orphans)
        if ended:
            self._notice("information", "orphans",
                         f"ended {len(ended)} session(s) left open by a process that died, "
                         "at their last recorded activity")

    async def _open_session(self, target: Target, client: AgentClient, probe: protocol.Probe,
                            started_wall: float) -> Link:
        if self.link is not None and self.session_id is not None:
            # A reconnect: the session (a connection-lifetime to the person) goes on.
            return Link(target, client, probe, self.session_id, self.link.rate,
                        self.link.budget, self.link.following)
        from .uptime.lease import is_this_machine

        cfg = load_config()
        rate = resolve_rate(target.rate, target.host, cfg)
        budget = resolve_budget(None, target.host, cfg)
        max_output = host_config(cfg, target.host).max_output_mib
        if max_output is not None:
            self.account.max_output_bytes = int(max_output * 2**20)
        self.this_machine = is_this_machine(probe)
        withheld = withheld_defaults(cfg, target.host, this_machine=self.this_machine)
        if withheld:  # once per session (reconnects return above); a warning: headless
            # runs print warnings only, and the person must learn why nothing was armed.
            self._notice("warning", "lease", "note: " + withheld_note(target.host, withheld))
        kind = transport_label(client)
        now = self.now()

        def record(s: Store) -> tuple[str, BudgetWindow]:
            # What the host cost before this session, read before it is opened.
            window = budget_window(s, target.host, started_wall)
            sid = s.open_session(target.host, kind, probe, rate, budget, started=started_wall)
            s.add_phase(sid, None, "connect", started_wall, now)
            return sid, window

        session_id, window = await self.store.call(record)
        self._lease = SessionLease(session_id)
        self.feed.set_session(session_id)
        if rate and budget is not None:
            self._spawn(self._watch_budget(rate, budget, started_wall, target, window),
                        "gpuws-budget")
        self._spawn(self._arm_pod_lease(client, target.host), "gpuws-pod-lease")
        return Link(target, client, probe, session_id, rate, budget)

    async def _arm_pod_lease(self, client: AgentClient, host: str) -> None:
        """Arm the pod's lease where the host's config asks for one (issue 22); say so,
        or why it could not be."""
        from .uptime.lease import arm, describe
        from .uptime.observed import disbelief, lease_seen

        status = self.pod_lease = await arm(client, host, this_machine=self.this_machine)
        now = self.now()
        learnt, denied = await self.store.call(lambda s: lease_seen(s, host, status, now))
        doubted = disbelief(status, denied)
        if doubted:
            self._notice("warning", "lease", doubted)
        if learnt:
            self._notice("information", "lease",
                         f"the pod's lease stopped {host} {learnt} time(s) since gpuws last "
                         "saw it (recorded from its log; the export counts billed time to "
                         "each stop)")
        if self.pod_lease.armed:
            self._notice("information", "lease", "pod lease: " + describe(self.pod_lease))
        elif host_config(load_config(), host,
                         this_machine=self.this_machine).idle_stop_minutes is not None:
            self._notice("warning", "lease", describe(self.pod_lease))

    def _attach_client(self, link: Link) -> None:
        self.link = link
        self.boundary = self._new_boundary()
        link.client.add_listener(self._on_wire)
        link.client.pace = self._pace
        self._spawn(self._watch(link), "gpuws-watch-link")

    async def disconnect(self) -> None:
        """End the session and close the link; the engine can connect again afterwards.

        Runs on the pod go on. The session's cost stops here.
        """
        for task in list(self._tasks):
            if task is not asyncio.current_task():
                task.cancel()
        for pull in list(self._pulls.values()):
            pull.cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.feed.drained(), 10)
        link, self.link = self.link, None
        sid = self.session_id
        try:
            if link is not None:
                await self._last_contact(link.target.host)
            if sid is not None and self._lease is not None:
                await self.store.call(lambda s: s.end_session(sid, ended=self.now()))
                self._lease.release()
                self._lease = None
        finally:
            self.target = None
            self.reconnecting = False
            self._finished.clear()
            self._unresumable.clear()
            self._pulls.clear()
            if link is not None:
                await link.client.close()

    async def close(self) -> None:
        """:meth:`disconnect`, then stop storing (idempotent)."""
        if self._closing:
            return
        self._closing = True
        try:
            await self.disconnect()
        finally:
            if self._feed_task is not None:
                self._feed_task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._feed_task
            async with self._changed:
                self._changed.notify_all()

    # ------------------------------------------------------------------ runs
    async def start_run(self, spec: protocol.RunSpec, code: CodeRecord | None = None,
                        entries: list[protocol.WsEntry] | None = None) -> protocol.RunInfo:
        """Start a run under an id the laptop chose, and follow it.

        ``code`` (with its manifest's ``entries``) is the workspace the run executes in, as
        synced: it is recorded with the run before the pod is asked, from what the laptop
        sent, never from what the pod says.
        """
        link = self._require_link()
        run_id = new_run_id(self.now())
        if code is not None:
            await self.store.call(lambda s: s.record_code(run_id, code, entries or []))
        self.boundary.expect(run_id, 0)
        link.following.add(run_id)
        info = await link.client.start_run(spec, run_id=run_id)
        if info.run_id != run_id:
            link.following.discard(run_id)
            raise ProtocolError(f"the pod started run {visible(info.run_id, 80)} when asked "
                                f"for {run_id}", title="Refused answer",
                                remedy="the agent on the pod is not gpuws's own; reconnect")
        return info

    async def attach(self, run_id: str, from_seq: int | None = None) -> protocol.RunInfo:
        """Follow a run: what the store holds is delivered first, then what it lacks.

        Raises:
            StoreError: the run was recorded from another host.
        """
        link = self._require_link()
        if not _RUN_ID.match(run_id):
            raise UsageError(f"{visible(run_id, 80)} is not a run id",
                             remedy="`gpuws runs HOST` lists the pod's runs, "
                                    "`gpuws history` the stored ones")

        def read(s: Store) -> tuple[int, list[protocol.Events], str | None]:
            try:
                row = s.run(run_id)
            except StoreError:
                return -1, [], None
            if row.run_id != run_id:
                return -1, [], None
            return s.last_seq(run_id), s.events(run_id), s.session(row.session_id).host

        last, stored, host = await self.store.call(read)
        if host is not None and host != link.target.host:
            raise StoreError(f"run {run_id} was recorded from {visible(host, 80)}, not from "
                             f"{visible(link.target.host, 80)}; a run's events are only "
                             "taken from the pod that ran it",
                             title="Run belongs to another pod",
                             remedy=f"attach from {visible(host, 80)}")
        if stored:
            self.on_batch(Batch(stored, [self.feed.clock()] * len(stored), 0))
        started = next((e for e in stored if isinstance(e, protocol.RunStarted)), None)
        begin = last + 1 if from_seq is None else from_seq
        self.account.resume(run_id, stored, begin)
        self.boundary.expect(run_id, begin, started=started.ts if started else None,
                             run_dir=started.run_dir if started else None)
        link.following.add(run_id)
        finished = next((e for e in stored if isinstance(e, protocol.RunFinished)), None)
        if finished is not None:
            await self._mark_finished(finished)
        return await link.client.attach(run_id, from_seq=begin)

    async def cancel(self, run_id: str) -> protocol.RunInfo:
        """Cancel a run on the pod; its ``run_finished`` arrives as an event."""
        return await self._require_link().client.cancel(run_id)

    async def list_runs(self) -> list[protocol.RunInfo]:
        """The runs the pod holds (their text is the pod's: show it through textsafe)."""
        return await self._require_link().client.list_runs()

    def finished(self, run_id: str) -> protocol.RunFinished | None:
        """The run's ``run_finished`` if it is stored already (no waiting)."""
        return self._finished.get(run_id)

    async def wait_finished(self, run_id: str) -> protocol.RunFinished:
        """Wait until the run's ``run_finished`` is stored (through any reconnects).

        Raises:
            ConnectError: the link died and could not be restored.
        """
        async with self._changed:
            await self._changed.wait_for(
                lambda: run_id in self._finished or run_id in self._unresumable
                or self.lost is not None or self._closing)
        if run_id in self._finished:
            return self._finished[run_id]
        raise (self._unresumable.get(run_id) or self.lost
               or ConnectError("the engine was closed", title="Closed"))

    async def settled(self, run_id: str) -> PullOutcome:
        """The automatic pull of a finished run (nothing when auto-pull is off)."""
        await self.wait_finished(run_id)
        task = self._pulls.get(run_id)
        return await task if task is not None else PullOutcome([])

    async def pull(self, run_id: str, progress: Progress | None = None) -> list[PullResult]:
        """Pull a run's artifacts home: resumable, verified by sha256, each only once."""
        link = self._require_link()
        # sessions.artifacts works with a store on the calling thread: the pull gets its
        # own short-lived connection to the same file (SQLite serialises the writers).
        limits = load_config().pull  # read now: the file may have changed since connect
        with Store(self.store.path) as local:
            return await pull_run(link.client, local, link.session_id, run_id, progress,
                                  limits=limits)

    async def drained(self) -> None:
        """Wait until every event received so far is stored and delivered."""
        await self.feed.drained()

    def push_recorded(self, ev: protocol.Events) -> None:
        """One event of a recording (a replay), through the same checks as a live stream.

        A recording file is as untrusted as a pod: whoever wrote it chose its contents.
        """
        if ev.run_id is not None and not self.boundary.expects(ev.run_id):
            try:
                self.boundary.expect(ev.run_id, 0)
            except ValueError:
                pass  # not a run id: the boundary refuses the event below
        checked = self.boundary.check(ev)
        if checked is not None:
            checked = self.account.check(checked)
        if checked is not None:
            self.feed.push(checked)

    # ------------------------------------------------------------------ the wire
    def _on_wire(self, ev: protocol.Events | protocol.BadLine) -> None:
        """The client's listener: check, then store-and-deliver or hand to the face."""
        checked = self.boundary.check(ev)
        if checked is None:
            return
        if checked.run_id is not None:
            checked = self.account.check(checked)  # the output cap, seqs that never came
            if checked is None:
                return
        if checked.run_id is not None or isinstance(checked, (protocol.Diagnosis,
                                                               protocol.ProbeResult)):
            self.feed.push(checked)
        else:
            if isinstance(checked, protocol.Error) and checked.req is None:
                # Unasked (the pod's follower dropped a line of a run's log, say): every
                # face shows it, where before the headless one ignored it.
                self._notice("warning", "pod_error", f"the pod says: {checked.title}: "
                             f"{checked.message}" + (f" → {checked.remedy}"
                                                     if checked.remedy else ""))
            self.on_side(checked)

    async def _pace(self, nbytes: int) -> None:
        """The client's pace: read on only while the store keeps up (the feed's bound)."""
        self.feed.received(nbytes)
        await self.feed.room()

    def _delivered(self, batch: Batch) -> None:
        for ev in batch.events:
            if isinstance(ev, protocol.RunFinished) and ev.run_id is not None:
                self._spawn(self._mark_finished(ev), "gpuws-finished")
        self.on_batch(batch)

    async def _mark_finished(self, ev: protocol.RunFinished) -> None:
        run_id = ev.run_id
        assert run_id is not None
        if run_id in self._finished:
            return
        self._finished[run_id] = ev
        link = self.link
        # The one place "run finished → pull" is decided, for every face.
        if (self.auto_pull and link is not None and run_id in link.following
                and run_id not in self._pulls):
            self._pulls[run_id] = asyncio.create_task(self._auto_pull(run_id))
        async with self._changed:
            self._changed.notify_all()

    async def _auto_pull(self, run_id: str) -> PullOutcome:
        try:
            results = await self.pull(run_id, self.pull_progress)
        except GpuwsError as exc:
            self._notice("error", "pull_failed", f"{exc.message} → {exc.remedy}"
                         if exc.remedy else exc.message, run_id)
            return PullOutcome([], exc)
        if results:
            self._notice("information", "pulled", ", ".join(
                f"{visible(r.name, 200)} → {r.local_path}" for r in results), run_id)
        return PullOutcome(results)

    # ------------------------------------------------------------------ reconnect
    async def _watch(self, link: Link) -> None:
        await link.client.wait_closed()
        if self._closing or self.link is not link:
            return
        try:
            await self._recover(link)
        except Exception as exc:
            # Nothing awaits this task: an error left in it would be lost, and every
            # wait_finished would wait for ever. It ends the engine's link instead.
            self.reconnecting = False
            error = exc if isinstance(exc, GpuwsError) else ConnectError(
                f"reconnecting failed: {type(exc).__name__}: {visible(str(exc), 300)}",
                title="Connection lost", remedy="reconnect; each run resumes where it stopped")
            self._lose(error)

    async def _recover(self, link: Link) -> None:
        """Reconnect with backoff after ``link`` died, and resume the runs it followed."""
        reason = _lost_reason(link.client)
        await self._last_contact(link.target.host)
        policy = self.reconnect_policy
        if not policy.enabled or self.target is None:
            self._lose(ConnectError(f"the link to the pod dropped ({reason}); runs on the "
                                    "pod go on", title="Connection lost",
                                    remedy="reconnect; each run resumes where it stopped"))
            return
        self._notice("warning", "link_lost", f"the link to the pod dropped ({reason}); "
                     "reconnecting — runs on the pod go on")
        self.reconnecting = True
        deadline = time.monotonic() + policy.give_up_s
        wait, attempt = policy.first_s, 0
        target = self.target
        while not self._closing:
            attempt += 1
            try:
                client, probe = await dial(target)
            except GpuwsError as exc:
                if time.monotonic() + wait > deadline:
                    self.reconnecting = False
                    self._lose(ConnectError(
                        f"the link to the pod dropped ({reason}) and {attempt} attempt(s) "
                        f"to reconnect failed; the last: {exc.message}",
                        title="Connection lost",
                        remedy=exc.remedy or "reconnect when the pod is reachable; runs "
                                             "resume where they stopped"))
                    return
                self._notice("warning", "reconnecting",
                             f"reconnect attempt {attempt} failed ({exc.title}); next in "
                             f"{wait:.0f} s")
                await asyncio.sleep(wait)
                wait = min(wait * 2, policy.max_s)
                continue
            new_link = await self._open_session(target, client, probe, self.now())
            self._attach_client(new_link)
            self.reconnecting = False
            resumed = await self._reattach(new_link)
            self._notice("information", "reconnected",
                         f"reconnected after {attempt} attempt(s)"
                         + (f"; resumed {', '.join(resumed)}" if resumed else ""))
            return

    async def _reattach(self, link: Link) -> list[str]:
        await self.feed.drained()
        resumed = []
        for run_id in sorted(link.following):
            if run_id in self._finished:
                continue
            last = await self.store.call(_last_seq(run_id))
            self.boundary.expect(run_id, last + 1)
            try:
                await link.client.attach(run_id, from_seq=last + 1)
            except GpuwsError as exc:
                # The pod no longer has the run (its directory removed, a new machine
                # behind the same name): the others still resume; this one's waiters
                # learn why instead of waiting for an end that will never come.
                self._unresumable[run_id] = ConnectError(
                    f"run {run_id} could not be resumed after reconnecting: {exc.message}",
                    title="Run not resumed",
                    remedy=f"`gpuws runs` lists what the pod holds; the {last + 1} event(s) "
                           "received before the link dropped are stored")
                self._notice("error", "not_resumed", self._unresumable[run_id].message, run_id)
                self._spawn(self._wake(), "gpuws-wake")
                continue
            resumed.append(f"{run_id} from event {last + 1}")
        return resumed

    def _lose(self, error: GpuwsError) -> None:
        self.lost = error
        self._notice("error", "gave_up", f"{error.message} → {error.remedy}")
        self._spawn(self._wake(), "gpuws-wake")

    async def _wake(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # ------------------------------------------------------------------ helpers
    def _new_boundary(self) -> Boundary:
        return Boundary(on_refusal=self._refused, now=self.now)

    def _refused(self, kind: str, message: str, count: int) -> None:
        times = "" if count == 1 else f" ({count} so far on this connection)"
        self._notice("warning", "refused", f"refused from the pod{times}: {message}")

    def _conflicts(self, pairs: list[tuple[str, int]]) -> None:
        run_id, seq = pairs[0]
        self._notice("warning", "conflict",
                     f"{len(pairs)} event(s) arrived again with different contents (first: "
                     f"run {run_id} seq {seq}); the first copy is kept", run_id)

    def _accounted(self, run_id: str, kind: str, message: str) -> None:
        self._notice("warning", kind, message, run_id)

    def _store_failed(self, error: GpuwsError) -> None:
        self._notice("error", "store_failed", error.message)

    def _notice(self, severity: Severity, kind: str, message: str,
                run_id: str | None = None) -> None:
        self.on_notice(Notice(kind, visible(message, 1000), severity, run_id))

    def _require_link(self) -> Link:
        if self.link is None or self.link.client.closed:
            raise ConnectError("not connected to a pod", title="Not connected",
                               remedy="connect first"
                               + (" (reconnecting now…)" if self.reconnecting else ""))
        return self.link

    async def _watch_budget(self, rate: float, budget: float, started_wall: float,
                            target: Target, window: BudgetWindow) -> None:
        """Say so, to every face, when the host's cost in its budget window (per pod start
        and per day, :class:`BudgetWindow`: earlier sessions' and this one's) reaches 80%
        and then 100% of its budget. This session's cost accrues for connected wall time at
        ``rate``: the moments are known in advance, so nothing polls. A step already passed
        when the session opens is said at once, with the share it has reached; past 100% by
        earlier sessions, only the 100% line."""
        steps: tuple[tuple[float, Severity], ...] = ((BUDGET_WARN_FRACTION, "warning"),
                                                     (1.0, "error"))
        host = target.host
        earlier = window.spent_usd
        for fraction, severity in steps:
            at = started_wall + max(0.0, fraction * budget - earlier) / rate * 3600.0
            await asyncio.sleep(max(0.0, at - self.now()))
            spent = earlier + rate * (self.now() - started_wall) / 3600.0
            if fraction < 1.0 and earlier >= budget:
                # Earlier sessions spent it all: one line. A slow connect of this session
                # still says both (the 80% warning is what a script's log shows first).
                continue
            share = spent / budget  # what it is, not the step: a slow connect overshoots
            cfg = host_config(load_config(), host, this_machine=self.this_machine)
            stopping = fraction >= 1.0 and cfg.stops_at_budget
            sessions = window.sessions + 1
            self._notice(severity, "budget", (
                f"this pod has cost {humanfmt.usd(spent)} {window.words()} ({sessions} "
                f"session{'s' if sessions != 1 else ''}), {share:.0%} of its "
                f"{humanfmt.usd(budget)} budget at {humanfmt.usd(rate)}/h: "
                + ("stopping the pod (budget_action = \"stop\")" if stopping else
                   "the pod keeps billing until it is stopped")))
            if stopping:
                await self._stop_host(target, cfg.stop, cfg.stop_wait_s)

    async def _stop_host(self, target: Target, argv: list[str] | None,
                         wait_s: float | None) -> None:
        """The host's own ``stop`` (issue 22, point 3), on the laptop, believed only once
        the host stops answering SSH (:func:`uptime.power.stop`, as ``gpuws stop``);
        recorded in the store whether it worked or not; the outcome said in one line."""
        host = target.host
        if not argv:
            self._notice("error", "budget", f"budget_action is \"stop\" but {host} has no "
                         f"`stop` command: add stop = [\"…\"] under [hosts.{host}]; the pod "
                         "keeps billing")
            return
        from .uptime import power

        wait = power.WAIT_S if wait_s is None else wait_s
        try:
            async with power.recorded(self.save_host_action, host, "stop"):
                await power.stop(target, argv, wait_s=wait, timeout_s=power.START_TIMEOUT_S,
                                 on_wait=_ignore_wait)
        except GpuwsError as exc:  # PowerError, or a host that refused (it still answers)
            self._notice("error", "budget", f"{exc.message}: the pod may still bill; stop it "
                                            "in the provider's console")
            return
        self._notice("warning", "budget", f"{host} stopped by its `stop` command at 100% "
                                          "of the budget: it no longer answers SSH")

    async def save_host_action(self, host: str, action: str, started: float, ended: float,
                                ok: bool, detail: str) -> None:
        """:data:`uptime.power.Save` through the store's thread."""
        await self.store.call(lambda s: s.add_host_action(host, action, started, ended, ok=ok,
                                                          detail=detail))

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _ignore_wait(_what: str, _left: float) -> None:
    """The budget stop's countdown is not shown: one line says the outcome."""


def _lost_reason(client: AgentClient) -> str:
    """Why the link closed, in words: the transport's verdict, else the agent's last words."""
    reason = client.transport.lost_reason
    if reason:
        return visible(reason, 300)
    if client.stderr_tail:
        return "agent said: " + visible(client.stderr_tail[-1], 300)
    return "the connection closed"


def _last_seq(run_id: str) -> Callable[[Store], int]:
    return lambda s: s.last_seq(run_id)
