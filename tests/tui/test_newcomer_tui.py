"""What a newcomer met in the TUI (issue 24, "The TUI"): a clock that stopped between
events, a destination box that looked focused while keys went to hotkeys, a replay that
did not leave, run ids cut on Sessions, a dashboard that moved under the reader, a
launcher that kept Tier 1 ticked for commands and forgot the kernel."""

from __future__ import annotations

from typing import Any

from textual.pilot import Pilot

from gpuws import protocol
from gpuws.tui.app import GpuwsApp, StartHome
from gpuws.tui.messages import RunEvents
from gpuws.tui.screens.run import RunScreen
from tui.tuikit import recorded_events, until  # type: ignore[import-not-found]

NO_SSH_CONFIG = "/nonexistent/gpuws-test/ssh_config"


class Clock:
    """The app's wall clock, moved by the test (the run screen ages a live run by it)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def _send(pilot: Pilot[Any], screen: RunScreen, events: list[protocol.Events]) -> None:
    screen.post_message(RunEvents(screen.run_id, events, [0.0] * len(events)))
    await pilot.pause()


async def test_a_live_runs_clock_moves_between_events_and_stops_at_the_end() -> None:
    """The title read "running · 0.3 s" while the workload had run 8.5 s: it moved only
    when an event came. It follows the clock every second now, and stops at the end."""
    events = recorded_events()
    started = events[0].ts
    clock = Clock(started)
    app = GpuwsApp(StartHome(), ssh_config=NO_SSH_CONFIG, now=clock)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = RunScreen(events[0].run_id or "", live=True, backfill=False)
        await app.push_screen(screen)
        await _send(pilot, screen, events[:2])  # started, Tier 1 started: then silence
        await until(pilot, lambda: "running · " in screen.sub_title)
        clock.now = started + 8.5  # 8.5 s later, no event since
        await until(pilot, lambda: "running · 8.5 s" in screen.sub_title)
        assert screen.clock_running
        await _send(pilot, screen, events[2:])  # the rest, to run_finished
        finished = events[-1]
        assert isinstance(finished, protocol.RunFinished)
        clock.now = started + 600  # the run's end, not the clock, decides what it reads
        await until(pilot, lambda: not screen.clock_running)
        assert f" {finished.wall_s:.1f} s" in screen.sub_title, screen.sub_title
        await app.shutdown()
