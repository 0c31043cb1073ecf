"""Choose one of the runs the pod holds (to re-attach to it)."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Static

from ... import protocol
from ...text.textsafe import text as safe_text
from .. import fmt


class PickRunScreen(ModalScreen[str | None]):
    """Lists the pod's runs, newest first; Enter picks one, Escape picks none."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "dismiss(None)", "Cancel")]
    DEFAULT_CSS = """
    PickRunScreen { align: center middle; }
    PickRunScreen > Vertical { width: 90%; max-width: 110; height: 70%; border: thick $primary;
                               background: $surface; padding: 0 1; }
    PickRunScreen DataTable { height: 1fr; }
    """

    def __init__(self, runs: list[protocol.RunInfo]) -> None:
        super().__init__()
        self.runs = sorted(runs, key=lambda r: -r.started)

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("Runs on the pod — Enter re-attaches (missed events are fetched)")
            yield DataTable(cursor_type="row")

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        # The workload before the start time and event count: at 80x24 it came last and
        # showed only "cmd", the rest of it off the modal's right edge.
        table.add_columns("run", "status", "workload", "started", "events")
        for r in self.runs:
            # Everything here is the pod's word: shown as text, never as markup.
            table.add_row(safe_text(r.run_id), safe_text(r.status),
                          safe_text(r.workload, limit=60), fmt.when(r.started),
                          str(r.last_seq + 1), key=r.run_id)
        table.focus()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.dismiss(event.row_key.value)
