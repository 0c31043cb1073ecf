"""Non-physical numbers from the pod: refused at the boundary with one line and a count.

A Tier-1 sample of 1e308 passed the old checks (finite, so fine), was stored and crashed
the histogram each time the run was opened. ``gpuws.physical`` now gives every numeric
field of every event a range; these tests survey that no field is missing, try the worst
values of each through :class:`~gpuws.live.boundary.Boundary`, and send them through a
lying agent (a stand-in for a pod: no real agent sends them) into the real engine, store
and printer, where honest events in the same stream must all be kept.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from faults.figures import record  # type: ignore[import-not-found]
from gpuws import physical, protocol
from gpuws.commands.run import Printer
from gpuws.live.boundary import Boundary, is_refusal
from gpuws.live.engine import Notice
from gpuws.live.model import RunModel
from security.test_untrusted_lying_agent import (  # type: ignore[import-not-found]
    NOW,
    RUN_DIR,
    LyingAgent,
    _drive,
    ev,
)
from tui.tuikit import recorded_events  # type: ignore[import-not-found]

RUN = "20261121-130950-9ba123"


# ---------------------------------------------------------------------- the survey
def _numeric(t: msgspec.inspect.Type) -> bool:
    if isinstance(t, (msgspec.inspect.IntType, msgspec.inspect.FloatType)):
        return True
    if isinstance(t, msgspec.inspect.UnionType):
        return any(_numeric(x) for x in t.types)
    if isinstance(t, (msgspec.inspect.ListType, msgspec.inspect.DictType)):
        item = t.item_type if isinstance(t, msgspec.inspect.ListType) else t.value_type
        return _numeric(item)
    return False


def _structs(t: msgspec.inspect.Type, seen: dict[str, msgspec.inspect.StructType]) -> None:
    if isinstance(t, msgspec.inspect.StructType):
        if t.cls.__name__ in seen:
            return
        seen[t.cls.__name__] = t
        for f in t.fields:
            _structs(f.type, seen)
    elif isinstance(t, msgspec.inspect.UnionType):
        for x in t.types:
            _structs(x, seen)
    elif isinstance(t, (msgspec.inspect.ListType, msgspec.inspect.DictType)):
        _structs(t.item_type if isinstance(t, msgspec.inspect.ListType) else t.value_type, seen)


def numeric_fields() -> set[tuple[str, str]]:
    """Every (struct, field) holding a number, in every event the laptop decodes."""
    seen: dict[str, msgspec.inspect.StructType] = {}
    _structs(msgspec.inspect.type_info(protocol.Events), seen)
    out = set()
    for name, info in seen.items():
        for f in info.fields:
            if _numeric(f.type):
                owner = "Event" if f.name in {"seq", "ts", "req", "run_id"} else name
                out.add((owner, f.name))
    return out


def test_every_numeric_field_of_every_event_has_a_range() -> None:
    fields = numeric_fields()
    missing = fields - set(physical.FIELDS) - physical.UNCHECKED
    assert not missing, f"numeric fields without a physical range: {sorted(missing)}"
    # The table names no field that does not exist (a typo would check nothing).
    assert set(physical.FIELDS) | physical.UNCHECKED <= fields
    record("test_every_numeric_field_of_every_event_has_a_range",
           numeric_fields=len(fields), ranged=len(set(physical.FIELDS) & fields))


@given(st.floats(allow_nan=True, allow_infinity=True),
       st.sampled_from(sorted(physical.BOUNDS)))
def test_within_is_finite_and_in_range(value: float, kind: str) -> None:
    bound = physical.BOUNDS[kind]
    assert physical.within(value, kind) == (math.isfinite(value)
                                            and bound.low <= value <= bound.high)


@settings(max_examples=200)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=50))
def test_a_sample_batch_passes_only_if_every_sample_is_a_time(values: list[float]) -> None:
    batch = protocol.Samples(run_id=RUN, seq=1, ts=NOW, values_ms=values)
    ok = all(physical.within(v, "ms") for v in values)
    assert (physical.problem(batch) is None) == ok
    assert physical.keep(values, "ms") == [v for v in values if physical.within(v, "ms")]


# ---------------------------------------------------------------------- the boundary
def _worst(kind: str) -> list[float]:
    bound = physical.BOUNDS[kind]
    candidates: list[Any] = [1e308, -1e308, -1.0, bound.high * 2 + 1, bound.low - 1,
                             -1, -(2**53), 2**53]
    if bound.high < 2**52:  # exact as a float too: one past the range stays past it
        candidates += [int(bound.high) + 1, int(bound.low) - 1]
    return [v for v in candidates if not physical.within(v, kind)]


def _variants(obj: msgspec.Struct) -> list[tuple[str, msgspec.Struct]]:
    """``obj`` with one numeric field (nested structs too) set to each worst value its
    type can hold."""
    out: list[tuple[str, msgspec.Struct]] = []
    name = type(obj).__name__
    for field in obj.__struct_fields__:
        current = getattr(obj, field)
        kind = physical.FIELDS.get((name, field))
        if kind is not None:
            for bad in _worst(kind):
                value: Any = bad
                if isinstance(current, list):
                    value = [1.0, bad, 2.0]
                elif isinstance(current, dict):
                    value = {**current, "hostile": bad}
                raw = {**protocol.to_builtins(obj), field: value}
                try:
                    out.append((f"{name}.{field}={bad!r}", msgspec.convert(raw, type(obj))))
                except msgspec.ValidationError:
                    pass  # a float for an int field: the decoder refuses it already
        elif isinstance(current, msgspec.Struct):
            out += [(label, msgspec.structs.replace(obj, **{field: v}))
                    for label, v in _variants(current)]
        elif isinstance(current, list) and current and isinstance(current[0], msgspec.Struct):
            out += [(label, msgspec.structs.replace(obj, **{field: [v, *current[1:]]}))
                    for label, v in _variants(current[0])]
    return out


def _poisoned(events: list[protocol.Events]) -> list[tuple[str, protocol.Events]]:
    """Each event of the recording with one numeric field set to each worst value."""
    return [(label, bad) for e in events for label, bad in _variants(e)]  # type: ignore[misc]


def test_the_worst_value_of_every_field_is_refused_and_honest_events_kept() -> None:
    honest = recorded_events()
    poisoned = _poisoned(honest)
    assert len(poisoned) > 60  # every field of every event type in the real recording
    said: list[tuple[str, str, int]] = []
    b = Boundary(on_refusal=lambda kind, message, n: said.append((kind, message, n)))
    b.expect(RUN, 0)
    kept = 0
    for label, bad in poisoned:
        # Each poisoned copy comes in place of the honest event (same seq), then the
        # honest one: the stand-in logs the refusal, the honest one is still let through.
        b.expect(RUN, bad.seq or 0)  # each copy in sequence (the laptop asked from there)
        out = b.check(bad)
        assert out is not None and is_refusal(out), label
        # Said why: the physical range, or (past 2**53) the integer bound before it.
        assert ("not a physical value" in out.message  # type: ignore[union-attr]
                or "is out of range" in out.message), label  # type: ignore[union-attr]
        again = b.check(honest[bad.seq or 0])
        assert again is not None and not is_refusal(again), label
        kept += 1
    refused = b.refused_total()
    assert refused == len(poisoned)
    # One line per kind and power of ten, not one per refusal.
    for kind, entry in b.refusals.items():
        count = entry.count
        assert [n for k, _, n in said if k == kind] == [
            n for n in (1, 10, 100, 1000) if n <= count]
    record("test_the_worst_value_of_every_field_is_refused_and_honest_events_kept",
           tried=len(poisoned), refused=refused, lines_said=len(said), honest_kept=kept,
           kinds="+".join(sorted(b.refusals)))


def test_a_telemetry_sample_out_of_range_is_refused() -> None:
    b = Boundary()
    sample = protocol.Telemetry(ts=time.time(), gpus=[protocol.GpuSample(index=0,
                                                                         temp_c=1e308)])
    assert b.check(sample) is None
    assert b.refusals["value"].count == 1


def test_a_probe_s_garbage_readings_are_left_out_and_its_lies_refused() -> None:
    from gpuws.errors import ProtocolError
    from gpuws.live.boundary import check_answer
    from tui.tuikit import h200_probe  # type: ignore[import-not-found]

    probe = h200_probe()
    gpu = probe.gpus[0]
    # A reading that may be missing: shown as not measured, the rest of the probe kept.
    bad = msgspec.structs.replace(probe, gpus=[msgspec.structs.replace(
        gpu, memory_total_mib=1e308, power_w=4294967.295)])
    kept = check_answer(protocol.ProbeResult(ts=time.time(), probe=bad)).probe
    assert kept.gpus[0].memory_total_mib is None and kept.gpus[0].power_w is None
    assert kept.gpus[0].name == gpu.name and kept.gpus[0].sm_clock_mhz == gpu.sm_clock_mhz
    assert kept.gpu_error is not None and "2 reading(s) no GPU gives left out: " \
        "gpus[0].memory_total_mib = 1e+308, gpus[0].power_w = 4294967.295" in kept.gpu_error
    # A number that must be there and is no number a pod has: the answer is refused.
    lie = msgspec.structs.replace(probe, gpus=[msgspec.structs.replace(gpu, index=70_000)])
    with pytest.raises(ProtocolError, match=r"gpus\[0\].index = 70000"):
        check_answer(protocol.ProbeResult(ts=time.time(), probe=lie))
    honest = check_answer(protocol.ProbeResult(ts=time.time(), probe=probe)).probe
    assert honest == probe  # nothing changed in an honest probe


# ---------------------------------------------------------------------- a lying agent
def test_a_lying_agent_s_1e308_samples_are_refused_and_the_rest_stored(
        capsys: pytest.CaptureFixture[str]) -> None:
    notices: list[Notice] = []

    def script(agent: LyingAgent, req: dict[str, Any]) -> None:
        if req["type"] != "start_run":
            return
        run_id = req["run_id"]
        agent.send({"type": "run_list", "req": req["req"], "ts": NOW, "runs": [
            {"run_id": run_id, "workload": "cmd:true", "status": "running", "started": NOW,
             "last_seq": 0}]})
        agent.send(
            ev(run_id, 0, "run_started", spec={"workload": "cmd:true", "tiers": [1]},
               run_dir=RUN_DIR.format(run_id=run_id), pid=7),
            ev(run_id, 1, "samples", values_ms=[0.5, 0.51, 0.49]),
            ev(run_id, 2, "samples", values_ms=[0.5, 1e308, -1e308]),
            ev(run_id, 3, "samples", values_ms=[0.52, 0.5]),
            ev(run_id, 4, "tier_finished", tier=1, status="ok", wall_s=-5.0),
            ev(run_id, 5, "kernel_table", source="nsys", kernels=[
                {"name": "k", "calls": 1, "total_ns": 1e308, "mean_ns": 1.0,
                 "share_pct": 5000.0}]),
            ev(run_id, 6, "run_finished", status="ok", wall_s=1.0))

    async def go() -> list[protocol.Events]:
        run_id, engine = await _drive(script, Printer(as_json=False), notices)
        try:
            await asyncio.wait_for(engine.wait_finished(run_id), 10)
            await engine.drained()
            samples = await engine.store.call(lambda s: s.samples(run_id))
            assert samples == [0.5, 0.51, 0.49, 0.52, 0.5]
            return await engine.store.call(lambda s: s.events(run_id))
        finally:
            await engine.close()
            await engine.store.close()

    stored = asyncio.run(go())
    assert [e.seq for e in stored] == list(range(7))  # gap-free: stand-ins in place
    stand_ins = [e for e in stored if is_refusal(e)]
    assert [e.seq for e in stand_ins] == [2, 4, 5]
    said = [n.message for n in notices if n.kind == "refused"]
    assert len(said) == 1 and "values_ms[1] = 1e+308 is not a physical value" in said[0]
    out = capsys.readouterr()
    assert "Traceback" not in out.err


@settings(max_examples=200)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=40))
def test_the_model_s_figures_stay_finite_whatever_was_stored(values: list[float]) -> None:
    # What an older gpuws stored unchecked: the model leaves it out of every figure, so the
    # histogram, the sparkline and the statistics line only ever see times a call takes.
    model = RunModel(RUN)
    model.apply([protocol.Samples(run_id=RUN, seq=0, ts=NOW, values_ms=values)])
    kept = [v for v in values if physical.within(v, "ms")]
    assert model.samples == kept and model.samples_dropped == len(values) - len(kept)
    stats = model.running_stats()
    if stats is None:
        assert not kept
    else:
        figures = (stats.median_ms, stats.ci_low_ms, stats.ci_high_ms, stats.min_ms,
                   stats.max_ms, stats.p5_ms, stats.p95_ms)
        assert all(math.isfinite(x) for x in figures)
