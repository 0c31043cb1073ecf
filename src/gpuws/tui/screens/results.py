"""A run's results: metrics by section, findings by speedup, roofline, baseline comparison."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from rich.table import Table
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Header, Static, TabbedContent, TabPane

from ... import protocol
from ...gpu import clocks, evidence
from ...sessions.compare import Comparison, caution_lines, code_lines
from ...text.textsafe import text as safe_text
from ...text.textsafe import visible
from .. import fmt
from ..messages import ResultsData
from ..results import RunResults
from ..widgets.run.banner import DiagnosisBanner
from ..widgets.run.metrics_table import MetricsTable
from ..widgets.run.roofline import Roofline, ceilings_from, points_from
from ..widgets.run.rules import RuleList
from ..widgets.run.run_panes import render_static
from ..widgets.run.timeline import TimelinePane, TimelineView
from ..widgets.run.verdict import VerdictView

if TYPE_CHECKING:
    from ..app import GpuwsApp


class ResultsScreen(Screen[None]):
    """Everything a finished run found, read from the store.

    Args:
        run_id: the run.
        tab: the tab to open on: ``tab-verdict`` (the default: what bounds the program
            comes first), ``tab-timeline``, ``tab-metrics``, ``tab-findings``,
            ``tab-roofline`` or ``tab-compare``.
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("b", "baseline", "Mark as baseline"),
        Binding("f", "artifacts", "Artifacts"),
        Binding("e", "app.export", "Export"),
        Binding("question_mark", "app.help", "Help"),
    ]
    DEFAULT_CSS = """
    ResultsScreen #summary { height: auto; padding: 0 1; }
    ResultsScreen #results-tabs { height: 1fr; }
    ResultsScreen TabPane { height: 1fr; }
    ResultsScreen .caption { color: $text-muted; padding: 0 1; height: auto; }
    ResultsScreen #compare { padding: 0 1; }
    ResultsScreen #metrics-note { display: none; padding: 1 1; height: auto; }
    """

    app: GpuwsApp

    def __init__(self, run_id: str, tab: str = "tab-verdict") -> None:
        super().__init__()
        self.run_id = run_id
        self.tab = tab
        self.results: RunResults | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(Text("reading the store…", "dim"), id="summary")
        with TabbedContent(id="results-tabs", initial=self.tab):
            # What matters first comes first: what bounds the program, then its timeline;
            # one kernel's counters (a 4.6 µs kernel's, often) after them.
            with TabPane("Verdict", id="tab-verdict"), VerticalScroll():
                yield VerdictView(id="verdict")
            with TabPane("Timeline", id="tab-timeline"):
                yield TimelinePane(id="timeline")
            with TabPane("Metrics", id="tab-metrics"):
                yield Static(id="metrics-note")
                yield MetricsTable(id="metrics")
            with TabPane("Findings", id="tab-findings"), VerticalScroll():
                yield VerticalScroll(id="diagnoses")
                yield RuleList(id="rules")
            with TabPane("Roofline", id="tab-roofline"):
                yield Roofline(id="roofline")
            with TabPane("Compare", id="tab-compare"), VerticalScroll():
                yield Static(id="compare")
        yield Footer()

    def on_mount(self) -> None:
        self.title = f"results · {visible(self.run_id, 80)}"
        self.app.load_results(self)

    def on_results_data(self, message: ResultsData) -> None:
        r = self.results = message.results
        # The workload and status are the pod's (or a recording's) words: visible, so
        # "\x1b]0;…" in them cannot retitle the terminal.
        self.sub_title = visible(f"{r.run.workload} · {r.run.status}", 400)
        self.query_one("#summary", Static).update(_summary(r))
        self.query_one(MetricsTable).show(r.metrics)
        # A run without metrics says why (failed, skipped, not asked for), not "yet".
        note = r.metrics_note()
        self.query_one("#metrics-note", Static).update(Text(note, "yellow"))
        self.query_one("#metrics-note").display = bool(note)
        self.query_one(MetricsTable).display = not note
        self.query_one(RuleList).show(r.rules)
        self.query_one(VerdictView).show(r.verdicts)
        box = self.query_one("#diagnoses", VerticalScroll)
        box.remove_children()
        box.mount_all(DiagnosisBanner(d) for d in r.diagnoses)
        points, notes = points_from(r.tier1, r.metrics)
        self.query_one(Roofline).show(ceilings_from(r.tier1, r.probe), points, notes)
        self.query_one("#compare", Static).update(
            render_comparison(r.comparison) if r.comparison else Text(r.baseline_note, "dim"))
        self.query_one(TimelinePane).show_trace(r.trace, r.kernel_table, r.no_trace_why())

    @on(TabbedContent.TabActivated, "#results-tabs", pane="#tab-timeline")
    def _timeline_shown(self) -> None:
        """The timeline's keys work as soon as its tab shows (its footer lists them)."""
        view = self.query_one(TimelineView)
        if view.display:
            view.focus()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "baseline":
            # A recording replayed from a file lives in a throwaway store: a baseline
            # marked there said "now the baseline" and was gone on leaving. Not offered.
            return not self.app.replaying_file
        return True

    def action_baseline(self) -> None:
        """Mark this run as the baseline later runs of its workload are compared with."""
        self.app.mark_baseline(self.run_id)

    def action_artifacts(self) -> None:
        """This run's artifacts."""
        self.app.show_artifacts(self.run_id)


def _summary(r: RunResults) -> Text:
    text = Text()
    text.append(visible(r.run.workload), "bold")
    colour = {"ok": "", "running": "cyan", "cancelled": "yellow"}.get(r.run.status, "bold red")
    text.append(" · ")
    text.append(visible(r.run.status, 40), colour)
    text.append(f" in {fmt.duration(r.run.wall_s)}")
    if r.run.is_baseline:
        text.append(" · baseline", "bold magenta")
    if r.code is not None:
        # Which code gave these numbers (laptop-recorded; visible() for the path's sake).
        text.append(f"\ncode: {visible(r.code.short(), 300)} · {visible(r.code.directory, 200)}",
                    "dim")
    if r.failure:
        text.append(f"\n✗ {visible(r.failure)}", "red" if r.run.status == "failed" else "yellow")
    if r.tier1 is not None:
        s = r.tier1.stats
        text.append(f"\nTier 1: median {fmt.ms(s.median_ms)} "
                    f"[{fmt.ms(s.ci_low_ms)}, {fmt.ms(s.ci_high_ms)}] n={s.n}")
        if r.tier1.gbps is not None:
            text.append(f" · {fmt.num(r.tier1.gbps, 'GB/s')}")
        if r.tier1.tflops is not None:
            text.append(f" · {r.tier1.tflops:.3g} TFLOP/s")
        text.append("\n" + clocks.line(r.tier1.clocks), "dim" if r.tier1.clocks is None else "")
        caution = clocks.caution(r.tier1.clocks)
        if caution is not None:
            text.append(f"\n! caution: {caution}", "yellow")
    for tier in (1, 0):  # NVML GPM over Tier 1's window, or over a cmd:'s run
        done = r.tiers.get(tier)
        line = evidence.gpm_line(done.gpm if done is not None else None, evidence.gpm_over(
            tier, r.tier1.mode if r.tier1 is not None else None))
        if line is not None and done is not None:
            text.append("\n" + line, "" if evidence.gpm_measured(done.gpm) else "dim")
            break
    if r.static:
        text.append("\n")
        text.append(render_static(r.static))
    return text


def _sm_median(c: protocol.ClockRange | None) -> str:
    if c is None:
        return "not recorded"
    return fmt.mhz(c.sm_mhz_median)


def render_comparison(c: Comparison) -> Table | Text:
    """Tier-1 verdict (speedup, CI, Cliff's δ) and metric deltas per kernel."""
    table = Table(title=f"{c.run_b} vs baseline {c.run_a}", title_justify="left", expand=True)
    table.add_column("kernel · metric", ratio=3, overflow="fold")
    table.add_column("baseline", justify="right")
    table.add_column("this run", justify="right")
    table.add_column("Δ", justify="right")
    if c.tier1 is not None:
        t = c.tier1
        quiet = t.within_noise or t.under_floor
        style = "dim" if quiet else "bold green" if t.speedup > 1 else "bold red"
        table.caption = t.verdict + (f" — caution: {c.tier1_caution}" if c.tier1_caution
                                     else "")
        table.caption_style = style
        table.add_row("Tier 1 median", fmt.ms(t.median_a_ms), fmt.ms(t.median_b_ms),
                      Text(f"{fmt.ratio(t.speedup)} [{t.ci_low:.3f}, {t.ci_high:.3f}]", style))
        table.add_row("Cliff's δ", "", "", f"{t.cliffs_delta:+.2f} ({t.magnitude})")
        if c.cycle_ratio is not None:
            table.add_row("cycles (time × SM clock)", "", "", fmt.ratio(c.cycle_ratio))
        if c.clocks_a is not None or c.clocks_b is not None:
            # Only the medians here (the table is narrow); differences go in the caption.
            table.add_row("SM clock (median)", _sm_median(c.clocks_a), _sm_median(c.clocks_b),
                          "")
    else:
        table.caption = c.tier1_missing
    notes = caution_lines(c) + ([c.cycle_note] if c.cycle_note else []) + code_lines(c)
    # Text, not str: a caption string would be read as markup, and GPU names are pod text.
    table.caption = Text("\n".join([str(table.caption or ""), *notes]).strip())
    for k in c.kernels:
        for d in k.metrics:
            if d.a is None and d.b is None:
                continue
            delta = "—" if d.delta_pct is None else f"{d.delta_pct:+.1f}%"
            table.add_row(safe_text(f"{k.kernel} #{k.launch} · {d.key}"), fmt.metric(d.key, d.a),
                          fmt.metric(d.key, d.b), delta)
    return table
