"""A run, live or replayed: the panes fill as its events are stored.

The screen first shows what the store already holds for the run (a run may have sent
events before the screen opened, or be a replay), then the events that arrive; the
model ignores any event it has already seen, so the two never double up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Footer, Header, TabbedContent

from ...text.textsafe import visible
from ..messages import ArtifactsData, Backfill, PullDone, RunEvents
from ..widgets.run.run_panes import RunPanes

if TYPE_CHECKING:
    from ..app import GpuwsApp

_TABS = ("tab-timing", "tab-kernels", "tab-metrics", "tab-findings", "tab-verdict",
         "tab-timeline")


class RunScreen(Screen[None]):
    """The live metric panes of one run.

    Args:
        run_id: the run.
        live: the run is followed over a link now (cancel and attach make sense);
            otherwise it is a replay.
        backfill: first show what the store holds for the run; a paced replay turns
            this off and sends every event through the feed instead.
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("c", "cancel", "Cancel run"),
        # One key, three meanings; check_action shows the one that is true: leaving a live
        # run lets it go on, leaving a replay or a finished run is just going back.
        Binding("escape,d", "detach", "Leave (run goes on)"),
        Binding("escape,d", "leave_replay", "Leave replay"),
        Binding("escape,d", "back", "Back"),
        Binding("a", "attach", "Re-attach"),
        Binding("r", "results", "Results"),
        Binding("f", "artifacts", "Artifacts"),
        Binding("e", "app.export", "Export"),
        Binding("1", "tab(0)", "Timing", show=False),
        Binding("2", "tab(1)", "Kernels", show=False),
        Binding("3", "tab(2)", "Metrics", show=False),
        Binding("4", "tab(3)", "Findings", show=False),
        Binding("5", "tab(4)", "Verdict", show=False),
        Binding("6", "tab(5)", "Timeline", show=False),
        Binding("question_mark", "app.help", "Help"),
        Binding("q", "app.quit", "Quit", show=False),
    ]
    # Wide terminals put the log beside the tabs instead of under them.
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (140, "-wide")]  # noqa: RUF012
    DEFAULT_CSS = """
    RunScreen.-wide RunPanes #body { layout: horizontal; }
    RunScreen.-wide RunPanes #run-tabs { width: 3fr; }
    RunScreen.-wide RunPanes #log-pane { width: 2fr; height: 1fr; max-height: 100%;
                                         border-top: none; border-left: solid $primary 50%; }
    """

    app: GpuwsApp

    def __init__(self, run_id: str, *, live: bool, backfill: bool = True) -> None:
        super().__init__()
        self.run_id = run_id
        self.live = live
        self._backfilled = not backfill
        self._held: list[RunEvents] = []
        self._clock: Timer | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        yield RunPanes(self.run_id, id="panes")
        yield Footer()

    @property
    def panes(self) -> RunPanes:
        """The panes (and, through them, the run's model)."""
        return self.query_one(RunPanes)

    def on_mount(self) -> None:
        self.title = f"run {visible(self.run_id, 80)}"
        self._update_subtitle()
        self.app.register_run_screen(self)
        if self.live and self.app.link is not None:
            # The session's rate prices Tier 3's estimate in the tier strip (a replay may
            # be another session's run: no rate rather than the wrong one).
            self.panes.model.rate_usd_per_hour = self.app.link.rate
        if not self._backfilled:
            self.app.backfill(self)
        if self.live:
            # The title's clock and the running tiers' ages move every second, not only
            # when an event comes (a quiet workload sends none for seconds).
            self._clock = self.set_interval(1.0, self._tick)

    @property
    def clock_running(self) -> bool:
        """Whether the title's clock still ticks (only while a live run goes on)."""
        return self._clock is not None

    def on_unmount(self) -> None:
        self.app.unregister_run_screen(self)

    def on_backfill(self, message: Backfill) -> None:
        self.panes.apply(message.events)
        self._backfilled = True
        if self.panes.model.finished is not None:
            # A finished run opens on what matters first: what bounds it (then its
            # timeline, next door), not Tier 1's chart or one kernel's counters.
            self.query_one(TabbedContent).active = "tab-verdict"
            self.app.load_artifacts(self)
        held, self._held = self._held, []
        for batch in held:
            self.on_run_events(batch)
        self._update_subtitle()
        self.refresh_bindings()  # the footer's esc says "Back" once the run has finished

    def on_run_events(self, message: RunEvents) -> None:
        if not self._backfilled:
            self._held.append(message)  # shown after what the store already had
            return
        changed = self.panes.apply(message.events)
        self.app.note_shown(message.arrived)
        if "finished" in changed:
            self.app.load_artifacts(self)  # the Timeline tab: the trace, or why none
        if changed & {"header", "finished"}:
            self._update_subtitle()
            self.refresh_bindings()

    def on_artifacts_data(self, message: ArtifactsData) -> None:
        self.panes.show_trace(message.rows)

    def on_pull_done(self, message: PullDone) -> None:
        if self.panes.model.finished is not None:
            self.app.load_artifacts(self)  # the trace may be home now

    def _tick(self) -> None:
        if self.panes.model.finished is not None:
            self._stop_clock()
            return
        self.panes.tick(self.app.now())
        self._update_subtitle()

    def _stop_clock(self) -> None:
        if self._clock is not None:
            self._clock.stop()
            self._clock = None

    def _update_subtitle(self) -> None:
        """The title line. While a live run goes on its clock reads the app's clock (the
        same the tier strip ages its tiers by); a replay's reads up to its last event, a
        finished run's its wall time."""
        m = self.panes.model
        if m.finished is not None:
            self._stop_clock()  # the end: nothing moves any more
        now = self.app.now() if self._clock is not None else None
        host = f" on {m.hostname}" if m.hostname else ""
        gpu = self.panes.gpu
        if gpu is not None:
            host += f" · GPU {gpu.index}"
        mode = "" if self.live else " · replay"
        # The workload, the pod's hostname and the status are the pod's words: visible.
        self.sub_title = visible(f"{m.workload or '…'}{host} · {m.status} · "
                                 f"{m.elapsed(now):.1f} s{mode}", 400)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        finished = self.panes.model.finished is not None if self.is_mounted else False
        if action == "cancel":
            return self.app.can_reach_pod() and not finished
        if action == "attach":
            return self.app.can_reach_pod() and not finished
        if action == "detach":
            return self.live and not finished
        if action == "leave_replay":
            return not self.live
        if action == "back":
            return self.live and finished
        return True

    def action_cancel(self) -> None:
        """Cancel the run on the pod (its whole process group)."""
        self.app.cancel_run(self.run_id)

    def action_detach(self) -> None:
        """Leave this screen; the run goes on on the pod and is still recorded."""
        self.app.leave_run(self)

    def action_leave_replay(self) -> None:
        """Leave this replay (nothing runs: the panes were read from a recording)."""
        self.app.leave_run(self)

    def action_back(self) -> None:
        """Leave this finished run's panes."""
        self.app.leave_run(self)

    def action_attach(self) -> None:
        """Ask the pod for what the store lacks of this run, and follow it."""
        self.app.attach_to(self.run_id)

    def action_results(self) -> None:
        """The run's results: metrics by section, findings, roofline, comparison."""
        self.app.show_results(self.run_id)

    def action_artifacts(self) -> None:
        """The run's artifacts and their pull progress."""
        self.app.show_artifacts(self.run_id)

    def action_tab(self, index: int) -> None:
        """Switch to the index-th tab."""
        self.query_one(TabbedContent).active = _TABS[index]
