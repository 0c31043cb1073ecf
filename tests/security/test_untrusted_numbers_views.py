"""Stored hostile numbers: no view of a run may crash on what an older gpuws let in.

Before the boundary refused non-physical values, a Tier-1 sample of 1e308 passed the checks,
was stored, and crashed the histogram each time the run was opened again. The store holds
what it holds; so each numeric field of every event type the recording has is set here to
the worst values (±1e308, the smallest subnormal, zero, -1, ±2**53 for integers), the run is
stored directly (as the old boundary let it through) and opened in every view: the run's
panes (each tab), its results (each tab), its artifacts, the sessions screen, the export.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from textual.widgets import TabbedContent

from faults.figures import record  # type: ignore[import-not-found]
from gpuws import protocol
from gpuws.cli import main
from gpuws.sessions.export import export_session
from gpuws.sessions.store import Store
from gpuws.tui.app import GpuwsApp, StartHome
from gpuws.tui.screens.artifacts import ArtifactsScreen
from gpuws.tui.screens.results import ResultsScreen
from gpuws.tui.screens.run import RunScreen
from gpuws.tui.screens.sessions import SessionsScreen
from tui.tuikit import fill_store, h200_probe, recorded_events, until  # type: ignore[import-not-found]

#: What each case opens: the run's four tabs at three sizes, the results' four tabs, the
#: artifacts, the sessions screen, and the export.
VIEWS = ("run timing", "run kernels", "run metrics", "run findings", "results metrics",
         "results findings", "results roofline", "results compare", "artifacts", "sessions",
         "export")
#: (float, int) put into every numeric field of every event.
WORST = [(1e308, 2**53), (-1e308, -(2**53)), (5e-324, 1), (0.0, 0), (-1.0, -1)]
_ENVELOPE = {"run_id", "seq", "ts", "req"}


def _poison(value: Any, f: float, i: int) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, float):
        return f
    if isinstance(value, int):
        return i
    if isinstance(value, list):
        if value and all(isinstance(v, float) for v in value):
            return [f, -f, 1.0, f, 0.0, f]  # samples: the hostile among honest ones
        return [_poison(v, f, i) for v in value]
    if isinstance(value, dict):
        return {k: _poison(v, f, i) for k, v in value.items()}
    return value


def hostile_run(run_id: str, f: float, i: int) -> list[protocol.Events]:
    """The real recording with every number (but the envelope's) set to ``f`` or ``i``."""
    out: list[protocol.Events] = []
    for ev in recorded_events(run_id):
        raw = protocol.to_builtins(ev)
        bad = {k: (v if k in _ENVELOPE or k == "type" else _poison(v, f, i))
               for k, v in raw.items()}
        out.append(msgspec.convert(bad, type(ev)))
    return out


def store_hostile(f: float, i: int) -> tuple[str, str]:
    run_id = f"r-hostile-{abs(i)}{'n' if f < 0 else 'p'}"
    events = hostile_run(run_id, f, i)
    with Store() as s:
        sid = s.open_session("evil", "ssh+sftp", h200_probe(), 3.99, 20.0,
                             started=events[0].ts - 30)
        s.ingest_many(sid, events)
        s.end_session(sid, ended=events[-1].ts + 60)
    return sid, run_id


@pytest.mark.parametrize(("f", "i"), WORST, ids=[repr(w[0]) for w in WORST])
async def test_a_stored_hostile_run_opens_in_every_view(f: float, i: int,
                                                        tmp_path: Path) -> None:
    sid, run_id = store_hostile(f, i)
    with Store() as s:
        export_session(s, sid)  # the markdown export reads the same numbers
    app = GpuwsApp(StartHome(), ssh_config="/nonexistent/gpuws-test/ssh_config")
    async with app.run_test(size=(160, 45)) as pilot:
        app.replay_stored_run(run_id)
        await until(pilot, lambda: isinstance(app.screen, RunScreen)
                    and bool(app.screen.query("RunPanes"))
                    and app.screen.panes.model.finished is not None)
        for tab in ("tab-timing", "tab-kernels", "tab-metrics", "tab-findings"):
            app.screen.query_one(TabbedContent).active = tab
            await pilot.pause(0.2)
        for size in ((80, 24), (200, 60)):
            await pilot.resize_terminal(*size)
            await pilot.pause(0.2)
        app.show_results(run_id)
        await until(pilot, lambda: isinstance(app.screen, ResultsScreen)
                    and app.screen.results is not None)
        for tab in ("tab-metrics", "tab-findings", "tab-roofline", "tab-compare"):
            app.screen.query_one(TabbedContent).active = tab
            await pilot.pause(0.2)
        app.show_artifacts(run_id)
        await until(pilot, lambda: isinstance(app.screen, ArtifactsScreen))
        await pilot.pause(0.3)
        app.push_screen(SessionsScreen(sid))
        await until(pilot, lambda: isinstance(app.screen, SessionsScreen))
        await pilot.pause(0.5)
        crashed = app._exception
    crashes = int(crashed is not None) + int(app._exception is not None)
    record("test_a_stored_hostile_run_opens_in_every_view", value=repr(f),
           views=len(VIEWS), crashes=crashes)
    assert crashes == 0, app._exception


@pytest.mark.parametrize(("f", "i"), WORST, ids=[repr(w[0]) for w in WORST])
def test_a_stored_hostile_run_in_every_headless_command(f: float, i: int) -> None:
    # The headless faces read the same stored numbers: each answers 0, no traceback.
    sid, run_id = store_hostile(f, i)
    _, honest = fill_store()
    commands = (["history"], ["history", "--json"], ["sessions"], ["sessions", "--json"],
                ["export", sid], ["compare", honest, run_id],
                ["compare", run_id, honest, "--json"])
    exits = [main(argv) for argv in commands]
    record("test_a_stored_hostile_run_in_every_headless_command", value=repr(f),
           commands=len(commands), nonzero_exits=sum(code != 0 for code in exits))
    assert exits == [0] * len(commands), list(zip(commands, exits, strict=True))
