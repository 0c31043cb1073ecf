"""Actions that need no pod: the command palette, and the ncu install's confirmation."""

from __future__ import annotations

import msgspec
from textual.command import CommandPalette
from textual.widgets import Button, Static

from gpuws import protocol
from gpuws.live.storeio import StoreHandle
from gpuws.live.telemetry import TelemetryHistory
from gpuws.remote_agent.profilers.ncu_select import select_ncu
from gpuws.tui.app import GpuwsApp, StartHome, StartReplay
from gpuws.tui.messages import NcuPlanReady
from gpuws.tui.screens.confirm import ConfirmScreen
from gpuws.tui.screens.dashboard import DashboardScreen
from gpuws.tui.screens.results import ResultsScreen
from gpuws.tui.screens.run import RunScreen
from tui.tuikit import RECORDING, h200_probe, until  # type: ignore[import-not-found]

UBUNTU = 'ID=ubuntu\nVERSION_ID="24.04"\n'


async def test_palette_offers_the_screens_actions() -> None:
    app = GpuwsApp(StartReplay(str(RECORDING), speed=None), store=StoreHandle.throwaway())
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, RunScreen)
                    and app.screen.panes.model.finished is not None)
        await pilot.press("ctrl+p")
        await until(pilot, lambda: isinstance(app.screen, CommandPalette))
        await pilot.press(*"results")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ResultsScreen))
        await app.shutdown()


async def test_installing_ncu_asks_first_and_cancel_changes_nothing() -> None:
    """None fits: the plan's button opens a confirmation; Cancel starts no install."""
    probe = msgspec.structs.replace(h200_probe(), ncu=[], driver="570.172.08")
    plan = msgspec.convert(select_ncu([], probe.driver, "9.0", os_release=UBUNTU, is_root=True,
                                      home="/root"), protocol.NcuPlan)
    app = GpuwsApp(StartHome(), ssh_config="/nonexistent/gpuws-test/ssh_config")
    async with app.run_test(size=(120, 50)) as pilot:
        screen = DashboardScreen("pod", probe, "ssh+sftp", TelemetryHistory())
        await app.push_screen(screen)
        screen.post_message(NcuPlanReady(plan))
        await until(pilot, lambda: screen.query_one("#ncu-install", Button).display)
        assert str(screen.query_one("#ncu-install", Button).label) == (
            f"Install ncu {plan.install_target_version}…")
        await pilot.click("#ncu-install")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        body = " ".join(str(w.render()) for w in app.screen.query(Static))
        assert "apt-get" in body and f"Install ncu {plan.install_target_version}" in body
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is screen)
        assert not [w for w in app.workers if w.group == "ncu"]  # nothing was installed
        await app.shutdown()


async def test_help_names_the_screen_for_people() -> None:
    """? on the dashboard lists its keys under "dashboard", not a class name."""
    from gpuws.tui.screens.help import HelpScreen

    app = GpuwsApp(StartHome(), ssh_config="/nonexistent/gpuws-test/ssh_config")
    async with app.run_test(size=(120, 50)) as pilot:
        await app.push_screen(DashboardScreen("pod", h200_probe(), "ssh+sftp",
                                              TelemetryHistory()))
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        assert isinstance(app.screen, HelpScreen)
        title = app.screen.keys_table().title
        assert title == "Keys on this screen (dashboard)"
        await app.shutdown()
