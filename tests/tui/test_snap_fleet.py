"""The fleet screen: a stored fleet's comparison, reached from Sessions with ``m``.

The store holds a fleet of three pods: the first is the real H200 saxpy recording
(tests/fixtures/recorded), the second a saxpy stream of tests/sessions/recorded.py (the
real H200 probe, ncu report and metrics, its Tier-1 samples generated around a chosen
median: only one real Tier-1 recording exists, and a comparison needs two), the third a
pod that could not be reached. Figures in the table are computed from those events by
the same code ``gpuws run POD POD ...`` ends with.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
from textual.pilot import Pilot
from textual.widgets import DataTable

from gpuws import protocol
from gpuws.sessions.store import Store
from gpuws.tui.screens.fleet import FleetScreen
from gpuws.tui.screens.results import ResultsScreen
from gpuws.tui.screens.sessions import SessionsScreen
from tui.tuikit import (  # type: ignore[import-not-found]
    RECORDED,
    SnapCompare,
    h200_probe,
    recorded_events,
)
from tui.tuikit import frozen_app as app_on  # type: ignore[import-not-found]
from tui.tuikit import settle as until  # type: ignore[import-not-found]

UNREACHABLE = ("Connection refused: connection to 203.0.113.9:22 refused — is sshd running "
               "there, and is the port right (-p / Port)?")


def fill_fleet() -> tuple[str, list[str]]:
    """The fleet described above; returns its id and the pods' session ids."""
    real = recorded_events()
    t0 = real[0].ts
    second: list[protocol.Events] = []
    for line in RECORDED.saxpy_run("20261121-131100-5e0c0bd1", t0=t0 + 1, median_ms=0.2061,
                                   mode="hot"):
        ev = protocol.decode_event(line)
        assert not isinstance(ev, protocol.BadLine)
        second.append(ev)
    probe = h200_probe()
    sessions = []
    pods: list[tuple[str, list[protocol.Events]]] = [("h200-a", real), ("h200-b", second)]
    with Store() as s:
        spec = msgspec.convert({"workload": "builtin:saxpy"}, protocol.RunSpec)
        fid = s.open_fleet(spec, ["h200-a", "h200-b", "a100-c"], started=t0 - 40)
        for position, (host, events) in enumerate(pods):
            sid = s.open_session(host, "ssh+sftp", probe, 3.99, started=t0 - 30)
            s.ingest_many(sid, events)
            s.end_session(sid, ended=events[-1].ts + 5)
            run_id = events[0].run_id
            assert run_id is not None
            s.set_fleet_pod(fid, position, status="ok", session_id=sid, run_id=run_id)
            sessions.append(sid)
        s.set_fleet_pod(fid, 2, status="unreachable", error=UNREACHABLE)
        s.end_fleet(fid, ended=second[-1].ts + 6)
    return fid, sessions


def comparison_rows(app: Any) -> int:
    screen = app.screen
    return screen.query_one("#comparison", DataTable).row_count \
        if isinstance(screen, FleetScreen) else 0


def test_fleet_comparison(snap_compare: SnapCompare, snapshot_home: Path) -> None:
    """Pods, GPU, driver, median ± CI, GB/s with % of peak, speedup vs the first pod,
    wall; the unreachable pod's line says why."""
    fill_fleet()

    async def run_before(pilot: Pilot[Any]) -> None:
        await pilot.app.push_screen(FleetScreen())
        await until(pilot, lambda: comparison_rows(pilot.app) == 3)

    assert snap_compare(app_on(), terminal_size=(160, 30), run_before=run_before)


async def test_sessions_m_opens_the_fleet_of_the_selected_session() -> None:
    """From a session that was one pod of a fleet, ``m`` opens that fleet; ``r`` a pod's
    results; ``e`` writes the comparison (the store is this test's own, not the
    screenshots' shared directory)."""
    fid, (_, second) = fill_fleet()
    app = app_on()
    async with app.run_test(size=(160, 40)) as pilot:
        await app.push_screen(SessionsScreen(second))
        await until(pilot, lambda: pilot.app.screen.query_one("#runs", DataTable).row_count > 0)
        await pilot.press("m")
        await until(pilot, lambda: comparison_rows(app) == 3)
        screen = app.screen
        assert isinstance(screen, FleetScreen) and screen.fleet_id == fid
        assert screen.comparison is not None
        lines = screen.comparison.lines
        assert [line.pod for line in lines] == ["h200-a", "h200-b", "a100-c"]
        assert lines[0].median_ms is not None and lines[1].speedup is not None
        assert lines[2].median_ms is None and lines[2].error == UNREACHABLE
        table = screen.query_one("#comparison", DataTable)
        table.focus()
        table.move_cursor(row=1)
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, ResultsScreen))
        assert isinstance(app.screen, ResultsScreen)
        assert app.screen.run_id == lines[1].run_id
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, FleetScreen))
        await pilot.press("e")
        path = app.exports_dir() / f"gpuws-fleet-{fid}.md"
        await until(pilot, path.exists)
        text = path.read_text()
        assert "| `h200-b` | ok | NVIDIA H200 |" in text
        assert f"- a100-c unreachable: {UNREACHABLE}" in text.replace("\\|", "|")
