"""Fleets: one workload run on several pods at once, and the comparison of their pods.

The fleets are listed above; the selected fleet's comparison below, with exactly the
columns and cells ``gpuws run POD POD ...`` ends with and ``gpuws export --fleet``
writes (:mod:`gpuws.sessions.fleet` decides them). Enter on a pod opens its run's
results; ``e`` writes the comparison as markdown.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Label, Static

from ...sessions.export import export_fleet
from ...sessions.fleet import (
    FleetComparison,
    cells,
    columns,
    failure_lines,
    fleet_comparison,
    notes,
)
from ...sessions.store import FleetRow, Store
from ...text.textsafe import text as safe_text
from .. import fmt

if TYPE_CHECKING:
    from ..app import GpuwsApp

_STATUS_STYLE = {"ok": "green", "running": "cyan", "connected": "cyan", "pending": "dim"}


class FleetData(Message, bubble=False):
    """Every fleet, and the comparison of the one asked about (None: there is none)."""

    def __init__(self, fleets: list[FleetRow], comparison: FleetComparison | None) -> None:
        self.fleets = fleets
        self.comparison = comparison
        super().__init__()


class FleetExported(Message, bubble=False):
    """A fleet's comparison was written as markdown to ``path``."""

    def __init__(self, fleet_id: str, path: str, size: int) -> None:
        self.fleet_id = fleet_id
        self.path = path
        self.size = size
        super().__init__()


class FleetScreen(Screen[None]):
    """Fleets above, the selected fleet's comparison below.

    Args:
        fleet_id: the fleet to open on (an id or unique prefix).
        session_id: open on the fleet this session was one pod of (when ``fleet_id`` is
            not given); the newest fleet otherwise.
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("e", "export", "Export"),
        Binding("r", "results", "Results"),
        Binding("question_mark", "app.help", "Help"),
    ]
    DEFAULT_CSS = """
    FleetScreen Vertical { padding: 0 1; }
    FleetScreen .section { text-style: bold; margin-top: 1; }
    FleetScreen #fleets { height: 1fr; }
    FleetScreen #comparison { height: 1fr; }
    FleetScreen #fleet-notes { height: auto; }
    FleetScreen #fleet-export { height: auto; }
    """

    app: GpuwsApp

    def __init__(self, fleet_id: str | None = None, session_id: str | None = None) -> None:
        super().__init__()
        self.fleet_id = fleet_id
        self.session_id = session_id
        self.comparison: FleetComparison | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        with Vertical():
            yield Label("Fleets — one workload run on several pods at once "
                        "(gpuws run POD POD ... -w W)", classes="section")
            yield DataTable(id="fleets", cursor_type="row", zebra_stripes=True)
            yield Label("Comparison with the first pod — Enter or r opens a pod's results, "
                        "e exports", classes="section")
            yield DataTable(id="comparison", cursor_type="row", zebra_stripes=True)
            yield Static(id="fleet-notes")
            yield Static(id="fleet-export")
        yield Footer()

    def on_mount(self) -> None:
        self.title = "gpuws · fleets"
        for label, width in (("fleet", 12), ("started", 16), ("workload", 30), ("pods", 40)):
            self.query_one("#fleets", DataTable).add_column(label, width=width)
        self._load()

    # ------------------------------------------------------------------ reading
    def _load(self) -> None:
        fleet_id, session_id = self.fleet_id, self.session_id

        def read(s: Store) -> FleetData:
            rows = s.fleets()
            fid = s.fleet(fleet_id).id if fleet_id else (
                s.fleet_of_session(session_id) if session_id else None)
            if fid is None and rows:
                fid = rows[0].id
            return FleetData(rows, fleet_comparison(s, fid) if fid else None)

        async def work() -> None:
            self.post_message(await self.app.store.call(read))

        # The app's worker handler reports a failure (one place for every screen).
        self.app.run_worker(work(), group="store", name="store", exit_on_error=False,
                            description="read the fleets", exclusive=True)

    def on_fleet_data(self, message: FleetData) -> None:
        table = self.query_one("#fleets", DataTable)
        if table.row_count != len(message.fleets):
            table.clear()
            for f in message.fleets:
                pods = Text()
                for i, p in enumerate(f.pods):
                    if i:
                        pods.append(", ")
                    pods.append_text(safe_text(p.pod, limit=40))
                    pods.append(f" {p.status}", _STATUS_STYLE.get(p.status, "red"))
                table.add_row(safe_text(f.id), fmt.when(f.started), safe_text(f.workload, limit=80),
                              pods,
                              key=f.id)
        c = message.comparison
        self.comparison = c
        self.sub_title = f"{len(message.fleets)} fleet" + ("" if len(message.fleets) == 1
                                                           else "s")
        if c is None:
            self.query_one("#fleet-notes", Static).update(Text(
                "no fleets yet: gpuws run POD POD ... -w WORKLOAD runs one workload on "
                "several pods at once and compares them", "yellow"))
            return
        self.fleet_id = c.fleet.id
        table.move_cursor(row=table.get_row_index(c.fleet.id))
        self._show(c)

    def _show(self, c: FleetComparison) -> None:
        table = self.query_one("#comparison", DataTable)
        table.clear(columns=True)
        cols = columns(c)
        for col in cols:
            table.add_column(col)
        for line in c.lines:
            row = cells(line)
            # Pod text (hostnames, GPU names, errors) as Text: never read as markup.
            table.add_row(*(safe_text(row[col], _STATUS_STYLE.get(row[col], "red"))
                            if col == "status" else safe_text(row[col], limit=200)
                            for col in cols), key=str(line.position))
        body = Text()
        for note in notes(c):
            body.append_text(safe_text(note, "dim"))
            body.append("\n")
        for failure in failure_lines(c):
            body.append_text(safe_text(failure, "red"))
            body.append("\n")
        self.query_one("#fleet-notes", Static).update(body)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "fleets" and event.row_key.value != self.fleet_id:
            self.fleet_id = event.row_key.value
            self._load()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table.id == "comparison":
            self.action_results()
        elif event.data_table.id == "fleets":
            self.query_one("#comparison", DataTable).focus()

    # ------------------------------------------------------------------ actions
    def action_results(self) -> None:
        """Results of the selected pod's run."""
        c = self.comparison
        table = self.query_one("#comparison", DataTable)
        if c is None or table.row_count == 0:
            return
        line = c.lines[table.cursor_row]
        if line.run_id is None:
            self.app.notify(f"{line.pod} has no run: {line.error or line.status}",
                            severity="warning", markup=False)
        else:
            self.app.show_results(line.run_id)

    def action_export(self) -> None:
        """Write the selected fleet's comparison as markdown under the export directory."""
        fleet_id = self.fleet_id
        if fleet_id is None:
            return

        async def work() -> None:
            from ..workers import write_atomic  # the workers import the screens

            text = await self.app.store.call(lambda s: export_fleet(s, fleet_id))
            path = self.app.exports_dir() / f"gpuws-fleet-{fleet_id}.md"
            size = await asyncio.to_thread(write_atomic, path, text)
            self.post_message(FleetExported(fleet_id, str(path), size))

        self.app.run_worker(work(), group="export", name="export", exit_on_error=False,
                            description=f"export fleet {fleet_id}")

    def on_fleet_exported(self, message: FleetExported) -> None:
        self.query_one("#fleet-export", Static).update(
            Text.assemble(("✓ exported ", "bold green"), f"fleet {message.fleet_id} → ",
                          (message.path, "bold"), f" ({fmt.size(message.size)})"))

