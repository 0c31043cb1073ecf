"""Helpers for the TUI tests: the real recording, the H200 probe, a filled store.

Imported as ``tui.tuikit`` (``tests`` is on the path; test modules are imported by path).
"""

from __future__ import annotations

import importlib.util
import itertools
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import msgspec
from textual.message import Message
from textual.pilot import Pilot
from textual.widgets import Input

from gpuws import protocol
from gpuws.live.storeio import StoreHandle
from gpuws.sessions.store import Store
from gpuws.tui.app import GpuwsApp, StartHome, StartReplay
from gpuws.tui.messages import RunEvents
from gpuws.tui.screens.run import RunScreen

FIXTURES = Path(__file__).parent.parent / "fixtures"
RECORDING = FIXTURES / "recorded" / "saxpy_h200.ndjson"
REPORT = FIXTURES / "recorded" / "saxpy_h200.ncu-rep"


def _load_recorded() -> ModuleType:
    # tests/sessions/recorded.py builds realistic streams from the real H200 fixtures
    # (the probe among them); loaded by path, under a name no other test tree uses.
    path = Path(__file__).parent.parent / "sessions" / "recorded.py"
    spec = importlib.util.spec_from_file_location("gpuws_tui_recorded", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RECORDED = _load_recorded()


def recorded_events(run_id: str | None = None) -> list[protocol.Events]:
    """The real H200 recording's events (optionally under another run id)."""
    events = []
    for line in RECORDING.read_bytes().splitlines():
        ev = protocol.decode_event(line)
        assert not isinstance(ev, protocol.BadLine)
        events.append(ev if run_id is None else msgspec.structs.replace(ev, run_id=run_id))
    return events


def h200_probe() -> protocol.Probe:
    """The H200 pod's probe, from the real fixtures (tests/sessions/recorded.py)."""
    return msgspec.convert(RECORDED.probe(), protocol.Probe)


def fill_store(path: Path | None = None) -> tuple[str, str]:
    """A finished session on the H200 pod holding the real recording; (session, run) ids."""
    events = recorded_events()
    with Store(path) as s:
        sid = s.open_session("h200", "ssh+sftp", h200_probe(), 3.99, 20.0,
                             started=events[0].ts - 30)
        s.ingest_many(sid, events)
        s.end_session(sid, ended=events[-1].ts + 60)
    run_id = events[0].run_id
    assert run_id is not None
    return sid, run_id


def gated_count(gate: Path) -> str:
    """A command printing line-1 … line-10, waiting for ``gate`` to exist, then line-11 … 40.

    The test decides when the second half comes (after it left, dropped the link, …), so
    "mid-run" is true however slow the machine is.
    """
    return (f"for i in $(seq 1 10); do echo line-$i; done; "
            f"while [ ! -e {gate} ]; do sleep 0.02; done; "
            f"for i in $(seq 11 40); do echo line-$i; sleep 0.01; done")


async def until(pilot: Pilot[Any], ready: Callable[[], Any], timeout: float = 60.0) -> None:
    """Let the app run until ``ready()`` holds, then until what that set off is done (mounts,
    animations, the messages they posted: the app idle), however slow the machine."""
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out; screen is {pilot.app.screen!r}")
        await pilot.pause(0.05)
    await pilot.wait_for_scheduled_animations()


def outputs(messages: list[Message], run_id: str | None = None) -> list[str]:
    """The output lines the panes were sent, in order."""
    return [e.text for m in messages if isinstance(m, RunEvents)
            and (run_id is None or m.run_id == run_id)
            for e in m.events if isinstance(e, protocol.Output)]


def run_screen(app: GpuwsApp) -> RunScreen:
    """The current screen, which must be a run's."""
    screen = app.screen
    assert isinstance(screen, RunScreen), screen
    return screen


async def launch_command(pilot: Pilot[Any], command: str) -> RunScreen:
    """From the dashboard: n, pick 'command', type it, Ctrl+R."""
    await pilot.press("n")
    await until(pilot, lambda: pilot.app.screen.query("#kind-cmd"))
    await pilot.click("#kind-cmd")
    # Picking "command" puts the focus in its box, ready for typing.
    await until(pilot, lambda: getattr(pilot.app.focused, "id", None) == "cmd")
    pilot.app.screen.query_one("#cmd", Input).value = command
    await pilot.press("ctrl+r")
    await until(pilot, lambda: isinstance(pilot.app.screen, RunScreen))
    return run_screen(pilot.app)  # type: ignore[arg-type]


#: The clock of every snapshot: screenshots show times, so they must not move.
FIXED_NOW = 1_795_270_000.0
SnapCompare = Callable[..., bool]


async def settle(pilot: Pilot[Any], ready: Callable[[], bool], timeout: float = 60.0) -> None:
    """Wait for ``ready()``, then for the app to be idle with no animation left: tables
    size their columns on idle, so a screenshot taken then is the settled screen."""
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError("the app did not settle")
        await pilot.pause(0.05)
    await pilot.wait_for_scheduled_animations()
    await pilot.pause()


def frozen_app(start: Any = None, ssh_config: str = "/nonexistent/gpuws-test/ssh_config"
               ) -> GpuwsApp:
    """The app with frozen clocks and no ssh config of the machine's own."""
    ticks = itertools.count()
    return GpuwsApp(start or StartHome(), now=lambda: FIXED_NOW,
                    step_clock=lambda: next(ticks) * 0.125, ssh_config=ssh_config)


def replay_app(source: Path) -> GpuwsApp:
    """A replay of ``source`` as fast as it goes, into a throwaway store."""
    return GpuwsApp(StartReplay(str(source), speed=None), store=StoreHandle.throwaway(),
                    now=lambda: FIXED_NOW)


def replayed(*keys: str) -> Callable[[Pilot[Any]], Awaitable[None]]:
    """run_before: wait for the whole recording to be shown, then press keys."""

    async def run_before(pilot: Pilot[Any]) -> None:
        app = pilot.app
        assert isinstance(app, GpuwsApp)

        def shown() -> bool:
            screen = app.screen
            # The screen may be pushed and not composed yet: no panes to ask then. The
            # Tier-1 pane's last throttled redraw must have come too.
            return (isinstance(screen, RunScreen) and bool(screen.query("RunPanes"))
                    and screen.panes.model.finished is not None and app.feed.backlog == 0
                    and not screen.panes.timing_redraw_pending)

        await settle(pilot, shown)
        for key in keys:
            await pilot.press(key)
            await pilot.wait_for_scheduled_animations()
        app.clear_notifications()
        await pilot.wait_for_scheduled_animations()

    return run_before
