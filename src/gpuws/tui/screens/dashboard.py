"""The pod dashboard: what the pod has, whether it can profile, its telemetry and cost.

Every GPU of the pod is listed (in the probe panel: memory, clocks, power, heat, who uses
it) and sampled: a pod with one GPU shows a sparkline per quantity, a pod with several a
two-line row per GPU, so eight GPUs still fit beside the probe.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Header, Label, Log, Static

from ... import protocol
from ...live.link import probe_summary
from ...live.telemetry import GAUGES, TelemetryHistory
from ...sessions.cost import Economics
from ...text.textsafe import text as safe_text
from ...text.textsafe import visible
from ..messages import AgentLog, EconomicsTick, LinkDown, NcuPlanReady, NsysPlanReady, TelemetryTick
from ..widgets.pod.cost_ticker import CostTicker
from ..widgets.pod.counters import CountersPanel
from ..widgets.pod.gpu_row import GpuRow
from ..widgets.pod.ncu_panel import NcuPanel
from ..widgets.pod.nsys_panel import NsysPanel
from ..widgets.pod.pod_info import PodInfo
from ..widgets.pod.spark_gauge import SparkGauge

if TYPE_CHECKING:
    from ..app import GpuwsApp


class DashboardScreen(Screen[None]):
    """GPU(s), driver, CUDA, tools, counters; live telemetry sparklines; the cost ticker."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("n", "app.new_run", "New run"),
        Binding("a", "app.attach_run", "Attach"),
        Binding("r", "app.results", "Results"),
        Binding("f", "app.artifacts", "Artifacts"),
        Binding("s", "app.open_sessions", "Sessions"),
        Binding("e", "app.export", "Export"),
        Binding("i", "install_ncu", "Install ncu", show=False),
        Binding("R", "app.reconnect", "Reconnect", show=False),
        Binding("x", "app.disconnect", "Disconnect", show=False),
        Binding("question_mark", "app.help", "Help"),
        Binding("q", "app.quit", "Quit"),
    ]
    # Narrow terminals stack the two columns.
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (110, "-wide")]  # noqa: RUF012
    DEFAULT_CSS = """
    DashboardScreen #columns { height: 1fr; }
    DashboardScreen #left { width: 1fr; }
    DashboardScreen #right { width: 1fr; }
    DashboardScreen.-narrow #columns { layout: vertical; }
    /* At 80x24 the Pod panel had 7 rows and ncu, nsys and counters were below its fold:
       their verdicts get one line above the columns, the titles no blank line above, and
       the telemetry and cost only the rows they use. */
    DashboardScreen #tools-line { display: none; padding: 0 1; }
    DashboardScreen.-narrow #tools-line { display: block; height: 1; }
    DashboardScreen.-narrow .title { margin-top: 0; }
    DashboardScreen.-narrow #left { height: 1fr; }
    DashboardScreen.-narrow #right { height: auto; }
    DashboardScreen.-narrow SparkGauge { height: 1; }
    DashboardScreen.-narrow SparkGauge Sparkline { height: 1; }
    DashboardScreen.-narrow #agent-log { height: 3; }
    DashboardScreen .title { text-style: bold; background: $boost; padding: 0 1;
                             margin-top: 1; width: 100%; }
    DashboardScreen #link-banner { display: none; background: $error 20%; padding: 0 1;
                                   border-left: thick $error; }
    DashboardScreen #gauges { height: auto; padding: 0 1; }
    DashboardScreen.-narrow GpuRow { height: 1; }
    DashboardScreen.-narrow GpuRow .gpu-detail { display: none; }
    DashboardScreen #no-telemetry { padding: 0 1; color: $text-muted; }
    DashboardScreen #agent-log { height: 5; margin: 0 1; }
    DashboardScreen #agent-title, DashboardScreen #agent-log { display: none; }
    DashboardScreen #runs-going { display: none; background: $accent 20%; padding: 0 1;
                                  border-left: thick $accent; }
    """

    app: GpuwsApp

    def __init__(self, host: str, probe: protocol.Probe, transport: str,
                 history: TelemetryHistory) -> None:
        super().__init__()
        self.host = host
        self.probe = probe
        self.transport = transport
        self.history = history
        self.plan: protocol.NcuPlan | None = None
        self._nsys: protocol.NsysPlan | None = None
        self._telemetry_stopped = False

    def compose(self) -> ComposeResult:
        # The breakpoint's class from the start: it came with the first resize, so the
        # first paint had two columns and jumped to one a moment later.
        wide = self.app.size.width >= 110
        self.set_class(not wide, "-narrow")
        self.set_class(wide, "-wide")
        yield Header()
        yield Static(id="link-banner")
        yield Static(id="runs-going")
        yield Static(self._tools_line(), id="tools-line")
        with Horizontal(id="columns"):
            with VerticalScroll(id="left"):
                yield Label("Pod", classes="title")
                yield PodInfo(id="pod")
                yield Label("Performance counters", classes="title")
                yield CountersPanel(id="counters")
                yield Label("Nsight Compute", classes="title")
                yield NcuPanel(id="ncu")
                yield NsysPanel(id="nsys")  # shown once the agent answers
            with Vertical(id="right"):
                yield Label(self._telemetry_title(Text("waiting for the first sample…",
                                                       "dim")),
                            classes="title", id="telemetry-title")
                yield Static(Text("no GPU on this pod: nothing to sample", "yellow"),
                             id="no-telemetry")
                with Vertical(id="gauges"):
                    if len(self.probe.gpus) > 1:
                        for gpu in self.probe.gpus:
                            yield GpuRow(gpu)
                    else:
                        index = self.probe.gpus[0].index if self.probe.gpus else 0
                        for gauge in GAUGES:
                            yield SparkGauge(gauge, index)
                yield Label("Cost", classes="title")
                yield CostTicker(id="cost")
                # Shown with the agent's first message: an empty heading read as a panel
                # that failed to load, and took the rows the Pod panel needs at 80×24.
                yield Label("Agent", classes="title", id="agent-title")
                yield Log(id="agent-log", max_lines=200)
        yield Footer()

    def on_mount(self) -> None:
        self.title = f"gpuws · {visible(self.host, 200)}"
        # The hostname and the GPUs' names in the summary are the pod's words: visible.
        self.sub_title = visible(f"{self.probe.hostname} · {self.transport} · "
                                 f"{probe_summary(self.probe)}", 400)
        self.query_one(PodInfo).show(self.probe)
        self.query_one(CountersPanel).show(self.probe.counters)
        self.query_one(CostTicker).show(None)
        # Everything has its final place from the start: the gauges (blank until the
        # first sample), the cost's lines, the ncu and nsys panels. Filled in a second
        # later, nothing moves (the columns reflowed as each answer arrived).
        self.query_one("#gauges").display = bool(self.probe.gpus)
        self.query_one("#no-telemetry").display = not self.probe.gpus
        self.on_telemetry_tick(TelemetryTick())
        self.show_runs_going(sorted(self.app.runs_going))

    def on_screen_resume(self) -> None:
        self.show_runs_going(sorted(self.app.runs_going))

    def show_runs_going(self, run_ids: list[str]) -> None:
        """Name the runs still going on the pod that this connection follows (left with
        esc, say), and the key that brings one back."""
        line = self.query_one("#runs-going", Static)
        line.display = bool(run_ids)
        if run_ids:
            shown = ", ".join(run_ids[:3]) + (f" and {len(run_ids) - 3} more"
                                              if len(run_ids) > 3 else "")
            line.update(Text.assemble(
                (f"{len(run_ids)} run{'s' if len(run_ids) > 1 else ''} going on the pod: ",
                 "bold"), shown, " — a re-attaches, r shows results"))

    def _tools_line(self) -> Text:
        """Counters, ncu and nsys in one line (shown on narrow terminals, where their
        panels are below the Pod panel's fold)."""
        look = {"allowed": ("✓ counters allowed", "green"),
                "blocked": ("✗ counters blocked", "red")}
        verdict = self.probe.counters.verdict if self.probe.counters else "unknown"
        counters = look.get(verdict, ("? counters unknown", "yellow"))
        ncu = (("… ncu: asking", "dim") if self.plan is None
               else (visible(f"✓ ncu {self.plan.selected_version or '?'}", 30), "green")
               if self.plan.selected else ("✗ no ncu fits", "red"))
        nsys = self._nsys
        nsys_part = (("… nsys: asking", "dim") if nsys is None
                     else (visible(f"✓ nsys {nsys.selected_version or '?'}", 30), "green")
                     if nsys.selected else ("✗ no working nsys", "yellow"))
        return Text.assemble(counters, " · ", ncu, " · ", nsys_part,
                             (" — details under Pod", "dim"))

    def _telemetry_title(self, state: Text | None = None) -> Text:
        """The telemetry pane's title, with how sampling goes where it is not just going."""
        n = len(self.probe.gpus)
        title = Text("Telemetry (1 Hz)" if n < 2 else f"Telemetry of {n} GPUs (1 Hz)")
        if state is not None and self.probe.gpus:
            title.append(" · ")
            title.append(state)
        return title

    # -- gauges (coalesced messages: each redraws from the history, which keeps every sample)
    def on_telemetry_tick(self, _: TelemetryTick) -> None:
        if not self.history.gpus:
            return
        if not self._telemetry_stopped:
            self.query_one("#telemetry-title", Label).update(self._telemetry_title())
        for gauge in self.query(SparkGauge):
            gauge.show(self.history.values(gauge.gpu, gauge.gauge.key))
        for row in self.query(GpuRow):
            row.show(self.history)

    def on_economics_tick(self, message: EconomicsTick) -> None:
        self.show_economics(message.econ)

    def show_economics(self, econ: Economics) -> None:
        """Redraw the cost ticker."""
        self.query_one(CostTicker).show(econ, self.app.engine.pod_lease)

    # -- discrete
    def on_ncu_plan_ready(self, message: NcuPlanReady) -> None:
        self.plan = message.plan
        self.query_one(NcuPanel).show(message.plan)
        self.query_one("#tools-line", Static).update(self._tools_line())
        self.refresh_bindings()

    def on_nsys_plan_ready(self, message: NsysPlanReady) -> None:
        self._nsys = message.plan
        self.query_one(NsysPanel).show(message.plan)
        self.query_one("#tools-line", Static).update(self._tools_line())

    def on_nsys_panel_install_requested(self, message: NsysPanel.InstallRequested) -> None:
        self.app.confirm_nsys_install(message.plan)

    def on_agent_log(self, message: AgentLog) -> None:
        log = self.query_one("#agent-log", Log)
        log.display = self.query_one("#agent-title").display = True
        log.write_line(visible(f"{message.log.level}: {message.log.message}"))
        if message.log.message.startswith("telemetry stopped"):
            self._telemetry_stopped = True
            self.query_one("#telemetry-title", Label).update(self._telemetry_title(
                safe_text(message.log.message, "yellow", 200)))

    def on_link_down(self, message: LinkDown) -> None:
        banner = self.query_one("#link-banner", Static)
        banner.update(Text.assemble(("Connection lost: ", "bold"), message.reason,
                                    " — runs on the pod go on. Press R to reconnect."))
        banner.display = True

    def link_restored(self, probe: protocol.Probe, transport: str) -> None:
        """The pod is back: hide the connection-lost banner, show the fresh probe."""
        self.probe, self.transport = probe, transport
        self.query_one("#link-banner").display = False
        self.query_one(PodInfo).show(probe)
        self.query_one(CountersPanel).show(probe.counters)
        self.query_one("#tools-line", Static).update(self._tools_line())

    def on_ncu_panel_install_requested(self, message: NcuPanel.InstallRequested) -> None:
        self.app.confirm_ncu_install(message.plan)

    def action_install_ncu(self) -> None:
        """Install the ncu the plan proposes (asks first)."""
        if self.plan is not None:
            self.app.confirm_ncu_install(self.plan)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "install_ncu":
            plan = self.plan
            return bool(plan and plan.install_plan and not plan.selected and not plan.installed)
        return True
