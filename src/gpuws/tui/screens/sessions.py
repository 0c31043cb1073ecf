"""Sessions: every recorded connection with its cost; open a run to replay it; export."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Label, Static

from ...text.textsafe import text as safe_text
from .. import fmt
from ..columns import SESSION_COLUMNS, fill, fitting, session_cells
from ..hosts import SessionSummary
from ..messages import Exported, SessionsData

if TYPE_CHECKING:
    from ..app import GpuwsApp


#: The most of a workload the runs table shows (a command can be a whole script).
WORKLOAD_LIMIT = 200


class SessionsScreen(Screen[None]):
    """Sessions above, the selected session's runs below."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("enter", "open_run", "Replay run", show=False),
        Binding("e", "export", "Export"),
        Binding("r", "results", "Results"),
        Binding("f", "artifacts", "Artifacts"),
        Binding("m", "fleets", "Fleets"),
        Binding("question_mark", "app.help", "Help"),
    ]
    DEFAULT_CSS = """
    SessionsScreen Vertical { padding: 0 1; }
    SessionsScreen .section { text-style: bold; margin-top: 1; }
    SessionsScreen #sessions { height: 1fr; }
    SessionsScreen #runs { height: 1fr; }
    SessionsScreen #export-status { height: auto; }
    """

    app: GpuwsApp

    def __init__(self, select: str | None = None) -> None:
        super().__init__()
        self.session_id: str | None = select
        self.sessions: list[SessionSummary] = []

    def compose(self) -> ComposeResult:
        yield Header()
        with Vertical():
            yield Label("Sessions — e exports the selected one as markdown", classes="section")
            yield DataTable(id="sessions", cursor_type="row", zebra_stripes=True)
            yield Label("Runs of the session — Enter replays, r results, f artifacts",
                        classes="section")
            yield DataTable(id="runs", cursor_type="row", zebra_stripes=True)
            yield Static(id="export-status")
        yield Footer()

    def on_mount(self) -> None:
        self.title = "gpuws · sessions"
        self._draw_sessions()
        self._run_columns(22, 10, 30)
        self.app.load_sessions(self, self.session_id)

    def on_resize(self) -> None:
        if self.query("#sessions"):  # a resize may come before the tables are mounted
            self._draw_sessions()

    def _draw_sessions(self) -> None:
        """The sessions, with the columns that fit (fixed widths: columns do not jump as
        rows arrive; on a narrow terminal the GPU goes, where "runs" and "cost" were
        pushed off-screen and "duration" cut)."""
        fill(self.query_one("#sessions", DataTable),
             fitting(SESSION_COLUMNS, self.app.size.width - 3),
             ((s.row.id, session_cells(s)) for s in self.sessions))

    def _run_columns(self, id_width: int, baseline_width: int, workload_width: int) -> None:
        """The runs table's columns, ids and workloads whole: a run id (22 characters from
        the agent, up to 64 in a recording) and "vs <id>" were cut at a fixed 22 and 24, a
        workload at 30 even at 160 columns. The workload comes last: the widest."""
        runs = self.query_one("#runs", DataTable)
        runs.clear(columns=True)
        for label, width in (("run", id_width), ("status", 9), ("wall", 10),
                             ("baseline", baseline_width), ("started", 16),
                             ("workload", workload_width)):
            runs.add_column(label, width=width)

    def on_sessions_data(self, message: SessionsData) -> None:
        table = self.query_one("#sessions", DataTable)
        if table.row_count != len(message.sessions):
            self.sessions = message.sessions
            self._draw_sessions()
        self.session_id = message.session_id
        if message.session_id is not None:
            table.move_cursor(row=table.get_row_index(message.session_id))
        bases = ["★ baseline" if r.is_baseline else (f"vs {r.baseline_of}" if r.baseline_of
                                                    else "") for r in message.runs]
        # Widths from the rows: the columns change only when another session is shown.
        workloads = [safe_text(r.workload, limit=WORKLOAD_LIMIT) for r in message.runs]
        self._run_columns(max([22, *(len(r.run_id) for r in message.runs)]),
                          max([10, *(len(b) for b in bases)]),
                          max([30, *(w.cell_len for w in workloads)]))
        runs = self.query_one("#runs", DataTable)
        for r, base, workload in zip(message.runs, bases, workloads, strict=True):
            runs.add_row(safe_text(r.run_id), safe_text(r.status), fmt.duration(r.wall_s),
                         safe_text(base), fmt.when(r.started), workload, key=r.run_id)
        count = len(message.sessions)
        self.sub_title = f"{count} session" + ("" if count == 1 else "s")

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "sessions" and event.row_key.value != self.session_id:
            self.app.load_sessions(self, event.row_key.value)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table.id == "runs" and event.row_key.value:
            self.app.replay_stored_run(event.row_key.value)
        elif event.data_table.id == "sessions":
            self.query_one("#runs", DataTable).focus()

    def _selected_run(self) -> str | None:
        runs = self.query_one("#runs", DataTable)
        if runs.row_count == 0:
            return None
        key = runs.coordinate_to_cell_key(runs.cursor_coordinate).row_key.value
        return key

    def action_open_run(self) -> None:
        """Replay the selected run through the live panes."""
        run = self._selected_run()
        if run:
            self.app.replay_stored_run(run)

    def action_results(self) -> None:
        """Results of the selected run."""
        run = self._selected_run()
        if run:
            self.app.show_results(run)

    def action_artifacts(self) -> None:
        """Artifacts of the selected run."""
        run = self._selected_run()
        if run:
            self.app.show_artifacts(run)

    def action_fleets(self) -> None:
        """Fleets (one workload on several pods at once), opened on the selected
        session's fleet when it was one pod of a fleet."""
        from .fleet import FleetScreen

        self.app.push_screen(FleetScreen(session_id=self.session_id))

    def action_export(self) -> None:
        """Write the selected session as a markdown report."""
        if self.session_id:
            self.app.export_session(self.session_id)

    def on_exported(self, message: Exported) -> None:
        self.query_one("#export-status", Static).update(
            Text.assemble(("✓ exported ", "bold green"), f"session {message.session_id} → ",
                          (message.path, "bold"), f" ({fmt.size(message.size)})"))
