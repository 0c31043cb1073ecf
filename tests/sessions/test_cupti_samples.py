"""A short call's figure and its samples are the same measurement.

Tier 1 times a call under 50 µs twice: CUDA events stream their samples as they come, then
CUPTI's activity records time it again and give the figure the run reports. Found on the
H200 (docs/gpu-validation.md run 19): an agent's loop compared two runs of a 43.6 µs
Triton add by their *event* samples (44.45 → 44.77 µs, "+0.7% slower") while each run
reported CUPTI's 43.62 and 43.63 µs. The CUPTI samples now travel as ``samples`` events
marked ``source="cupti"``, and wherever the laptop reads a run's samples (compare, watch,
the export, the live histogram) they replace the event ones. The streams are the recorded
saxpy run's (tests/sessions/recorded.py) with a CUPTI batch added as the agent sends it.
"""

from __future__ import annotations

import json
from types import ModuleType

import pytest

from gpuws import protocol
from gpuws.live.model import RunModel
from gpuws.sessions.compare import compare_runs
from gpuws.sessions.store import Store


def short_run(recorded: ModuleType, run_id: str, *, t0: float, events_ms: float,
              cupti_ms: float, seed: int) -> list[bytes]:
    """A Tier-1 run whose event samples read ``events_ms`` and whose CUPTI ones ``cupti_ms``."""
    lines = [json.loads(line) for line in recorded.saxpy_run(
        run_id, t0=t0, median_ms=events_ms, seed=seed, tiers=(1,), mode="cold")]
    at = next(i for i, e in enumerate(lines) if e["type"] == "tier1_result")
    cupti = dict(lines[at - 1], values_ms=recorded.make_samples(200, cupti_ms, seed + 100),
                 batch=1, source="cupti")
    lines.insert(at, cupti)
    for seq, e in enumerate(lines):
        e["seq"] = seq
    return [json.dumps(e).encode() + b"\n" for e in lines]


def test_the_store_gives_the_reported_figures_samples(store: Store,
                                                      recorded: ModuleType) -> None:
    sid = store.open_session("pod", "local", None, 3.99, started=recorded.T0 - 10)
    lines = short_run(recorded, "r-short", t0=recorded.T0, events_ms=0.00595, cupti_ms=0.00518,
                      seed=1)
    assert store.ingest_many(sid, lines) == len(lines)
    assert store.samples("r-short") == recorded.make_samples(200, 0.00518, 101)


def test_compare_judges_cupti_samples_not_the_events(store: Store,
                                                    recorded: ModuleType) -> None:
    # The same kernel twice: the event samples moved 5% (the event pair's floor changed),
    # CUPTI's did not; the comparison says so and claims nothing.
    sid = store.open_session("pod", "local", None, 3.99, started=recorded.T0 - 10)
    store.ingest_many(sid, short_run(recorded, "r-a", t0=recorded.T0, events_ms=0.00595,
                                     cupti_ms=0.00518, seed=1))
    store.ingest_many(sid, short_run(recorded, "r-b", t0=recorded.T0 + 60, events_ms=0.00625,
                                     cupti_ms=0.00518, seed=2))
    t = compare_runs(store, "r-a", "r-b").tier1
    assert t is not None
    assert t.median_a_ms == pytest.approx(0.00518, rel=0.005)
    assert t.median_b_ms == pytest.approx(0.00518, rel=0.005)
    assert t.within_noise or t.under_floor, t.verdict


def test_the_live_histogram_swaps_to_the_cupti_samples(recorded: ModuleType) -> None:
    lines = short_run(recorded, "r-live", t0=recorded.T0, events_ms=0.00595, cupti_ms=0.00518,
                      seed=3)
    events = [protocol.decode_event(line) for line in lines]
    model = RunModel("r-live")
    at = next(i for i, e in enumerate(events)
              if isinstance(e, protocol.Samples) and e.source == "cupti")
    model.apply(events[:at])
    assert len(model.samples) == 200  # the event samples, as they streamed
    model.apply(events[at:])
    cupti = recorded.make_samples(200, 0.00518, 103)
    assert model.samples == cupti and model.sorted_samples == sorted(cupti)
    stats = model.running_stats()
    assert stats is not None and stats.median_ms == pytest.approx(0.00518, rel=0.005)


@pytest.mark.parametrize("source", ["events", "CUPTI", "x" * 10_000, 1, ""])
def test_a_samples_source_other_than_cupti_is_refused_at_the_wire(source: object) -> None:
    """The mark decides whose samples a run's figures are read from: a pod can say only
    "cupti" (or nothing), and anything else makes the line a BadLine, counted, not used."""
    line = json.dumps({"type": "samples", "run_id": "r", "seq": 3, "ts": 1.0,
                       "values_ms": [0.005], "source": source}).encode()
    assert isinstance(protocol.decode_event(line), protocol.BadLine)
    ok = json.loads(line)
    ok["source"] = "cupti"
    decoded = protocol.decode_event(json.dumps(ok).encode())
    assert isinstance(decoded, protocol.Samples) and decoded.source == "cupti"
