"""The gpuws Textual app: screens, routing, and the one place worker failures are handled.

Everything that touches SSH or the disk runs as an async worker on the app's loop
(``workers.py``); workers only post typed messages. The pod is driven through the laptop
engine (:class:`~gpuws.live.engine.Engine`, the same one the headless commands use): it
checks, stores and then hands each batch of run events to :meth:`GpuwsApp._deliver`,
which routes it to the run screens showing that run.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from textual import on
from textual.app import App, SystemCommand
from textual.binding import Binding, BindingType
from textual.content import Content
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.timer import Timer
from textual.worker import Worker, WorkerState

from .. import protocol
from ..errors import GpuwsError
from ..live.engine import Engine, Notice
from ..live.feed import Batch, EventFeed
from ..live.link import Link, Target, UnknownHostKey
from ..live.storeio import StoreHandle
from ..live.telemetry import TelemetryHistory
from ..live.watchloop import WatchLoop
from ..locations import gpuws_home
from ..remote_agent.profilers.ncu_select import step_text
from ..runspec import LaunchOptions
from ..sessions.cost import Economics
from ..text.textsafe import visible, visible_lines
from . import fmt, workers
from .commands import ActionsProvider
from .messages import (
    AgentLog,
    LinkDown,
    LinkUp,
    NcuPlanReady,
    NsysPlanReady,
    PullDone,
    PullProgress,
    RunEvents,
    TelemetryTick,
)
from .screens.connecting import ConnectingScreen
from .screens.dashboard import DashboardScreen
from .screens.help import HelpScreen
from .screens.home import HomeScreen
from .screens.run import RunScreen


@dataclass(frozen=True)
class StartHome:
    """Open on Home."""


@dataclass(frozen=True)
class StartConnect:
    """Connect to ``target`` right away (``gpuws connect``)."""

    target: Target


@dataclass(frozen=True)
class StartReplay:
    """Play a recording (``gpuws replay``): an NDJSON file or a stored session.

    ``speed`` divides the recorded gaps; ``None`` plays everything at once.
    """

    source: str
    speed: float | None = 1.0
    run: str | None = None


Start = StartHome | StartConnect | StartReplay


class GpuwsApp(App[int]):
    """The workstation.

    Args:
        start: what to open on.
        store: the session store (a throwaway one for replaying a file).
        ssh_config: ``-F FILE`` for Home's host list and typed destinations.
        export_dir: where exported markdown goes (default ``GPUWS_HOME/exports``).
        now: the wall clock (tests freeze it).
        step_clock: the clock connection steps are timed with (tests make it tick evenly).
    """

    TITLE = "gpuws"
    CSS_PATH = "app.tcss"
    COMMANDS = App.COMMANDS | {ActionsProvider}
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("question_mark", "help", "Help", show=False),
        Binding("ctrl+q", "quit", "Quit", show=False, priority=True),
    ]

    def __init__(self, start: Start, *, store: StoreHandle | None = None,
                 ssh_config: str | None = None, export_dir: Path | None = None,
                 now: Callable[[], float] = time.time,
                 step_clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.start = start
        self.store = store or StoreHandle()
        self.ssh_config = ssh_config
        self.export_dir = export_dir
        self.now = now
        self.step_clock = step_clock
        self.engine = Engine(self.store, on_batch=self._deliver, on_side=self.on_side_event,
                             on_notice=self.on_notice, pull_progress=self._pull_progress)
        self.link: Link | None = None
        self.last_target: Target | None = None
        self.telemetry = TelemetryHistory()
        self.run_screens: dict[str, list[RunScreen]] = {}
        self.pending_baselines: dict[str, str] = {}
        self.last_run_id: str | None = None
        #: Runs this connection follows that have not finished (left with esc, say): the
        #: dashboard names them, and quitting says how to attach again.
        self.runs_going: set[str] = set()
        #: The workload the launcher held last, by pod (the launcher opens on it again).
        self.chosen_workloads: dict[str, str] = {}
        #: Arrival-to-pane latencies in seconds, kept only while ``measure`` is True (bench).
        self.measure = False
        self.latencies: list[float] = []
        self._shut_down = False
        self._economics_timer: Timer | None = None
        #: The watch loop the watch screen shows (one at a time), while it runs.
        self.watch_loop: WatchLoop | None = None

    # ------------------------------------------------------------------ lifecycle
    @property
    def feed(self) -> EventFeed:
        """The engine's feed: events stored, then delivered."""
        return self.engine.feed

    def on_mount(self) -> None:
        self.engine.start()
        start = self.start
        if isinstance(start, StartConnect):
            self.last_target = start.target
            self.push_screen(ConnectingScreen(start.target))
        elif isinstance(start, StartReplay):
            self._work(workers.replay(self, start), "replay", f"replay {start.source}")
        else:
            self.push_screen(HomeScreen())

    async def shutdown(self) -> None:
        """End the session and close the link and the store (idempotent)."""
        if self._shut_down:
            return
        self._shut_down = True
        self.link = None
        try:
            await self.engine.close()
        finally:
            await self.store.close()

    async def action_quit(self) -> None:
        """Leave gpuws; runs on the pod go on."""
        await self.shutdown()
        self.exit(0)

    # ------------------------------------------------------------------ workers
    def _work(self, coro: Coroutine[Any, Any, Any], group: str, description: str,
              exclusive: bool = False) -> Worker[Any]:
        return self.run_worker(coro, group=group, name=group, exclusive=exclusive,
                               exit_on_error=False, description=description)

    @on(Worker.StateChanged)
    def _worker_failed(self, event: Worker.StateChanged) -> None:
        """The one place a failed worker is handled, by its group."""
        if event.state is not WorkerState.ERROR:
            return
        error = event.worker.error
        if event.worker.group == "connect":
            screen = self._find(ConnectingScreen)
            if screen is not None:
                if isinstance(error, UnknownHostKey):
                    screen.ask_host_key(error)
                else:
                    screen.show_failure(error or RuntimeError("unknown failure"))
                return
        self.report_error(error, event.worker.description)

    # ------------------------------------------------------------------ text for people
    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None, markup: bool = True) -> None:
        """Textual's notification, with the pod's words in mind: no control character in
        a message or title reaches the terminal (a reason, a path, a run's status all come
        from the pod). Every gpuws call passes ``markup=False`` (a test holds them to it);
        the default stays Textual's for Textual's own hints, which use markup."""
        super().notify(message if markup else visible_lines(message), title=visible(title, 200),
                       severity=severity, timeout=timeout, markup=markup)

    def format_title(self, title: str, sub_title: str) -> Content:
        """The header's title line. Screens make the pod's words in their titles visible
        where they set them; this keeps any that did not from the terminal."""
        return super().format_title(visible(title, 400), visible(sub_title, 400))

    def report_error(self, error: BaseException | None, doing: str = "") -> None:
        """Show a failure with its cause and remedy (a notification that stays a while)."""
        if isinstance(error, GpuwsError):
            remedy = f"\n→ {error.remedy}" if error.remedy else ""
            self.notify(error.message + remedy, title=error.title, severity="error", timeout=15,
                        markup=False)
        else:
            where = f" while trying to {doing}" if doing else ""
            self.notify(f"{type(error).__name__}: {error}{where}", title="Unexpected error",
                        severity="error", timeout=15, markup=False)

    # ------------------------------------------------------------------ event routing
    def on_side_event(self, ev: protocol.Events) -> None:
        """Checked events that belong to no run: telemetry and the agent's logs."""
        if isinstance(ev, protocol.Telemetry):
            self.telemetry.add(ev)
            self._post(DashboardScreen, TelemetryTick())
        elif isinstance(ev, protocol.Log):
            self._post(DashboardScreen, AgentLog(ev))

    def on_notice(self, notice: Notice) -> None:
        """What the engine wants the person to know (already safe to show)."""
        from .screens.artifacts import ArtifactsScreen

        if notice.kind == "reconnected" and self.engine.link is not None:
            self.post_message(LinkUp(self.engine.link))
        elif notice.kind in ("link_lost", "reconnecting"):
            self._post(DashboardScreen, LinkDown(notice.message))
        elif notice.kind == "gave_up":
            self.post_message(LinkDown(notice.message))
            return
        elif notice.kind in ("pulled", "pull_failed") and notice.run_id is not None:
            run_id = notice.run_id
            names = [] if notice.kind == "pull_failed" else [notice.message]
            error = notice.message if notice.kind == "pull_failed" else None
            self.post_to_screens(ArtifactsScreen, lambda: PullDone(run_id, names, error))
            for run_screen in self.run_screens.get(run_id, []):  # its Timeline tab
                run_screen.post_message(PullDone(run_id, names, error))
        title = {"pulled": "Artifacts home", "refused": "Refused from the pod"}.get(
            notice.kind, "")
        self.notify(notice.message, title=title, severity=notice.severity, markup=False,
                    timeout=15 if notice.severity != "information" else 8)

    def _pull_progress(self, name: str, done: int, total: int) -> None:
        from .screens.artifacts import ArtifactsScreen

        run_id = self.last_run_id or ""
        self.post_to_screens(ArtifactsScreen, lambda: PullProgress(run_id, name, done, total))

    def _deliver(self, batch: Batch) -> None:
        by_run: dict[str, tuple[list[protocol.Events], list[float]]] = {}
        for ev, arrived in zip(batch.events, batch.arrived, strict=True):
            if ev.run_id is not None:
                events, times = by_run.setdefault(ev.run_id, ([], []))
                events.append(ev)
                times.append(arrived)
            elif isinstance(ev, protocol.Diagnosis):
                # Pod text: each piece made visible on its own, never read as markup.
                lines = [visible(ev.cause), *(f"→ {visible(r)}" for r in ev.remedies)]
                self.notify("\n".join(lines), title=visible(ev.title), severity="warning",
                            timeout=15, markup=False)
        for run_id, (events, times) in by_run.items():
            self._run_bookkeeping(run_id, events)
            for screen in self.run_screens.get(run_id, []):
                screen.post_message(RunEvents(run_id, events, times))

    def _run_bookkeeping(self, run_id: str, events: list[protocol.Events]) -> None:
        if run_id in self.pending_baselines:
            base = self.pending_baselines.pop(run_id)
            self._work(workers.set_baseline_of(self, run_id, base), "store",
                       f"compare {run_id} with {base}")
        link = self.link
        end = next((e for e in events if isinstance(e, protocol.RunFinished)), None)
        finished = end is not None
        watching = self.watch_loop is not None and run_id in self.watch_loop.run_ids
        if end is not None and link is not None and run_id in link.following and not watching:
            # The engine pulls its artifacts (the one "finished → pull" rule). The toast
            # says how it ended: "finished" read as a success for a failed or cancelled run.
            self.notify(run_end_line(run_id, end), timeout=5, markup=False,
                        severity="information" if end.status == "ok" else "warning")
        if link is not None and run_id in link.following and not watching:
            before = set(self.runs_going)
            (self.runs_going.discard if finished else self.runs_going.add)(run_id)
            if self.runs_going != before:
                for screen in self.screen_stack:
                    if isinstance(screen, DashboardScreen):
                        screen.show_runs_going(sorted(self.runs_going))

    def attach_hints(self) -> list[str]:
        """For each run still going on the pod, the command that follows it again."""
        target = self.link.target if self.link is not None else self.last_target
        if target is None:
            return []
        return [target.command("attach", run_id) for run_id in sorted(self.runs_going)]

    def register_run_screen(self, screen: RunScreen) -> None:
        """Route the run's events to this screen from now on."""
        self.run_screens.setdefault(screen.run_id, []).append(screen)
        self.last_run_id = screen.run_id

    def unregister_run_screen(self, screen: RunScreen) -> None:
        """Stop routing to a closed screen (events are still stored)."""
        screens = self.run_screens.get(screen.run_id, [])
        if screen in screens:
            screens.remove(screen)
        if not screens:  # no map entry per id a recording (or a pod) ever named
            self.run_screens.pop(screen.run_id, None)

    def note_shown(self, arrived: list[float]) -> None:
        """Record arrival-to-pane latencies (only while measuring)."""
        if self.measure:
            now = self.feed.clock()
            self.latencies.extend(now - t for t in arrived)

    def _post(self, kind: type[Screen[Any]], message: Any) -> None:
        screen = self._find(kind)
        if screen is not None:
            screen.post_message(message)

    def post_to_screens(self, kind: type[Screen[Any]], make: Callable[[], Any]) -> None:
        """Post a fresh message from ``make`` to every open screen of ``kind``."""
        for screen in self.screen_stack:
            if isinstance(screen, kind):
                screen.post_message(make())

    def _find(self, kind: type[Any]) -> Any:
        for screen in reversed(self.screen_stack):
            if isinstance(screen, kind):
                return screen
        return None

    # ------------------------------------------------------------------ link
    def connect_to(self, destination: str) -> None:
        """Connect to what Home was given (an alias, ``user@host[:port]``, ``local``)."""
        target = Target(destination, ssh_config=self.ssh_config)
        self.last_target = target
        self.push_screen(ConnectingScreen(target))

    def start_connect(self, target: Target, screen: ConnectingScreen) -> None:
        """Run the connection steps (results go to ``screen``)."""
        self.last_target = target
        self._work(workers.connect(self, target, screen), "connect",
                   f"connect to {target.host}", exclusive=True)

    def start_host(self, target: Target, argv: list[str], screen: ConnectingScreen) -> None:
        """Start a host that does not answer with its ``start`` command, then wait for SSH
        (the countdown goes to ``screen``). A connection attempt like any other: the
        "connect" group, so :meth:`cancel_connect` stops it and a failure reaches the
        screen's failure panel."""
        self._work(workers.start_host(self, target, argv, screen), "connect",
                   f"start {target.host}", exclusive=True)

    def cancel_connect(self) -> None:
        """Stop a connection attempt in progress."""
        self.workers.cancel_group(self, "connect")

    def on_link_up(self, message: LinkUp) -> None:
        link = self.link = message.link
        existing = self._find(DashboardScreen)
        if existing is not None:  # a reconnect: the dashboard (and open runs) stay
            existing.link_restored(link.probe, link.transport_label)
            if isinstance(self.screen, ConnectingScreen):
                self.pop_screen()
        else:
            dashboard = DashboardScreen(link.target.host, link.probe, link.transport_label,
                                        self.telemetry)
            if isinstance(self.screen, ConnectingScreen):
                self.switch_screen(dashboard)
            else:
                self.push_screen(dashboard)
        self._work(workers.after_connect(self, link), "link", "start telemetry and ask for ncu")
        if self._economics_timer is None:
            self._economics_timer = self.set_interval(1.0, self._economics_tick)
        for run_id, screens in self.run_screens.items():
            # Runs the engine did not follow yet (it re-attaches those it did by itself).
            if run_id not in link.following and any(
                    s.panes.model.finished is None for s in screens):
                self.attach_to(run_id)

    def on_link_down(self, message: LinkDown) -> None:
        """The engine gave up reconnecting: the person decides (R reconnects)."""
        self.link = None
        self.notify(f"{message.reason} — runs on the pod go on; R on the dashboard reconnects",
                    title="Connection lost", severity="error", timeout=20, markup=False)
        self._post(DashboardScreen, LinkDown(message.reason))

    def _economics_tick(self) -> None:
        if self.link is not None:
            self._work(workers.economics(self, self.link.session_id), "economics",
                       "compute the session's cost", exclusive=True)

    def on_economics_ready(self, econ: Economics) -> None:
        """Called by the economics worker."""
        from .messages import EconomicsTick

        self._post(DashboardScreen, EconomicsTick(econ))

    def can_reach_pod(self) -> bool:
        """Whether a link is up (cancel, attach and pull need one)."""
        return self.link is not None and not self.link.client.closed

    def link_label(self) -> str:
        """``host · transport`` of the link, or ``not connected``."""
        if self.link is None:
            return "not connected"
        return f"{self.link.target.host} · {self.link.transport_label}"

    def on_ncu_plan_ready(self, message: NcuPlanReady) -> None:
        self._post(DashboardScreen, NcuPlanReady(message.plan))

    def on_nsys_plan_ready(self, message: NsysPlanReady) -> None:
        self._post(DashboardScreen, NsysPlanReady(message.plan))

    # ------------------------------------------------------------------ navigation
    def go_home(self) -> None:
        """Back to Home (closing nothing)."""
        while len(self.screen_stack) > 2 and not isinstance(self.screen, HomeScreen):
            self.pop_screen()
        if not isinstance(self.screen, HomeScreen):
            self.switch_screen(HomeScreen())

    def action_help(self) -> None:
        """Explain gpuws and the keys of this screen."""
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.screen))

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand("Help", "What gpuws does, and the keys of this screen",
                            self.action_help)

    def open_run_screen(self, run_id: str, *, live: bool, backfill: bool = True) -> RunScreen:
        """Show a run's panes (reusing the screen if it is the current one)."""
        if isinstance(self.screen, RunScreen) and self.screen.run_id == run_id:
            return self.screen
        screen = RunScreen(run_id, live=live, backfill=backfill)
        self.push_screen(screen)
        return screen

    def leave_run(self, screen: RunScreen) -> None:
        """Close a run's screen; the run goes on and its events are still recorded.

        Leaving the last screen of ``gpuws replay`` leaves the replay: gpuws exits, as the
        footer's "esc Leave replay" says (before, it stayed with a toast).
        """
        if len(self.screen_stack) > 2:
            self.pop_screen()
        elif not screen.live and isinstance(self.start, StartReplay):
            self.exit(0)
        elif self.link is None:
            self.notify("this is the only screen; q quits", timeout=4, markup=False)

    # ------------------------------------------------------------------ actions (palette too)
    def action_open_sessions(self) -> None:
        """Every recorded session: replay its runs, export it."""
        self.open_sessions()

    def open_sessions(self, select: str | None = None) -> None:
        """Open the sessions screen, optionally on one session."""
        from .screens.sessions import SessionsScreen

        self.push_screen(SessionsScreen(select))

    def action_new_run(self) -> None:
        """Choose a workload and tiers, and start a run on the pod."""
        if not self.can_reach_pod():
            self.notify("connect to a pod first", severity="warning", markup=False)
            return
        self._work(workers.open_launcher(self), "store", "list baseline candidates")

    def remember_workload(self, workload: str) -> None:
        """What the launcher held when it closed, for the next time it opens on this pod."""
        if self.link is not None:
            self.chosen_workloads[self.link.target.host] = workload

    def launch_run(self, spec: protocol.RunSpec, baseline: str | None,
                   workspace: str | None = None) -> None:
        """Ask the pod to start ``spec`` (called by the launcher), in ``workspace`` synced
        first when one is given."""
        self._work(workers.launch(self, spec, baseline, workspace), "run",
                   f"start {spec.workload}")

    def start_watch(self, options: LaunchOptions, baseline: str | None) -> None:
        """Run the watch loop for the launcher's options on this connection (called by the
        launcher, which checked them): every save is a run, shown on the watch screen."""
        from ..live.watchloop import watched_paths
        from .screens.watch import WatchScreen

        if self.watch_loop is not None and not self.watch_loop.stopped:
            self.notify("a watch loop runs already: esc on its screen stops it",
                        severity="warning", markup=False)
            return
        roots = watched_paths(options.workspace, options.workload)
        screen = WatchScreen(options.workload, roots)
        self.pop_screen()  # the launcher
        self.push_screen(screen)
        self._work(workers.watch(self, screen, options, roots, baseline), "watch",
                   f"watch {options.workload}")

    def stop_watch(self) -> None:
        """End the watch loop; an iteration's run is cancelled on the pod (and stored)."""
        if self.watch_loop is not None:
            self.watch_loop.stop(cancel_run=True)

    def mark_watch_baseline(self, n: int) -> None:
        """Compare the watch loop's iterations with iteration ``n`` from now on."""
        loop = self.watch_loop
        if loop is not None:
            self._work(workers.watch_baseline(self, loop, n), "store",
                       f"compare the iterations with #{n}")

    def cancel_run(self, run_id: str) -> None:
        """Cancel a run on the pod."""
        self._work(workers.cancel(self, run_id), "run", f"cancel {run_id}")

    def action_attach_run(self) -> None:
        """Pick one of the pod's runs and follow it (fetching what the store lacks)."""
        if not self.can_reach_pod():
            self.notify("connect to a pod first", severity="warning", markup=False)
            return
        self._work(workers.pick_run(self), "run", "list the pod's runs")

    def attach_to(self, run_id: str) -> None:
        """Follow a run from ``store.last_seq + 1`` and show it."""
        self._work(workers.attach(self, run_id), "run", f"attach to {run_id}")

    def action_results(self) -> None:
        """Results of the latest run."""
        if self.last_run_id:
            self.show_results(self.last_run_id)
        else:
            self.notify("no run yet: n starts one", severity="warning", markup=False)

    def show_results(self, run_id: str) -> None:
        """Open a run's results."""
        from .screens.results import ResultsScreen

        self.push_screen(ResultsScreen(run_id))

    def action_artifacts(self) -> None:
        """Artifacts of the latest run."""
        if self.last_run_id:
            self.show_artifacts(self.last_run_id)
        else:
            self.notify("no run yet: n starts one", severity="warning", markup=False)

    def show_artifacts(self, run_id: str) -> None:
        """Open a run's artifacts."""
        from .screens.artifacts import ArtifactsScreen

        self.push_screen(ArtifactsScreen(run_id))

    @property
    def replaying_file(self) -> bool:
        """Whether this app replays a recording file: into a throwaway store (a recording
        is untrusted and never enters the person's sessions), so nothing marked or stored
        in it outlives the app."""
        return isinstance(self.start, StartReplay) and self.store.is_throwaway

    def action_export(self) -> None:
        """Write the current session as a markdown report."""
        sid = self.engine.session_id
        if sid is None:
            self.notify("no session to export yet", severity="warning", markup=False)
        elif self.replaying_file:
            # The report lasts; the throwaway session it was read from does not: the file
            # is named after the recording, not after a session id that will not exist.
            assert isinstance(self.start, StartReplay)
            self._work(workers.export(self, sid, replay_export_name(self.start.source)),
                       "export", f"export the replay of {self.start.source}")
        else:
            self.export_session(sid)

    def export_session(self, session_id: str) -> None:
        """Write a session as markdown under the export directory."""
        self._work(workers.export(self, session_id), "export", f"export session {session_id}")

    def exports_dir(self) -> Path:
        """Where exports are written."""
        return self.export_dir or gpuws_home() / "exports"

    def action_reconnect(self) -> None:
        """Connect again to the last pod (open runs are re-attached)."""
        if self.last_target is None:
            self.notify("no pod to reconnect to", severity="warning", markup=False)
        elif not self.can_reach_pod():
            self.push_screen(ConnectingScreen(self.last_target))

    def action_disconnect(self) -> None:
        """Close the connection (runs on the pod go on) and go Home."""
        self._work(workers.disconnect(self), "link", "disconnect")

    def confirm_ncu_install(self, plan: protocol.NcuPlan) -> None:
        """Ask, then run the ncu install plan on the pod."""
        from rich.text import Text

        from .screens.confirm import ConfirmScreen

        body = Text("These commands run on the pod, then ncu is verified with --version "
                    "and a one-pass smoke profile:\n")
        for step in plan.install_plan or []:
            body.append("\n$ " + visible(step_text(step)), "bold")

        def answered(yes: bool | None) -> None:
            if yes:
                self._work(workers.install_ncu(self), "ncu", "install ncu on the pod")

        self.push_screen(ConfirmScreen(f"Install ncu {plan.install_target_version or ''} on "
                                       "the pod?", body, "Install"), answered)

    def confirm_nsys_install(self, plan: protocol.NsysPlan) -> None:
        """Ask, then run the nsys install plan on the pod."""
        from rich.text import Text

        from ..text.textsafe import markup_escape
        from .screens.confirm import ConfirmScreen

        body = Text(visible(f"{plan.install_how}. These commands run on the pod, then nsys "
                            "is verified with --version and a smoke profile that must write "
                            "a report:\n"))
        for step in plan.install_plan or []:
            body.append("\n$ " + visible(step_text(step)), "bold")

        def answered(yes: bool | None) -> None:
            if yes:
                self._work(workers.install_nsys(self), "nsys", "install nsys on the pod")

        self.push_screen(ConfirmScreen(markup_escape(f"Install {plan.install_target or 'nsys'} "
                                                     "on the pod?"), body, "Install"), answered)

    # ------------------------------------------------------------------ store readers
    def load_home(self, screen: Screen[Any]) -> None:
        """Read Home's hosts and sessions."""
        self._work(workers.load_home(self, screen), "store", "read the hosts and sessions")

    def load_sessions(self, screen: Screen[Any], session_id: str | None) -> None:
        """Read the sessions and one session's runs."""
        self._work(workers.load_sessions(self, screen, session_id), "sessions",
                   "read the sessions", exclusive=True)

    def backfill(self, screen: RunScreen) -> None:
        """Send a run screen what the store already holds for its run."""
        self._work(workers.backfill(self, screen), "store", f"read run {screen.run_id}")

    def load_results(self, screen: Screen[Any]) -> None:
        """Read a run's results for the results screen."""
        self._work(workers.load_results(self, screen), "store", "read the results")

    def load_artifacts(self, screen: Screen[Any]) -> None:
        """Read a run's artifacts for the artifacts screen."""
        self._work(workers.load_artifacts(self, screen), "store", "read the artifacts")

    def pull(self, run_id: str) -> None:
        """Pull a run's artifacts home."""
        self._work(workers.pull(self, run_id, quiet=False), "pull", f"pull {run_id}")

    def mark_baseline(self, run_id: str) -> None:
        """Make a run the baseline of its workload."""
        self._work(workers.mark_baseline(self, run_id), "store", f"mark {run_id} baseline")

    def replay_stored_run(self, run_id: str) -> None:
        """Show a stored run's panes, filled from the store."""
        self.open_run_screen(run_id, live=self.link is not None and run_id in self.link.following)


def replay_export_name(source: str) -> str:
    """``gpuws-replay-STEM.md`` for a recording file (its name tamed to a safe file name)."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(source).stem).strip("._") or "recording"
    return f"gpuws-replay-{stem[:80]}.md"


def run_end_line(run_id: str, end: protocol.RunFinished) -> str:
    """How a followed run ended, in one toast line: ``run … ok in 2.3 s``, ``run … failed:
    why``, ``run … cancelled``."""
    if end.status == "ok":
        return f"run {run_id} ok in {fmt.duration(end.wall_s)}"
    if end.status == "cancelled":
        return f"run {run_id} cancelled after {fmt.duration(end.wall_s)}"
    why = end.error or (f"exit code {end.exit_code}" if end.exit_code is not None else "")
    # The pod's words: made visible, and cut so the toast stays a line or two.
    return f"run {run_id} failed" + (f": {visible(why, 160)}" if why else "")
