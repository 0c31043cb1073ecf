"""The Timeline view (issue 33 point 2): a real H200 HF `generate` run's pulled trace drawn
in the results screen; the keys (zoom, pan, next gap, next launch of the kernel, select)
driven by a pilot; the screens open on what matters first; hostile traces stay inert and
bounded. The run is built from real events (tests/tui/timelinekit.py)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from textual.pilot import Pilot
from textual.widgets import Sparkline, Static, TabbedContent

from gpuws.live import timeline as tl
from gpuws.live.verdicts import short
from gpuws.text.textsafe import visible
from gpuws.tui.screens.results import ResultsScreen
from gpuws.tui.screens.run import RunScreen
from gpuws.tui.widgets.quiet import QuietStatic
from gpuws.tui.widgets.run.histogram import Histogram
from gpuws.tui.widgets.run.timeline import TimelinePane, TimelineView
from gpuws.tui.widgets.run.timing import TimingPane
from tui.timelinekit import (  # type: ignore[import-not-found]
    HF,
    RECORDINGS,
    RUN_ID,
    real_trace,
    store_real,
    store_run,
)
from tui.tuikit import (  # type: ignore[import-not-found]
    frozen_app,
    replay_app,
    replayed,
    until,
)

# ---------------------------------------------------------------------- the model


def hf_timeline(tmp_path: Path) -> tl.Timeline:
    data, _ = real_trace(tmp_path)
    path = tmp_path / "t.json.gz"
    path.write_bytes(data)
    return tl.load(path)


def test_the_real_trace_becomes_rows_window_and_gaps(tmp_path: Path) -> None:
    t = hf_timeline(tmp_path)
    with gzip.open(HF, "rt") as f:
        raw = json.load(f)["traceEvents"]
    gpu = [e for e in raw if e.get("ph") == "X"
           and str(e.get("cat", "")).lower() in ("kernel", "gpu_memcpy", "gpu_memset")]
    assert t.events == len(gpu)  # every kernel and memcpy of the recording, none made up
    assert [tr.label for tr in t.tracks] == ["rank 0 · stream 7"]
    assert t.window is not None and t.window[2] == "judged window: decode steps 2-9"
    assert len(t.phases) == 3 and t.phases[0].startswith("left out: before the first kernel")
    gaps = t.gaps["rank 0"]
    assert gaps and all(hi - lo >= tl.GAP_MIN_US for lo, hi in gaps)
    track = t.tracks[0]
    for lo, hi in gaps:  # nothing runs inside a gap
        i = track.at(lo + 1e-3)
        assert i is not None and track.starts[i] >= hi - 1e-3
    fams = {tl.FAMILIES[f] for f in track.fams}
    assert {"GEMM", "attention", "elementwise", "reduction", "copy/memset"} <= fams


def test_columns_add_up_to_the_busy_time(tmp_path: Path) -> None:
    t = hf_timeline(tmp_path)
    track = t.tracks[0]
    busy = sum(e - s for s, e in zip(track.starts, track.ends, strict=True))
    for n in (7, 80, 1000):
        got = tl.columns(track, 0.0, t.end, n)
        assert got.stride == 1
        assert abs(sum(got.busy) * t.end / n - busy) < busy * 1e-6


def test_a_big_trace_is_drawn_from_its_overview_and_a_bounded_walk() -> None:
    n = 200_000
    events: list[dict[str, Any]] = [
        {"ph": "X", "cat": "kernel", "name": "nvjet_gemm" if i % 2 else "vectorized_add",
         "ts": 10.0 * i, "dur": 5.0, "pid": 0, "tid": "stream 7"} for i in range(n)]
    t = tl.build({"traceEvents": events})
    track = t.tracks[0]
    assert track.bins is not None and len(track.bins.busy) == tl.BINS
    whole = tl.columns(track, 0.0, t.end, 160)  # from the overview: no event walked
    assert all(abs(b - 0.5) < 0.01 for b in whole.busy)
    mid = tl.columns(track, 0.0, t.end / 40, 160)  # 5000 events: walked, every one
    assert mid.stride == 1
    # The walk's bound: a view with more events than MAX_WALK strides, and says so.
    track.bins = None
    assert tl.columns(track, 0.0, t.end, 160).stride == -(-n // tl.MAX_WALK)


def test_overlapping_and_zero_length_events_are_drawn_within_bounds() -> None:
    events = [{"ph": "X", "cat": "kernel", "name": "k", "ts": 0.0, "dur": 1000.0, "pid": 0,
               "tid": 1} for _ in range(500)]
    events.append({"ph": "X", "cat": "kernel", "name": "z", "ts": 10.0, "dur": 0.0, "pid": 0,
                   "tid": 1})
    t = tl.build({"traceEvents": events})
    got = tl.columns(t.tracks[0], 0.0, t.end, 50)
    assert max(got.busy) == 1.0  # 500 overlapping copies fill a column, not 500 of it


def test_two_ranks_get_a_row_per_stream_and_their_own_gaps() -> None:
    t = tl.load(RECORDINGS / "ddp_step.timeline.trace.json.gz")
    labels = [tr.label for tr in t.tracks]
    assert labels[0].startswith("rank 0 · ") and labels[-1].startswith("rank 1 · ")
    assert {tr.rank for tr in t.tracks} == {"rank 0", "rank 1"} == set(t.gaps)
    assert {tr.stream for tr in t.tracks} == {"stream 7", "stream 14", "stream 15"}
    assert t.window is not None and t.window[2] == "judged window: steps 2-39"
    assert set(t.windows) == {"rank 0", "rank 1"}  # each rank judged its own steps
    assert {w[2] for w in t.windows.values()} == {"judged window: steps 2-39"}


# ---------------------------------------------------------------------- the screen


async def open_timeline(pilot: Pilot[Any], run_id: str) -> tuple[ResultsScreen,
                                                                TimelineView]:
    app = pilot.app
    screen = ResultsScreen(run_id)
    await app.push_screen(screen)
    view = screen.query_one(TimelineView)
    await until(pilot, lambda: view.timeline is not None)
    screen.query_one(TabbedContent).active = "tab-timeline"
    await until(pilot, lambda: view.has_focus)
    return screen, view


def detail(screen: ResultsScreen) -> str:
    return str(screen.query_one("#timeline-detail", QuietStatic).render())


async def test_the_results_screen_opens_on_the_verdict() -> None:
    run_id = store_real("hf_generate")
    app = frozen_app()
    async with app.run_test(size=(120, 40)) as pilot:
        screen = ResultsScreen(run_id)
        await app.push_screen(screen)
        await until(pilot, lambda: screen.results is not None)
        tabs = screen.query_one(TabbedContent)
        assert tabs.active == "tab-verdict"
        labels = [str(t.label) for t in tabs.query("ContentTab")]
        assert labels[:2] == ["Verdict", "Timeline"]
    app.store.close_blocking()


async def test_select_zoom_pan_gap_and_next_launch() -> None:
    run_id = store_real("hf_generate")
    app = frozen_app()
    async with app.run_test(size=(160, 45)) as pilot:
        screen, view = await open_timeline(pilot, run_id)
        t = view.timeline
        assert t is not None
        track = t.tracks[view.track]
        assert (view.lo, view.hi) == (0.0, t.end)
        # It opens on the first launch of Tier 2's top kernel, its row under the rows
        # with the Python line that launched it.
        results = screen.results
        assert results is not None and results.kernel_table is not None
        top = results.kernel_table.kernels[0]
        first = track.instances(t.names.index(top.name))[0]
        assert view.index == first
        shown = detail(screen)
        assert f"Tier 2: {top.calls} calls" in shown and str(top.code) in shown
        assert f"launch 1 of {len(track.instances(track.names[first]))} on this row" in shown
        # Select: the block before, and back.
        await pilot.press("left")
        assert view.index == first - 1
        assert short(t.names[track.names[first - 1]]) in detail(screen)
        await pilot.press("right")
        assert view.index == first
        # Zoom in twice around the selected block: a quarter of the run, the block in it.
        await pilot.press("plus", "plus")
        assert abs((view.hi - view.lo) - t.end / 4) < 1e-6
        assert view.lo <= track.starts[first] <= view.hi
        # Zoom out: half the run.
        await pilot.press("minus")
        assert abs((view.hi - view.lo) - t.end / 2) < 1e-6
        # Pan on a quarter of the view, and back.
        lo = view.lo
        await pilot.press("l")
        assert abs(view.lo - (lo + t.end / 8)) < 1e-6
        await pilot.press("h")
        assert abs(view.lo - lo) < 1e-6
        # The next gap: the next idle stretch after the selected block, in view, with the
        # block after it selected.
        end = track.ends[view.index or 0]
        await pilot.press("g")
        gap = t.next_gap("rank 0", end)
        assert gap is not None
        assert view.lo <= gap[0] and gap[1] <= view.hi
        assert view.index is not None and track.starts[view.index] >= gap[1] - 1e-6
        assert "idle gap of" in detail(screen)
        # The next launch of the selected kernel: the same name, later on.
        here = view.index
        same = track.instances(track.names[here])
        await pilot.press("n")
        if len(same) > same.index(here) + 1:
            assert view.index == same[same.index(here) + 1]
            assert track.names[view.index] == track.names[here]
            assert view.lo <= track.starts[view.index] <= view.hi
        # The whole run again.
        await pilot.press("0")
        assert (view.lo, view.hi) == (0.0, t.end)
    app.store.close_blocking()


async def test_next_launch_walks_every_launch_of_the_kernel() -> None:
    run_id = store_real("hf_generate")
    app = frozen_app()
    async with app.run_test(size=(120, 40)) as pilot:
        screen, view = await open_timeline(pilot, run_id)
        t = view.timeline
        assert t is not None
        track = t.tracks[view.track]
        # The GEMM of the attention output projection: the most launched nvjet kernel.
        gemm = max((n for n in set(track.names) if t.names[n].startswith("nvjet")),
                   key=lambda n: len(track.instances(n)))
        launches = track.instances(gemm)
        assert len(launches) > 12
        view.index = launches[0]
        seen = [launches[0]]
        for _ in range(10):
            await pilot.press("n")
            seen.append(view.index)
        assert seen == launches[:11]
        view.index = launches[-2]
        await pilot.press("n", "n")
        assert view.index == launches[-1]
        assert f"the last of its {len(launches)} launches" in detail(screen)
    app.store.close_blocking()


async def test_up_and_down_move_between_ranks_and_streams_at_the_same_time() -> None:
    run_id = store_real("ddp_step")
    app = frozen_app()
    async with app.run_test(size=(160, 45)) as pilot:
        screen, view = await open_timeline(pilot, run_id)
        t = view.timeline
        assert t is not None and len(t.tracks) == 6
        await pilot.press("0", *["up"] * len(t.tracks))
        assert view.track == 0
        seen = [t.tracks[0].label]
        for _ in range(len(t.tracks) - 1):
            before = view.selected
            when = before[0].starts[before[1]] if before is not None else 0.0
            await pilot.press("down")
            seen.append(t.tracks[view.track].label)
            # The block selected on the new row runs at, or is the next after, the time
            # of the one selected before ("down" keeps the place in time), or is the
            # row's last where nothing runs after.
            row = t.tracks[view.track]
            assert view.index is not None
            assert row.reach[view.index] >= when or view.index == len(row) - 1
        assert seen == [tr.label for tr in t.tracks]
        assert visible(t.tracks[-1].label) in detail(screen)
        await pilot.press("up")
        assert view.track == len(t.tracks) - 2
        rows = str(view.render())
        for track in t.tracks:
            assert track.label in rows  # six rows fit at 160x45, each named
    app.store.close_blocking()


async def test_a_click_selects_the_block_under_it() -> None:
    run_id = store_real("hf_generate")
    app = frozen_app()
    async with app.run_test(size=(160, 45)) as pilot:
        _, view = await open_timeline(pilot, run_id)
        t = view.timeline
        assert t is not None
        track = t.tracks[0]
        # A column in the middle of the view, on the stream's row (3 header rows).
        col = 70
        when = view.lo + (col + 0.5) * (view.hi - view.lo) / (view.size.width - 19)
        await pilot.click(TimelineView, offset=(19 + col, 3))
        want = track.at(when)
        assert view.index == want
    app.store.close_blocking()


def hostile_trace() -> bytes:
    names = ["[bold]x[/]", "[/]", "\x1b]0;pwned\x07k", "n" * 5000, "[link=http://e]c[/link]"]
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "ts": 0,
         "args": {"name": "[red]rank[/red] \x1b[2J"}}]
    for i, name in enumerate(names * 3):
        events.append({"ph": "X", "cat": "kernel", "name": name, "ts": 100.0 * i,
                       "dur": 50.0, "pid": 0, "tid": "[b]stream[/b]"})
    events.append({"ph": "X", "cat": "kernel", "name": "neg", "ts": -5, "dur": 1, "pid": 0,
                   "tid": 1})
    return gzip.compress(json.dumps({"traceEvents": events}).encode())


async def test_pod_names_are_shown_as_text_never_markup(tmp_path: Path) -> None:
    store_run(tmp_path, trace=hostile_trace())
    app = frozen_app()
    async with app.run_test(size=(160, 45)) as pilot:
        screen, view = await open_timeline(pilot, RUN_ID)
        assert "1 malformed event(s) dropped" in str(
            screen.query_one("#timeline-note", QuietStatic).render())
        seen = []
        for _ in range(5):
            seen.append(detail(screen))
            await pilot.press("right")
        assert "▸ [bold]x[/]" in seen[0] and "▸ [/]" in seen[1]
        assert "\x1b" not in seen[2] and "\\e]0;pwned\\x07k" in seen[2]
        assert "[link=http://e]c[/link]" in seen[4]
        # The 5000-character name: cut to 1 KiB by the trace's check, at most 600 shown.
        assert "n" * 600 in seen[3] and "n" * 601 not in seen[3]
        rows = str(view.render())
        assert "\x1b" not in rows and "\n[red]rank[/red] " in rows
    app.store.close_blocking()


async def test_a_trace_still_on_the_pod_says_how_to_bring_it_home() -> None:
    run_id = store_real("hf_generate", pulled=False)
    app = frozen_app()
    async with app.run_test(size=(120, 30)) as pilot:
        screen = ResultsScreen(run_id, tab="tab-timeline")
        await app.push_screen(screen)
        await until(pilot, lambda: screen.results is not None)
        note = str(screen.query_one("#timeline-note", QuietStatic).render())
        assert "still on the pod" in note and f"gpuws pull {run_id}" in note
        assert not screen.query_one(TimelineView).display
    app.store.close_blocking()


async def test_a_broken_trace_says_why_in_one_line(tmp_path: Path) -> None:
    store_run(tmp_path, trace=b"\x1f\x8bnot gzip at all")
    app = frozen_app()
    async with app.run_test(size=(120, 30)) as pilot:
        screen = ResultsScreen(RUN_ID, tab="tab-timeline")
        await app.push_screen(screen)
        note = screen.query_one("#timeline-note", QuietStatic)
        await until(pilot, lambda: "not valid gzip" in str(note.render()))
        shown = str(note.render())
        assert "\n" not in shown and shown.startswith("Trace refused: ")
        assert "gpuws pull RUN" in shown
        # Pulled again, whole this time (the same path): the tab reads it again.
        results = screen.results
        assert results is not None and results.trace is not None
        assert results.trace.local_path is not None
        Path(results.trace.local_path).write_bytes(real_trace(tmp_path / "again")[0])
        screen.query_one(TimelinePane).show_trace(results.trace, results.kernel_table, "")
        view = screen.query_one(TimelineView)
        await until(pilot, lambda: view.timeline is not None)
        assert view.display and "1470 GPU events" in str(note.render())
    app.store.close_blocking()


# ---------------------------------------------------------------------- the run screen


async def test_a_finished_run_opens_on_its_verdict_and_draws_its_timeline() -> None:
    run_id = store_real("hf_generate")
    app = frozen_app()
    async with app.run_test(size=(160, 45)) as pilot:
        app.replay_stored_run(run_id)
        await until(pilot, lambda: isinstance(app.screen, RunScreen)
                    and bool(app.screen.query("RunPanes"))
                    and app.screen.panes.model.finished is not None)
        screen = app.screen
        assert isinstance(screen, RunScreen)
        assert screen.query_one("#run-tabs", TabbedContent).active == "tab-verdict"
        view = screen.query_one(TimelineView)
        await until(pilot, lambda: view.timeline is not None)
        await pilot.press("6")
        await until(pilot, lambda: view.has_focus)
        with gzip.open(RECORDINGS / "hf_generate.timeline.trace.json.gz", "rt") as f:
            gpu = [e for e in json.load(f)["traceEvents"]
                   if e.get("cat") in ("kernel", "memcpy", "memset")]
        assert view.timeline is not None and view.timeline.events == len(gpu) == 19595
        table = screen.panes.model.kernel_table
        assert table is not None
        top = table.kernels[0]
        assert f"launched from {top.code}" in " ".join(str(
            screen.query_one("#timeline-detail", QuietStatic).render()).split())
    app.store.close_blocking()


async def test_a_command_run_s_timing_tab_says_why_it_has_no_chart() -> None:
    app = replay_app(RECORDINGS / "hf_generate.ndjson")
    async with app.run_test(size=(80, 24)) as pilot:
        await replayed()(pilot)
        screen = app.screen
        assert isinstance(screen, RunScreen)
        timing = screen.query_one(TimingPane)
        assert not timing.query_one(Sparkline).parent.display  # type: ignore[union-attr]
        assert not timing.query_one(Histogram).display
        shown = " ".join(str(timing.query_one("#t1-stats", Static).render()).split())
        assert shown.startswith("No Tier-1 samples: a command runs whole.")
        assert "Tier 0, the workload's own run: ok in 32.1 s" in shown  # its tier_finished
        # A replay's trace never came home: its Timeline tab says so, and how.
        await pilot.press("6")
        note = screen.query_one("#timeline-note", QuietStatic)
        await until(pilot, lambda: "still on the pod" in str(note.render()))
    app.store.close_blocking()
