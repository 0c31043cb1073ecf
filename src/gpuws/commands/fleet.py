"""``gpuws run POD POD ... -w W`` (a fleet), ``gpuws fleets``, ``gpuws export --fleet``.

A fleet runs one workload on several pods at once. Each pod gets its own laptop engine
(:class:`gpuws.live.engine.Engine`, the one every face uses: connect, boundary, store,
reconnect, pull), all on one event loop, each recording its own session as a single-pod
``gpuws run`` would. This module only drives them side by side, shows their progress
and prints the comparison (:mod:`gpuws.sessions.fleet` decides its columns and cells).

One pod failing (unreachable, its run failing, its link lost for good) never stops the
others: its line says why, and the exit status is :data:`FLEET_FAILED_EXIT`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from dataclasses import dataclass, field
from typing import Any

import msgspec
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from .. import protocol
from ..errors import ConnectError, GpuwsError, StoreError, UsageError
from ..live.boundary import SeqGate
from ..live.engine import Engine, Notice, ReconnectPolicy
from ..live.feed import Batch
from ..live.lease import close_orphans
from ..live.link import probe_summary
from ..live.storeio import StoreHandle
from ..sessions.export import export_fleet
from ..sessions.fleet import (
    FleetComparison,
    cells,
    columns,
    failure_lines,
    fleet_comparison,
    notes,
)
from ..sessions.runlist import why_failed
from ..sessions.store import FleetRow, Store
from ..text import humanfmt
from ..text.textsafe import json_visible, visible
from ..text.textsafe import text as safe
from .common import check_output, console, print_json, target_of, write_report
from .run import build_spec

#: The exit status when one or more pods of a fleet gave no result (README, cli.EXIT_CODES).
FLEET_FAILED_EXIT = 12
#: Options of ``gpuws run`` that mean nothing (or something wrong) for several pods.
_REFUSED = (
    ("detach", "--detach", "a fleet is followed to its comparison table; start each pod "
                           "with its own `gpuws run POD --detach` instead"),
    ("baseline", "--baseline", "a fleet compares its pods with the first one; compare a "
                               "run with a baseline later: gpuws compare BASELINE RUN"),
    ("fail_if_slower", "--fail-if-slower", "gate one pod's run: gpuws run POD --baseline "
                                           "RUN --fail-if-slower PCT"),
    ("rate", "--rate", "pods have their own prices: set each in the config "
                       "([hosts.POD] rate_usd_per_hour)"),
    ("port", "-p", "give each pod its own port: user@host:PORT"),
    ("workspace", "-W", "a fleet does not sync a workspace yet: run `gpuws run POD -W DIR "
                        "-w …` on each pod"),
)
_STATE_STYLE = {"ok": "green", "running": "cyan", "connected": "cyan", "connecting": "cyan",
                "pending": "dim"}


def pods_of(args: argparse.Namespace) -> list[str]:
    """The pods ``gpuws run`` was given, in order (the first is the reference)."""
    return [args.host, *(getattr(args, "more_pods", None) or [])]


def check_fleet_args(args: argparse.Namespace) -> list[str]:
    """Refuse what cannot work for several pods, before anything connects.

    Raises:
        UsageError: an option that only makes sense for one pod, or a pod named twice.
    """
    pods = pods_of(args)
    for name, flag, remedy in _REFUSED:
        if getattr(args, name, None) not in (None, False):
            raise UsageError(f"{flag} does not apply to a fleet of {len(pods)} pods",
                             remedy=remedy)
    seen: set[str] = set()
    for pod in pods:
        if pod in seen:
            raise UsageError(f"{visible(pod, 80)} is named twice; two runs at once on one "
                             "pod would time each other, not the pod",
                             remedy="name each pod once")
        seen.add(pod)
    return pods


@dataclass
class PodRun:
    """One pod of the fleet: its engine and what it has come to."""

    position: int
    pod: str
    engine: Engine
    status: str = "pending"
    detail: str = ""
    session_id: str | None = None
    run_id: str | None = None
    error: str = ""
    samples: int = 0
    gates: dict[str, SeqGate] = field(default_factory=dict)


class FleetView:
    """The fleet's progress: one updating line per pod on a terminal, prefixed lines
    otherwise, NDJSON (each object with a ``pod`` field) with ``--json``.

    Pod names are the person's; everything else shown comes from the pods and goes
    through :mod:`gpuws.text.textsafe`.
    """

    def __init__(self, as_json: bool, live: bool | None = None) -> None:
        self.as_json = as_json
        self.out = console(markup=False)
        self.err = console(stderr=True, markup=False)
        self.live_mode = (self.out.is_terminal if live is None else live) and not as_json
        self.pods: list[PodRun] = []
        self._live: Live | None = None

    def __enter__(self) -> FleetView:
        if self.live_mode:
            self._live = Live(get_renderable=self.render, console=self.out,
                              refresh_per_second=8, transient=False)
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def render(self) -> RenderableType:
        """The live block: pod · state · latest detail."""
        grid = Table.grid(padding=(0, 1))
        # Pod and state keep their width; the detail takes what is left and is cut.
        grid.add_column(no_wrap=True, min_width=min(30, max((len(visible(p.pod))
                                                              for p in self.pods), default=4)))
        grid.add_column(no_wrap=True, min_width=len("interrupted"))
        grid.add_column(overflow="ellipsis", no_wrap=True, ratio=1)
        for p in self.pods:
            grid.add_row(safe(p.pod, "bold", 60), _state(p.status), safe(p.detail, limit=200))
        return Group(grid)

    # ------------------------------------------------------------------ updates
    def state(self, pod: PodRun, status: str, detail: str = "") -> None:
        """A pod's state changed (connected, running, ok, failed…)."""
        if detail == pod.detail:
            detail = ""  # already printed as progress ("run ok in 3.2 s")
        pod.status = status
        pod.detail = detail or pod.detail
        if self.as_json:
            _ndjson({"pod": pod.pod, "type": "fleet_pod", "status": status,
                     "detail": detail, "session_id": pod.session_id, "run_id": pod.run_id,
                     "error": pod.error})
        elif not self.live_mode:
            line = _state(status)
            if detail:
                line.append_text(Text.assemble(" ", safe(detail)))
            self._line(pod, line)

    def detail(self, pod: PodRun, detail: str, *, line: bool = True) -> None:
        """Progress within a state (a tier, samples so far); printed as a line when not
        on a terminal and ``line`` says it is worth one."""
        pod.detail = detail
        if not self.live_mode and not self.as_json and line:
            self._line(pod, safe(detail))

    def step(self, pod: PodRun) -> Any:
        """The engine's ``on_step`` for this pod's connection."""
        def on_step(step: str, state: str, seconds: float | None, detail: str) -> None:
            if state == "running":
                self.detail(pod, f"{step}…", line=False)
            elif state == "failed":
                self.detail(pod, f"{step} failed: {detail}", line=False)
        return on_step

    def batch(self, pod: PodRun) -> Any:
        """The engine's ``on_batch`` for this pod: each run event once, in order."""
        def on_batch(batch: Batch) -> None:
            for ev in batch.events:
                if ev.run_id is not None and ev.seq is not None:
                    gate = pod.gates.setdefault(ev.run_id, SeqGate())
                    if not gate.admit(ev):
                        continue
                self.event(pod, ev)
        return on_batch

    def notice(self, pod: PodRun) -> Any:
        """The engine's ``on_notice`` for this pod (link lost, reconnecting, refusals)."""
        def on_notice(n: Notice) -> None:
            if self.as_json:
                _ndjson({"pod": pod.pod, "type": "fleet_notice", "kind": n.kind,
                         "severity": n.severity, "message": n.message})
            elif n.severity != "information" or n.kind in ("reconnected", "pulled"):
                self.detail(pod, n.message)
        return on_notice

    def event(self, pod: PodRun, ev: protocol.Events) -> None:
        if self.as_json:
            body = msgspec.to_builtins(ev)
            _ndjson({"pod": pod.pod, **body})
            return
        match ev:
            case protocol.RunStarted():
                self.detail(pod, f"run {ev.run_id} started on {ev.hostname or '?'}")
            case protocol.TierStarted():
                self.detail(pod, f"▶ tier {ev.tier} {ev.name}")
            case protocol.TierFinished():
                why = f" — {ev.reason}" if ev.reason else ""
                self.detail(pod, f"■ tier {ev.tier} {ev.status} in "
                                 f"{humanfmt.duration(ev.wall_s)}{why}")
            case protocol.Samples():
                pod.samples += len(ev.values_ms)
                self.detail(pod, f"tier 1: {pod.samples} samples", line=False)
            case protocol.Tier1Result():
                self.detail(pod, f"tier 1: median {humanfmt.ms(ev.stats.median_ms)} "
                                 f"±{humanfmt.share(ev.stats.ci_rel_halfwidth, 2)} "
                                 f"(n={ev.stats.n})")
            case protocol.NcuProgress():
                self.detail(pod, f"ncu {ev.kernel}: {ev.percent}%", line=ev.done)
            case protocol.Diagnosis():
                self.detail(pod, f"! {ev.title}: {ev.cause}")
            case protocol.Output():
                self.detail(pod, f"{ev.stream}│ {ev.text}")
            case protocol.RunFinished():
                why = f" — {ev.error}" if ev.error else ""
                self.detail(pod, f"run {ev.status} in {humanfmt.duration(ev.wall_s)}{why}")
            case _:
                pass

    def _line(self, pod: PodRun, body: Text) -> None:
        # One physical line per update (soft_wrap): a script greps "POD│ ...".
        self.out.print(Text.assemble(safe(pod.pod, "bold", 60), ("│ ", "dim"), body),
                       soft_wrap=True)


def _state(status: str) -> Text:
    return Text(status, _STATE_STYLE.get(status, "red"))


def _ndjson(obj: dict[str, Any]) -> None:
    sys.stdout.write(json_visible(msgspec.json.encode(obj).decode()) + "\n")


# ----------------------------------------------------------------------------- the run
class Fleet:
    """Runs one spec on several pods at once and records it as a fleet.

    Args:
        args: ``gpuws run``'s arguments (connection options apply to every pod).
        spec: the run's spec, checked before anything connects.
        pods: the pods, in order.
        view: where progress goes.
        store: the session store (one, shared by every pod's engine: see :meth:`run`).
        reconnect: how each engine retries a dropped link (the engine's default if None).
    """

    def __init__(self, args: argparse.Namespace, spec: protocol.RunSpec, pods: list[str],
                 view: FleetView, store: StoreHandle,
                 reconnect: ReconnectPolicy | None = None) -> None:
        self.args = args
        self.spec = spec
        self.view = view
        self.store = store
        self.fleet_id: str | None = None
        self.pods: list[PodRun] = []
        for i, name in enumerate(pods):
            pod = PodRun(i, name, Engine(store, auto_pull=not args.no_pull,
                                         reconnect=reconnect))
            pod.engine.on_batch = view.batch(pod)
            pod.engine.on_notice = view.notice(pod)
            self.pods.append(pod)
        view.pods = self.pods

    async def run(self) -> FleetComparison:
        """Connect, run and follow every pod at once; the comparison once all are done.

        Raises:
            asyncio.CancelledError: interrupted; what each pod had come to is recorded
                (runs go on on their pods) before this propagates.
        """
        spec, pods = self.spec, [p.pod for p in self.pods]
        self.fleet_id = await self.store.call(lambda s: s.open_fleet(spec, pods))
        # Sessions left open by a killed gpuws are ended first, once, on the store's one
        # thread: each engine also does so when it connects, and with several engines a
        # second sweep must never end a session a first engine has just opened (its lease
        # is taken right after the session row is written). One StoreHandle runs calls in
        # order, and every engine asks for its sweep in the first loop turn below, before
        # any of them has dialled, let alone opened a session.
        await self.store.call(close_orphans)
        tasks = [asyncio.create_task(self._pod(p), name=f"gpuws-fleet-{p.pod}")
                 for p in self.pods]
        try:
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
            # Each pod records how it ended even when interrupted (shielded from a
            # second Ctrl-C only as long as the store takes).
            await asyncio.gather(*tasks, return_exceptions=True)
            fid = self.fleet_id
            await self.store.call(lambda s: s.end_fleet(fid))
        return await self.store.call(lambda s: fleet_comparison(s, fid))

    async def _pod(self, pod: PodRun) -> None:
        engine, view = pod.engine, self.view
        target = target_of(argparse.Namespace(**{**vars(self.args), "host": pod.pod}))
        try:
            view.state(pod, "connecting", "")
            try:
                link = await engine.connect(target, on_step=view.step(pod))
            except GpuwsError as exc:
                await self._ended(pod, "unreachable", exc.one_line())
                return
            pod.session_id = link.session_id
            await self._record(pod, "connected")
            view.state(pod, "connected", probe_summary(link.probe))
            try:
                info = await engine.start_run(self.spec)
            except GpuwsError as exc:
                await self._ended(pod, "failed", exc.one_line())
                return
            pod.run_id = info.run_id
            await self._record(pod, "running")
            view.state(pod, "running")
            try:
                fin = await engine.wait_finished(info.run_id)
            except ConnectError as exc:
                last = await self.store.call(lambda s: s.last_seq(info.run_id))
                await self._ended(pod, "lost", (
                    f"{exc.title}: {exc.message} — the run goes on on the pod: gpuws attach "
                    f"{pod.pod} {info.run_id} (resumes after event {last})"))
                return
            outcome = await engine.settled(info.run_id)
            if fin.status != "ok":
                why = await self.store.call(lambda s: why_failed(s, info.run_id))
                await self._ended(pod, "failed" if fin.status == "failed" else fin.status,
                                  f"run {fin.status}: {why or fin.error or 'no reason given'}"
                                  f" — gpuws export {link.session_id} has its record")
            elif outcome.error is not None:
                await self._ended(pod, "failed", outcome.error.one_line())
            else:
                await self._ended(pod, "ok", f"run ok in {humanfmt.duration(fin.wall_s)}")
        except Exception as exc:  # one pod's fault (a bug) must not stop the others
            await self._ended(pod, "failed", f"unexpected {type(exc).__name__}: "
                              f"{visible(exc, 300)} — the other pods went on; please report "
                              "this with `gpuws export` of its session")
        except asyncio.CancelledError:
            why = (f"interrupted; the run goes on on the pod: gpuws attach {pod.pod} "
                   f"{pod.run_id}" if pod.run_id else "interrupted before the run started")
            await asyncio.shield(self._ended(pod, "interrupted", why))
            raise
        finally:
            with contextlib.suppress(GpuwsError):
                await asyncio.shield(engine.close())

    async def _record(self, pod: PodRun, status: str, error: str = "") -> None:
        fid, position = self.fleet_id, pod.position
        assert fid is not None
        sid, rid = pod.session_id, pod.run_id
        await self.store.call(lambda s: s.set_fleet_pod(fid, position, status=status,
                                                        session_id=sid, run_id=rid,
                                                        error=error))

    async def _ended(self, pod: PodRun, status: str, message: str) -> None:
        pod.error = "" if status == "ok" else message
        await self._record(pod, status, pod.error)
        self.view.state(pod, status, message)


async def run(args: argparse.Namespace, reconnect: ReconnectPolicy | None = None) -> int:
    """``gpuws run POD POD ... -w W``: the fleet, its progress, its comparison table.

    Args:
        args: ``gpuws run``'s arguments with more than one pod.
        reconnect: how long each pod's dropped link is retried (tests shorten it).

    Returns:
        0 when every pod gave its result, :data:`FLEET_FAILED_EXIT` when some did not
        (each named on stderr), 130 when interrupted.
    """
    pods = check_fleet_args(args)
    spec = build_spec(args)
    store = StoreHandle()
    view = FleetView(args.json)
    fleet = Fleet(args, spec, pods, view, store, reconnect)
    task = asyncio.current_task()
    if task is not None:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            # SIGTERM ends the fleet like Ctrl-C: each pod's state recorded, sessions ended.
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    interrupted = False
    try:
        with view:
            try:
                comparison = await fleet.run()
            except asyncio.CancelledError:
                interrupted = True
                fid = fleet.fleet_id
                if fid is None:
                    raise
                comparison = await store.call(lambda s: fleet_comparison(s, fid))
    finally:
        await store.close()
    show_comparison(comparison, view, args.json)
    if interrupted:
        return 130
    return FLEET_FAILED_EXIT if comparison.failed else 0


def show_comparison(c: FleetComparison, view: FleetView, as_json: bool) -> None:
    """The end of a fleet run: the table (or one JSON object), then one stderr line per
    pod that gave no result."""
    if as_json:
        _ndjson({"type": "fleet_result", "fleet_id": c.fleet.id,
                 "lines": [msgspec.to_builtins(line) for line in c.lines],
                 "failed": [line.pod for line in c.failed]})
    else:
        # Not on a terminal, the table gets room for whole rows instead of 80 columns.
        table_out = view.out if view.out.is_terminal else Console(
            highlight=False, soft_wrap=False, markup=False, emoji=False,
            width=max(view.out.width, 200))
        table_out.print(comparison_table(c))
        for note in notes(c):
            view.out.print(safe(note, "dim"), soft_wrap=True)
        view.out.print(Text(f"`gpuws export --fleet {c.fleet.id}` writes this comparison "
                            "as markdown; `gpuws history SESSION` lists each pod's run",
                            "dim"), soft_wrap=True)
    for failure in failure_lines(c):
        view.err.print(safe(f"gpuws: {failure}", "red"), soft_wrap=True)


def comparison_table(c: FleetComparison) -> Table:
    """The comparison as a Rich table; every cell is plain text, never markup."""
    cols = columns(c)
    t = Table(title=visible(f"fleet {c.fleet.id} · {c.fleet.workload} · "
                            f"{len(c.lines)} pods"), title_justify="left")
    right = {"Tier-1 median (95% CI)", "throughput", "% of peak", "vs first", "wall"}
    for col in cols:
        t.add_column(col, justify="right" if col in right else "left",
                     overflow="fold")
    for line in c.lines:
        row = cells(line)
        t.add_row(*(safe(row[col], _STATE_STYLE.get(row[col], "red")) if col == "status"
                    else safe(row[col], limit=300) for col in cols))
    return t


# ----------------------------------------------------------------------------- listings
def find_fleet(store: Store, fleet_id: str) -> FleetRow:
    """A stored fleet by id or unique prefix.

    Raises:
        UsageError: no fleet (or more than one) matches; the remedy points to
            ``gpuws fleets``.
    """
    try:
        return store.fleet(fleet_id)
    except StoreError as exc:
        raise UsageError(exc.message, remedy="`gpuws fleets` lists the fleets and their ids; "
                                             "give an id or a unique prefix of one") from None


async def fleets(args: argparse.Namespace) -> int:
    """``gpuws fleets``: every fleet, newest first, with its pods and how each ended."""
    with Store() as store:
        rows = store.fleets()
    if args.json:
        print_json([msgspec.to_builtins(r) for r in rows])
        return 0
    out = console(markup=False)
    if not rows:
        out.print(Text("no fleets yet: `gpuws run POD POD ... -w WORKLOAD` makes one",
                       "yellow"))
        return 0
    t = Table(title="fleets", title_justify="left",
              caption="`gpuws export --fleet ID` writes one's comparison as markdown",
              caption_justify="left")
    for col in ("id", "started", "workload", "pods"):
        t.add_column(col, overflow="fold")
    for r in rows:
        pods = Text()
        for i, p in enumerate(r.pods):
            if i:
                pods.append(", ")
            pods.append_text(safe(p.pod, limit=60))
            pods.append(f" {p.status}", _STATE_STYLE.get(p.status, "red"))
        t.add_row(Text(r.id), humanfmt.when(r.started), safe(r.workload, limit=80), pods)
    out.print(t)
    return 0


async def export(args: argparse.Namespace) -> int:
    """``gpuws export --fleet ID``: the fleet's comparison as markdown."""
    check_output(args.output)
    with Store() as store:
        fleet = find_fleet(store, args.fleet)
        text = export_fleet(store, fleet.id)
    write_report(text, args.output)
    return 0
