"""What a newcomer met in the TUI, second round (issue 34, finding 19): words that said
"yet" or "finished" when nothing more would come. A cancelled run's tier read "failed —
exit code -15", its Timing tab "no samples yet", a run whose Tiers 2 and 3 were skipped
"no verdict yet: it comes with Tier 2's kernel table…"."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console
from textual.pilot import Pilot
from textual.widget import Widget
from textual.widgets import Static

from gpuws import protocol
from gpuws.tui.app import GpuwsApp, StartHome
from gpuws.tui.screens.run import RunScreen
from gpuws.tui.widgets.run.histogram import Histogram
from gpuws.tui.widgets.run.tier_strip import TierStrip
from gpuws.tui.widgets.run.verdict import VerdictView
from tui.tuikit import recorded_events, until  # type: ignore[import-not-found]

NO_SSH_CONFIG = "/nonexistent/gpuws-test/ssh_config"


def _text(widget: Widget) -> str:
    """What a widget shows, as plain text (a table's cells too)."""
    console = Console(width=200, record=True, file=io.StringIO())
    # A Static's content as given (a tier strip's rich Table), else what it renders.
    console.print(widget.content if isinstance(widget, Static) else widget.render())
    return console.export_text()


def _run_that_ends(tier_ends: list[protocol.TierFinished], status: str,
                   exit_code: int | None = None) -> list[protocol.Events]:
    """The recorded saxpy run's start, then these tier ends and a run end of ``status``."""
    started = recorded_events()[0]
    assert isinstance(started, protocol.RunStarted)
    run_id, ts = started.run_id, started.ts
    events: list[protocol.Events] = [started]
    seq = 1
    for end in tier_ends:
        events.append(protocol.TierStarted(run_id=run_id, seq=seq, ts=ts + seq, tier=end.tier,
                                           name=f"tier {end.tier}"))
        end.run_id, end.seq, end.ts = run_id, seq + 1, ts + seq + 1
        events.append(end)
        seq += 2
    events.append(protocol.RunFinished(run_id=run_id, seq=seq, ts=ts + seq,
                                       status=status,  # type: ignore[arg-type]
                                       wall_s=float(seq), exit_code=exit_code))
    return events


async def _show(pilot: Pilot[Any], events: list[protocol.Events]) -> RunScreen:
    from gpuws.tui.messages import RunEvents
    screen = RunScreen(events[0].run_id or "", live=True, backfill=False)
    await pilot.app.push_screen(screen)
    screen.post_message(RunEvents(screen.run_id, events, [0.0] * len(events)))
    await until(pilot, lambda: screen.query_one("RunPanes").model.finished is not None)
    return screen


async def test_a_cancelled_run_reads_cancelled_not_failed_with_exit_code_minus_15() -> None:
    """The cancel's SIGTERM came back as Tier 1 "failed — exit code -15" and an empty
    histogram "no samples yet"; both say cancelled now, and nothing says "yet"."""
    events = _run_that_ends([protocol.TierFinished(tier=1, status="failed", wall_s=2.69,
                                                   reason="exit code -15")], "cancelled")
    app = GpuwsApp(StartHome(), ssh_config=NO_SSH_CONFIG)
    async with app.run_test(size=(160, 45)) as pilot:
        screen = await _show(pilot, events)
        strip = screen.query_one(TierStrip)
        await until(pilot, lambda: "cancelled (SIGTERM)" in _text(strip))
        assert "exit code -15" not in _text(strip)
        hist = screen.query_one(Histogram)
        await until(pilot, lambda: "cancelled — no samples" in _text(hist))
        verdict = screen.query_one(VerdictView)
        await until(pilot, lambda: "no verdict: " in _text(verdict))
        assert "yet" not in _text(verdict), _text(verdict)
        await app.shutdown()


async def test_a_failed_run_keeps_its_exit_code_and_its_histogram_says_failed() -> None:
    """A program that failed on its own (exit code 1) still reads failed, with its code."""
    events = _run_that_ends([protocol.TierFinished(tier=1, status="failed", wall_s=0.4,
                                                   reason="exit code 1")], "failed", 1)
    app = GpuwsApp(StartHome(), ssh_config=NO_SSH_CONFIG)
    async with app.run_test(size=(160, 45)) as pilot:
        screen = await _show(pilot, events)
        strip = screen.query_one(TierStrip)
        await until(pilot, lambda: "exit code 1" in _text(strip))
        assert "cancelled" not in _text(strip)
        hist = screen.query_one(Histogram)
        await until(pilot, lambda: "failed — no samples" in _text(hist))
        await app.shutdown()


async def test_a_run_with_tiers_2_and_3_skipped_says_so_in_its_verdict_tab() -> None:
    """Not "no verdict yet: it comes with Tier 2's kernel table": nothing more will come."""
    events = _run_that_ends([
        protocol.TierFinished(tier=1, status="failed", wall_s=0.4, reason="exit code 1"),
        protocol.TierFinished(tier=2, status="skipped", wall_s=0.0, reason="no nsys"),
        protocol.TierFinished(tier=3, status="skipped", wall_s=0.0, reason="no ncu"),
    ], "ok")
    app = GpuwsApp(StartHome(), ssh_config=NO_SSH_CONFIG)
    async with app.run_test(size=(160, 45)) as pilot:
        screen = await _show(pilot, events)
        verdict = screen.query_one(VerdictView)
        await until(pilot, lambda: "no verdict: Tiers 2 and 3 were skipped" in _text(verdict))
        await app.shutdown()
