"""The launcher's Tier 3 budget: the same ``--max-tier3-seconds`` the command line takes."""

from __future__ import annotations

import asyncio

import pytest
from textual.widgets import Input

from gpuws.errors import UsageError
from gpuws.runspec import build_spec
from gpuws.tui.screens.launcher import LauncherScreen
from tui.tuikit import frozen_app as app_on  # type: ignore[import-not-found]


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
