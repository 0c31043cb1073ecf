"""Cancelling a run, and leaving one then re-attaching to it, through the app.

Against the local transport (the agent as a subprocess here); runs are ``cmd:``
workloads, which need no GPU. What the panes show is checked against what was recorded.
"""

from __future__ import annotations

from pathlib import Path

from gpuws import protocol
from gpuws.live.link import Target
from gpuws.sessions.store import Store
from gpuws.tui.app import GpuwsApp, StartConnect
from gpuws.tui.screens.dashboard import DashboardScreen
from gpuws.tui.screens.pick_run import PickRunScreen
from gpuws.tui.screens.run import RunScreen
from tui.tuikit import gated_count, launch_command, run_screen, until  # type: ignore[import-not-found]


async def test_cancel_stops_the_run_on_the_pod() -> None:
    app = GpuwsApp(StartConnect(Target("local")))
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, DashboardScreen))
        screen = await launch_command(pilot, "echo started; sleep 60")
        await until(pilot, lambda: screen.panes.model.tiers.get(0) is not None)
        await pilot.press("c")
        await until(pilot, lambda: screen.panes.model.finished is not None)
        assert screen.panes.model.status == "cancelled"
        with Store() as s:
            assert s.run(screen.run_id).status == "cancelled"
        await app.shutdown()


async def test_leave_then_attach_shows_every_line_once(tmp_path: Path) -> None:
    app = GpuwsApp(StartConnect(Target("local")))
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, DashboardScreen))
        gate = tmp_path / "go-on"
        screen = await launch_command(pilot, gated_count(gate))
        run_id = screen.run_id
        await until(pilot, lambda: screen.panes._log_lines == 10)
        await pilot.press("d")  # leave: the run goes on, and is still recorded
        await until(pilot, lambda: isinstance(app.screen, DashboardScreen))
        gate.touch()
        await pilot.press("a")
        await until(pilot, lambda: isinstance(app.screen, PickRunScreen))
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, RunScreen))
        again = run_screen(app)
        await until(pilot, lambda: again.panes.model.finished is not None)
        assert again is not screen and again.run_id == run_id
        assert again.panes._log_lines == 40
        with Store() as s:
            texts = [e.text for e in s.events(run_id) if isinstance(e, protocol.Output)]
        assert texts == [f"line-{i}" for i in range(1, 41)]
        await app.shutdown()
