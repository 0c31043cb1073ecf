"""Screenshots of the live run panes, fed by the real H200 recording (and a blocked run)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from textual.pilot import Pilot

from gpuws.live.storeio import StoreHandle
from gpuws.tui.app import GpuwsApp, StartReplay
from gpuws.tui.screens.run import RunScreen
from tui.tuikit import RECORDED, RECORDING  # type: ignore[import-not-found]

FIXED_NOW = 1_795_270_000.0
SnapCompare = Callable[..., bool]


def replay_app(source: Path) -> GpuwsApp:
    return GpuwsApp(StartReplay(str(source), speed=None), store=StoreHandle.throwaway(),
                    now=lambda: FIXED_NOW)


async def until(pilot: Pilot[Any], ready: Callable[[], bool], timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.05)):
        if ready():
            await pilot.pause(0.1)
            return
        await pilot.pause(0.05)
    raise AssertionError("the app did not settle")


def replayed(*keys: str) -> Callable[[Pilot[Any]], Awaitable[None]]:
    """run_before: wait for the whole recording to be shown, then press keys."""

    async def run_before(pilot: Pilot[Any]) -> None:
        app = pilot.app
        assert isinstance(app, GpuwsApp)

        def shown() -> bool:
            screen = app.screen
            # The screen may be pushed and not composed yet: no panes to ask then.
            return (isinstance(screen, RunScreen) and bool(screen.query("RunPanes"))
                    and screen.panes.model.finished is not None and app.feed.backlog == 0)

        await until(pilot, shown)
        await pilot.pause(0.4)  # the Tier-1 pane's last throttled redraw
        for key in keys:
            await pilot.press(key)
            await pilot.pause(0.1)
        app.clear_notifications()
        await pilot.pause()

    return run_before


def test_live_run_timing_80x24(snap_compare: SnapCompare) -> None:
    """The recorded saxpy run at 80×24: tiers, final Tier-1 statistics, histogram, output."""
    app = replay_app(RECORDING)
    assert snap_compare(app, terminal_size=(80, 24), run_before=replayed())
    app.store.close_blocking()


def test_live_run_kernels_tab(snap_compare: SnapCompare) -> None:
    """Tier 2's kernel table, ncu's 20 passes, static analysis."""
    app = replay_app(RECORDING)
    assert snap_compare(app, terminal_size=(100, 30), run_before=replayed("2"))
    app.store.close_blocking()


def test_live_run_findings_tab(snap_compare: SnapCompare) -> None:
    """ncu's rule findings, biggest estimated speedup first."""
    app = replay_app(RECORDING)
    assert snap_compare(app, terminal_size=(100, 30), run_before=replayed("4"))
    app.store.close_blocking()


def test_live_run_wide_puts_the_log_beside(snap_compare: SnapCompare) -> None:
    """At 160 columns the output pane moves beside the tabs."""
    app = replay_app(RECORDING)
    assert snap_compare(app, terminal_size=(160, 44), run_before=replayed("3"))
    app.store.close_blocking()


def test_blocked_counters_banner(snap_compare: SnapCompare, tmp_path: Path) -> None:
    """Counters blocked: the banner says what fell back and what was not measured."""
    source = tmp_path / "blocked.ndjson"
    source.write_bytes(b"".join(RECORDED.blocked_run("20251121-101010-blocked")))
    app = replay_app(source)
    assert snap_compare(app, terminal_size=(100, 32), run_before=replayed("2"))
    app.store.close_blocking()
