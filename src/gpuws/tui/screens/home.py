"""Home: the hosts you can connect to, and the sessions you had."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Input, Label

from ...text.textsafe import text as safe_text
from .. import fmt
from ..columns import SESSION_COLUMNS, Column, fill, fitting, session_cells
from ..hosts import HostEntry, SessionSummary, destination_problem
from ..messages import HomeData

if TYPE_CHECKING:
    from ..app import GpuwsApp


#: Home's keys that are letters: while the destination box has the focus they are typed
#: into it, so the footer does not offer them then.
_LETTER_ACTIONS = frozenset({"focus_destination", "sessions", "help", "quit"})


#: The hosts table; the GPU column is left out where the terminal is too narrow.
HOST_COLUMNS = [Column("host", 16), Column("where", 26), Column("GPU", 16, optional=True),
                Column("last cost", 9), Column("last used", 16)]

class HomeScreen(Screen[None]):
    """Type a destination (the box has the focus when Home opens), or pick a host (Enter);
    recent sessions below."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("slash,c", "focus_destination", "Type a host"),
        # Shown while typing: the way to the hosts list, where the letters are keys again
        # (priority: the box binds ↓ itself, to scrolling, which would hide this one).
        Binding("down", "focus_hosts", "Hosts", priority=True),
        Binding("s", "sessions", "Sessions"),
        Binding("f5", "reload", "Reload", show=False),
        Binding("question_mark", "help", "Help"),
        Binding("q", "quit", "Quit"),
    ]
    DEFAULT_CSS = """
    HomeScreen Vertical { padding: 0 1; }
    HomeScreen .section { text-style: bold; margin-top: 1; }
    HomeScreen #dest { margin: 0 0; }
    HomeScreen #dest-error { color: $error; display: none; width: 100%; }
    HomeScreen #hosts { height: auto; max-height: 12; }
    HomeScreen #recent { height: 1fr; }
    """

    app: GpuwsApp

    def __init__(self) -> None:
        super().__init__()
        self.hosts: list[HostEntry] = []
        self.recent: list[SessionSummary] = []

    def compose(self) -> ComposeResult:
        yield Header()
        with Vertical():
            yield Label("Connect to", classes="section")
            yield Input(placeholder="ssh alias, user@host[:port], or local — then Enter",
                        id="dest")
            yield Label("", id="dest-error")
            yield Label("Hosts (ssh config and used before) — Enter connects", classes="section")
            yield DataTable(id="hosts", cursor_type="row", zebra_stripes=True)
            yield Label("Recent sessions — Enter opens", classes="section")
            yield DataTable(id="recent", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        self.title = "gpuws"
        self.sub_title = "home"
        self._draw_tables()
        # The box looks like the place to type, so it is: a host name typed at once goes
        # into it (with the list focused, its "s" opened Sessions).
        self.query_one("#dest", Input).focus()
        self.action_reload()

    def action_reload(self) -> None:
        """Read the hosts and sessions again."""
        self.app.load_home(self)

    def action_focus_destination(self) -> None:
        """Put the cursor in the destination box."""
        self.query_one("#dest", Input).focus()

    def action_focus_hosts(self) -> None:
        """Leave the destination box for the hosts list."""
        self.query_one("#hosts", DataTable).focus()

    def action_sessions(self) -> None:
        """Every recorded session: replay its runs, export it."""
        self.app.open_sessions()

    def action_help(self) -> None:
        """Explain gpuws and the keys of this screen."""
        self.app.action_help()

    async def action_quit(self) -> None:
        """Leave gpuws; runs on the pod go on."""
        await self.app.action_quit()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        typing = isinstance(self.focused, Input)
        if action == "focus_hosts":
            return typing
        if action in _LETTER_ACTIONS:
            return not typing  # a letter typed into the box is never a hotkey
        return True

    def on_resize(self) -> None:
        if self.query("#recent"):  # a resize may come before the tables are mounted
            self._draw_tables()

    def _draw_tables(self) -> None:
        """Both tables, with the columns that fit the terminal. Fixed widths: columns do
        not jump as rows arrive, and long names are cut, not wrapped; on a narrow one the
        GPU column goes (the rest was pushed off-screen, "duration" cut to "durati")."""
        room = self.app.size.width - 3  # the padding either side, the scrollbar
        fill(self.query_one("#hosts", DataTable), fitting(HOST_COLUMNS, room),
             self._host_rows())
        fill(self.query_one("#recent", DataTable), fitting(SESSION_COLUMNS, room),
             self._session_rows())

    def on_home_data(self, message: HomeData) -> None:
        self.hosts, self.recent = message.hosts, message.sessions
        self._draw_tables()

    def _host_rows(self) -> Iterator[tuple[str, dict[str, Text | str]]]:
        for h in self.hosts:
            mark = (Text("● ", "green") if h.in_config else Text("? ", "yellow")
                    if h.unknown_name else Text("  "))
            where = (Text("not in ssh config (-F?)", "yellow") if h.unknown_name
                     else safe_text(h.where, limit=200))
            # Text of visible(): a GPU's name is the pod's word (never markup, never an
            # escape); host names come from the ssh config and the store.
            yield h.name, {"host": mark + safe_text(h.name, "bold", 200), "where": where,
                           "GPU": safe_text(h.gpu or "—", limit=200),
                           "last cost": fmt.usd(h.last_cost),
                           "last used": fmt.when(h.last_used)}

    def _session_rows(self) -> Iterator[tuple[str, dict[str, Text | str]]]:
        for s in self.recent:
            yield s.row.id, session_cells(s)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        dest = event.value.strip()
        error = self.query_one("#dest-error", Label)
        problem = destination_problem(dest) if dest else None
        error.display = problem is not None
        if problem is not None:
            # A pasted command line or a stray key is not sent to ssh as a host (it came
            # back as a "configuration error" with a command to paste).
            error.update(Text.assemble(("✗ ", "bold"), safe_text(dest, limit=60),
                                       f": {problem} — type an ssh alias, user@host[:port] "
                                       "or local"))
            return
        if dest:
            self.app.connect_to(dest)

    def on_input_changed(self, event: Input.Changed) -> None:
        self.query_one("#dest-error").display = False

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "hosts":
            self._say_unknown(event.row_key.value)

    def _say_unknown(self, name: str | None) -> None:
        """Under the box: how a host Home cannot reach by name alone is reached."""
        error = self.query_one("#dest-error", Label)
        host = next((h for h in self.hosts if h.name == name), None)
        error.display = host is not None and host.unknown_name
        if host is not None and host.unknown_name:
            error.update(Text.assemble(
                ("? ", "bold"), safe_text(host.name, limit=60),
                " is not in your ssh config: if it was reached with -F FILE, start "
                "gpuws -F FILE connect ", safe_text(shlex.quote(host.name), limit=60)))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        key = event.row_key.value
        if key is None:
            return
        if event.data_table.id == "hosts":
            self.app.connect_to(key)
        else:
            self.app.open_sessions(key)
