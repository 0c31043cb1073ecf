"""Screenshots of the live run panes, fed by the real H200 recording (and a blocked run)."""

from __future__ import annotations

from pathlib import Path

from tui.tuikit import (  # type: ignore[import-not-found]
    RECORDED,
    RECORDING,
    SnapCompare,
    replay_app,
    replayed,
)


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


def test_live_run_verdict_tab(snap_compare: SnapCompare) -> None:
    """The verdicts of the recorded run (stated before verdict events existed, so derived
    by today's logic): saxpy dominates, busy share not measured, DRAM-bound with ncu's
    rules ranked, Tier 3 checked against Tier 2."""
    app = replay_app(RECORDING)
    assert snap_compare(app, terminal_size=(100, 40), run_before=replayed("5"))
    app.store.close_blocking()
