"""Screenshots of a run's results and artifacts, read from a store holding the recording.

The comparison is the recorded run against itself recorded again under another id (the
same samples: a comparison that must say "within noise").
"""

from __future__ import annotations

import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from textual.pilot import Pilot
from textual.widgets import TabbedContent

from gpuws.locations import artifacts_dir
from gpuws.sessions.store import Store
from gpuws.tui.app import GpuwsApp, StartHome
from gpuws.tui.screens.artifacts import ArtifactsScreen
from gpuws.tui.screens.results import ResultsScreen
from tui.tuikit import (  # type: ignore[import-not-found]
    RECORDED,
    REPORT,
    fill_store,
    h200_probe,
    recorded_events,
)

FIXED_NOW = 1_795_270_000.0
SnapCompare = Callable[..., bool]
RERUN = "20261121-131500-b0b0b0"


def app() -> GpuwsApp:
    return GpuwsApp(StartHome(), now=lambda: FIXED_NOW,
                    ssh_config="/nonexistent/gpuws-test/ssh_config")


def with_baseline() -> str:
    """The recording as the baseline, and a second run of it compared with the first."""
    sid, run_id = fill_store()
    with Store() as s:
        s.set_baseline(run_id)
        s.ingest_many(sid, recorded_events(RERUN))
        assert s.run(RERUN).baseline_of == run_id  # same workload: compared automatically
    return RERUN


def results(run_id: str, tab: str) -> Callable[[Pilot[Any]], Awaitable[None]]:
    async def run_before(pilot: Pilot[Any]) -> None:
        screen = ResultsScreen(run_id)
        await pilot.app.push_screen(screen)
        for _ in range(100):
            if screen.results is not None:
                break
            await pilot.pause(0.05)
        screen.query_one(TabbedContent).active = tab
        # Under a loaded machine 0.3 s was sometimes too short for the tab to settle.
        await pilot.wait_for_scheduled_animations()
        await pilot.pause(0.6)

    return run_before


def test_results_metrics_by_section(snap_compare: SnapCompare, snapshot_home: Path) -> None:
    """Canonical metrics under their report sections, warp stalls below."""
    assert snap_compare(app(), terminal_size=(100, 40),
                        run_before=results(with_baseline(), "tab-metrics"))


def test_results_roofline(snap_compare: SnapCompare, snapshot_home: Path) -> None:
    """The workload on the roofline under Tier 1's measured bandwidth and the FP32 peak."""
    assert snap_compare(app(), terminal_size=(100, 32),
                        run_before=results(with_baseline(), "tab-roofline"))


def test_results_compare_with_baseline(snap_compare: SnapCompare, snapshot_home: Path) -> None:
    """Speedup with its CI, Cliff's δ, metric deltas."""
    assert snap_compare(app(), terminal_size=(100, 40),
                        run_before=results(with_baseline(), "tab-compare"))


def test_artifacts_pulled(snap_compare: SnapCompare, snapshot_home: Path) -> None:
    """A pulled report: size, sha256 (verified by the store), local path, how to open it."""
    sid, run_id = fill_store()
    local = artifacts_dir(sid, run_id) / "profile.ncu-rep"
    shutil.copyfile(REPORT, local)
    with Store() as s:
        s.mark_pulled(run_id, "profile.ncu-rep", local)

    async def run_before(pilot: Pilot[Any]) -> None:
        await pilot.app.push_screen(ArtifactsScreen(run_id))
        await pilot.pause(0.4)

    assert snap_compare(app(), terminal_size=(100, 20), run_before=run_before)


def test_results_of_a_failed_run_say_why(snap_compare: SnapCompare, snapshot_home: Path) -> None:
    """Counters blocked: the summary and the metrics tab say Tier 3 failed and why."""
    run_id = "20261121-101010-blocked"
    with Store() as s:
        sid = s.open_session("l4", "ssh+sftp", h200_probe(), 0.8, started=RECORDED.T0 - 30)
        s.ingest_many(sid, RECORDED.blocked_run(run_id))
        s.end_session(sid, ended=RECORDED.T0 + 60)
    assert snap_compare(app(), terminal_size=(100, 24),
                        run_before=results(run_id, "tab-metrics"))


def test_results_of_a_tier1_only_run(snap_compare: SnapCompare, snapshot_home: Path) -> None:
    """No Tier 3 asked for: the metrics tab says so instead of "no metrics yet"."""
    run_id = "20261121-111111-t1only"
    with Store() as s:
        sid = s.open_session("h200", "ssh+sftp", h200_probe(), 3.99, started=RECORDED.T0 - 30)
        s.ingest_many(sid, RECORDED.saxpy_run(run_id, tiers=(1,)))
        s.end_session(sid, ended=RECORDED.T0 + 60)
    assert snap_compare(app(), terminal_size=(100, 16),
                        run_before=results(run_id, "tab-metrics"))


def test_results_verdict_of_a_blocked_run(snap_compare: SnapCompare,
                                          snapshot_home: Path) -> None:
    """Counters blocked: the verdict says what it could tell without them, and from what."""
    run_id = "20261121-101010-blocked"
    with Store() as s:
        sid = s.open_session("l4", "ssh+sftp", h200_probe(), 0.8, started=RECORDED.T0 - 30)
        s.ingest_many(sid, RECORDED.blocked_run(run_id))
        s.end_session(sid, ended=RECORDED.T0 + 60)
    assert snap_compare(app(), terminal_size=(100, 24),
                        run_before=results(run_id, "tab-verdict"))
