"""Every TUI view of a run whose pod wrote hostile text: no crash, no escape on the screen.

The store is filled the way a pod fills it (``hostile_text.py``: a lying agent's probe and
the real H200 recording with hostile strings in every free-text field, through the real
engine and store). Each view people open on such a run is then drawn by Textual's own
test harness: the replay's run panes (every tab), the results (every tab) of both runs,
the sessions list, the artifacts, Home's recent sessions, the dashboard of the lying pod
and the launcher offering its GPUs and the stored runs as baselines. For each: the app
must not crash (Rich/Textual markup such as ``[link=…]``, ``[/]`` or ``[@click=…]`` in a
kernel name crashed every later view of a run once stored), the screen's title and
subtitle must be free of control characters, and so must everything drawn: the text of
the app's screenshot, which is what the terminal would be sent.
"""

from __future__ import annotations

import ast
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable, Select, Static, TabbedContent

import gpuws.tui
from faults.figures import record  # type: ignore[import-not-found]
from gpuws import protocol
from gpuws.live.telemetry import TelemetryHistory
from gpuws.sessions.store import Store
from gpuws.tui import workers
from gpuws.tui.app import GpuwsApp, StartHome, StartReplay
from gpuws.tui.screens.artifacts import ArtifactsScreen
from gpuws.tui.screens.dashboard import DashboardScreen
from gpuws.tui.screens.launcher import LauncherScreen
from gpuws.tui.screens.results import ResultsScreen
from gpuws.tui.screens.run import RunScreen
from gpuws.tui.screens.sessions import SessionsScreen
from security.hostile_text import HOSTILE, PIECES, hostile_store, unsafe_chars  # type: ignore[import-not-found]
from tui.tuikit import until  # type: ignore[import-not-found]

View = Callable[[GpuwsApp, Pilot[Any]], Awaitable[None]]


class Checked:
    """What was looked at, and every unsafe character found on the way."""

    def __init__(self) -> None:
        self.views: list[str] = []
        self.problems: list[str] = []
        self.shown_escapes = 0

    async def look(self, name: str, app: GpuwsApp, pilot: Pilot[Any]) -> None:
        await pilot.pause(0.2)
        screen = app.screen
        self.views.append(name)
        for what, value in (("title", screen.title or ""), ("sub_title", screen.sub_title or "")):
            bad = unsafe_chars(value)
            if bad:
                self.problems.append(f"{name}: {what} holds {bad[:3]!r}")
        drawn = app.export_screenshot()
        bad = unsafe_chars(drawn)
        if bad:
            self.problems.append(f"{name}: the screen holds {sorted(set(bad))[:5]!r}")
        # The pod's text is there, shown as characters: \e]0;pwned is visible.
        self.shown_escapes += drawn.count("\\e]0;pwned")

    async def tabs(self, name: str, app: GpuwsApp, pilot: Pilot[Any]) -> None:
        tabbed = app.screen.query_one(TabbedContent)
        for pane in [p.id for p in tabbed.query("TabPane")]:
            assert pane is not None
            tabbed.active = pane
            await self.look(f"{name} {pane}", app, pilot)


@pytest.fixture
def store_ids() -> tuple[str, list[str]]:
    return hostile_store()


def _artifacts_shown(app: GpuwsApp, run_id: str) -> bool:
    screen = app.screen
    if not (isinstance(screen, ArtifactsScreen) and screen.run_id == run_id
            and screen.query("#art-status")):
        return False
    return "reading" not in str(screen.query_one("#art-status", Static).render())


def _probe(session_id: str) -> protocol.Probe:
    with Store() as s:
        probe = s.session(session_id).probe
    assert probe is not None and HOSTILE in probe.hostname  # the liar's probe, stored
    return probe


async def test_every_view_of_a_hostile_run(store_ids: tuple[str, list[str]]) -> None:
    session_id, runs = store_ids
    checked = Checked()

    # The replay of the stored session: each run's panes, every tab.
    app = GpuwsApp(StartReplay(session_id, speed=None))
    async with app.run_test(size=(160, 50)) as pilot:
        def finished() -> bool:
            s = app.screen
            return (isinstance(s, RunScreen) and s.run_id == runs[-1]
                    and s.panes.model.finished is not None and app.feed.backlog == 0)

        await until(pilot, finished)
        for _ in runs:
            assert isinstance(app.screen, RunScreen)
            await checked.tabs(f"replay {app.screen.run_id}", app, pilot)
            if len(app.screen_stack) > 2:
                app.pop_screen()
    assert app.return_code in (None, 0)

    app = GpuwsApp(StartHome())
    async with app.run_test(size=(160, 50)) as pilot:
        # Each view is looked at once its data is drawn, not merely mounted.
        await until(pilot, lambda: app.screen.query("#recent")
                    and app.screen.query_one("#recent", DataTable).row_count > 0)
        await checked.look("home", app, pilot)
        for run_id in runs:
            app.show_results(run_id)
            await until(pilot, lambda r=run_id: isinstance(app.screen, ResultsScreen)
                        and app.screen.run_id == r and app.screen.results is not None)
            await checked.tabs(f"results {run_id}", app, pilot)
            app.show_artifacts(run_id)
            await until(pilot, lambda r=run_id: _artifacts_shown(app, r))
            await checked.look(f"artifacts {run_id}", app, pilot)
        app.open_sessions(session_id)
        await until(pilot, lambda: isinstance(app.screen, SessionsScreen)
                    and bool(app.screen.query("#runs"))
                    and app.screen.query_one("#runs", DataTable).row_count == len(runs))
        await checked.look("sessions", app, pilot)
        probe = _probe(session_id)
        await app.push_screen(DashboardScreen("liar", probe, "ssh", TelemetryHistory()))
        await checked.look("dashboard", app, pilot)
        # The launcher: the stored runs offered as baselines (the real list, from the
        # store), then the pod's GPUs; each Select opened, so its options are drawn.
        await workers.open_launcher(app)
        await until(pilot, lambda: isinstance(app.screen, LauncherScreen))
        app.screen.query_one("#baseline", Select).expanded = True
        await checked.look("launcher baselines", app, pilot)
        app.pop_screen()
        await app.push_screen(LauncherScreen([], probe))
        app.screen.query_one("#gpu", Select).expanded = True
        await checked.look("launcher GPUs", app, pilot)
    assert app.return_code in (None, 0)

    assert checked.problems == [], "\n".join(checked.problems)
    assert checked.shown_escapes > 0
    # Reached only when no view crashed and none drew an unsafe character.
    record("test_every_view_of_a_hostile_run", views=len(checked.views),
           hostile_pieces=len(PIECES), unsafe_on_screen=len(checked.problems),
           escapes_shown_as_text=checked.shown_escapes)


def test_every_notification_of_gpuws_is_plain_text() -> None:
    """A notification's message is read as markup unless ``markup=False``; gpuws's carry
    run ids, paths, statuses and reasons from the pod, so every call says so (Textual's
    own hints keep the default, which ``GpuwsApp.notify`` leaves as Textual has it)."""
    tui = Path(gpuws.tui.__file__).parent
    calls, loose = 0, []
    for path in sorted(tui.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "notify"
                    and not isinstance(node.func.value, ast.Call)):  # not super().notify
                calls += 1
                markup = next((k.value for k in node.keywords if k.arg == "markup"), None)
                if not (isinstance(markup, ast.Constant) and markup.value is False):
                    loose.append(f"{path.name}:{node.lineno}")
    assert calls >= 25 and loose == []
