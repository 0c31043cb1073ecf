"""The newcomer's second tour in the TUI (issue 34): a run left with esc is named on the
dashboard and on quitting, the Agent block waits for a message, dialogs say their keys."""

from __future__ import annotations

from textual.app import App, ComposeResult
from textual.widgets import Static

from gpuws.live.link import Target
from gpuws.tui.app import GpuwsApp, StartConnect
from gpuws.tui.screens.confirm import ConfirmScreen
from gpuws.tui.screens.dashboard import DashboardScreen
from gpuws.tui.screens.help import HelpScreen
from tui.tuikit import launch_command, until  # type: ignore[import-not-found]


def _shown(widget: Static) -> str:
    return str(widget.render())


async def test_a_run_left_with_esc_is_named_on_the_dashboard_and_when_quitting() -> None:
    """Findings 5, 6 and 21: after esc the dashboard said nothing of the run going on, its
    Agent block was an empty heading, and q quit without a word about the run."""
    app = GpuwsApp(StartConnect(Target("local")))
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, DashboardScreen))
        dashboard = app.screen
        assert not dashboard.query_one("#agent-log").display
        assert not dashboard.query_one("#runs-going").display
        screen = await launch_command(pilot, "echo started; sleep 60")
        await until(pilot, lambda: screen.panes.model.started is not None)
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is dashboard)
        going = dashboard.query_one("#runs-going", Static)
        await until(pilot, lambda: going.display)
        assert screen.run_id in _shown(going) and "a re-attaches" in _shown(going)
        assert app.attach_hints() == [f"gpuws attach local {screen.run_id}"]
        app.cancel_run(screen.run_id)
        await until(pilot, lambda: not going.display)
        assert app.attach_hints() == []
        await app.shutdown()


def test_an_attach_hint_repeats_the_connection_options_and_quotes_them() -> None:
    """Finding 3: the printed command dropped -F/-p/-l, so pasting it failed."""
    target = Target("pod", ssh_config="/tmp/my config", port=2222, user="me")
    assert target.command("attach", "20261128-1") == (
        "gpuws attach -F '/tmp/my config' -p 2222 -l me pod 20261128-1")


class _Host(App[None]):
    def compose(self) -> ComposeResult:
        yield Static("under")


async def test_a_confirm_dialog_says_its_keys() -> None:
    """Finding 9: nothing said y launches and Enter cancels."""
    app = _Host()
    async with app.run_test(size=(100, 30)) as pilot:
        answers: list[bool | None] = []
        app.push_screen(ConfirmScreen("Launch anyway?", "no GPU", "Launch anyway"),
                        answers.append)
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        keys = _shown(app.screen.query_one("#keys", Static))
        assert "y  Launch anyway" in keys and "Enter  Cancel" in keys
        await pilot.press("enter")
        await until(pilot, lambda: answers == [False])


async def test_help_says_how_to_close_it() -> None:
    """Finding 23: `?` hid the footer and nothing said how to leave."""
    app = _Host()
    async with app.run_test(size=(160, 45)) as pilot:
        app.push_screen(HelpScreen(app.screen))
        await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        table = app.screen.keys_table()
        assert table.caption is not None and "Esc, q or ? closes this help" in str(table.caption)
        assert table.caption_justify == "left"
