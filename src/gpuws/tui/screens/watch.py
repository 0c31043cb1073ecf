"""The watch loop in the TUI: every save of the project is a measured run, shown as a row
and a point of a chart.

The loop is ``live.watchloop.WatchLoop``, the one ``gpuws watch`` prints; the app's
``watch`` worker runs it on the app's engine and posts each iteration and status here.
The screen only draws: a status line (watching N files, syncing, running iteration k,
waiting for a save), the iterations (changed files, median ± CI, Δ against the previous
iteration and the baseline, the verdict; a failed one with its error), and the medians
with their 95% CIs as error bars (``widgets/run/ci_chart.py``). Esc stops the loop (an
iteration's run is cancelled on the pod and stored as cancelled); ``b`` makes the selected
iteration the baseline; Enter opens an iteration's results.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static

from ...live.watchloop import Iteration, WatchStatus
from ...sessions.compare import Tier1Comparison, change_range, verdict_word
from ...text.textsafe import visible
from ..fmt import duration, ms
from ..messages import WatchIterationDone, WatchStatusChanged
from ..widgets.run.ci_chart import CiChart, Point

if TYPE_CHECKING:
    from ..app import GpuwsApp

#: The verdict's colour, as ``gpuws watch`` prints it.
VERDICT_STYLE = {"faster": "green", "slower": "red"}
COLUMNS = ("#", "changed", "median ± CI", "Δ prev", "Δ baseline", "verdict")


class WatchScreen(Screen[None]):
    """One watch loop's iterations.

    Args:
        workload: the workload watched (as the launcher built it).
        roots: what the watcher watches (the workspace, or the ``file:`` workload).
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "leave", "Stop watching"),
        Binding("b", "mark_baseline", "Baseline = selected"),
        Binding("question_mark", "app.help", "Help"),
        Binding("q", "app.quit", "Quit", show=False),
    ]
    #: Keys the help lists besides the bindings: Enter belongs to the table (whose own
    #: binding the help leaves out), so a person never learnt it from the help.
    HELP_KEYS: ClassVar[tuple[tuple[str, str], ...]] = (
        ("enter", "the selected iteration's results"),)
    DEFAULT_CSS = """
    WatchScreen #watch-status { height: auto; padding: 0 1; background: $boost; }
    WatchScreen #watch-detail { height: auto; padding: 0 1; }
    WatchScreen #iterations { height: 2fr; min-height: 5; }
    WatchScreen #chart { height: 3fr; min-height: 8; border-top: solid $primary 50%; }
    """

    app: GpuwsApp

    def __init__(self, workload: str, roots: list[Path]) -> None:
        super().__init__()
        self.workload = workload
        self.roots = roots
        self.iterations: dict[int, Iteration] = {}
        self.baseline_n: int | None = None
        self.baseline_ms: float | None = None
        self.status: WatchStatus | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="watch-status")
        yield Static(id="watch-detail")
        table: DataTable[Text] = DataTable(id="iterations", cursor_type="row", zebra_stripes=True)
        yield table
        yield CiChart(id="chart")
        yield Footer()

    def on_mount(self) -> None:
        # The workload and paths are this machine's words, yet a file name can hold
        # anything: visible, never markup.
        self.title = f"watch {visible(self.workload, 120)}"
        self.sub_title = self.app.link_label()
        table = self.query_one("#iterations", DataTable)
        for name in COLUMNS:
            table.add_column(name, key=name)
        self._draw_status()

    def on_unmount(self) -> None:
        # However the screen goes (esc, Home, a disconnect), its loop goes with it: no
        # loop measures saves nobody sees.
        self.app.stop_watch()

    # ------------------------------------------------------------------ what the loop says
    def on_watch_iteration_done(self, message: WatchIterationDone) -> None:
        self.show_iteration(message.iteration, message.baseline_n, message.baseline_ms)

    def on_watch_status_changed(self, message: WatchStatusChanged) -> None:
        self.show_status(message.status)

    def show_iteration(self, it: Iteration, baseline_n: int | None,
                       baseline_ms: float | None) -> None:
        """Add the iteration's row and point, or redraw them (its comparison changed)."""
        new_baseline = baseline_n != self.baseline_n
        self.iterations[it.n] = it
        self.baseline_n, self.baseline_ms = baseline_n, baseline_ms
        table = self.query_one("#iterations", DataTable)
        if new_baseline:  # the star moves: every row's first cell
            for n in self.iterations:
                if str(n) in table.rows:
                    table.update_cell(str(n), "#", self._number(n))
        cells = self._cells(it)
        key = str(it.n)
        if key in table.rows:
            for column, cell in zip(COLUMNS, cells, strict=True):
                table.update_cell(key, column, cell)
        else:
            table.add_row(*cells, key=key)
            table.move_cursor(row=table.row_count - 1)  # follow the newest
        self.query_one(CiChart).show(
            [Point(i.n, i.median_ms, i.ci_low_ms, i.ci_high_ms, i.status != "ok")
             for _, i in sorted(self.iterations.items())], self.baseline_ms)
        self._draw_status()
        self.refresh_bindings()  # b is offered once an iteration has a median

    def show_status(self, status: WatchStatus) -> None:
        """Redraw the status line."""
        self.status = status
        self._draw_status()
        self.refresh_bindings()

    def _draw_status(self) -> None:
        if not self.is_mounted:
            return
        status = self.status
        where = ", ".join(visible(str(r), 120) for r in self.roots)
        line = Text()
        if status is None:
            line.append("starting…", "bold")
        else:
            k = status.iteration
            run = f" · run {status.run_id}" if status.run_id else ""
            line.append({"syncing": f"syncing the workspace for iteration {k}",
                         "running": f"running iteration {k}{run}",
                         "waiting": "waiting for a save",
                         "stopping": f"stopping: iteration {k}'s run is being cancelled",
                         "stopped": "stopped"}[status.phase], "bold")
            if status.phase != "stopped":
                files = f"{status.files:,} file{'s' if status.files != 1 else ''}"
                line.append(f" · watching {files} in {where}")
        if self.baseline_n is not None:
            line.append(f" · baseline #{self.baseline_n}", "yellow")
        self.query_one("#watch-status", Static).update(line)
        self._draw_detail()

    def _draw_detail(self) -> None:
        """The selected iteration's run and, when it failed, its whole error line."""
        table = self.query_one("#iterations", DataTable)
        it = None
        if table.row_count:
            key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
            it = self.iterations.get(int(key)) if key is not None else None
        detail = Text()
        if it is None:
            detail.append("each save is a run: its row, its point on the chart; Enter opens "
                          "a row's results, b makes it the baseline", "dim")
        else:
            detail.append(f"#{it.n} · run {it.run_id or '—'}")
            if it.status not in ("", "ok"):
                # The pod's words: control characters made visible, never read as markup.
                detail.append(f" · {visible(it.status, 40)}: "
                              f"{visible(it.error or 'no reason given', 600)}", "bold red")
            elif it.wall_s:
                overhead = (f", {duration(it.overhead_s)} of it the loop's"
                            if it.overhead_s is not None else "")
                detail.append(f" · save → result {duration(it.wall_s)}{overhead}", "dim")
            detail.append(" · Enter: its results", "dim")
        self.query_one("#watch-detail", Static).update(detail)

    @on(DataTable.RowHighlighted, "#iterations")
    def _highlighted(self) -> None:
        self._draw_detail()

    def _number(self, n: int) -> Text:
        return Text(f"★{n}" if n == self.baseline_n else str(n),
                    "bold yellow" if n == self.baseline_n else "")

    def _cells(self, it: Iteration) -> list[Text]:
        head = [self._number(it.n), Text(_changed(it.changed, 24))]
        if it.status != "ok":
            # A failed iteration: its status, and its error where the verdict would be
            # (whole in the line under the table).
            return [*head, Text(visible(it.status or "—", 20), "bold red"), Text("—"),
                    Text("—"), Text(_cut(visible(it.error or "no reason given", 200), 28), "red")]
        if it.median_ms is None:
            return [*head, Text("no Tier-1 samples", "yellow"), Text("—"), Text("—"),
                    Text("Tier 1 times run()", "dim")]
        return [*head, Text(ms(it.median_ms) + _ci(it.ci_pct)), _delta(it.vs_prev),
                _delta(it.vs_base), _verdict(it)]

    # ------------------------------------------------------------------ keys
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "mark_baseline":
            # Dimmed, not hidden, until an iteration has samples: on a pod where every
            # iteration failed, b was in neither the footer nor the help.
            return True if any(i.samples for i in self.iterations.values()) else None
        return True

    def action_leave(self) -> None:
        """Stop the loop (an iteration's run is cancelled on the pod) and go back."""
        self.app.stop_watch()
        self.app.pop_screen()

    def action_mark_baseline(self) -> None:
        """Compare every iteration with the selected one from now on."""
        table = self.query_one("#iterations", DataTable)
        if table.row_count == 0:
            return
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        if key is not None:
            self.app.mark_watch_baseline(int(key))

    @on(DataTable.RowSelected, "#iterations")
    def _open_results(self, event: DataTable.RowSelected) -> None:
        it = self.iterations.get(int(event.row_key.value or 0))
        if it is not None and it.run_id:
            self.app.show_results(it.run_id)


def _delta(c: Tier1Comparison | None) -> Text:
    """The change with its 95% CI, coloured by its verdict."""
    return Text(change_range(c), VERDICT_STYLE.get(verdict_word(c), "dim"))


def _cut(shown: str, width: int) -> str:
    """A visible string cut to ``width`` cells with an ellipsis (a table cell)."""
    return shown if len(shown) <= width else shown[:width - 1] + "…"


def _changed(paths: list[str], width: int) -> str:
    """The files an iteration's save changed, as many whole names as fit, then ``+N``."""
    if not paths:
        return "start"
    names = [visible(p, 200) for p in paths]
    shown = _cut(names[0], width)
    for i, name in enumerate(names[1:], 1):
        rest = f" +{len(names) - i - 1}" if i < len(names) - 1 else ""
        if len(shown) + 2 + len(name) + len(rest) > width:
            return f"{shown} +{len(names) - i}"
        shown += f", {name}"
    return shown


def _ci(pct: float | None) -> str:
    """`` ±0.04%``: two decimals below 1%, where Tier 1's CIs usually are."""
    if pct is None:
        return ""
    return f" ±{pct:.2f}%" if pct < 1 else f" ±{pct:.1f}%"


def _verdict(it: Iteration) -> Text:
    """The verdict against the previous iteration (the edit just made), and against the
    baseline when that says otherwise."""
    prev, base = verdict_word(it.vs_prev), verdict_word(it.vs_base)
    if not prev and not base:
        return Text("baseline" if it.vs_base is None else "—", "dim")
    text = Text(prev or "—", VERDICT_STYLE.get(prev, ""))
    if base and base != prev:
        text.append(f" · base: {base}", VERDICT_STYLE.get(base, "dim"))
    return text


def snapshot(it: Iteration) -> Iteration:
    """A copy of an iteration for the screen (the loop may change its own later)."""
    return dataclasses.replace(it, changed=list(it.changed), samples=list(it.samples))
