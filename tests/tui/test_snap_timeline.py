"""Screenshots of the Timeline tab at 80x24 and 160x45: real runs recorded on an H200
(tests/fixtures/real-programs-h200x2), stored with their traces pulled: HF `generate` whole, and a
two-rank DDP step after g (the next idle gap)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from textual.pilot import Pilot
from textual.widgets import TabbedContent

from gpuws.tui.screens.results import ResultsScreen
from gpuws.tui.widgets.run.timeline import TimelineView
from tui.timelinekit import RECORDINGS, store_real  # type: ignore[import-not-found]
from tui.tuikit import (  # type: ignore[import-not-found]
    SnapCompare,
    frozen_app,
    replay_app,
    replayed,
    settle,
)


def timeline_tab(run_id: str, *keys: str) -> Callable[[Pilot[Any]], Awaitable[None]]:
    async def run_before(pilot: Pilot[Any]) -> None:
        screen = ResultsScreen(run_id)
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


def test_timeline_whole_run_80x24(snap_compare: SnapCompare, snapshot_home: Path) -> None:
    """HF generate whole: its streams, the judged window over them, Tier 2's top kernel
    selected with the Python line that launched it."""
    run_id = store_real("hf_generate")
    assert snap_compare(frozen_app(), terminal_size=(80, 24),
                        run_before=timeline_tab(run_id))


def test_timeline_two_ranks_next_gap_160x45(snap_compare: SnapCompare,
                                            snapshot_home: Path) -> None:
    """Two ranks, three streams each; after g: the next idle gap of the selected row's
    rank a quarter of the view, the block after it selected."""
    run_id = store_real("ddp_step")
    assert snap_compare(frozen_app(), terminal_size=(160, 45),
                        run_before=timeline_tab(run_id, "g"))


def test_a_command_run_s_timing_tab_80x24(snap_compare: SnapCompare) -> None:
    """The recorded HF generate run (a `cmd:`, Tier 2 only) replayed: its Timing tab says
    why there are no Tier-1 samples and how long the command ran, with no empty chart
    (issue 34, finding 20)."""
    app = replay_app(RECORDINGS / "hf_generate.ndjson")
    assert snap_compare(app, terminal_size=(80, 24), run_before=replayed())
    app.store.close_blocking()
