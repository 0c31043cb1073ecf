"""A short call's Tier-1 figure in the faces: what timed it, the event median, the caution.

The real H200 recording (tests/tui/tuikit.py) with its ``tier1_result`` given the fields
a CUPTI-timed short call carries (the figures of tests/gpu/programs/short_cupti_probe.py
on an H200), and once with the caution an event-timed short call carries, then stored in
a real SQLite store and exported, and printed as ``gpuws run`` prints it.
"""

from __future__ import annotations

import msgspec
from rich.console import Console

from gpuws import protocol
from gpuws.commands.run import tier1_table
from gpuws.remote_agent.measure.device_time import floor_caution, ncu_note
from gpuws.sessions.export import export_session
from gpuws.sessions.store import Store
from gpuws.text.textsafe import md_text
from tui.tuikit import h200_probe, recorded_events  # type: ignore[import-not-found]


def _with(**fields: object) -> tuple[list[protocol.Events], protocol.Tier1Result]:
    events = recorded_events()
    for i, ev in enumerate(events):
        if isinstance(ev, protocol.Tier1Result):
            events[i] = msgspec.structs.replace(ev, **fields)  # type: ignore[arg-type]
            result = events[i]
            assert isinstance(result, protocol.Tier1Result)
            return events, result
    raise AssertionError("the recording has no tier1_result")


def _export(events: list[protocol.Events]) -> str:
    with Store() as s:
        sid = s.open_session("h200", "ssh+sftp", h200_probe(), 3.99, 20.0,
                             started=events[0].ts - 30)
        s.ingest_many(sid, events)
        s.end_session(sid, ended=events[-1].ts + 60)
        return export_session(s, sid)


def _printed(result: protocol.Tier1Result) -> str:
    console = Console(width=400, record=True, color_system=None)
    console.print(tier1_table(result))
    return console.export_text()


def test_a_cupti_figure_says_so_and_keeps_the_event_median() -> None:
    note = ncu_note(0.006464)
    events, result = _with(timing_source="CUPTI (torch.profiler)", events_median_ms=0.00787,
                           caution=note)
    md = _export(events)
    assert md_text("Timed by CUPTI (torch.profiler); CUDA events read 7.87 µs.") in md
    assert md_text(f"Caution: {note}") in md
    printed = _printed(result)
    assert "Tier 1 · CUPTI (torch.profiler) ·" in printed
    assert "CUDA events read 7.9 µs" in printed  # humanfmt's 2 significant digits
    assert "! timed from CUPTI activity records (6.46 µs" in printed


def test_an_event_figure_with_a_caution_shows_it_and_older_results_read_as_before() -> None:
    caution = floor_caution(0.00787, "no torch in the workload's Python")
    events, result = _with(timing_source="CUDA events", caution=caution)
    md = _export(events)
    assert md_text(f"Caution: {caution}") in md  # as inert markdown
    assert "Timed by" not in md
    assert "Tier 1 · CUDA events ·" in _printed(result)
    _, old = _with()  # a result from an agent before these fields
    assert old.timing_source is None and "Tier 1 · CUDA events ·" in _printed(old)
