"""Screenshots of the Timeline tab at 80x24 and 160x45: the stored `cmd:` run of the real
H200 HF `generate` trace (tests/tui/timelinekit.py), whole and zoomed onto an idle gap."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from textual.pilot import Pilot
from textual.widgets import TabbedContent

from gpuws.tui.screens.results import ResultsScreen
from gpuws.tui.widgets.run.timeline import TimelineView
from tui.timelinekit import RUN_ID, store_run  # type: ignore[import-not-found]
from tui.tuikit import SnapCompare, frozen_app, settle  # type: ignore[import-not-found]


def timeline_tab(*keys: str) -> Callable[[Pilot[Any]], Awaitable[None]]:
    async def run_before(pilot: Pilot[Any]) -> None:
        screen = ResultsScreen(RUN_ID)
        await pilot.app.push_screen(screen)
        view = screen.query_one(TimelineView)
        await settle(pilot, lambda: view.timeline is not None)
        screen.query_one(TabbedContent).active = "tab-timeline"
        await settle(pilot, lambda: view.has_focus)
        for key in keys:
            await pilot.press(key)
        await pilot.wait_for_scheduled_animations()
        await pilot.pause()

    return run_before


def test_timeline_whole_run_80x24(snap_compare: SnapCompare, snapshot_home: Path,
                                  tmp_path: Path) -> None:
    """The whole run on one stream, the judged window over it, Tier 2's top kernel
    selected with the Python line that launched it."""
    store_run(tmp_path)
    assert snap_compare(frozen_app(), terminal_size=(80, 24), run_before=timeline_tab())


def test_timeline_next_gap_160x45(snap_compare: SnapCompare, snapshot_home: Path,
                                  tmp_path: Path) -> None:
    """After g: the next idle gap a quarter of the view, the block after it selected."""
    store_run(tmp_path)
    assert snap_compare(frozen_app(), terminal_size=(160, 45),
                        run_before=timeline_tab("g"))
