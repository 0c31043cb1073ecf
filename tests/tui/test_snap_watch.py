"""A screenshot of the watch screen after four saves: medians with their CIs, the changes
against the previous iteration and the baseline with their verdicts, a failed iteration
with its error, the chart.

Deterministic data, driven through the screen's own update methods (the real loop drives
them in test_watch_screen.py): the Tier-1 samples of the real H200 saxpy recording for the
start, the same calls 7% faster for the edits (the same samples scaled, then reversed: "no
difference" against each other), and the error text the pod gives a workload that exits 1.
The comparisons are ``sessions.compare``'s, as the loop makes them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from textual.pilot import Pilot

from gpuws import protocol
from gpuws.live.watchloop import Iteration, WatchStatus
from gpuws.sessions.compare import compare_samples
from gpuws.tui.screens.watch import WatchScreen
from tui.tuikit import SnapCompare, frozen_app, recorded_events, settle  # type: ignore[import-not-found]

ROOT = Path("/home/me/attn-kernels")


def recorded() -> tuple[list[float], protocol.TimingStats]:
    samples: list[float] = []
    stats = None
    for ev in recorded_events():
        if isinstance(ev, protocol.Samples):
            samples += ev.values_ms
        elif isinstance(ev, protocol.Tier1Result):
            stats = ev.stats
    assert samples and stats is not None
    return samples, stats


def measured(n: int, changed: list[str], run_id: str, samples: list[float],
             stats: protocol.TimingStats, scale: float) -> Iteration:
    return Iteration(n, changed, run_id=run_id, status="ok", samples=samples,
                     median_ms=stats.median_ms * scale, ci_pct=stats.ci_rel_halfwidth * 100,
                     ci_low_ms=stats.ci_low_ms * scale, ci_high_ms=stats.ci_high_ms * scale)


def iterations() -> list[Iteration]:
    base, stats = recorded()
    faster = [v * 0.93 for v in base]
    again = list(reversed(faster))
    one = measured(1, [], "20261125-021500-5e1a7c01", base, stats, 1.0)
    two = measured(2, ["kern/attn.py"], "20261125-021642-5e1a7c02", faster, stats, 0.93)
    two.vs_prev = two.vs_base = compare_samples(base, faster)
    three = Iteration(3, ["kern/attn.py"], run_id="20261125-021733-5e1a7c03", status="failed",
                      error="the workload exited with code 1")
    four = measured(4, ["kern/attn.py", "kern/__init__.py"], "20261125-021811-5e1a7c04",
                    again, stats, 0.93)
    four.vs_prev = compare_samples(faster, again)
    four.vs_base = compare_samples(base, again)
    return [one, two, three, four]


def test_watch_screen_four_iterations(snap_compare: SnapCompare) -> None:
    its = iterations()
    base_ms = its[0].median_ms

    async def run_before(pilot: Pilot[Any]) -> None:
        screen = WatchScreen("file:bench/attn.py", [ROOT])
        await pilot.app.push_screen(screen)
        await settle(pilot, lambda: screen.is_mounted)
        for it in its:
            screen.show_iteration(it, 1, base_ms)
        screen.show_status(WatchStatus("waiting", 4, 12))
        await settle(pilot, lambda: screen.query_one("#iterations").row_count == 4)

    assert snap_compare(frozen_app(), terminal_size=(120, 36), run_before=run_before)


def test_verdicts_of_the_recorded_iterations() -> None:
    """What the screenshot shows is what the comparisons say."""
    one, two, _three, four = iterations()
    assert two.vs_prev is not None and not two.vs_prev.within_noise
    assert two.vs_prev.speedup > 1  # faster
    assert four.vs_prev is not None and four.vs_prev.within_noise  # the same calls
    assert four.vs_base is not None and four.vs_base.speedup > 1 and not four.vs_base.within_noise
    assert one.vs_prev is None and one.vs_base is None


async def test_b_makes_the_selected_iteration_the_baseline() -> None:
    """b on row 2: the loop (``WatchLoop.set_baseline``) compares every iteration with #2
    again and the screen shows it: the star moves, #1 reads slower than the baseline, #4
    no different from it. The loop holds the recorded iterations (it never ran: no GPU)."""
    from textual.widgets import DataTable

    from gpuws.live.watchloop import WatchLoop
    from gpuws.tui.messages import WatchIterationDone

    app = frozen_app()
    async with app.run_test(size=(120, 36)) as pilot:
        screen = WatchScreen("file:bench/attn.py", [ROOT])
        await app.push_screen(screen)
        await settle(pilot, lambda: screen.is_mounted)
        its = iterations()

        def shown(it: Iteration) -> None:
            median = next(i.median_ms for i in loop.iterations if i.n == loop.baseline_n)
            screen.post_message(WatchIterationDone(it, loop.baseline_n, median))

        loop = WatchLoop(app.engine, [ROOT], lambda: protocol.RunSpec(workload="builtin:saxpy"),
                         on_iteration=shown)
        loop.iterations = its
        loop.baseline, loop.baseline_n = its[0].samples, 1
        app.watch_loop = loop
        for it in its:
            screen.show_iteration(it, 1, its[0].median_ms)
        table = screen.query_one("#iterations", DataTable)
        table.move_cursor(row=1)
        await pilot.press("b")
        await settle(pilot, lambda: screen.baseline_n == 2
                     and str(table.get_row_at(0)[4]) != "—")
        cells = [[str(c) for c in table.get_row_at(i)] for i in range(4)]
        assert [r[0] for r in cells] == ["1", "★2", "3", "4"]
        assert cells[0][4].startswith("+7.5%") and cells[0][5] == "— · base: slower"
        assert cells[1][4] == "—" and cells[1][5] == "faster"
        assert cells[3][4].startswith("+0.0%") and cells[3][5] == "no difference"
        assert "baseline #2" in str(screen.query_one("#watch-status").render())
        # b on a failed iteration is refused in a banner, and nothing changes.
        notes: list[str] = []
        app.notify = lambda message, **_: notes.append(message)  # type: ignore[method-assign]
        table.move_cursor(row=2)
        await pilot.press("b")
        await settle(pilot, lambda: bool(notes))
        assert "#3 has no Tier-1 samples" in notes[0] and screen.baseline_n == 2
