"""The live metric panes of one run; the same code shows a live run and a replay.

``apply(events)`` folds events into the run's :class:`~gpuws.live.model.RunModel` and
redraws only the panes whose part of the model changed, once per batch. A GPU that other
processes used when the run started is named in a banner above the tabs; a pane that
will stay empty (the run failed, was cancelled, or did not ask for its tier) says why.
"""

from __future__ import annotations

import time

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.css.query import NoMatches
from textual.timer import Timer
from textual.widgets import DataTable, Label, TabbedContent, TabPane

from .... import protocol
from ....gpu import gpus
from ....live import timeline, verdicts
from ....live.model import LogLine, RunModel
from ....sessions.store import ArtifactRow
from ....text.textsafe import visible
from ... import fmt
from ...notes import why_missing, why_no_verdict
from ...results import no_trace_why
from ..quiet import QuietStatic
from .banner import DiagnosisBanner
from .kernel_table import KernelTablePane, kernel_table_caption
from .metrics_table import MetricsTable
from .ncu_progress import NcuProgressPane
from .output_log import OutputLog
from .rules import RuleList
from .tier_strip import TierStrip
from .timeline import TimelinePane, TimelineView
from .timing import TimingPane
from .verdict import VerdictView

#: Most redraws per second of the Tier-1 pane while samples stream in.
TIMING_FPS = 4
_PREFIX = {0: "run", 1: "T1", 2: "T2", 3: "T3"}
#: The parts of the model a verdict is derived from.
VERDICT_PARTS = frozenset({"verdict", "kernels", "metrics", "rules", "static", "tier1", "tiers",
                           "diagnoses", "header", "finished"})
_STREAM = {"stdout": "out", "stderr": "err", "warning": "wrn", "error": "err"}


class RunPanes(Vertical):
    """Tier strip, diagnosis banners, tabs (timing, kernels, metrics, findings, verdict,
    timeline), and the log."""

    DEFAULT_CSS = """
    RunPanes { height: 1fr; }
    RunPanes #banners { height: auto; max-height: 9; }
    RunPanes #body { height: 1fr; }
    RunPanes #run-tabs { height: 1fr; }
    RunPanes #log-pane { height: 30%; min-height: 4; max-height: 14;
                         border-top: solid $primary 50%; }
    RunPanes #log-title { color: $text-muted; padding: 0 1; height: 1; width: 1fr; }
    RunPanes #run-log { height: 1fr; scrollbar-size-horizontal: 0; }
    RunPanes .caption { color: $text-muted; padding: 0 1; height: auto; }
    """

    def __init__(self, run_id: str, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.model = RunModel(run_id)
        self._banners_shown = 0
        self._log_lines = 0
        self._timing_drawn = 0.0
        self._timing_timer: Timer | None = None
        #: What each heavy pane shows now, to skip redrawing the same content.
        self._shown: dict[str, object] = {"kernels": None, "metrics": []}
        #: The GPU the run was pinned to (from RunStarted), once it is known.
        self.gpu: protocol.GpuTarget | None = None
        #: A busy-GPU banner was made here from RunStarted (the agent's own is then skipped).
        self._busy_shown = False

    def compose(self) -> ComposeResult:
        yield TierStrip(id="tiers")
        yield VerticalScroll(id="banners")
        with Vertical(id="body"):
            with TabbedContent(id="run-tabs"):
                with TabPane("Timing", id="tab-timing"):
                    yield TimingPane(id="timing")
                with TabPane("Kernels", id="tab-kernels"), VerticalScroll():
                    yield QuietStatic(kernel_table_caption(None), id="kernels-caption",
                                      classes="caption")
                    yield KernelTablePane(id="kernels")
                    yield QuietStatic("", id="kernel-full", classes="caption")
                    yield Label("ncu progress", classes="caption")
                    yield NcuProgressPane(id="ncu")
                    yield QuietStatic("", id="static", classes="caption")
                with TabPane("Metrics", id="tab-metrics"):
                    yield MetricsTable(id="metrics")
                with TabPane("Findings", id="tab-findings"), VerticalScroll():
                    yield RuleList(id="rules")
                with TabPane("Verdict", id="tab-verdict"), VerticalScroll():
                    yield VerdictView(id="verdict")
                with TabPane("Timeline", id="tab-timeline"):
                    yield TimelinePane(id="timeline")
            with Vertical(id="log-pane"):
                yield Label("output", id="log-title")
                yield OutputLog(id="run-log", max_lines=5000)

    def on_mount(self) -> None:
        try:
            self.query_one("#banners").display = False
            self.query_one(TierStrip).show(self.model)
            self.query_one(NcuProgressPane).show({})
            self.query_one(MetricsTable).show([])
            self.query_one(RuleList).show([])
            self.query_one(VerdictView).show(verdicts.Verdicts())
        except NoMatches:
            # The screen closed while it was being built (the app quitting on SIGTERM, a
            # screen replaced at once): nothing left to draw into. Seen as a traceback and
            # exit 1 when a replay was ended right as it opened.
            return

    @on(TabbedContent.TabActivated, "#run-tabs", pane="#tab-timeline")
    def _timeline_shown(self) -> None:
        """The timeline's keys work as soon as its tab shows (its footer lists them)."""
        view = self.query_one(TimelineView)
        if view.display:
            view.focus()

    def show_trace(self, rows: list[ArtifactRow]) -> None:
        """The run's artifacts as the store has them: draw its timeline trace once home."""
        m = self.model
        row = next((r for r in rows if r.name == timeline.FILE_NAME), None)
        why = ""
        if row is None:
            tiers = m.spec.tiers if m.spec is not None else [1, 2, 3]
            status = m.finished.status if m.finished is not None else "running"
            why = no_trace_why(tiers, m.kernel_table, status,
                               why_missing(m, 2, "kernel table") or "")
        self.query_one(TimelinePane).show_trace(row, m.kernel_table, why)

    @on(DataTable.RowHighlighted, "#kernels")
    def _kernel_highlighted(self, event: DataTable.RowHighlighted) -> None:
        """The full demangled name of the highlighted kernel, under the table."""
        full = self.query_one(KernelTablePane).full_name(event.row_key.value)
        shown = visible(full) if full is not None and verdicts.short(full) != full else ""
        self.query_one("#kernel-full", QuietStatic).show_if_changed(shown, Text(shown, "dim"))

    def apply(self, events: list[protocol.Events]) -> set[str]:
        """Fold events into the model and redraw what changed; returns the changed parts."""
        changed, lines = self.model.apply(events)
        if not changed:
            return changed
        m = self.model
        if "header" in changed and self.gpu is None:
            self._gpu_started(events)
        if lines:
            self._write_log(lines)
        if changed & {"header", "tiers", "finished"}:
            self.query_one(TierStrip).show(m)
        if changed & {"samples", "tier1", "header", "tiers", "finished"}:
            self._timing_soon()
        table = m.kernel_table
        table_key = (None if table is None else
                     (table.source, table.kernels, table.gpu_idle_pct, table.memcpy_pct))
        if "kernels" in changed and table_key != self._shown["kernels"]:
            self._shown["kernels"] = table_key
            self.query_one(KernelTablePane).show(m.kernel_table)
            self.query_one("#kernels-caption", QuietStatic).show_if_changed(
                kernel_table_caption(m.kernel_table), kernel_table_caption(m.kernel_table), 1)
            self._label("tab-kernels", f"Kernels ({len(m.kernel_table.kernels)})"
                        if m.kernel_table else "Kernels")
        if "ncu" in changed:
            self.query_one(NcuProgressPane).show(m.ncu)
        if "static" in changed:
            text = render_static(m.static)
            self.query_one("#static", QuietStatic).show_if_changed(text.plain, text)
        if "metrics" in changed:
            key = [(x.kernel, x.launch, x.metrics, x.stalls) for x in m.metrics]
            if key != self._shown["metrics"]:
                self._shown["metrics"] = key
                self.query_one(MetricsTable).show(m.metrics)
            self._label("tab-metrics", f"Metrics ({len(m.metrics)})")
        if "rules" in changed:
            self.query_one(RuleList).show(m.rules)
            self._label("tab-findings", f"Findings ({len(m.rules)})")
        if "diagnoses" in changed:
            self._show_banners()
        if changed & VERDICT_PARTS:
            self.query_one(VerdictView).show(verdicts.derive(verdicts.inputs_from_model(m)),
                                             why_no_verdict(m) or "")
        if changed & {"header", "tiers", "finished"}:
            self._show_why_empty()
        return changed

    def _gpu_started(self, events: list[protocol.Events]) -> None:
        started = next((e for e in events if isinstance(e, protocol.RunStarted)
                        and e.run_id == self.model.run_id and e.gpu is not None), None)
        if started is None or started.gpu is None:
            return
        self.gpu = started.gpu
        busy = busy_diagnosis(started.gpu)
        if busy is not None and not any(d.code == busy.code for d in self.model.diagnoses):
            # The agent warns too (a gpu_busy diagnosis); one banner is enough.
            self._busy_shown = True
            box = self.query_one("#banners", VerticalScroll)
            box.mount(DiagnosisBanner(busy))
            box.display = True

    def _show_why_empty(self) -> None:
        """Once the run will not fill a pane, say why instead of "… yet"."""
        m = self.model
        if not m.metrics:
            why = why_missing(m, 3, "Tier-3 metrics")
            if why != self._shown.get("metrics-why"):
                self._shown["metrics-why"] = why
                self.query_one(MetricsTable).show([], why)
        if not m.rules:
            self.query_one(RuleList).show([], why_missing(m, 3, "rule findings"))
        if m.kernel_table is None:
            caption = kernel_table_caption(None, why_missing(m, 2, "kernel table"))
            self.query_one("#kernels-caption", QuietStatic).show_if_changed(caption, caption, 1)

    def _timing_soon(self) -> None:
        # The Tier-1 pane is a gauge: under a flood of samples it redraws at most
        # TIMING_FPS times a second (its statistics need every sample in order), and
        # once more after the burst, so the last state (the final result) always shows.
        if self._timing_timer is not None:
            return
        wait = self._timing_drawn + 1 / TIMING_FPS - time.monotonic()
        if wait <= 0:
            self._draw_timing()
        else:
            self._timing_timer = self.set_timer(wait, self._draw_timing)

    @property
    def timing_redraw_pending(self) -> bool:
        """A Tier-1 redraw is held back by the throttle and will come (a test waits on it
        rather than on a pause long enough on an idle machine)."""
        return self._timing_timer is not None

    def _draw_timing(self) -> None:
        if self._timing_timer is not None:
            self._timing_timer.stop()
            self._timing_timer = None
        self._timing_drawn = time.monotonic()
        self.query_one(TimingPane).show(self.model)

    def tick(self, now: float) -> None:
        """Age the running tiers while the run is live (``now`` in unix seconds)."""
        if self.model.finished is None and self.model.started is not None:
            self.query_one(TierStrip).show(self.model, now)

    def _write_log(self, lines: list[LogLine]) -> None:
        self._log_lines += len(lines)
        self.query_one("#run-log", OutputLog).add_lines([
            f"{_source(ln)} {_STREAM.get(ln.stream, visible(ln.stream[:3], None))}│ "
            f"{visible(ln.text)}" for ln in lines])
        # The title's size never changes (width 1fr, one line): no layout pass.
        lines_word = "line" if self._log_lines == 1 else "lines"
        self.query_one("#log-title", Label).update(f"output · {self._log_lines} {lines_word}",
                                                  layout=False)

    def _show_banners(self) -> None:
        new = self.model.diagnoses[self._banners_shown:]
        self._banners_shown = len(self.model.diagnoses)
        if self._busy_shown:
            new = [d for d in new if d.code != "gpu_busy"]
        if not new:
            return
        box = self.query_one("#banners", VerticalScroll)
        box.mount_all(DiagnosisBanner(d) for d in new)
        box.display = True

    def _label(self, pane: str, label: str) -> None:
        if self._shown.get(pane) != label:
            self._shown[pane] = label
            self.query_one(TabbedContent).get_tab(pane).label = label


def busy_diagnosis(target: protocol.GpuTarget) -> protocol.Diagnosis | None:
    """A warning banner's content for a GPU others used when the run started (None: idle).

    Made here from ``RunStarted.gpu.busy`` (the pod's word, shown through textsafe by
    :func:`gpuws.gpu.gpus.processes`) when the agent's own ``gpu_busy`` diagnosis has not come
    with it; whichever comes first is the one banner shown.
    """
    if not target.busy:
        return None
    n = len(target.busy)
    return protocol.Diagnosis(
        code="gpu_busy", severity="warning",
        title=f"{gpus.label(target.index, target.name)} is busy",
        cause=f"{n} other process{'es' if n > 1 else ''} used it when the run started: "
              f"{gpus.processes(target.busy)}.",
        meaning="They share its SMs and memory bandwidth: this run's figures may be slower "
                "and noisier than the GPU gives alone.",
        remedies=["pick an idle GPU: the launcher's GPU field, or gpuws run --gpu N (the "
                  "dashboard shows who uses each)"])


def _source(line: LogLine) -> str:
    if line.stream in ("stdout", "stderr") and line.tier is not None:
        return _PREFIX.get(line.tier, f"T{line.tier}")
    return "agent"


def render_static(analyses: list[protocol.StaticAnalysis]) -> Text:
    """Registers, shared and local memory, and the theoretical occupancy they allow."""
    text = Text()
    for s in analyses:
        if text:
            text.append("\n")
        text.append("static ", "bold")
        occ = fmt.pct(s.theoretical_occupancy_pct, 0)
        regs = "?" if s.registers_per_thread is None else str(s.registers_per_thread)
        # At 100% nothing limits it: "(limited by registers)" there read as a problem.
        full = (s.theoretical_occupancy_pct is not None
                and s.theoretical_occupancy_pct >= 100)
        limit = " (the most an SM allows)" if full else f" (limited by {s.limiter or '?'})"
        # The kernel's name, the limiter and the source are the pod's words: visible.
        text.append(visible(f"{verdicts.short(s.kernel)}: {regs} regs/thread · "
                            f"{fmt.size(s.shared_mem_per_block)} smem/block · "
                            f"{fmt.size(s.local_mem_per_thread)} local/thread · block "
                            f"{s.block_size or '?'} → theoretical occupancy {occ}"
                            f"{limit} · {s.source}"))
    return text
