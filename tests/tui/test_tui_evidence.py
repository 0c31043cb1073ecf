"""The workstation's part of issue 21's points 3 and 5: the launcher's Tier 3 budget (the
same ``--max-tier3-seconds`` the command line takes) and NVML GPM on the results screen."""

from __future__ import annotations

import asyncio
import json

import msgspec
import pytest
from textual.widgets import Input, Static

from cli.test_cli_evidence import COPY_GPM, RATE, RECORDED  # type: ignore[import-not-found]
from gpuws import protocol
from gpuws.errors import UsageError
from gpuws.runspec import build_spec
from gpuws.sessions.store import Store
from gpuws.tui.app import GpuwsApp, StartHome
from gpuws.tui.screens.launcher import LauncherScreen
from gpuws.tui.screens.results import ResultsScreen
from tui.tuikit import frozen_app as app_on  # type: ignore[import-not-found]
from tui.tuikit import until  # type: ignore[import-not-found]


def test_the_launcher_carries_the_tier3_budget_into_the_spec() -> None:
    async def go() -> None:
        app = app_on()
        async with app.run_test(size=(100, 60)) as pilot:
            await app.push_screen(LauncherScreen([]))
            await pilot.pause()
            screen = app.screen
            assert isinstance(screen, LauncherScreen)
            assert build_spec(screen.options()).max_tier3_s is None  # empty: no budget
            screen.query_one("#max-tier3", Input).value = "45"
            assert build_spec(screen.options()).max_tier3_s == 45.0
            screen.query_one("#max-tier3", Input).value = "0"
            with pytest.raises(UsageError, match="--max-tier3-seconds 0 must be above 0"):
                build_spec(screen.options())

    asyncio.run(go())


def test_the_results_screen_shows_gpm_beside_tier1() -> None:
    run_id = "20261124-130000-aaaaaa"
    lines = []
    for line in RECORDED.saxpy_run(run_id, tiers=(1,)):
        event = json.loads(line)
        if event["type"] == "tier_finished" and event["tier"] == 1:
            event["gpm"] = COPY_GPM
        lines.append(json.dumps(event).encode())
    with Store() as store:
        sid = store.open_session("h200", "ssh+sftp", msgspec.convert(RECORDED.probe(),
                                                                     protocol.Probe),
                                 RATE, started=RECORDED.T0 - 10)
        store.ingest_many(sid, lines)

    async def go() -> str:
        app = GpuwsApp(StartHome(), ssh_config="/nonexistent/gpuws-test/ssh_config")
        async with app.run_test(size=(160, 50)) as pilot:
            await app.push_screen(ResultsScreen(run_id))

            def summary() -> str:
                return str(app.screen.query_one("#summary", Static).render())

            await until(pilot, lambda: "Tier 1:" in summary())
            text = summary()
            await app.shutdown()
            return text

    text = asyncio.run(go())
    assert ("NVML GPM over 2.05 s (Tier 1's timed rounds): SM active 98%, SM occupancy 47%, "
            "tensor active 0%, DRAM bandwidth 89%") in text
