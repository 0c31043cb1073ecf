"""Pod text on the TUI's screens: shown as the characters it is, never read as markup.

A workload named ``[/]`` crashed the re-attach list (Rich read it as a closing tag with
nothing to close); escape sequences could retitle the terminal. The pod's word is drawn
here through the real screens, in Textual's own test harness, with the worst values.
"""

from __future__ import annotations

from textual.app import App
from textual.widgets import DataTable

from gpuws import protocol
from gpuws.tui.screens.pick_run import PickRunScreen

#: Markup that does not parse, markup that would restyle, a terminal title escape, a bell.
HOSTILE = "[/] [bold red]x[/bold red] \x1b]0;pwned\x07 \x1b[2J"


class _Host(App[None]):
    def __init__(self, runs: list[protocol.RunInfo]) -> None:
        super().__init__()
        self.runs = runs

    def on_mount(self) -> None:
        self.push_screen(PickRunScreen(self.runs))


async def test_pick_run_shows_hostile_workload_and_status_as_text() -> None:
    runs = [protocol.RunInfo(run_id="r-1", workload=f"cmd:{HOSTILE}", status=HOSTILE,
                             started=1.7e9, last_seq=3),
            protocol.RunInfo(run_id="r-2", workload="[/]", status="done", started=1.7e9 + 1,
                             last_seq=0)]
    app = _Host(runs)
    async with app.run_test(size=(120, 20)) as pilot:
        await pilot.pause()
        assert isinstance(app.screen, PickRunScreen)
        table = app.screen.query_one(DataTable)
        cells = [str(c) for row in range(table.row_count) for c in table.get_row_at(row)]
        shown = " ".join(cells)
        # The brackets are there as characters; the escapes are shown, not sent.
        assert "[/]" in shown and "[bold red]x[/bold red]" in shown
        assert "\x1b" not in shown and "\x07" not in shown
        assert "\\e]0;pwned\\x07" in shown


async def test_pick_run_dismisses_with_the_chosen_run_id() -> None:
    chosen: list[str | None] = []

    class Picker(App[None]):
        def on_mount(self) -> None:
            runs = [protocol.RunInfo(run_id="r-9", workload="[/]", status="running",
                                     started=1.7e9, last_seq=1)]
            self.push_screen(PickRunScreen(runs), chosen.append)

    app = Picker()
    async with app.run_test(size=(120, 20)) as pilot:
        await pilot.pause()
        await pilot.press("enter")
        await pilot.pause()
    assert chosen == ["r-9"]
